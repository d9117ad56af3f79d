//! [`HostBuffer`]: the host memory behind a CPU tensor, drawn from the CPU's caching allocator.
//!
//! A buffer owns one block ([`Allocation`]) of the process-wide CPU allocator
//! ([`crate::allocator`]`(Device::Cpu)`), so every CPU tensor shows up in
//! `memory_allocated(Device::Cpu)` and a freed buffer goes back to the cache, not to the system
//! (large host buffers then stay page-faulted in, instead of being faulted in again each step).
//! Kernels see `&[T]` / `&mut [T]` and never the allocation behind them.
//!
//! - **Alignment.** Blocks start on 512-byte boundaries (the allocator's block granularity, in
//!   4 KiB- or 2 MiB-aligned segments), more than any element type needs; construction checks it.
//! - **Initialisation.** Every byte of every block is initialised: the host backend zeroes each
//!   segment it reserves, and buffers only ever write whole elements of types for which every
//!   bit pattern is valid. Every constructor writes every element (a copy, a fill or zeros)
//!   except [`HostBuffer::for_overwrite`], whose caller's kernel writes them all instead (a
//!   skipped element would show the stale bytes of the block's last use, never uninitialised
//!   memory; debug builds fill such blocks with a poison value so tests catch the kernel).
//!   Cached blocks keep old bytes, so nothing may rely on fresh memory being zero without
//!   [`HostBuffer::zeroed`].
//! - **Empty buffers** take no block (a dangling, aligned pointer), like PyTorch's null data
//!   pointer for zero-element tensors.
//! - **Ownership.** The buffer is the only owner of its block (like a `Vec`): `Clone` allocates a
//!   new block and copies, so it is `Send`/`Sync` exactly when `T` is.
//! - **Allocation failure.** The `try_` constructors return the allocator's error (its
//!   out-of-memory report); op outputs use them, so an op that cannot get its output block
//!   returns that error. [`HostBuffer::from_vec`] (user data already in a `Vec` of the same
//!   size) and [`HostBuffer::scratch`] (kernel scratch that used to be a `Vec`) keep `Vec`'s
//!   contract instead: on failure they end the process through `handle_alloc_error`. Scratch
//!   sized from user input (conv2d's im2col columns) uses [`HostBuffer::try_scratch`] instead.
//! - **Kernel outputs** are written in place, with no intermediate `Vec` and no copy: a kernel
//!   that writes every element of its output gets an unfilled block
//!   ([`HostBuffer::for_overwrite`]: no fill pass over memory the kernel rewrites anyway); an
//!   accumulating kernel gets its zero start from [`HostBuffer::try_filled_with`] or
//!   [`HostBuffer::scratch`]. What the allocator's statistics do and do not count during an op
//!   is listed in `ops/cpu_dispatch.rs`.

use std::alloc::Layout;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use kiln_alloc_cache::{Allocation, StreamId};

use crate::{Device, Element, Error, Result};

/// A typed, owned, contiguous host buffer in a block of the CPU caching allocator.
pub struct HostBuffer<T: Copy> {
    ptr: NonNull<T>,
    len: usize,
    /// The block behind `ptr`; `None` for an empty buffer.
    block: Option<Allocation>,
    _elements: PhantomData<T>,
}

// SAFETY: the buffer exclusively owns its block (no other handle to the memory exists), exactly
// like `Vec<T>`; moving it to another thread moves `T` values, and `&HostBuffer` only gives `&[T]`.
unsafe impl<T: Copy + Send> Send for HostBuffer<T> {}
// SAFETY: as above; shared access only reads through `&[T]`.
unsafe impl<T: Copy + Sync> Sync for HostBuffer<T> {}

impl<T: Copy> HostBuffer<T> {
    /// An uninitialised buffer of `len` elements; every constructor initialises it fully before
    /// returning it.
    fn allocate(len: usize) -> Result<Self> {
        let Some(bytes) = len.checked_mul(std::mem::size_of::<T>()) else {
            return Err(Error::Alloc(kiln_alloc_cache::Error::InvalidSize {
                requested: usize::MAX,
                reason: "element count times element size overflows; check the shape arithmetic",
            }));
        };
        if bytes == 0 {
            return Ok(HostBuffer {
                ptr: NonNull::dangling(),
                len,
                block: None,
                _elements: PhantomData,
            });
        }
        let block = crate::allocator(Device::Cpu)?.allocate_static(bytes, StreamId::DEFAULT)?;
        let ptr = NonNull::new(block.as_ptr().cast::<T>())
            .filter(|p| p.as_ptr().align_offset(std::mem::align_of::<T>()) == 0)
            .ok_or(Error::Unsupported {
                what: "host allocator returned a null or misaligned block",
            })?;
        Ok(HostBuffer {
            ptr,
            len,
            block: Some(block),
            _elements: PhantomData,
        })
    }

