//! cuBLAS and NCCL through their exported C functions on real emulated device memory and
//! streams (two devices of 64 MiB): kiln's row-major GEMM call, status codes for bad handles and
//! pointers, beta = 0 over NaN, and collectives on communicators made by `ncclCommInitAll` and by
//! `ncclCommInitRank` from two threads.

mod common;

use std::ffi::{c_void, CStr};

use common::{alloc, bind, setup, stream};
use cudarc::cublas::sys::cublasStatus_t as S;
use cudarc::driver::sys::{CUdeviceptr, CUresult, CUstream};
use cudarc::nccl::sys::{ncclComm_t, ncclResult_t as R, ncclUniqueId};
use half::bf16;
use kiln_cuda_emu::cublas::gemm::*;
use kiln_cuda_emu::cublas::typed::*;
use kiln_cuda_emu::cublas::*;
use kiln_cuda_emu::driver::*;
use kiln_cuda_emu::nccl::ops::*;
use kiln_cuda_emu::nccl::*;

const ENV: &[(&str, &str)] = &[
    ("KILN_EMU_DEVICES", "2"),
    ("KILN_EMU_MEMORY", "64M"),
    ("KILN_EMU_NCCL_TIMEOUT", "1"),
];

fn upload<T: Copy>(data: &[T]) -> CUdeviceptr {
    let bytes = std::mem::size_of_val(data);
    let p = alloc(bytes).unwrap();
    let r = unsafe { cuMemcpyHtoD_v2(p, data.as_ptr().cast(), bytes) };
    assert_eq!(r, CUresult::CUDA_SUCCESS);
    p
}

fn download<T: Copy + Default>(p: CUdeviceptr, len: usize) -> Vec<T> {
    let mut out = vec![T::default(); len];
    let bytes = std::mem::size_of_val(out.as_slice());
    let r = unsafe { cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), p, bytes) };
    assert_eq!(r, CUresult::CUDA_SUCCESS);
    out
}

fn sync(s: CUstream) {
    assert_eq!(unsafe { cuStreamSynchronize(s) }, CUresult::CUDA_SUCCESS);
}

/// Row-major `[m,k] @ [k,n]` as kiln issues it: Cᵀ = Bᵀ·Aᵀ, B first, both op N.
#[allow(clippy::too_many_arguments)]
unsafe fn row_major_gemm(
    h: cudarc::cublas::sys::cublasHandle_t,
    (m, k, n): (i32, i32, i32),
    a: u64,
    b: u64,
    c: u64,
    data: u32,
    alpha: &f32,
    beta: &f32,
) -> S {
    // SAFETY: forwarded from the caller.
    unsafe {
        cublasGemmStridedBatchedEx(
            h,
            0,
            0,
            n,
            m,
            k,
            (alpha as *const f32).cast(),
            b as *const c_void,
            data,
            n,
            0,
            a as *const c_void,
            data,
            k,
            0,
            (beta as *const f32).cast(),
            c as *mut c_void,
            data,
            n,
            (m * n) as i64,
            1,
            68,
            -1,
        )
    }
}

