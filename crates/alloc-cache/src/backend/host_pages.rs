//! Page mapping for [`HostBackend`](super::HostBackend) on Linux: expandable segments (and page
//! stitching) for host memory.
//!
//! Physical pages are slots of one `memfd` (anonymous shared memory). An address-space
//! reservation is a `PROT_NONE`, `MAP_NORESERVE` anonymous mapping; mapping a page maps one
//! slot of the memfd over it (`mmap(MAP_FIXED | MAP_SHARED)`, read-write); unmapping puts a
//! `PROT_NONE` mapping back and punches the slot out of the file (`fallocate(PUNCH_HOLE)`), so
//! the memory returns to the system; a remap maps the same slot at the new address, so the
//! memory moves without being freed; an alias maps the same slot at a second address too
//! (`aliases`), and is unmapped without punching the slot.
//!
//! Invariants: every mapped page address has exactly one slot and every slot is mapped at one
//! address of `mapped` at most, plus as many alias addresses as `alias_count` says; a slot with
//! aliases is neither unmapped nor moved; a slot is either mapped or in `free_slots` or past the
//! file's end; addresses are multiples of [`HOST_PAGE`].

use super::BackendError;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

/// Page size of host expandable segments: 2 MiB, the transparent-huge-page size.
pub const HOST_PAGE: usize = 2 << 20;

#[derive(Debug, Default)]
struct Slots {
    /// The memfd, created on the first map.
    file: Option<OwnedFd>,
    /// Slots the file has room for.
    file_slots: usize,
    /// Slots below `file_slots` that are not mapped.
    free_slots: Vec<usize>,
    /// Slot of every mapped page, by page address.
    mapped: HashMap<u64, usize>,
    /// Slot of every alias page, by page address.
    aliases: HashMap<u64, usize>,
    /// Alias addresses of each slot that has any.
    alias_count: HashMap<usize, usize>,
}

/// The memfd slots behind mapped host pages.
#[derive(Debug, Default)]
pub(super) struct HostPages {
    slots: Mutex<Slots>,
}

fn os_error(call: &str) -> BackendError {
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::ENOMEM) | Some(libc::ENOSPC) => BackendError::OutOfMemory {
            requested: HOST_PAGE,
            free: 0,
        },
        _ => BackendError::Driver(format!("{call}: {e}")),
    }
}

