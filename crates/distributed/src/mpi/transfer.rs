//! The communication thread's side of [`super::MpiGroup`]: each collective as a signature
//! all-gather and then the nonblocking MPI call on copies of the tensors, polled against the
//! deadline.
//!
//! Invariants: a buffer lent to MPI ([`Lent`]) is taken back only after its request completed;
//! on a timeout the request and its buffers are leaked, never freed under MPI; a tensor is
//! written only after its collective completed.

use crate::collective::Op;
use crate::signature::{check_table, Signature};
use crate::{Error, ReduceOp, Result};
use ::mpi::collective::SystemOperation;
use ::mpi::datatype::Equivalence;
use ::mpi::request::{Request, StaticScope};
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;
use kiln_autograd::{DType, Tensor};
use kiln_device::{CpuStorage, Storage};
use std::time::{Duration, Instant};

/// What the communication thread needs to run a job.
pub(super) struct Ctx {
    pub(super) world: SimpleCommunicator,
    pub(super) rank: usize,
    pub(super) world_size: usize,
    pub(super) timeout: Duration,
}

/// A buffer handed to a nonblocking MPI call: owned here, lent to MPI as `'static` and taken
/// back once the call completed (or leaked when it never does).
struct Lent<T: 'static> {
    ptr: *mut [T],
}

impl<T: 'static> Lent<T> {
    fn new(data: Vec<T>) -> Self {
        Lent {
            ptr: Box::into_raw(data.into_boxed_slice()),
        }
    }

    /// The buffer for the MPI call.
    ///
    /// # Safety
    /// At most one reference from `lend` or `lend_mut` is alive, and none once `take` ran.
    unsafe fn lend_mut(&self) -> &'static mut [T] {
        // SAFETY: the box is alive until `take`; the caller keeps one reference at a time.
        unsafe { &mut *self.ptr }
    }

    /// # Safety
    /// As [`Lent::lend_mut`].
    unsafe fn lend(&self) -> &'static [T] {
        // SAFETY: as above.
        unsafe { &*self.ptr }
    }

    /// The buffer back, once MPI is done with it.
    ///
    /// # Safety
    /// The request that used the buffer has completed (so no reference to it is left).
    unsafe fn take(self) -> Vec<T> {
        // SAFETY: `ptr` came from `Box::into_raw` and is taken back once.
        unsafe { Box::from_raw(self.ptr) }.into_vec()
    }
}

/// An element type MPI carries, with typed access to a host buffer.
trait MpiElem: Equivalence + Copy + Default + Send + 'static {
    fn slice(s: &CpuStorage) -> Option<&[Self]>;
    fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;
    fn divide(self, n: usize) -> Self;
}

macro_rules! mpi_elem {
    ($t:ty, $variant:ident, $div:expr) => {
        impl MpiElem for $t {
            fn slice(s: &CpuStorage) -> Option<&[Self]> {
                match s {
                    CpuStorage::$variant(b) => Some(b.as_slice()),
                    _ => None,
                }
            }
            fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
                match s {
                    CpuStorage::$variant(b) => Some(b.as_mut_slice()),
                    _ => None,
                }
            }
            fn divide(self, n: usize) -> Self {
                let div: fn($t, usize) -> $t = $div;
                div(self, n)
            }
        }
    };
}
mpi_elem!(f32, F32, |v, n| v / n as f32);
mpi_elem!(f64, F64, |v, n| v / n as f64);
mpi_elem!(i64, I64, |v, n| v / n as i64);

fn buffer_err(op: &'static str) -> Error {
    Error::InvalidArgument {
        op,
        msg: "the tensor's buffer is not a host buffer of its dtype".into(),
    }
}

/// The tensor's elements, copied out of its buffer.
fn read<T: MpiElem>(op: &'static str, t: &Tensor) -> Result<Vec<T>> {
    let guard = t.storage_read();
    let Storage::Cpu(cpu) = &*guard else {
        return Err(buffer_err(op));
    };
    let all = T::slice(cpu).ok_or_else(|| buffer_err(op))?;
    let start = t.layout().offset();
    all.get(start..start + t.numel())
        .map(<[T]>::to_vec)
        .ok_or_else(|| buffer_err(op))
}

/// Writes `data` over the tensor's elements (a new version of its buffer).
fn write<T: MpiElem>(op: &'static str, t: &Tensor, data: &[T]) -> Result<()> {
    let mut guard = kiln_autograd::no_grad(|| t.storage_write())?;
    let Storage::Cpu(cpu) = &mut *guard else {
        return Err(buffer_err(op));
    };
    let all = T::slice_mut(cpu).ok_or_else(|| buffer_err(op))?;
    let start = t.layout().offset();
    all.get_mut(start..start + data.len())
        .ok_or_else(|| buffer_err(op))?
        .copy_from_slice(data);
    Ok(())
}

fn system_op(op: ReduceOp) -> SystemOperation {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => SystemOperation::sum(),
        ReduceOp::Max => SystemOperation::max(),
    }
}