#[test]
fn kilns_row_major_gemm_runs_on_the_stream_with_cublas_status_codes() {
    let _g = setup(ENV);
    bind(0);
    let s = stream(0);
    unsafe {
        let mut h = std::ptr::null_mut();
        assert_eq!(cublasCreate_v2(&mut h), S::CUBLAS_STATUS_SUCCESS);
        assert_eq!(cublasSetStream_v2(h, s.cast()), S::CUBLAS_STATUS_SUCCESS);
        let (m, k, n) = (3usize, 4usize, 2usize);
        let a: Vec<f32> = (0..m * k).map(|i| i as f32 - 5.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32) * 0.5).collect();
        let want: Vec<f32> = (0..m * n)
            .map(|idx| {
                (0..k)
                    .map(|p| a[idx / n * k + p] * b[p * n + idx % n])
                    .sum()
            })
            .collect();
        let (da, db) = (upload(&a), upload(&b));
        let dc = upload(&vec![f32::NAN; m * n]);
        let (one, zero) = (1f32, 0f32);
        let dims = (m as i32, k as i32, n as i32);
        assert_eq!(
            row_major_gemm(h, dims, da, db, dc, 0, &one, &zero),
            S::CUBLAS_STATUS_SUCCESS
        );
        sync(s);
        assert_eq!(download::<f32>(dc, m * n), want, "beta = 0 over NaN C");

        // bf16 in, bf16 out, f32 accumulation.
        let to_bf = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
        let (ha, hb) = (upload(&to_bf(&a)), upload(&to_bf(&b)));
        let hc = alloc(m * n * 2).unwrap();
        assert_eq!(
            row_major_gemm(h, dims, ha, hb, hc, 14, &one, &zero),
            S::CUBLAS_STATUS_SUCCESS
        );
        sync(s);
        let got: Vec<f32> = download::<bf16>(hc, m * n)
            .iter()
            .map(|x| x.to_f32())
            .collect();
        assert_eq!(
            got,
            to_bf(&want).iter().map(|x| x.to_f32()).collect::<Vec<_>>()
        );

        // A host pointer, a buffer too small, a buffer on the other device: INVALID_VALUE.
        let host = a.clone();
        let bad = row_major_gemm(h, dims, host.as_ptr() as u64, db, dc, 0, &one, &zero);
        assert_eq!(bad, S::CUBLAS_STATUS_INVALID_VALUE);
        let small = alloc(8).unwrap();
        assert_eq!(
            row_major_gemm(h, dims, small, db, dc, 0, &one, &zero),
            S::CUBLAS_STATUS_INVALID_VALUE
        );
        bind(1);
        let other = alloc(m * k * 4).unwrap();
        bind(0);
        assert_eq!(
            row_major_gemm(h, dims, other, db, dc, 0, &one, &zero),
            S::CUBLAS_STATUS_INVALID_VALUE
        );
        // Device-side alpha in host pointer mode is refused.
        let dev_one = upload(&[1f32]);
        let dev_alpha = &*(dev_one as *const f32);
        assert_eq!(
            row_major_gemm(h, dims, da, db, dc, 0, dev_alpha, &zero),
            S::CUBLAS_STATUS_INVALID_VALUE
        );
        // ...and used in device pointer mode.
        assert_eq!(cublasSetPointerMode_v2(h, 1), S::CUBLAS_STATUS_SUCCESS);
        let dev_zero = upload(&[0f32]);
        let dz = &*(dev_zero as *const f32);
        assert_eq!(
            row_major_gemm(h, dims, da, db, dc, 0, dev_alpha, dz),
            S::CUBLAS_STATUS_SUCCESS
        );
        sync(s);
        assert_eq!(download::<f32>(dc, m * n), want);
        assert_eq!(cublasSetPointerMode_v2(h, 0), S::CUBLAS_STATUS_SUCCESS);

        // Pointer arrays: two products of the same A with B and with 2·B, into two Cs.
        let b2: Vec<f32> = b.iter().map(|x| 2.0 * x).collect();
        let db2 = upload(&b2);
        let (dc1, dc2) = (alloc(m * n * 4).unwrap(), alloc(m * n * 4).unwrap());
        let a_arr = upload(&[db, db2]);
        let b_arr = upload(&[da, da]);
        let c_arr = upload(&[dc1, dc2]);
        let batched = |a_arr: u64| {
            cublasGemmBatchedEx(
                h,
                0,
                0,
                n as i32,
                m as i32,
                k as i32,
                (&one as *const f32).cast(),
                a_arr as _,
                0,
                n as i32,
                b_arr as _,
                0,
                k as i32,
                (&zero as *const f32).cast(),
                c_arr as _,
                0,
                n as i32,
                2,
                68,
                -1,
            )
        };
        assert_eq!(batched(a_arr), S::CUBLAS_STATUS_SUCCESS);
        sync(s);
        assert_eq!(download::<f32>(dc1, m * n), want);
        let twice: Vec<f32> = want.iter().map(|x| 2.0 * x).collect();
        assert_eq!(download::<f32>(dc2, m * n), twice);
        // A host array of pointers is refused at the call.
        let host_arr = [db, db2];
        assert_eq!(
            batched(host_arr.as_ptr() as u64),
            S::CUBLAS_STATUS_INVALID_VALUE
        );

        let mut got_stream = std::ptr::null_mut();
        assert_eq!(
            cublasGetStream_v2(h, &mut got_stream),
            S::CUBLAS_STATUS_SUCCESS
        );
        assert_eq!(got_stream as usize, s as usize);
        assert_eq!(cublasSetMathMode(h, 3), S::CUBLAS_STATUS_SUCCESS);
        assert_eq!(cublasSetMathMode(h, 7), S::CUBLAS_STATUS_INVALID_VALUE);
        let name = CStr::from_ptr(cublasGetStatusName(7)).to_str().unwrap();
        assert_eq!(name, "CUBLAS_STATUS_INVALID_VALUE");
        assert_eq!(cublasDestroy_v2(h), S::CUBLAS_STATUS_SUCCESS);
        // A destroyed or null handle.
        assert_eq!(
            row_major_gemm(h, dims, da, db, dc, 0, &one, &zero),
            S::CUBLAS_STATUS_NOT_INITIALIZED
        );
        let null = std::ptr::null_mut();
        assert_eq!(
            cublasSgemm_v2(null, 0, 0, 1, 1, 1, &one, da as _, 1, db as _, 1, &zero, dc as _, 1),
            S::CUBLAS_STATUS_NOT_INITIALIZED
        );
        assert_eq!(cublasDestroy_v2(h), S::CUBLAS_STATUS_NOT_INITIALIZED);
    }
}

