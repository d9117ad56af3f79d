//! cudarc compiles (its NVRTC path, `compile_ptx_with_opts`), loads and launches kernels on the
//! emulator loaded as `libcuda.so` and `libnvrtc.so` (symlinks on `LD_LIBRARY_PATH`, in a child
//! process): a grid's results, a compile error's log, and a fault that poisons the context.

mod relaunch;

const SOURCE: &str = r#"
extern "C" __global__ void __launch_bounds__(256) saxpy(float* y, const float* x, float a, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
extern "C" __global__ void store_past(float* y, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n + 64) y[i] = 1.0f;
}
"#;

fn scenario() {
    use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
    use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions};
    let opts = || CompileOptions {
        arch: Some("compute_90"),
        options: vec![
            "--std=c++17".into(),
            "--device-as-default-execution-space".into(),
        ],
        ..Default::default()
    };
    match compile_ptx_with_opts("extern \"C\" __global__ void k() { nope(); }", opts()) {
        Err(CompileError::CompileError { log, .. }) => {
            assert!(log.to_string_lossy().contains("nope"), "{log:?}")
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
    let ptx = compile_ptx_with_opts(SOURCE, opts()).unwrap();
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let module = ctx.load_module(ptx).unwrap();
    let saxpy = module.load_function("saxpy").unwrap();
    let n = 5000u32;
    let xs: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let x = stream.clone_htod(&xs).unwrap();
    let mut y = stream.clone_htod(&vec![1.0f32; n as usize]).unwrap();
    let mut launch = stream.launch_builder(&saxpy);
    launch.arg(&mut y).arg(&x).arg(&2.0f32).arg(&n);
    // 1024 threads per block: more than the kernel's __launch_bounds__(256).
    let refused = unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }.unwrap_err();
    assert_eq!(
        refused.0,
        cudarc::driver::sys::CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    );
    let config = LaunchConfig {
        grid_dim: (n.div_ceil(256), 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    unsafe { launch.launch(config) }.unwrap();
    let back = stream.clone_dtoh(&y).unwrap();
    assert!(back
        .iter()
        .enumerate()
        .all(|(i, &v)| v == 1.0 + 2.0 * i as f32));

    let past = module.load_function("store_past").unwrap();
    let mut small = stream.alloc_zeros::<f32>(64).unwrap();
    let mut launch = stream.launch_builder(&past);
    let n = 64u32;
    launch.arg(&mut small).arg(&n);
    unsafe { launch.launch(LaunchConfig::for_num_elems(256)) }.unwrap();
    let err = stream.synchronize().unwrap_err();
    assert_eq!(
        err.0,
        cudarc::driver::sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
    );
}

#[test]
fn cudarc_compiles_loads_and_launches_kernels() {
    if relaunch::in_child() {
        scenario();
        return;
    }
    let out = relaunch::run_child(
        "cudarc_compiles_loads_and_launches_kernels",
        &["cuda", "nvrtc"],
        &[],
    );
    let text = relaunch::text(&out);
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "the child did not run the scenario:\n{text}"
    );
    assert!(
        text.contains("store_past"),
        "the fault is logged naming the kernel:\n{text}"
    );
}
