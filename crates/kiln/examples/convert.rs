//! Converts a PyTorch checkpoint (`torch.save` of a `state_dict`, `.pth` / `.pt`, zip or legacy
//! format) to safetensors with the same tensor names, dtypes, shapes and bits, without running
//! any code from the file (`kiln::models::pth`).
//!
//! ```text
//! cargo run --release --example convert -- resnet18-f37072fd.pth resnet18.safetensors
//! ```

use kiln::models::pth::convert_to_safetensors;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: convert IN.pth OUT.safetensors\n\
    Reads a torch.save file of a state_dict (for example torchvision's weights) and writes its \
    tensors as safetensors.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let [input, output] = &args[..] else {
        eprintln!("convert: expected 2 arguments, got {}\n{USAGE}", args.len());
        return ExitCode::from(2);
    };
    let (input, output) = (PathBuf::from(input), PathBuf::from(output));
    if input.extension().is_some_and(|e| e == "safetensors") {
        eprintln!(
            "convert: {} is already safetensors; pass the .pth file first and the output second",
            input.display()
        );
        return ExitCode::from(2);
    }
    match convert_to_safetensors(&input, &output) {
        Ok(tensors) => {
            let mut by_dtype: BTreeMap<String, usize> = BTreeMap::new();
            let mut elements = 0usize;
            for (_, t) in &tensors {
                *by_dtype.entry(format!("{:?}", t.dtype())).or_default() += 1;
                elements += t.numel();
            }
            let dtypes: Vec<String> = by_dtype.iter().map(|(d, n)| format!("{n} {d}")).collect();
            println!(
                "wrote {} tensors ({elements} elements: {}) to {}",
                tensors.len(),
                dtypes.join(", "),
                output.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("convert: {e}");
            ExitCode::FAILURE
        }
    }
}
