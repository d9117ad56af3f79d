//! Page mapping for [`HostBackend`](super::HostBackend) on Linux: expandable segments (and page
//! stitching) for host memory.
//!
//! Physical pages are slots of one `memfd` (anonymous shared memory), each `page` bytes. An
//! address-space reservation is a `PROT_NONE`, `MAP_NORESERVE` anonymous mapping; mapping pages
//! maps slots of the memfd over them (`mmap(MAP_FIXED | MAP_SHARED)`, read-write); unmapping
//! puts a `PROT_NONE` mapping back and punches the slots out of the file
//! (`fallocate(PUNCH_HOLE)`), so the memory returns to the system; a remap maps the same slots
//! at the new address, so the memory moves without being freed; an alias maps the same slots at
//! a second address too (`aliases`), and is unmapped without punching them.
//!
//! Each call is one system call per run of consecutive slots at consecutive addresses (the
//! kernel then also keeps such a run as one mapping), and free slots are reused lowest first,
//! so a range mapped at once gets consecutive slots wherever the free ones allow.
//!
//! Invariants: every mapped page address has exactly one slot and every slot is mapped at one
//! address of `mapped` at most, plus as many alias addresses as `alias_count` says; a slot with
//! aliases is neither unmapped nor moved; a slot is either mapped or in `free_slots` or past the
//! file's end; addresses and lengths are multiples of `page`; a call that fails leaves every
//! page as it was; a `lost` page (unmapped at the kernel's limit on mappings, then found taken
//! by another mapping) is neither mapped nor an alias, is never mapped again, and is not
//! unmapped when its reservation is released.

use super::BackendError;
use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

#[derive(Debug)]
struct Slots {
    /// Bytes per page (and per slot).
    page: usize,
    /// The memfd, created on the first map.
    file: Option<OwnedFd>,
    /// Slots the file has room for.
    file_slots: usize,
    /// Slots below `file_slots` that are not mapped.
    free_slots: BTreeSet<usize>,
    /// Slot of every mapped page, by page address.
    mapped: HashMap<u64, usize>,
    /// Slot of every alias page, by page address.
    aliases: HashMap<u64, usize>,
    /// Alias addresses of each slot that has any.
    alias_count: HashMap<usize, usize>,
    /// Page addresses of reservations that another mapping may hold now (`protect_none`).
    lost: BTreeSet<u64>,
}

/// The memfd slots behind mapped host pages.
#[derive(Debug)]
pub(super) struct HostPages {
    slots: Mutex<Slots>,
}

fn os_error(call: &str, bytes: usize) -> BackendError {
    os_error_from(std::io::Error::last_os_error(), call, bytes)
}

/// [`os_error`] for an error already taken from `errno`.
fn os_error_from(e: std::io::Error, call: &str, bytes: usize) -> BackendError {
    if e.raw_os_error() == Some(libc::ENOMEM) && call.starts_with("mmap") {
        if let Some((count, limit)) = mapping_count_at_limit() {
            return BackendError::Driver(format!(
                "{call}: the process holds {count} memory mappings, the kernel's limit \
                 (vm.max_map_count = {limit}); use larger host pages (KILN_ALLOC_CONF=\
                 host_page_kb:2048) or raise the limit (sysctl -w vm.max_map_count={})",
                limit.saturating_mul(4)
            ));
        }
    }
    match e.raw_os_error() {
        Some(libc::ENOMEM) | Some(libc::ENOSPC) => BackendError::OutOfMemory {
            requested: bytes,
            free: 0,
        },
        _ => BackendError::Driver(format!("{call}: {e}")),
    }
}

/// The process's count of memory mappings and the kernel's limit on it, when the count is
/// within a few mappings of the limit (a failed `mmap` then failed for that reason, not for
/// lack of memory). Reads through a buffer on the stack: at the limit, a heap allocation large
/// enough to need a mapping of its own would fail too.
fn mapping_count_at_limit() -> Option<(usize, usize)> {
    use std::io::Read;
    let mut buf = [0u8; 8192];
    let mut limit_file = std::fs::File::open("/proc/sys/vm/max_map_count").ok()?;
    let n = limit_file.read(&mut buf).ok()?;
    let limit: usize = std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()?;
    let mut maps = std::fs::File::open("/proc/self/maps").ok()?;
    let mut count = 0;
    loop {
        match maps.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => count += buf[..n].iter().filter(|&&b| b == b'\n').count(),
            Err(_) => return None,
        }
    }
    (count.saturating_add(8) >= limit).then_some((count, limit))
}