    /// A buffer holding a copy of `data`.
    pub fn try_from_slice(data: &[T]) -> Result<Self> {
        let buf = Self::allocate(data.len())?;
        // SAFETY: the block holds `data.len()` elements and cannot overlap `data` (it is ours).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.ptr.as_ptr(), data.len()) };
        Ok(buf)
    }

    /// A buffer of `len` copies of `value`.
    pub fn filled(len: usize, value: T) -> Result<Self> {
        let buf = Self::allocate(len)?;
        for i in 0..len {
            // SAFETY: `i < len`, inside the block; writing does not read the old bytes.
            unsafe { buf.ptr.as_ptr().add(i).write(value) };
        }
        Ok(buf)
    }

    /// A buffer of `len` copies of `init` that `write` then fills in place: how CPU kernels put
    /// their output straight into an allocator block (one block, no intermediate `Vec`, no
    /// copy). `write` may leave elements untouched; they keep `init`.
    pub fn try_filled_with(len: usize, init: T, write: impl FnOnce(&mut [T])) -> Result<Self> {
        let mut buf = Self::filled(len, init)?;
        write(buf.as_mut_slice());
        Ok(buf)
    }

    /// [`HostBuffer::scratch`] that returns the allocator's error (its out-of-memory report)
    /// instead of ending the process: for scratch whose size follows from user input.
    pub fn try_scratch(len: usize, init: T) -> Result<Self> {
        Self::filled(len, init)
    }

    /// Kernel scratch (im2col columns, partial sums, widened half-precision operands): a buffer
    /// of `len` copies of `init` from the CPU allocator, so that `max_memory_allocated` sees it
    /// while the op runs. Like the `Vec` it replaces, it ends the process through
    /// `handle_alloc_error` when no block can be had.
    pub fn scratch(len: usize, init: T) -> Self {
        Self::filled(len, init).unwrap_or_else(|_| {
            std::alloc::handle_alloc_error(
                Layout::array::<T>(len).unwrap_or_else(|_| Layout::new::<T>()),
            )
        })
    }

    /// A buffer of `len` elements for a kernel that writes every one of them before anything
    /// reads the buffer: no fill pass in release builds (the block keeps its last use's bytes
    /// until the kernel replaces them); debug builds fill it with [`Element::POISON`] first, so
    /// a kernel that skips an element fails its tests.
    pub(crate) fn for_overwrite(len: usize) -> Result<Self>
    where
        T: Element,
    {
        if cfg!(debug_assertions) {
            Self::filled(len, T::POISON)
        } else {
            // Sound: the block's bytes are initialised (see the module doc) and every bit
            // pattern is a valid `T` (every `Element` is a plain number or byte).
            Self::allocate(len)
        }
    }

    /// A buffer of `len` elements whose bytes are all zero.
    ///
    /// # Safety
    /// The all-zero bit pattern must be a valid `T` (true for every kiln element type).
    pub unsafe fn zeroed(len: usize) -> Result<Self> {
        let buf = Self::allocate(len)?;
        // SAFETY: `len` elements fit in the block; the caller vouches for zero being valid.
        unsafe { std::ptr::write_bytes(buf.ptr.as_ptr(), 0, len) };
        Ok(buf)
    }

    /// A buffer holding `data` (copied into a block of the CPU allocator).
    pub fn try_from_vec(data: Vec<T>) -> Result<Self> {
        Self::try_from_slice(&data)
    }

    /// A buffer holding `data` (copied into a block of the CPU allocator). Ends the process
    /// through `handle_alloc_error` when no block can be had, as `Vec` does; use
    /// [`try_from_vec`](Self::try_from_vec) to get the error instead.
    pub fn from_vec(data: Vec<T>) -> Self {
        let len = data.len();
        Self::try_from_vec(data).unwrap_or_else(|_| {
            std::alloc::handle_alloc_error(
                Layout::array::<T>(len).unwrap_or_else(|_| Layout::new::<T>()),
            )
        })
    }

    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `ptr` points at `len` initialised elements (or is dangling with `len` elements
        // of zero total size), owned by `self` for the borrow.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The elements, writable.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the allocator block behind the buffer (the byte size rounded up to the block
    /// granularity; 0 for an empty buffer). This is what the buffer adds to `memory_allocated`.
    pub fn block_size(&self) -> usize {
        self.block.as_ref().map_or(0, Allocation::block_size)
    }

    /// Address of the allocator block behind the buffer (`None` for an empty buffer), as the
    /// allocator's history names it.
    pub fn block_addr(&self) -> Option<u64> {
        self.block.as_ref().map(Allocation::addr)
    }

    /// The elements as a `Vec` (a copy; the block returns to the cache).
    pub fn into_vec(self) -> Vec<T> {
        self.as_slice().to_vec()
    }

    /// A copy in a new block.
    pub fn try_clone(&self) -> Result<Self> {
        Self::try_from_slice(self.as_slice())
    }
}

impl<T: Copy> std::ops::Deref for HostBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T: Copy> std::ops::DerefMut for HostBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.as_mut_slice()
    }
}