impl Ctx {
    /// Polls `request` until it completes or the deadline passes.
    fn complete<D: ?Sized>(
        &self,
        op: &'static str,
        request: Request<'static, D, StaticScope>,
        deadline: Instant,
    ) -> Result<()> {
        let mut request = request;
        let mut spins = 0u32;
        loop {
            match request.test() {
                Ok(_) => return Ok(()),
                Err(pending) => request = pending,
            }
            if Instant::now() >= deadline {
                // MPI still owns the buffers: they are leaked with the request.
                std::mem::forget(request);
                return Err(Error::Timeout {
                    rank: self.rank,
                    world_size: self.world_size,
                    op,
                    seconds: self.timeout.as_secs_f64(),
                });
            }
            spins += 1;
            if spins < 2000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    pub(super) fn run(&self, name: &'static str, signature: Signature, op: Op) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        let words = signature.words();
        let send = Lent::new(words.to_vec());
        let recv = Lent::new(vec![0i64; words.len() * self.world_size]);
        // SAFETY: one reference of each; the request is completed before `take` (or both are
        // leaked on a timeout, which returns before `take`).
        let request = unsafe {
            self.world
                .immediate_all_gather_into(StaticScope, send.lend(), recv.lend_mut())
        };
        self.complete(name, request, deadline)?;
        // SAFETY: the request completed.
        let (_, table) = unsafe { (send.take(), recv.take()) };
        // A rank that refused its own arguments reports its own error, the others the table's.
        if let Op::Refused(e) = op {
            return Err(e);
        }
        check_table(self.rank, self.world_size, name, &table)?;
        match op {
            Op::Refused(e) => Err(e),
            Op::Barrier => self.complete(name, self.world.immediate_barrier(), deadline),
            Op::AllReduce(t, op) => match t.dtype() {
                DType::F32 => self.all_reduce::<f32>(name, &t, op, deadline),
                DType::F64 => self.all_reduce::<f64>(name, &t, op, deadline),
                _ => self.all_reduce::<i64>(name, &t, op, deadline),
            },
            Op::Broadcast(t, root) => match t.dtype() {
                DType::F32 => self.broadcast::<f32>(name, &t, root, deadline),
                DType::F64 => self.broadcast::<f64>(name, &t, root, deadline),
                _ => self.broadcast::<i64>(name, &t, root, deadline),
            },
            Op::AllGather(i, o) => match i.dtype() {
                DType::F32 => self.all_gather::<f32>(name, &i, &o, deadline),
                DType::F64 => self.all_gather::<f64>(name, &i, &o, deadline),
                _ => self.all_gather::<i64>(name, &i, &o, deadline),
            },
            Op::ReduceScatter(i, o, op) => match i.dtype() {
                DType::F32 => self.reduce_scatter::<f32>(name, &i, &o, op, deadline),
                DType::F64 => self.reduce_scatter::<f64>(name, &i, &o, op, deadline),
                _ => self.reduce_scatter::<i64>(name, &i, &o, op, deadline),
            },
        }
    }

    fn average<T: MpiElem>(&self, data: &mut [T], op: ReduceOp) {
        if op == ReduceOp::Avg {
            for v in data {
                *v = v.divide(self.world_size);
            }
        }
    }

    fn all_reduce<T: MpiElem>(
        &self,
        name: &'static str,
        t: &Tensor,
        op: ReduceOp,
        deadline: Instant,
    ) -> Result<()> {
        self.reduce_into::<T>(name, (t, t), op, deadline, |send, recv, sys_op| {
            self.world
                .immediate_all_reduce_into(StaticScope, send, recv, sys_op)
        })
    }

    /// The nonblocking reduction `start` issues from `input`'s elements into a buffer of
    /// `output`'s size, completed, averaged for `Avg` and written over `output` (`all_reduce`
    /// passes one tensor as both).
    fn reduce_into<T: MpiElem>(
        &self,
        name: &'static str,
        (input, output): (&Tensor, &Tensor),
        op: ReduceOp,
        deadline: Instant,
        start: impl FnOnce(
            &'static [T],
            &'static mut [T],
            SystemOperation,
        ) -> Request<'static, [T], StaticScope>,
    ) -> Result<()> {
        let send = Lent::new(read::<T>(name, input)?);
        let recv = Lent::new(vec![T::default(); output.numel()]);
        // SAFETY: as in `run`.
        let (send_buf, recv_buf) = unsafe { (send.lend(), recv.lend_mut()) };
        let request = start(send_buf, recv_buf, system_op(op));
        self.complete(name, request, deadline)?;
        // SAFETY: the request completed.
        let mut out = unsafe {
            drop(send.take());
            recv.take()
        };
        self.average(&mut out, op);
        write(name, output, &out)
    }

    fn broadcast<T: MpiElem>(
        &self,
        name: &'static str,
        t: &Tensor,
        root: usize,
        deadline: Instant,
    ) -> Result<()> {
        let buf = Lent::new(read::<T>(name, t)?);
        // SAFETY: as in `run`.
        let request = unsafe {
            self.world
                .process_at_rank(root as i32)
                .immediate_broadcast_into(StaticScope, buf.lend_mut())
        };
        self.complete(name, request, deadline)?;
        // SAFETY: the request completed.
        let out = unsafe { buf.take() };
        if self.rank != root {
            write(name, t, &out)?;
        }
        Ok(())
    }

    fn all_gather<T: MpiElem>(
        &self,
        name: &'static str,
        input: &Tensor,
        output: &Tensor,
        deadline: Instant,
    ) -> Result<()> {
        let mine = read::<T>(name, input)?;
        let total = output.numel();
        let send = Lent::new(mine);
        let recv = Lent::new(vec![T::default(); total]);
        // SAFETY: as in `run`.
        let request = unsafe {
            self.world
                .immediate_all_gather_into(StaticScope, send.lend(), recv.lend_mut())
        };
        self.complete(name, request, deadline)?;
        // SAFETY: the request completed.
        let out = unsafe {
            drop(send.take());
            recv.take()
        };
        write(name, output, &out)
    }

    fn reduce_scatter<T: MpiElem>(
        &self,
        name: &'static str,
        input: &Tensor,
        output: &Tensor,
        op: ReduceOp,
        deadline: Instant,
    ) -> Result<()> {
        self.reduce_into::<T>(name, (input, output), op, deadline, |send, recv, sys_op| {
            self.world
                .immediate_reduce_scatter_block_into(StaticScope, send, recv, sys_op)
        })
    }
}
