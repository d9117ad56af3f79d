//! The kernel runtime end to end: compile with the emulator's NVRTC, load, launch, check results
//! and errors. Kernels take output addresses as `unsigned long long` here, so these tests need no
//! device memory (pointer arguments are checked against it, see `host_pointer_is_refused`).

mod runtime_support;

use cudarc::driver::sys::CUresult;
use cudarc::nvrtc::sys::nvrtcResult;
use runtime_support::*;

#[test]
fn a_1d_grid_runs_every_thread_once() {
    let m = load(
        "scale.cu",
        r#"extern "C" __global__ void scale(unsigned long long out, unsigned long long in, float s, unsigned n) {
            unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) ((float*)out)[i] = ((const float*)in)[i] * s;
        }"#,
    );
    let n = 1000u32;
    let input: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut out = vec![0f32; n as usize];
    launch(
        &m,
        "scale",
        [8, 1, 1],
        [128, 1, 1],
        &[
            Arg::U64(out.as_mut_ptr() as u64),
            Arg::U64(input.as_ptr() as u64),
            Arg::F32(2.0),
            Arg::U32(n),
        ],
    )
    .unwrap();
    assert!(out.iter().enumerate().all(|(i, &v)| v == 2.0 * i as f32));
}

#[test]
fn block_reduction_with_shared_memory_and_syncthreads() {
    let m = load(
        "reduce.cu",
        r#"extern "C" __global__ void block_sum(unsigned long long in, unsigned long long out) {
            __shared__ float partial[256];
            unsigned t = threadIdx.x;
            partial[t] = ((const float*)in)[blockIdx.x * blockDim.x + t];
            __syncthreads();
            for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
                if (t < s) partial[t] += partial[t + s];
                __syncthreads();
            }
            if (t == 0) ((float*)out)[blockIdx.x] = partial[0];
        }"#,
    );
    let blocks = 37u32;
    let input: Vec<f32> = (0..blocks * 256).map(|i| (i % 7) as f32).collect();
    let mut out = vec![0f32; blocks as usize];
    {
        launch(
            &m,
            "block_sum",
            [blocks, 1, 1],
            [256, 1, 1],
            &[
                Arg::U64(input.as_ptr() as u64),
                Arg::U64(out.as_mut_ptr() as u64),
            ],
        )
        .unwrap();
        for b in 0..blocks as usize {
            let want: f32 = input[b * 256..(b + 1) * 256].iter().sum();
            assert_eq!(out[b], want, "block {b}");
        }
    }
}

#[test]
fn compile_errors_return_nvrtc_compilation_and_the_log() {
    let (code, log) = compile(
        "broken.cu",
        "extern \"C\" __global__ void k() { undeclared_thing(); }",
        &kiln_options(),
    )
    .unwrap_err();
    assert_eq!(code, nvrtcResult::NVRTC_ERROR_COMPILATION);
    assert!(
        log.contains("broken.cu") && log.contains("undeclared_thing"),
        "{log}"
    );
}

#[test]
fn unknown_options_are_refused_naming_them() {
    let mut opts = kiln_options();
    opts.push("--no-such-option".into());
    let (code, log) = compile("k.cu", "extern \"C\" __global__ void k() {}", &opts).unwrap_err();
    assert_eq!(code, nvrtcResult::NVRTC_ERROR_INVALID_OPTION);
    assert!(log.contains("--no-such-option"), "{log}");
}

#[test]
fn host_pointer_is_refused() {
    let m = load(
        "ptr.cu",
        "extern \"C\" __global__ void k(int n, float* out) { if (n) out[0] = 1; }",
    );
    let host = [0f32; 4];
    assert_fails(
        launch(
            &m,
            "k",
            [1, 1, 1],
            [1, 1, 1],
            &[Arg::U32(1), Arg::U64(host.as_ptr() as u64)],
        ),
        CUresult::CUDA_ERROR_INVALID_VALUE,
        &["kernel k", "argument 1", "host pointer"],
    );
}

