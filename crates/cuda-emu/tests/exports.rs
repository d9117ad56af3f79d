//! The built library exports every symbol cudarc can load from the driver, NVRTC, cuBLAS and
//! NCCL (implemented or stubbed), so no call through cudarc panics on a missing symbol.

use std::ffi::CString;

#[test]
fn every_listed_symbol_is_exported() {
    let exe = std::env::current_exe().unwrap();
    let library = exe.parent().unwrap().join("libkiln_cuda_emu.so");
    if !library.exists() {
        eprintln!("skipped: {} was not built", library.display());
        return;
    }
    let path = CString::new(library.to_str().unwrap()).unwrap();
    // SAFETY: loading our own library; nothing in it runs at load time.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen {}", library.display());
    let names = concat!(env!("CARGO_MANIFEST_DIR"), "/names");
    let mut missing = Vec::new();
    for list in ["driver", "nvrtc", "cublas", "nccl"] {
        let text = std::fs::read_to_string(format!("{names}/{list}.txt")).unwrap();
        for name in text.lines().filter(|l| !l.is_empty()) {
            let symbol = CString::new(name).unwrap();
            // SAFETY: a symbol lookup in a library we hold open.
            if unsafe { libc::dlsym(handle, symbol.as_ptr()) }.is_null() {
                missing.push(name.to_string());
            }
        }
    }
    assert!(missing.is_empty(), "not exported: {missing:?}");
}