/// Each device's stream and an f32 buffer holding `rank + 1 + i`.
fn rank_buffers(count: usize) -> Vec<(CUstream, CUdeviceptr)> {
    (0..2)
        .map(|d| {
            bind(d);
            let data: Vec<f32> = (0..count).map(|i| (d as usize + 1 + i) as f32).collect();
            (stream(0), upload(&data))
        })
        .collect()
}

#[test]
fn init_all_communicators_all_reduce_on_their_streams_in_a_group() {
    let _g = setup(ENV);
    unsafe {
        let mut comms: [ncclComm_t; 2] = [std::ptr::null_mut(); 2];
        assert_eq!(
            ncclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()),
            R::ncclSuccess
        );
        let mut v = 0;
        assert_eq!(ncclCommCount(comms[1], &mut v), R::ncclSuccess);
        assert_eq!(v, 2);
        assert_eq!(ncclCommCuDevice(comms[1], &mut v), R::ncclSuccess);
        assert_eq!(v, 1);
        assert_eq!(ncclCommUserRank(comms[1], &mut v), R::ncclSuccess);
        assert_eq!(v, 1);
        let count = 1000;
        let bufs = rank_buffers(count);
        assert_eq!(ncclGroupStart(), R::ncclSuccess);
        for (r, &(s, p)) in bufs.iter().enumerate() {
            let r = ncclAllReduce(p as _, p as _, count, 7, 0, comms[r], s.cast());
            assert_eq!(r, R::ncclSuccess);
        }
        assert_eq!(ncclGroupEnd(), R::ncclSuccess);
        for (d, &(s, p)) in bufs.iter().enumerate() {
            bind(d as i32);
            sync(s);
            let want: Vec<f32> = (0..count).map(|i| (3 + 2 * i) as f32).collect();
            assert_eq!(download::<f32>(p, count), want);
        }
        // A swap in one group: each rank sends its buffer to the other and receives into a
        // second one.
        let others: Vec<CUdeviceptr> = (0..2)
            .map(|d| {
                bind(d);
                alloc(count * 4).unwrap()
            })
            .collect();
        assert_eq!(ncclGroupStart(), R::ncclSuccess);
        for (r, &(s, p)) in bufs.iter().enumerate() {
            let peer = 1 - r as i32;
            assert_eq!(
                ncclSend(p as _, count, 7, peer, comms[r], s.cast()),
                R::ncclSuccess
            );
            assert_eq!(
                ncclRecv(others[r] as _, count, 7, peer, comms[r], s.cast()),
                R::ncclSuccess
            );
        }
        assert_eq!(ncclGroupEnd(), R::ncclSuccess);
        for (d, &(s, p)) in bufs.iter().enumerate() {
            bind(d as i32);
            sync(s);
            assert_eq!(download::<f32>(others[d], count), download::<f32>(p, count));
        }
        assert_eq!(
            ncclSend(bufs[0].1 as _, count, 7, 2, comms[0], bufs[0].0.cast()),
            R::ncclInvalidArgument
        );
        // Bad arguments: a buffer of the other device, a bad root, a bad type, a null comm.
        let (s0, p0) = bufs[0];
        let (_, p1) = bufs[1];
        bind(0);
        assert_eq!(
            ncclAllReduce(p1 as _, p0 as _, count, 7, 0, comms[0], s0.cast()),
            R::ncclInvalidArgument
        );
        assert_eq!(
            ncclBroadcast(p0 as _, p0 as _, count, 7, 2, comms[0], s0.cast()),
            R::ncclInvalidArgument
        );
        assert_eq!(
            ncclAllReduce(p0 as _, p0 as _, count, 42, 0, comms[0], s0.cast()),
            R::ncclInvalidArgument
        );
        assert_eq!(
            ncclAllReduce(p0 as _, p0 as _, count, 7, 9, comms[0], s0.cast()),
            R::ncclInvalidArgument
        );
        assert_eq!(
            ncclAllGather(p0 as _, p0 as _, usize::MAX / 2, 7, comms[0], s0.cast()),
            R::ncclInvalidArgument
        );
        let null = std::ptr::null_mut();
        assert_eq!(
            ncclAllReduce(p0 as _, p0 as _, count, 7, 0, null, s0.cast()),
            R::ncclInvalidArgument
        );
        assert_eq!(ncclGroupEnd(), R::ncclInvalidUsage);
        let mut e = R::ncclInternalError;
        assert_eq!(ncclCommGetAsyncError(comms[0], &mut e), R::ncclSuccess);
        assert_eq!(e, R::ncclSuccess);
        for c in comms {
            assert_eq!(ncclCommDestroy(c), R::ncclSuccess);
        }
        assert_eq!(ncclCommDestroy(comms[0]), R::ncclInvalidArgument);
    }
}

