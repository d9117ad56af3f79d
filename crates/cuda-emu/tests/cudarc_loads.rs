//! cudarc itself loads the emulator as `libcuda.so` (from a temporary directory of symlinks on
//! `LD_LIBRARY_PATH`, in a child process: the loader reads that variable at start-up) and drives
//! it through the calls kiln makes: contexts, streams, events, allocation, copies, memory info,
//! VMM and errors.

use std::path::PathBuf;
use std::process::Command;

const CHILD: &str = "KILN_EMU_TEST_CHILD";

fn scenario() {
    use cudarc::driver::{result, sys, CudaContext};
    assert_eq!(CudaContext::device_count().unwrap(), 2);
    let ctx = CudaContext::new(1).unwrap();
    assert_eq!(ctx.name().unwrap(), "NVIDIA H200 (kiln-cuda-emu)");
    assert_eq!(ctx.compute_capability().unwrap(), (9, 0));
    let stream = ctx.default_stream();
    let a = stream.clone_htod(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let mut b = stream.alloc_zeros::<f32>(4).unwrap();
    let side = stream.fork().unwrap();
    side.memcpy_dtod(&a, &mut b).unwrap();
    let back = stream.clone_dtoh(&b).unwrap();
    assert_eq!(
        back,
        [1.0, 2.0, 3.0, 4.0],
        "event tracking orders the streams"
    );
    let start = stream
        .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .unwrap();
    let end = stream
        .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
        .unwrap();
    end.synchronize().unwrap();
    assert!(start.elapsed_ms(&end).unwrap() >= 0.0);
    let (free, total) = ctx.mem_get_info().unwrap();
    assert_eq!(total, 256 << 20);
    assert!(free < total);
    let err = unsafe { result::malloc_sync(1 << 30) }.unwrap_err();
    assert_eq!(err.0, sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(
        err.error_name().unwrap().to_str().unwrap(),
        "CUDA_ERROR_OUT_OF_MEMORY"
    );
    let vmm = ctx
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)
        .unwrap();
    assert_eq!(vmm, 1);
    drop((a, b, side));
    stream.synchronize().unwrap();
    ctx.synchronize().unwrap();
}

#[test]
fn cudarc_drives_the_emulator() {
    if std::env::var_os(CHILD).is_some() {
        scenario();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let library: PathBuf = exe.parent().unwrap().join("libkiln_cuda_emu.so");
    if !library.exists() {
        eprintln!("skipped: {} was not built", library.display());
        return;
    }
    let dir = std::env::temp_dir().join(format!("kiln-emu-cudarc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["libcuda.so", "libcuda.so.1"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&library, &link).unwrap();
    }
    let out = Command::new(&exe)
        .args(["--exact", "cudarc_drives_the_emulator", "--nocapture"])
        .env_remove("KILN_EMU_CC")
        .env_remove("KILN_EMU_DELAY")
        .env_remove("KILN_EMU_LOG")
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", &dir)
        .env("KILN_EMU_DEVICES", "3")
        .env("KILN_EMU_MEMORY", "256M")
        .env("CUDA_VISIBLE_DEVICES", "2,1")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "child failed:\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
}
