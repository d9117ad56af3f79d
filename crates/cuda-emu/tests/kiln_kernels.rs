//! Every kiln kernel file compiles under the emulator's NVRTC with kiln's own option list, and
//! loads, and every `extern "C"` kernel it defines can be looked up.

mod runtime_support;

use std::path::Path;

use runtime_support::compile;

/// kiln's kernel files, relative to kiln-device's `src/` (as kiln names them).
fn kiln_kernel_files() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../device/src");
    let mut files = vec!["cuda/deferred.cu".to_string()];
    for family in std::fs::read_dir(src.join("ops")).unwrap() {
        let family = family.unwrap().path();
        if !family.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(&family).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "cu") {
                let rel = path.strip_prefix(&src).unwrap();
                files.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    files.sort();
    files
}

#[test]
fn every_kiln_kernel_file_compiles_and_loads() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../device/src");
    let files = kiln_kernel_files();
    assert!(files.len() > 5, "{files:?}");
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(src.join(file)).unwrap();
        let expanded = kiln_device::cuda::headers::expand_includes(&text, file);
        let started = std::time::Instant::now();
        match compile(file, &expanded, &kiln_device::nvrtc_options(9, 0)) {
            Ok(image) => {
                eprintln!("{file}: {:.1?}", started.elapsed());
                let image = std::ffi::CString::new(image).unwrap();
                let module =
                    unsafe { kiln_cuda_emu::kernel::Module::load(image.as_ptr() as *const _) }
                        .unwrap_or_else(|e| panic!("{file}: {}", e.message));
                // Every kernel name written literally after `__global__ void` is found.
                for name in text.split("__global__ void ").skip(1).filter_map(|rest| {
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    (!name.is_empty()
                        && !name.contains("__launch_bounds__")
                        && !text.contains(&format!("{name}##")))
                    .then_some(name)
                }) {
                    if !name.ends_with('_') {
                        assert!(
                            module.function(&name).is_ok(),
                            "{file}: kernel {name} not found"
                        );
                    }
                }
            }
            Err((code, log)) => failures.push(format!("{file}: {code:?}\n{log}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