#[test]
fn init_rank_from_two_threads_broadcasts_and_all_gathers() {
    let _g = setup(ENV);
    let mut id = ncclUniqueId { internal: [0; 128] };
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, R::ncclSuccess);
    let id_bytes = id.internal;
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || unsafe {
                bind(rank);
                let mut comm = std::ptr::null_mut();
                let id = ncclUniqueId { internal: id_bytes };
                assert_eq!(ncclCommInitRank(&mut comm, 2, id, rank), R::ncclSuccess);
                let s = stream(0);
                let count = 5;
                let mine: Vec<i64> = (0..count).map(|i| 10 * rank as i64 + i).collect();
                let send = upload(&mine);
                let gathered = alloc(2 * count as usize * 8).unwrap();
                assert_eq!(
                    ncclAllGather(send as _, gathered as _, count as usize, 4, comm, s.cast()),
                    R::ncclSuccess
                );
                assert_eq!(
                    ncclBcast(send as _, count as usize, 4, 1, comm, s.cast()),
                    R::ncclSuccess
                );
                sync(s);
                let all: Vec<i64> = (0..2)
                    .flat_map(|r| (0..count).map(move |i| 10 * r + i))
                    .collect();
                assert_eq!(download::<i64>(gathered, all.len()), all);
                assert_eq!(download::<i64>(send, count as usize), all[count as usize..]);
                assert_eq!(ncclCommAbort(comm), R::ncclSuccess);
            })
        })
        .collect();
    for r in ranks {
        r.join().expect("rank thread panicked");
    }
}

#[test]
fn a_collective_a_peer_never_joins_fails_its_stream_after_the_timeout() {
    let _g = setup(ENV);
    unsafe {
        let mut comms: [ncclComm_t; 2] = [std::ptr::null_mut(); 2];
        assert_eq!(
            ncclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null()),
            R::ncclSuccess
        );
        let bufs = rank_buffers(4);
        let (s0, p0) = bufs[0];
        bind(0);
        let start = std::time::Instant::now();
        assert_eq!(
            ncclAllReduce(p0 as _, p0 as _, 4, 7, 0, comms[0], s0.cast()),
            R::ncclSuccess
        );
        assert_eq!(cuStreamSynchronize(s0), CUresult::CUDA_ERROR_UNKNOWN);
        let took = start.elapsed();
        assert!(
            took >= std::time::Duration::from_millis(900) && took.as_secs() < 10,
            "{took:?}"
        );
        let mut e = R::ncclSuccess;
        assert_eq!(ncclCommGetAsyncError(comms[0], &mut e), R::ncclSuccess);
        assert_eq!(e, R::ncclSystemError);
        let last = CStr::from_ptr(ncclGetLastError(comms[0])).to_str().unwrap();
        assert!(last.contains("timed out") && last.contains("[1]"), "{last}");
        // The failed communicator refuses further work.
        assert_eq!(
            ncclAllReduce(p0 as _, p0 as _, 4, 7, 0, comms[0], s0.cast()),
            R::ncclInvalidUsage
        );
        for c in comms {
            assert_eq!(ncclCommAbort(c), R::ncclSuccess);
        }
    }
}

#[test]
fn init_rank_config_wants_the_initializers_magic() {
    let _g = setup(ENV);
    bind(0);
    unsafe {
        let mut id = ncclUniqueId { internal: [0; 128] };
        assert_eq!(ncclGetUniqueId(&mut id), R::ncclSuccess);
        let mut config: cudarc::nccl::sys::ncclConfig_t = std::mem::zeroed();
        config.size = std::mem::size_of_val(&config);
        let mut comm = std::ptr::null_mut();
        let id2 = ncclUniqueId {
            internal: id.internal,
        };
        assert_eq!(
            ncclCommInitRankConfig(&mut comm, 1, id2, 0, &mut config),
            R::ncclInvalidArgument
        );
        config.magic = 0xcafe_beef;
        config.blocking = 0;
        assert_eq!(
            ncclCommInitRankConfig(&mut comm, 1, id, 0, &mut config),
            R::ncclSuccess
        );
        let mut v = -1;
        assert_eq!(ncclCommCount(comm, &mut v), R::ncclSuccess);
        assert_eq!(v, 1);
        assert_eq!(ncclGetVersion(&mut v), R::ncclSuccess);
        assert_eq!(v, 23000);
        assert_eq!(ncclCommDestroy(comm), R::ncclSuccess);
    }
}
