//! [`HostBuffer`]: the host memory behind a CPU tensor.
//!
//! Today it owns a `Vec<T>`. It is its own type so that switching CPU storage to blocks from
//! `kiln-alloc-cache` (a host `MemoryBackend` with caching and statistics) changes this file only:
//! kernels see `&[T]` / `&mut [T]` and never the allocation behind them.

/// A typed, owned, contiguous host allocation.
#[derive(Debug, Clone, PartialEq)]
pub struct HostBuffer<T> {
    data: Vec<T>,
}

impl<T> HostBuffer<T> {
    /// Takes ownership of `data`.
    pub fn from_vec(data: Vec<T>) -> Self {
        HostBuffer { data }
    }

    /// The elements.
    pub fn as_slice(&self) -> &[T] {
        &self.data
    }

    /// The elements, writable.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.data
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Gives the elements back as a `Vec`.
    pub fn into_vec(self) -> Vec<T> {
        self.data
    }
}
