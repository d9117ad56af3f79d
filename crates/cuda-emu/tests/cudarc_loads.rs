//! cudarc itself loads the emulator as `libcuda.so` (from a temporary directory of symlinks on
//! `LD_LIBRARY_PATH`, in a child process: the loader reads that variable at start-up) and drives
//! it through the calls kiln makes: contexts, streams, events, allocation, copies, memory info,
//! VMM and errors.

mod relaunch;

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
    if relaunch::in_child() {
        scenario();
        return;
    }
    let out = relaunch::run_child(
        "cudarc_drives_the_emulator",
        &["cuda"],
        &[
            ("KILN_EMU_DEVICES", "3"),
            ("KILN_EMU_MEMORY", "256M"),
            ("CUDA_VISIBLE_DEVICES", "2,1"),
        ],
    );
    let text = relaunch::text(&out);
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "the child did not run the scenario:\n{text}"
    );
}