/// Puts an inaccessible, unbacked mapping over `[addr, addr + bytes)`.
fn protect_none(addr: u64, bytes: usize) -> Result<(), BackendError> {
    // SAFETY: replaces pages of a reservation of ours (the allocator passes only such ranges).
    let got = unsafe {
        libc::mmap(
            addr as usize as *mut libc::c_void,
            bytes,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if got == libc::MAP_FAILED {
        return Err(os_error("mmap(PROT_NONE)"));
    }
    Ok(())
}

fn check(addr: u64, bytes: usize) -> Result<(), BackendError> {
    if bytes == 0 || addr % HOST_PAGE as u64 != 0 || bytes % HOST_PAGE != 0 {
        return Err(BackendError::Driver(format!(
            "host: range {addr:#x}+{bytes} is not a non-empty multiple of the {HOST_PAGE} byte page"
        )));
    }
    Ok(())
}

impl Slots {
    /// A free slot, growing the file when none is left.
    fn take(&mut self) -> Result<usize, BackendError> {
        if let Some(s) = self.free_slots.pop() {
            return Ok(s);
        }
        if self.file.is_none() {
            // SAFETY: a NUL-terminated name; the flags are valid.
            let fd = unsafe { libc::memfd_create(c"kiln-host-pages".as_ptr(), libc::MFD_CLOEXEC) };
            if fd < 0 {
                return Err(os_error("memfd_create"));
            }
            // SAFETY: `fd` is a fresh descriptor we own.
            self.file = Some(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let fd = self.file.as_ref().map_or(-1, |f| f.as_raw_fd());
        let len = (self.file_slots + 1)
            .checked_mul(HOST_PAGE)
            .and_then(|l| libc::off_t::try_from(l).ok())
            .ok_or(BackendError::OutOfMemory {
                requested: HOST_PAGE,
                free: 0,
            })?;
        // SAFETY: `fd` is our memfd.
        if unsafe { libc::ftruncate(fd, len) } != 0 {
            return Err(os_error("ftruncate"));
        }
        self.file_slots += 1;
        Ok(self.file_slots - 1)
    }

    /// Maps slot `slot` read-write at `addr`.
    fn map_slot(&self, addr: u64, slot: usize) -> Result<(), BackendError> {
        let fd = self.file.as_ref().map_or(-1, |f| f.as_raw_fd());
        // SAFETY: replaces one page of a reservation of ours with a page of our memfd.
        let got = unsafe {
            libc::mmap(
                addr as usize as *mut libc::c_void,
                HOST_PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                (slot * HOST_PAGE) as libc::off_t,
            )
        };
        if got == libc::MAP_FAILED {
            return Err(os_error("mmap(memfd)"));
        }
        Ok(())
    }

    /// Gives slot `slot`'s memory back to the system and makes it free.
    fn free(&mut self, slot: usize) {
        let fd = self.file.as_ref().map_or(-1, |f| f.as_raw_fd());
        // SAFETY: `fd` is our memfd; punching a hole only drops the slot's contents.
        unsafe {
            libc::fallocate(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                (slot * HOST_PAGE) as libc::off_t,
                HOST_PAGE as libc::off_t,
            )
        };
        self.free_slots.push(slot);
    }
}

impl HostPages {
    /// Maps the slots behind `[from, from + bytes)` also at `[to, to + bytes)`; on a failure
    /// part-way, the aliases made are unmapped again.
    pub fn map_alias(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        check(from, bytes)?;
        check(to, bytes)?;
        let mut s = self.lock();
        let page = |base: u64, i: usize| base + (i * HOST_PAGE) as u64;
        let pages = bytes / HOST_PAGE;
        let taken = |s: &Slots, a: u64| s.mapped.contains_key(&a) || s.aliases.contains_key(&a);
        if (0..pages).any(|i| !s.mapped.contains_key(&page(from, i)) || taken(&s, page(to, i))) {
            return Err(BackendError::Driver(format!(
                "host: alias {from:#x} -> {to:#x} (+{bytes}) needs mapped source, free target"
            )));
        }
        for i in 0..pages {
            let slot = s.mapped[&page(from, i)];
            if let Err(e) = s.map_slot(page(to, i), slot) {
                drop(s);
                if i > 0 {
                    self.unmap_alias(to, i * HOST_PAGE)?;
                }
                return Err(e);
            }
            s.aliases.insert(page(to, i), slot);
            *s.alias_count.entry(slot).or_insert(0) += 1;
        }
        Ok(())
    }

    /// Unmaps the alias pages of `[addr, addr + bytes)`; their slots stay mapped elsewhere.
    pub fn unmap_alias(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        check(addr, bytes)?;
        let mut s = self.lock();
        for i in 0..bytes / HOST_PAGE {
            let at = addr + (i * HOST_PAGE) as u64;
            let slot = s
                .aliases
                .remove(&at)
                .ok_or_else(|| BackendError::Driver(format!("host: page {at:#x} is no alias")))?;
            protect_none(at, HOST_PAGE)?;
            if let Some(n) = s.alias_count.get_mut(&slot) {
                *n -= 1;
                if *n == 0 {
                    s.alias_count.remove(&slot);
                }
            }
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A `PROT_NONE` reservation of `bytes` aligned to [`HOST_PAGE`].
    pub fn reserve_address_space(&self, bytes: usize) -> Result<u64, BackendError> {
        check(0, bytes)?;
        let span = bytes
            .checked_add(HOST_PAGE)
            .ok_or(BackendError::OutOfMemory {
                requested: bytes,
                free: 0,
            })?;
        // SAFETY: a fresh anonymous mapping chosen by the kernel.
        let got = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if got == libc::MAP_FAILED {
            return Err(os_error("mmap(reserve)"));
        }
        let start = got as usize;
        let aligned = start.next_multiple_of(HOST_PAGE);
        // SAFETY: trims the parts of our fresh mapping outside the aligned range.
        unsafe {
            if aligned > start {
                libc::munmap(got, aligned - start);
            }
            let end = aligned + bytes;
            if start + span > end {
                libc::munmap(end as *mut libc::c_void, start + span - end);
            }
        }
        Ok(aligned as u64)
    }

    /// Releases a reservation (its pages are unmapped already).
    pub fn release_address_space(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        check(addr, bytes)?;
        // SAFETY: the caller passes exactly a reservation of ours.
        if unsafe { libc::munmap(addr as usize as *mut libc::c_void, bytes) } != 0 {
            return Err(os_error("munmap"));
        }
        Ok(())
    }

    /// Maps fresh memory at every page of `[addr, addr + bytes)`; on a failure part-way, what
    /// was mapped is unmapped again.
    pub fn map(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        check(addr, bytes)?;
        let mut s = self.lock();
        let pages = bytes / HOST_PAGE;
        for i in 0..pages {
            let at = addr + (i * HOST_PAGE) as u64;
            let mapped = s.mapped.contains_key(&at);
            let result = if mapped {
                Err(BackendError::Driver(format!(
                    "host: page {at:#x} is mapped"
                )))
            } else {
                s.take().and_then(|slot| match s.map_slot(at, slot) {
                    Ok(()) => {
                        s.mapped.insert(at, slot);
                        Ok(())
                    }
                    Err(e) => {
                        s.free_slots.push(slot);
                        Err(e)
                    }
                })
            };
            if let Err(e) = result {
                drop(s);
                if i > 0 {
                    self.unmap(addr, i * HOST_PAGE)?;
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Unmaps every page of `[addr, addr + bytes)` and frees its memory.
    pub fn unmap(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        check(addr, bytes)?;
        let mut s = self.lock();
        for i in 0..bytes / HOST_PAGE {
            let at = addr + (i * HOST_PAGE) as u64;
            let slot = match s.mapped.get(&at) {
                Some(&slot) if !s.alias_count.contains_key(&slot) => slot,
                _ => {
                    return Err(BackendError::Driver(format!(
                        "host: page {at:#x} is not mapped, or has an alias"
                    )))
                }
            };
            s.mapped.remove(&at);
            protect_none(at, HOST_PAGE)?;
            s.free(slot);
        }
        Ok(())
    }

    /// Moves the memory of every page of `[from, from + bytes)` to `[to, to + bytes)`.
    pub fn remap(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        check(from, bytes)?;
        check(to, bytes)?;
        let mut s = self.lock();
        let pages = bytes / HOST_PAGE;
        let page = |base: u64, i: usize| base + (i * HOST_PAGE) as u64;
        let aliased = |s: &Slots, a: u64| {
            s.mapped
                .get(&a)
                .is_some_and(|x| s.alias_count.contains_key(x))
        };
        if (0..pages).any(|i| !s.mapped.contains_key(&page(from, i)) || aliased(&s, page(from, i)))
            || (0..pages).any(|i| {
                s.mapped.contains_key(&page(to, i)) || s.aliases.contains_key(&page(to, i))
            })
        {
            return Err(BackendError::Driver(format!(
                "host: remap {from:#x} -> {to:#x} (+{bytes}) needs mapped, unaliased source and unmapped target"
            )));
        }
        for i in 0..pages {
            let slot = s.mapped[&page(from, i)];
            s.map_slot(page(to, i), slot)?;
            protect_none(page(from, i), HOST_PAGE)?;
            s.mapped.remove(&page(from, i));
            s.mapped.insert(page(to, i), slot);
        }
        Ok(())
    }
}
