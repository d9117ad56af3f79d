//! cudarc itself loads the emulator as `libcuda.so`, `libcublas.so` and `libnccl.so` (symlinks
//! in a temporary directory on `LD_LIBRARY_PATH`, in a child process) and drives cuBLAS and NCCL
//! the way kiln and a data-parallel trainer do: `CudaBlas::new` / `Gemm` / kiln's
//! `gemm_strided_batched_ex` call in bf16, and `Comm::from_devices` / `Comm::from_rank` with
//! all-reduce and all-gather on each device's stream.

mod relaunch;

fn gemm_scenario() {
    use cudarc::cublas::{result, sys, CudaBlas, Gemm, GemmConfig};
    use cudarc::driver::{CudaContext, DevicePtr, DevicePtrMut};
    use half::bf16;
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let blas = CudaBlas::new(stream.clone()).unwrap();
    // Column-major 2×3 · 3×2.
    let a = stream
        .clone_htod(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])
        .unwrap();
    let b = stream
        .clone_htod(&[1.0f32, 0.0, 1.0, 0.0, 1.0, 0.0])
        .unwrap();
    let mut c = stream.clone_htod(&[f32::NAN; 4]).unwrap();
    let cfg = GemmConfig {
        transa: sys::cublasOperation_t::CUBLAS_OP_N,
        transb: sys::cublasOperation_t::CUBLAS_OP_N,
        m: 2,
        n: 2,
        k: 3,
        alpha: 1.0f32,
        lda: 2,
        ldb: 3,
        beta: 0.0,
        ldc: 2,
    };
    unsafe { blas.gemm(cfg, &a, &b, &mut c) }.unwrap();
    assert_eq!(stream.clone_dtoh(&c).unwrap(), [6.0, 8.0, 3.0, 4.0]);

    // kiln's call: bf16 data, f32 compute, strided batch with a broadcast operand.
    // bf16 travels as its bits (cudarc's f16 feature is off).
    let to_bf = |v: &[f32]| {
        v.iter()
            .map(|&x| bf16::from_f32(x).to_bits())
            .collect::<Vec<u16>>()
    };
    let ha = stream.clone_htod(&to_bf(&[1.0, 2.0, 3.0, 4.0])).unwrap();
    let hb = stream.clone_htod(&to_bf(&[1.0, 1.0, 2.0, 2.0])).unwrap();
    let mut hc = stream.alloc_zeros::<u16>(8).unwrap();
    let (one, zero) = (1f32, 0f32);
    {
        let (pa, _ra) = ha.device_ptr(&stream);
        let (pb, _rb) = hb.device_ptr(&stream);
        let (pc, _rc) = hc.device_ptr_mut(&stream);
        let bf = sys::cudaDataType::CUDA_R_16BF;
        unsafe {
            result::gemm_strided_batched_ex(
                *blas.handle(),
                sys::cublasOperation_t::CUBLAS_OP_N,
                sys::cublasOperation_t::CUBLAS_OP_T,
                2,
                2,
                2,
                (&one as *const f32).cast(),
                pa as *const _,
                bf,
                2,
                0,
                pb as *const _,
                bf,
                2,
                0,
                (&zero as *const f32).cast(),
                pc as *mut _,
                bf,
                2,
                4,
                2,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .unwrap();
    }
    let got: Vec<f32> = stream
        .clone_dtoh(&hc)
        .unwrap()
        .iter()
        .map(|&x| bf16::from_bits(x).to_f32())
        .collect();
    // A·Bᵀ with A = [[1,3],[2,4]], B = [[1,2],[1,2]]: [[7,7],[10,10]], column-major, twice.
    assert_eq!(got, [7.0, 10.0, 7.0, 10.0, 7.0, 10.0, 7.0, 10.0]);

    // A bad leading dimension is cuBLAS's INVALID_VALUE.
    let bad = GemmConfig { lda: 1, ..cfg };
    let e = unsafe { blas.gemm(bad, &a, &b, &mut c) }.unwrap_err();
    assert_eq!(e.0, sys::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE);
    drop(blas);
    stream.synchronize().unwrap();
}

fn nccl_scenario() {
    use cudarc::driver::CudaContext;
    use cudarc::nccl::{group_end, group_start, Comm, Id, ReduceOp};
    let streams: Vec<_> = (0..2)
        .map(|d| CudaContext::new(d).unwrap().new_stream().unwrap())
        .collect();
    let comms = Comm::from_devices(streams.clone()).unwrap();
    let sends: Vec<_> = streams
        .iter()
        .enumerate()
        .map(|(r, s)| s.clone_htod(&[r as f32 + 1.0; 5]).unwrap())
        .collect();
    let mut recvs: Vec<_> = streams
        .iter()
        .map(|s| s.alloc_zeros::<f32>(5).unwrap())
        .collect();
    group_start().unwrap();
    for ((comm, send), recv) in comms.iter().zip(&sends).zip(recvs.iter_mut()) {
        comm.all_reduce(send, recv, &ReduceOp::Avg).unwrap();
    }
    group_end().unwrap();
    for (s, recv) in streams.iter().zip(&recvs) {
        assert_eq!(s.clone_dtoh(recv).unwrap(), [1.5; 5]);
    }
    for s in &streams {
        s.synchronize().unwrap();
    }
    drop(comms);

    // One rank per thread, as a trainer with one process per GPU would (here: one process).
    let id = Id::new().unwrap();
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let id = Id::uninit(*id.internal());
            std::thread::spawn(move || {
                let stream = CudaContext::new(r).unwrap().new_stream().unwrap();
                let comm = Comm::from_rank(stream.clone(), r, 2, id).unwrap();
                let send = stream
                    .clone_htod(&[r as i32 * 10, r as i32 * 10 + 1])
                    .unwrap();
                let mut recv = stream.alloc_zeros::<i32>(4).unwrap();
                comm.all_gather(&send, &mut recv).unwrap();
                assert_eq!(stream.clone_dtoh(&recv).unwrap(), [0, 1, 10, 11]);
                stream.synchronize().unwrap();
            })
        })
        .collect();
    for r in ranks {
        r.join().unwrap();
    }
}

#[test]
fn cudarc_drives_the_emulated_cublas_and_nccl() {
    if relaunch::in_child() {
        gemm_scenario();
        nccl_scenario();
        return;
    }
    let out = relaunch::run_child(
        "cudarc_drives_the_emulated_cublas_and_nccl",
        &["cuda", "cublas", "nccl"],
        &[
            ("KILN_EMU_DEVICES", "2"),
            ("KILN_EMU_MEMORY", "64M"),
            ("KILN_EMU_NCCL_TIMEOUT", "20"),
        ],
    );
    let text = relaunch::text(&out);
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "the child did not run the scenario:\n{text}"
    );
}