#[test]
fn out_of_bounds_store_is_caught_naming_kernel_block_and_thread() {
    let m = load(
        "oob.cu",
        r#"extern "C" __global__ void oob_store(unsigned long long base) {
            if (blockIdx.x == 2 && threadIdx.x == 5) *(volatile int*)(base) = 1;
        }"#,
    );
    // An address that is mapped nowhere: a guard page made here.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    let addr = page as u64 + 64;
    assert_fails(
        launch(&m, "oob_store", [4, 1, 1], [32, 1, 1], &[Arg::U64(addr)]),
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
        &[
            "kernel oob_store",
            "block (2,0,0)",
            "thread (5,0,0)",
            &format!("0x{addr:x}"),
        ],
    );
    // The runtime is still usable afterwards.
    let mut out = [0u32; 1];
    let ok = load(
        "ok.cu",
        "extern \"C\" __global__ void put(unsigned long long p) { *(unsigned*)p = 7; }",
    );
    launch(
        &ok,
        "put",
        [1, 1, 1],
        [1, 1, 1],
        &[Arg::U64(out.as_mut_ptr() as u64)],
    )
    .unwrap();
    assert_eq!(out[0], 7);
    unsafe { libc::munmap(page, 4096) };
}

#[test]
fn divergent_barrier_is_detected() {
    let m = load(
        "diverge.cu",
        r#"extern "C" __global__ void diverge(int x) {
            if (threadIdx.x < 16) { __syncthreads(); }
            else { __syncthreads(); }
        }"#,
    );
    assert_fails(
        launch(&m, "diverge", [1, 1, 1], [32, 1, 1], &[Arg::U32(0)]),
        CUresult::CUDA_ERROR_LAUNCH_FAILED,
        &["kernel diverge", "different barriers", "diverge.cu:2"],
    );
    let m = load(
        "early.cu",
        r#"extern "C" __global__ void early_exit(int x) {
            if (threadIdx.x == 3) return;
            __syncthreads();
        }"#,
    );
    assert_fails(
        launch(&m, "early_exit", [1, 1, 1], [32, 1, 1], &[Arg::U32(0)]),
        CUresult::CUDA_ERROR_LAUNCH_FAILED,
        &["kernel early_exit", "thread (3,0,0) has exited"],
    );
}

#[test]
fn launch_bounds_are_reported_and_enforced() {
    let m = load(
        "lb.cu",
        "#define B 128\nextern \"C\" __global__ void __launch_bounds__(B * 2) bounded(int x) {}\n\
         extern \"C\" __global__ void free_(int x) {}",
    );
    assert_eq!(m.function("bounded").unwrap().max_threads_per_block(), 256);
    assert_eq!(m.function("free_").unwrap().max_threads_per_block(), 1024);
    assert_fails(
        launch(&m, "bounded", [1, 1, 1], [512, 1, 1], &[Arg::U32(0)]),
        CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
        &["kernel bounded", "512"],
    );
    assert!(m.function("missing").is_err());
}

#[test]
fn dynamic_shared_memory_is_per_block() {
    let m = load(
        "dyn.cu",
        r#"extern "C" __global__ void rotate(unsigned long long out) {
            extern __shared__ float buf[];
            unsigned t = threadIdx.x;
            buf[t] = (float)(blockIdx.x * 100 + t);
            __syncthreads();
            ((float*)out)[blockIdx.x * blockDim.x + t] = buf[(t + 1) % blockDim.x];
        }"#,
    );
    let mut out = vec![0f32; 4 * 64];
    launch_shared(
        &m,
        "rotate",
        [4, 1, 1],
        [64, 1, 1],
        64 * 4,
        &[Arg::U64(out.as_mut_ptr() as u64)],
    )
    .unwrap();
    for b in 0..4 {
        for t in 0..64 {
            assert_eq!(out[b * 64 + t], (b * 100 + (t + 1) % 64) as f32);
        }
    }
    assert!(launch_shared(&m, "rotate", [1, 1, 1], [64, 1, 1], 1 << 20, &[Arg::U64(0)]).is_err());
}

