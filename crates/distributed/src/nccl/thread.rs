//! The NCCL communication thread: runs each job's signature all-gather (polled against the
//! deadline), then its collective on the dedicated stream after the caller's start event, and
//! answers with the completion event.
//!
//! Invariants: every NCCL call of the group is made here, in job order; the thread has the
//! device's context bound; a job answers exactly once; after an abort every job fails at once.

use super::comm::Comm;
use crate::collective::Op;
use crate::signature::{check_table, Signature};
use crate::{Error, ReduceOp, Result};
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr};
use cudarc::nccl::{result as nccl, sys};
use kiln_autograd::{DType, Tensor};
use kiln_device::Storage;
use std::ffi::c_void;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// One started collective, as the thread receives it.
pub(crate) struct Job {
    pub(crate) name: &'static str,
    pub(crate) signature: Signature,
    pub(crate) op: Op,
    /// Recorded on the compute stream when the work was started.
    pub(crate) ready: CudaEvent,
    pub(crate) done: mpsc::Sender<Result<CudaEvent>>,
}

/// The thread's state.
pub(crate) struct Worker {
    rank: usize,
    world_size: usize,
    comm: Arc<Comm>,
    stream: Arc<CudaStream>,
    timeout: Duration,
    sig_send: CudaSlice<i64>,
    sig_recv: CudaSlice<i64>,
    barrier: CudaSlice<f32>,
}

fn nccl_dtype(d: DType) -> sys::ncclDataType_t {
    match d {
        DType::F64 => sys::ncclDataType_t::ncclFloat64,
        DType::I64 => sys::ncclDataType_t::ncclInt64,
        DType::F16 => sys::ncclDataType_t::ncclFloat16,
        DType::BF16 => sys::ncclDataType_t::ncclBfloat16,
        _ => sys::ncclDataType_t::ncclFloat32,
    }
}

fn nccl_op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
    }
}

impl Worker {
    pub(crate) fn new(
        rank: usize,
        world_size: usize,
        comm: Arc<Comm>,
        stream: Arc<CudaStream>,
        timeout: Duration,
    ) -> Result<Self> {
        let cuda = |e: cudarc::driver::DriverError| {
            Error::Unavailable(format!("allocating the NCCL signature buffers: {e}"))
        };
        let words = Signature::WORDS;
        let table = words
            .checked_mul(world_size)
            .ok_or_else(|| Error::Unavailable("world size overflows".into()))?;
        Ok(Worker {
            rank,
            world_size,
            sig_send: stream.alloc_zeros::<i64>(words).map_err(cuda)?,
            sig_recv: stream.alloc_zeros::<i64>(table).map_err(cuda)?,
            barrier: stream.alloc_zeros::<f32>(1).map_err(cuda)?,
            comm,
            stream,
            timeout,
        })
    }

    pub(crate) fn serve(mut self, jobs: mpsc::Receiver<Job>) {
        if let Err(e) = self.stream.context().bind_to_thread() {
            for job in jobs {
                let _ = job
                    .done
                    .send(Err(self.err(job.name, format!("CUDA context: {e}"))));
            }
            return;
        }
        for job in jobs {
            let Job {
                name,
                signature,
                op,
                ready,
                done,
            } = job;
            let result = if self.comm.is_aborted() {
                Err(self.err(
                    name,
                    "not run: the communicator was aborted after an earlier failure; stop this \
                     process"
                        .into(),
                ))
            } else {
                self.run(name, signature, op, &ready)
            };
            let _ = done.send(result);
        }
    }

    fn err(&self, op: &'static str, msg: String) -> Error {
        Error::Collective {
            rank: self.rank,
            world_size: self.world_size,
            op,
            msg,
        }
    }

    fn stream_ptr(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }

    /// Turns an NCCL result into this crate's error (aborting on failure).
    fn check(
        &self,
        op: &'static str,
        r: std::result::Result<nccl::NcclStatus, nccl::NcclError>,
    ) -> Result<()> {
        r.map(|_| ()).map_err(|e| {
            self.comm.abort();
            self.err(op, format!("NCCL returned {:?}", e.0))
        })
    }

    fn record(&self, op: &'static str) -> Result<CudaEvent> {
        self.stream
            .record_event(None)
            .map_err(|e| self.err(op, format!("recording an event: {e}")))
    }