impl<T: Copy> Clone for HostBuffer<T> {
    /// A copy in a new block; ends the process like [`HostBuffer::from_vec`] when none can be had.
    fn clone(&self) -> Self {
        self.try_clone().unwrap_or_else(|_| {
            std::alloc::handle_alloc_error(
                Layout::array::<T>(self.len).unwrap_or_else(|_| Layout::new::<T>()),
            )
        })
    }
}

impl<T: Copy + PartialEq> PartialEq for HostBuffer<T> {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl<T: Copy + fmt::Debug> fmt::Debug for HostBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("data", &self.as_slice())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn buffers_are_send_sync_and_aligned_for_every_dtype() {
        assert_send_sync::<HostBuffer<f64>>();
        fn check<T: Copy + PartialEq + fmt::Debug>(v: T) {
            // odd lengths, so consecutive blocks are not trivially aligned by size
            for len in [1, 3, 7, 1001] {
                let b = HostBuffer::filled(len, v).unwrap();
                assert_eq!(
                    b.as_slice().as_ptr() as usize % std::mem::align_of::<T>(),
                    0
                );
                assert_eq!(b.as_slice().as_ptr() as usize % 512, 0);
                assert!(b.as_slice().iter().all(|x| *x == v));
            }
        }
        check(1.5f32);
        check(-2.25f64);
        check(f16::from_f32(3.0));
        check(bf16::from_f32(-1.0));
        check(-7i64);
        check(9u8);
        check(crate::BoolByte(1));
    }

    #[test]
    fn copies_own_their_memory() {
        let a = HostBuffer::from_vec(vec![1i64, 2, 3]);
        let mut b = a.clone();
        b.as_mut_slice()[0] = 10;
        assert_eq!(a.as_slice(), &[1, 2, 3]);
        assert_eq!(b.as_slice(), &[10, 2, 3]);
        assert_ne!(a.as_slice().as_ptr(), b.as_slice().as_ptr());
        assert_eq!(b.clone().into_vec(), vec![10, 2, 3]);
        assert_eq!(a.block_size(), 512);
    }

    #[test]
    fn empty_buffers_take_no_block() {
        let e = HostBuffer::<f32>::from_vec(Vec::new());
        assert!(e.is_empty());
        assert_eq!(e.block_size(), 0);
        assert_eq!(e.as_slice(), &[] as &[f32]);
        assert_eq!(e.clone(), e);
    }

    /// Debug builds (the test suite) hand a kernel's unfilled output over full of the poison
    /// value, so an element the kernel forgets to write shows as NaN (or the integer pattern)
    /// in its tests rather than as a plausible stale number.
    #[cfg(debug_assertions)]
    #[test]
    fn unfilled_outputs_are_poisoned_in_debug_builds() {
        drop(HostBuffer::filled(300, 0.0f32).unwrap());
        let f = HostBuffer::<f32>::for_overwrite(75).unwrap();
        assert!(f.as_slice().iter().all(|x| x.is_nan()));
        let i = HostBuffer::<i64>::for_overwrite(9).unwrap();
        assert!(i.as_slice().iter().all(|&x| x == i64::POISON && x != 0));
        let b = HostBuffer::<crate::BoolByte>::for_overwrite(9).unwrap();
        assert!(b.as_slice().iter().all(|x| x.0 > 1));
        assert!(HostBuffer::<f64>::for_overwrite(0).unwrap().is_empty());
    }

    #[test]
    fn zeroed_is_zero_even_in_a_reused_block() {
        // dirty a block, free it, and get it (or another) back zeroed
        drop(HostBuffer::filled(300, u8::MAX).unwrap());
        // SAFETY: zero is a valid f32.
        let z = unsafe { HostBuffer::<f32>::zeroed(75) }.unwrap();
        assert!(z.as_slice().iter().all(|x| *x == 0.0));
    }
}