#[test]
fn named_headers_and_macros_are_honoured() {
    let mut opts = kiln_options();
    opts.push("-DSCALE=3".into());
    opts.push("--include-path=/nonexistent".into());
    let image = compile_with_headers(
        "hdr.cu",
        "#include \"mine/value.cuh\"\nextern \"C\" __global__ void put(unsigned long long p) { *(int*)p = VALUE * SCALE; }",
        &opts,
        &[("mine/value.cuh", "#define VALUE 14\n")],
    )
    .unwrap();
    let image = std::ffi::CString::new(image).unwrap();
    let m = unsafe { kiln_cuda_emu::kernel::Module::load(image.as_ptr() as *const _) }.unwrap();
    let mut out = [0i32; 1];
    launch(
        &m,
        "put",
        [1, 1, 1],
        [1, 1, 1],
        &[Arg::U64(out.as_mut_ptr() as u64)],
    )
    .unwrap();
    assert_eq!(out[0], 42);
}

#[test]
fn foreign_images_are_invalid_and_a_cleared_cache_recompiles() {
    use kiln_cuda_emu::kernel::Module;
    for text in [
        "//\n// Generated by NVIDIA NVVM Compiler\n.version 8.5\n.target sm_90\n",
        "garbage",
    ] {
        let c = std::ffi::CString::new(text).unwrap();
        let e = unsafe { Module::load(c.as_ptr() as *const _) }
            .err()
            .expect("refused");
        assert_eq!(e.code, CUresult::CUDA_ERROR_INVALID_IMAGE, "{}", e.message);
    }
    // A source no other test compiles, so removing its object races nobody.
    let nonce = format!("{:?}", std::time::SystemTime::now());
    let src = format!(
        "// {nonce}\nextern \"C\" __global__ void put(unsigned long long p) {{ *(int*)p = 5; }}"
    );
    let image = compile("again.cu", &src, &kiln_options()).unwrap();
    let hash = kiln_cuda_emu::nvrtc::image::decode(&image).unwrap().hash;
    assert!(image.contains("\n// .entry put(\n"), "{image}");
    let so = kiln_cuda_emu::nvrtc::compiler::cache_dir()
        .join("modules")
        .join(format!("{hash}.so"));
    std::fs::remove_file(&so).unwrap();
    let c = std::ffi::CString::new(image).unwrap();
    let m = unsafe { Module::load(c.as_ptr() as *const _) }.unwrap();
    assert!(so.is_file());
    let mut out = [0i32; 1];
    launch(
        &m,
        "put",
        [1, 1, 1],
        [1, 1, 1],
        &[Arg::U64(out.as_mut_ptr() as u64)],
    )
    .unwrap();
    assert_eq!(out[0], 5);
    std::fs::remove_file(&so).unwrap();
}

#[test]
fn traps_divisions_by_zero_and_stack_overflows_are_reported() {
    let m = load(
        "faults.cu",
        r#"__device__ int depth(volatile int* p, int n) { int pad[256]; pad[n & 255] = n; return n ? depth(p, n + 1) + pad[0] : 0; }
        extern "C" __global__ void trapper(int x) { if (threadIdx.x == 1) __trap(); }
        extern "C" __global__ void divider(unsigned long long p, int x) { volatile int zero = x; *(volatile int*)p = 7 / zero; }
        extern "C" __global__ void recurse(unsigned long long p) { depth((volatile int*)p, 1); }"#,
    );
    let failed = CUresult::CUDA_ERROR_LAUNCH_FAILED;
    let mut sink = [0i32; 1];
    assert_fails(
        launch(&m, "trapper", [1, 1, 1], [4, 1, 1], &[Arg::U32(0)]),
        failed,
        &["kernel trapper", "thread (1,0,0)", "__trap"],
    );
    assert_fails(
        launch(
            &m,
            "divider",
            [1, 1, 1],
            [1, 1, 1],
            &[Arg::U64(sink.as_mut_ptr() as u64), Arg::U32(0)],
        ),
        failed,
        &["kernel divider", "SIGFPE"],
    );
    let mut sink = [0i32; 1];
    assert_fails(
        launch(
            &m,
            "recurse",
            [1, 1, 1],
            [1, 1, 1],
            &[Arg::U64(sink.as_mut_ptr() as u64)],
        ),
        CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
        &["kernel recurse", "overflowed its stack"],
    );
}