    fn exchange(
        &mut self,
        op: &'static str,
        sig: &Signature,
        deadline: Instant,
    ) -> Result<Vec<i64>> {
        let words = sig.words();
        self.stream
            .memcpy_htod(&words[..], &mut self.sig_send)
            .map_err(|e| self.err(op, format!("copying the signature: {e}")))?;
        {
            let (send, _s) = self.sig_send.device_ptr(&self.stream);
            let (recv, _r) = self.sig_recv.device_ptr(&self.stream);
            // SAFETY: both buffers live on this device, sized WORDS and WORDS * world_size.
            let r = unsafe {
                nccl::all_gather(
                    send as *const c_void,
                    recv as *mut c_void,
                    Signature::WORDS,
                    sys::ncclDataType_t::ncclInt64,
                    self.comm.raw,
                    self.stream_ptr(),
                )
            };
            self.check(op, r)?;
        }
        let event = self.record(op)?;
        let who = (self.rank, self.world_size, op);
        let poll = Duration::from_micros(50);
        self.comm
            .await_event(who, &event, (deadline, self.timeout), poll)?;
        self.stream
            .clone_dtoh(&self.sig_recv)
            .map_err(|e| self.err(op, format!("reading the signatures: {e}")))
    }

    fn run(
        &mut self,
        name: &'static str,
        sig: Signature,
        op: Op,
        ready: &CudaEvent,
    ) -> Result<CudaEvent> {
        let deadline = Instant::now() + self.timeout;
        let table = self.exchange(name, &sig, deadline)?;
        if let Op::Refused(e) = op {
            return Err(e);
        }
        check_table(self.rank, self.world_size, name, &table)?;
        self.stream
            .wait(ready)
            .map_err(|e| self.err(name, format!("waiting for the compute stream: {e}")))?;
        let comm = self.comm.raw;
        let s = self.stream_ptr();
        // SAFETY (every call below): the pointers are the device addresses of live contiguous
        // tensors on this device (kept alive by the work) with the element counts checked
        // against the signature; the stream belongs to the communicator's device.
        let r = match &op {
            Op::AllReduce(t, rop) => {
                let p = address(name, t)?;
                unsafe {
                    nccl::all_reduce(
                        p as *const c_void,
                        p as *mut c_void,
                        t.numel(),
                        nccl_dtype(t.dtype()),
                        nccl_op(*rop),
                        comm,
                        s,
                    )
                }
            }
            Op::Broadcast(t, root) => {
                let p = address(name, t)?;
                unsafe {
                    nccl::broadcast(
                        p as *const c_void,
                        p as *mut c_void,
                        t.numel(),
                        nccl_dtype(t.dtype()),
                        *root as i32,
                        comm,
                        s,
                    )
                }
            }
            Op::AllGather(i, o) => {
                let (pi, po) = (address(name, i)?, address(name, o)?);
                unsafe {
                    nccl::all_gather(
                        pi as *const c_void,
                        po as *mut c_void,
                        i.numel(),
                        nccl_dtype(i.dtype()),
                        comm,
                        s,
                    )
                }
            }
            Op::ReduceScatter(i, o, rop) => {
                let (pi, po) = (address(name, i)?, address(name, o)?);
                unsafe {
                    nccl::reduce_scatter(
                        pi as *const c_void,
                        po as *mut c_void,
                        o.numel(),
                        nccl_dtype(i.dtype()),
                        nccl_op(*rop),
                        comm,
                        s,
                    )
                }
            }
            Op::Barrier => {
                let (p, _g) = self.barrier.device_ptr(&self.stream);
                unsafe {
                    nccl::all_reduce(
                        p as *const c_void,
                        p as *mut c_void,
                        1,
                        sys::ncclDataType_t::ncclFloat32,
                        sys::ncclRedOp_t::ncclSum,
                        comm,
                        s,
                    )
                }
            }
            Op::Refused(_) => unreachable!("returned above"),
        };
        self.check(name, r)?;
        if let Op::AllReduce(t, _)
        | Op::Broadcast(t, _)
        | Op::AllGather(_, t)
        | Op::ReduceScatter(_, t, _) = &op
        {
            bump_version(t)?;
        }
        self.record(name)
    }
}

/// The device address of a CUDA tensor's first element.
fn address(op: &'static str, t: &Tensor) -> Result<u64> {
    match &*t.storage_read() {
        Storage::Cuda(c) => {
            c.device_address(t.layout().offset())
                .map_err(|e| Error::InvalidArgument {
                    op,
                    msg: e.to_string(),
                })
        }
        _ => Err(Error::InvalidArgument {
            op,
            msg: "the tensor's buffer is not on a CUDA device".into(),
        }),
    }
}

/// Marks the tensor's buffer as written (its version counter), as every in-place op does.
fn bump_version(t: &Tensor) -> Result<()> {
    Ok(kiln_autograd::no_grad(|| t.storage_write().map(drop))?)
}
