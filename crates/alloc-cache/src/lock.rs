//! The allocator's lock: one atomic compare-exchange to take it, a plain release store to give it
//! back.
//!
//! `std::sync::Mutex` must swap the state atomically on unlock (to learn whether a thread sleeps
//! on it); that locked instruction waits for every store of the critical section to drain and
//! measured as about a third of a cache hit. Here waiters never sleep unannounced: they spin
//! briefly (a hit holds the lock for tens of nanoseconds), then yield, then poll with short
//! sleeps (only a miss that waits on the device holds it longer, and that costs far more than
//! the poll interval). No data can be left half-updated by a panic under the lock (no user code
//! runs there), so there is no poisoning.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A mutual-exclusion lock tuned for very short critical sections.
pub(crate) struct HitLock<T> {
    locked: AtomicBool,
    data: UnsafeCell<T>,
}

// SAFETY: access to `data` is serialised by `locked` (acquire on lock, release on unlock), so
// sharing the lock between threads only moves `T` between them, which `T: Send` allows.
unsafe impl<T: Send> Sync for HitLock<T> {}
// SAFETY: as above; the lock owns its `T`.
unsafe impl<T: Send> Send for HitLock<T> {}

impl<T> HitLock<T> {
    pub fn new(data: T) -> Self {
        Self {
            locked: AtomicBool::new(false),
            data: UnsafeCell::new(data),
        }
    }

    #[inline]
    pub fn lock(&self) -> HitGuard<'_, T> {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        HitGuard { lock: self }
    }

    #[cold]
    fn lock_contended(&self) {
        let mut waits = 0u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                match waits {
                    0..64 => std::hint::spin_loop(),
                    64..96 => std::thread::yield_now(),
                    _ => std::thread::sleep(Duration::from_micros(20)),
                }
                waits = waits.saturating_add(1);
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.data.get_mut()
    }
}

/// Holds the lock; releases it when dropped.
pub(crate) struct HitGuard<'a, T> {
    lock: &'a HitLock<T>,
}

impl<T> Deref for HitGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock, so no other reference to the data exists.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for HitGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock, so no other reference to the data exists.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for HitGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::HitLock;
    use std::sync::Arc;

    #[test]
    fn increments_from_many_threads_are_not_lost() {
        let lock = Arc::new(HitLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = Arc::clone(&lock);
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        *lock.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), 80_000);
    }
}