/// An inaccessible, unbacked mapping at `[addr, addr + bytes)`: over what is there
/// (`MAP_FIXED`), or (`replace` false) only where nothing is. Whether it is there.
fn reserve_at(addr: u64, bytes: usize, replace: bool) -> bool {
    let fixed = if replace {
        libc::MAP_FIXED
    } else {
        libc::MAP_FIXED_NOREPLACE
    };
    // SAFETY: over pages of a reservation of ours (the allocator passes only such ranges), or
    // where nothing is mapped.
    let got = unsafe {
        libc::mmap(
            addr as usize as *mut libc::c_void,
            bytes,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | fixed,
            -1,
            0,
        )
    };
    if got != libc::MAP_FAILED && got as usize as u64 != addr {
        // A kernel older than `MAP_FIXED_NOREPLACE` took the address as a hint.
        // SAFETY: the mapping just made, elsewhere.
        unsafe { libc::munmap(got, bytes) };
        return false;
    }
    got != libc::MAP_FAILED
}

/// The runs of consecutive slots in `slots` (in order), as (index of the first, length).
fn slot_runs(slots: &[usize]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= slots.len() {
            return None;
        }
        let start = i;
        i += 1;
        while i < slots.len() && slots[i] == slots[i - 1] + 1 {
            i += 1;
        }
        Some((start, i - start))
    })
}

