//! Single-image inference with a checkpoint written by the `train` example: reads a PNG or
//! JPEG, converts HWC to CHW, normalises it with the constants stored in the checkpoint, adds
//! the batch dimension (`unsqueeze(0)`), runs the model under `no_grad` in eval mode, removes
//! the batch dimension (`squeeze(0)`) and prints the five most likely classes
//! (`kiln::recipe::predict`).
//!
//! ```text
//! cargo run --release --example predict -- --checkpoint runs/train/ckpt.safetensors image.png
//! cargo run --release --example predict -- --checkpoint runs/train/ckpt.safetensors photo.jpg --resize
//! ```

use clap::Parser;
use kiln::data::ImageOptions;
use std::path::PathBuf;

/// Classify one image with a kiln training checkpoint.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The checkpoint (RUN_DIR/ckpt.safetensors).
    #[arg(long)]
    checkpoint: PathBuf,
    /// The image (PNG or JPEG).
    image: PathBuf,
    /// Resize the image to the model's input size instead of refusing another size.
    #[arg(long)]
    resize: bool,
    /// Convert gray / RGBA images to the model's channel count instead of refusing them.
    #[arg(long)]
    convert_channels: bool,
    /// How many classes to print.
    #[arg(long, default_value_t = 5)]
    top: usize,
}

fn main() {
    let args = Args::parse();
    let options = ImageOptions {
        resize: args.resize,
        convert_channels: args.convert_channels,
    };
    match kiln::recipe::predict(&args.checkpoint, &args.image, options, args.top) {
        Ok(top) => {
            println!("{}:", args.image.display());
            for (rank, (class, p)) in top.iter().enumerate() {
                println!("  {}. {class:<18} {:6.2}%", rank + 1, 100.0 * p);
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