impl Slots {
    /// Puts an inaccessible, unbacked mapping over `[addr, addr + bytes)`. At the kernel's
    /// limit on mappings an `mmap` is refused even where it would merge mappings and lower
    /// their count: then the range is unmapped (no split, when it is whole mappings, as a
    /// mapped run is) and reserved again, without replacing what another thread may have
    /// mapped there in between; such pages are `lost` (refused from then on) and the call
    /// still succeeds, the memory being unmapped either way.
    fn protect_none(&mut self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        if reserve_at(addr, bytes, true) {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        // SAFETY: pages of a reservation of ours, given back and reserved again below.
        if e.raw_os_error() != Some(libc::ENOMEM)
            || unsafe { libc::munmap(addr as usize as *mut libc::c_void, bytes) } != 0
        {
            return Err(os_error_from(e, "mmap(PROT_NONE)", bytes));
        }
        if !reserve_at(addr, bytes, false) {
            let pages = (addr..addr + bytes as u64).step_by(self.page);
            self.lost.extend(pages);
        }
        Ok(())
    }

    fn check(&self, addr: u64, bytes: usize) -> Result<usize, BackendError> {
        let page = self.page;
        if bytes == 0 || !addr.is_multiple_of(page as u64) || !bytes.is_multiple_of(page) {
            return Err(BackendError::Driver(format!(
                "host: range {addr:#x}+{bytes} is not a non-empty multiple of the {page} byte page"
            )));
        }
        Ok(bytes / page)
    }

    fn page_at(&self, base: u64, i: usize) -> u64 {
        base + (i * self.page) as u64
    }

    fn fd(&self) -> i32 {
        self.file.as_ref().map_or(-1, |f| f.as_raw_fd())
    }

    /// `n` free slots, lowest first, growing the file (once) by those missing.
    fn take(&mut self, n: usize) -> Result<Vec<usize>, BackendError> {
        let oom = BackendError::OutOfMemory {
            requested: n.saturating_mul(self.page),
            free: 0,
        };
        let mut slots: Vec<usize> = Vec::with_capacity(n);
        while slots.len() < n {
            match self.free_slots.pop_first() {
                Some(s) => slots.push(s),
                None => break,
            }
        }
        let grow = n - slots.len();
        if grow == 0 {
            return Ok(slots);
        }
        if self.file.is_none() {
            // SAFETY: a NUL-terminated name; the flags are valid.
            let fd = unsafe { libc::memfd_create(c"kiln-host-pages".as_ptr(), libc::MFD_CLOEXEC) };
            if fd < 0 {
                self.free_slots.extend(slots);
                return Err(os_error("memfd_create", self.page));
            }
            // SAFETY: `fd` is a fresh descriptor we own.
            self.file = Some(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let len = self
            .file_slots
            .checked_add(grow)
            .and_then(|s| s.checked_mul(self.page))
            .and_then(|l| libc::off_t::try_from(l).ok());
        // SAFETY: `fd` is our memfd.
        if len.is_none_or(|len| unsafe { libc::ftruncate(self.fd(), len) } != 0) {
            let e = if len.is_none() {
                oom
            } else {
                os_error("ftruncate", grow * self.page)
            };
            self.free_slots.extend(slots);
            return Err(e);
        }
        // Every free slot is below `file_slots`, so the slots stay in ascending order.
        slots.extend(self.file_slots..self.file_slots + grow);
        self.file_slots += grow;
        Ok(slots)
    }

    /// Maps `slots[i]` read-write at page `i` from `addr`, one call per run of consecutive
    /// slots; on a failure, the whole range is made inaccessible again.
    fn map_slots(&mut self, addr: u64, slots: &[usize]) -> Result<(), BackendError> {
        for (i, n) in slot_runs(slots) {
            let at = self.page_at(addr, i);
            // SAFETY: replaces pages of a reservation of ours with pages of our memfd.
            let got = unsafe {
                libc::mmap(
                    at as usize as *mut libc::c_void,
                    n * self.page,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    self.fd(),
                    (slots[i] * self.page) as libc::off_t,
                )
            };
            if got == libc::MAP_FAILED {
                let e = os_error("mmap(memfd)", n * self.page);
                self.protect_none(addr, slots.len() * self.page)?;
                return Err(e);
            }
        }
        Ok(())
    }

    /// Gives the memory of `slots` back to the system and makes them free.
    fn free(&mut self, slots: &[usize]) {
        let mut sorted = slots.to_vec();
        sorted.sort_unstable();
        for (i, n) in slot_runs(&sorted) {
            // SAFETY: `fd` is our memfd; punching a hole only drops the slots' contents.
            unsafe {
                libc::fallocate(
                    self.fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    (sorted[i] * self.page) as libc::off_t,
                    (n * self.page) as libc::off_t,
                )
            };
        }
        self.free_slots.extend(sorted);
    }

    /// The slots mapped at the `pages` pages from `addr`, or an error naming `what` is wrong
    /// when one is not mapped, or (with `unaliased`) has an alias.
    fn mapped_slots(
        &self,
        addr: u64,
        pages: usize,
        unaliased: bool,
        what: &str,
    ) -> Result<Vec<usize>, BackendError> {
        (0..pages)
            .map(|i| {
                let at = self.page_at(addr, i);
                match self.mapped.get(&at) {
                    Some(&slot) if !(unaliased && self.alias_count.contains_key(&slot)) => Ok(slot),
                    _ => Err(BackendError::Driver(format!(
                        "host: {what}: page {at:#x} is not mapped, or has an alias"
                    ))),
                }
            })
            .collect()
    }

    /// An error unless all `pages` pages from `addr` are neither mapped nor aliases.
    fn check_vacant(&self, addr: u64, pages: usize, what: &str) -> Result<(), BackendError> {
        let lost = (0..pages)
            .map(|i| self.page_at(addr, i))
            .find(|a| self.lost.contains(a));
        if let Some(at) = lost {
            return Err(BackendError::Driver(format!(
                "host: {what}: page {at:#x} was unmapped at the kernel's limit on mappings and \
                 may belong to another mapping now; free this segment and raise the limit \
                 (sysctl -w vm.max_map_count=...) or use larger host pages (host_page_kb)"
            )));
        }
        match (0..pages)
            .map(|i| self.page_at(addr, i))
            .find(|a| self.mapped.contains_key(a) || self.aliases.contains_key(a))
        {
            Some(at) => Err(BackendError::Driver(format!(
                "host: {what}: page {at:#x} is mapped already"
            ))),
            None => Ok(()),
        }
    }
}

impl HostPages {
    /// Page mapping with pages of `page` bytes (checked by the caller: a power of two, a
    /// multiple of the system page, at most `MAX_HOST_PAGE`).
    pub fn new(page: usize) -> Self {
        Self {
            slots: Mutex::new(Slots {
                page,
                file: None,
                file_slots: 0,
                free_slots: BTreeSet::new(),
                mapped: HashMap::new(),
                aliases: HashMap::new(),
                alias_count: HashMap::new(),
                lost: BTreeSet::new(),
            }),
        }
    }

    /// Bytes per page.
    pub fn page(&self) -> usize {
        self.lock().page
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Maps the slots behind `[from, from + bytes)` also at `[to, to + bytes)`.
    pub fn map_alias(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        let mut s = self.lock();
        let pages = s.check(from, bytes)?;
        s.check(to, bytes)?;
        let slots = s.mapped_slots(from, pages, false, "alias source")?;
        s.check_vacant(to, pages, "alias target")?;
        s.map_slots(to, &slots)?;
        for (i, slot) in slots.into_iter().enumerate() {
            let at = s.page_at(to, i);
            s.aliases.insert(at, slot);
            *s.alias_count.entry(slot).or_insert(0) += 1;
        }
        Ok(())
    }

    /// Unmaps the alias pages of `[addr, addr + bytes)`; their slots stay mapped elsewhere.
    pub fn unmap_alias(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let mut s = self.lock();
        let pages = s.check(addr, bytes)?;
        if let Some(at) = (0..pages)
            .map(|i| s.page_at(addr, i))
            .find(|a| !s.aliases.contains_key(a))
        {
            return Err(BackendError::Driver(format!(
                "host: page {at:#x} is no alias"
            )));
        }
        s.protect_none(addr, bytes)?;
        for i in 0..pages {
            let at = s.page_at(addr, i);
            if let Some(slot) = s.aliases.remove(&at) {
                if let Some(n) = s.alias_count.get_mut(&slot) {
                    *n -= 1;
                    if *n == 0 {
                        s.alias_count.remove(&slot);
                    }
                }
            }
        }
        Ok(())
    }

    /// A `PROT_NONE` reservation of `bytes` aligned to the page.
    pub fn reserve_address_space(&self, bytes: usize) -> Result<u64, BackendError> {
        let page = {
            let s = self.lock();
            s.check(0, bytes)?;
            s.page
        };
        let span = bytes.checked_add(page).ok_or(BackendError::OutOfMemory {
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
            return Err(os_error("mmap(reserve)", bytes));
        }
        let start = got as usize;
        let aligned = start.next_multiple_of(page);
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
        let mut s = self.lock();
        s.check(addr, bytes)?;
        let end = addr + bytes as u64;
        let lost: Vec<u64> = s.lost.range(addr..end).copied().collect();
        // The pieces between lost pages (another mapping's, perhaps), each unmapped.
        let mut cursor = addr;
        for at in lost.iter().copied().chain([end]) {
            let len = (at - cursor) as usize;
            // SAFETY: the caller passes a reservation of ours; lost pages are left alone.
            if len > 0 && unsafe { libc::munmap(cursor as usize as *mut libc::c_void, len) } != 0 {
                return Err(os_error("munmap", len));
            }
            cursor = at + s.page as u64;
        }
        for at in lost {
            s.lost.remove(&at);
        }
        Ok(())
    }

    /// Maps fresh memory at every page of `[addr, addr + bytes)`.
    pub fn map(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let mut s = self.lock();
        let pages = s.check(addr, bytes)?;
        s.check_vacant(addr, pages, "map")?;
        let slots = s.take(pages)?;
        if let Err(e) = s.map_slots(addr, &slots) {
            s.free(&slots);
            return Err(e);
        }
        for (i, slot) in slots.into_iter().enumerate() {
            let at = s.page_at(addr, i);
            s.mapped.insert(at, slot);
        }
        Ok(())
    }

    /// Unmaps every page of `[addr, addr + bytes)` and frees its memory.
    pub fn unmap(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let mut s = self.lock();
        let pages = s.check(addr, bytes)?;
        let slots = s.mapped_slots(addr, pages, true, "unmap")?;
        s.protect_none(addr, bytes)?;
        for i in 0..pages {
            let at = s.page_at(addr, i);
            s.mapped.remove(&at);
        }
        s.free(&slots);
        Ok(())
    }

    /// Moves the memory of every page of `[from, from + bytes)` to `[to, to + bytes)`.
    pub fn remap(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        let mut s = self.lock();
        let pages = s.check(from, bytes)?;
        s.check(to, bytes)?;
        let slots = s.mapped_slots(from, pages, true, "remap source")?;
        s.check_vacant(to, pages, "remap target")?;
        s.map_slots(to, &slots)?;
        if let Err(e) = s.protect_none(from, bytes) {
            // The memory stays where it was; the second mapping goes.
            s.protect_none(to, bytes)?;
            return Err(e);
        }
        for (i, slot) in slots.into_iter().enumerate() {
            let (old, new) = (s.page_at(from, i), s.page_at(to, i));
            s.mapped.remove(&old);
            s.mapped.insert(new, slot);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{slot_runs, HostPages};

    /// Whether `[addr, addr + bytes)` is mapped at all (`mincore` fails with `ENOMEM` where not).
    fn is_mapped(addr: u64, bytes: usize) -> bool {
        let mut residency = vec![0u8; bytes.div_ceil(4096)];
        // SAFETY: only asks the kernel about the range; `residency` has a byte per page.
        unsafe {
            libc::mincore(
                addr as usize as *mut libc::c_void,
                bytes,
                residency.as_mut_ptr(),
            ) == 0
        }
    }

    /// A page lost at the mapping limit (another mapping took it between unmapping and
    /// reserving it again, `Slots::protect_none`) is refused from then on, and releasing its
    /// reservation leaves that other mapping alone.
    #[test]
    fn a_lost_page_is_refused_and_left_to_its_new_owner() {
        let page = 4096;
        let pages = HostPages::new(page);
        let base = pages.reserve_address_space(4 * page).unwrap();
        pages.map(base, page).unwrap();
        let lost = base + page as u64;
        // Another mapping takes page 1, as another thread's mmap could between unmapping it
        // and reserving it again (made here in one step, so no other test's mapping can land
        // in between).
        // SAFETY: replaces a page of our own reservation with a mapping of our own.
        let other = unsafe {
            libc::mmap(
                lost as usize as *mut libc::c_void,
                page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        assert_eq!(other as usize as u64, lost);
        // SAFETY: the page just mapped read-write.
        unsafe { *(other as *mut u8) = 0x5a };
        pages.lock().lost.insert(lost);
        for e in [
            pages.map(lost, page).unwrap_err(),
            pages.remap(base, lost, page).unwrap_err(),
            pages.map_alias(base, lost, page).unwrap_err(),
        ] {
            assert!(e.to_string().contains("limit on mappings"), "{e}");
        }
        pages.unmap(base, page).unwrap();
        pages.release_address_space(base, 4 * page).unwrap();
        // The released pages around it may hold other tests' mappings at once, so only the
        // lost page is checked: still mapped, and still the other mapping's.
        assert!(is_mapped(lost, page), "the other mapping was unmapped");
        // SAFETY: checked mapped just above; no one else maps over it.
        assert_eq!(unsafe { *(other as *const u8) }, 0x5a);
        assert!(pages.lock().lost.is_empty());
        // SAFETY: the mapping made above.
        assert_eq!(unsafe { libc::munmap(other, page) }, 0);
    }

    /// One `mmap` per run of consecutive slots: runs split where the next slot is not one more.
    #[test]
    fn runs_are_the_consecutive_stretches() {
        let runs = |slots: &[usize]| slot_runs(slots).collect::<Vec<_>>();
        assert_eq!(runs(&[3, 4, 5, 9, 10, 2]), [(0, 3), (3, 2), (5, 1)]);
        assert_eq!(runs(&[7]), [(0, 1)]);
        assert_eq!(runs(&[5, 5]), [(0, 1), (1, 1)]);
        assert!(runs(&[]).is_empty());
    }
}
