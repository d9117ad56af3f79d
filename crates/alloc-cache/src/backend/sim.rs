//! `SimBackend`: a simulated device address space for tests and trace replay.
//!
//! No memory is touched: addresses come from a bump pointer (with a one-page guard gap between
//! ranges, so a bug that merges blocks across segments shows up as a bad address), physical use is
//! counted against a capacity, and every call is counted so tests can assert "zero backend calls".
//! Every misuse the allocator could commit (releasing an unknown segment, mapping a mapped page,
//! unmapping outside a reservation, leaking a reservation) is reported as an error.
//! Physical pages are modelled: each mapped page has a physical page number, fresh ones from
//! `map`, moved ones keeping theirs under `remap`, so tests can check that no physical page is
//! ever reachable at two addresses ([`SimBackend::physical_pages`]) other than through an alias
//! (`map_alias`, which charges nothing; a page with an alias can be neither unmapped nor moved
//! until the alias is gone).
//! Events complete only when a test says so ([`SimBackend::complete_event`]) or when the
//! allocator synchronises on them.

use super::{BackendError, EventId, MemoryBackend, StreamId};
use crate::page_runs::PageRuns;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Default page size for expandable segments: 2 MiB, the CUDA VMM granularity on current GPUs.
pub const SIM_DEFAULT_PAGE: usize = 2 << 20;

/// How many times each backend entry point was called.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SimCalls {
    /// `reserve` calls (including failed ones).
    pub reserve: u64,
    /// `release` calls.
    pub release: u64,
    /// `reserve_address_space` calls.
    pub reserve_address_space: u64,
    /// `release_address_space` calls.
    pub release_address_space: u64,
    /// `map` calls (including failed ones).
    pub map: u64,
    /// `unmap` calls.
    pub unmap: u64,
    /// `remap` calls.
    pub remap: u64,
    /// `map_alias` calls.
    pub map_alias: u64,
    /// `unmap_alias` calls.
    pub unmap_alias: u64,
    /// `record_event` calls.
    pub record_event: u64,
    /// `query_event` calls.
    pub query_event: u64,
    /// `synchronize_event` calls.
    pub synchronize_event: u64,
}

impl SimCalls {
    /// Calls that reserve, release, map or unmap memory (what a real device charges for).
    pub fn memory_calls(&self) -> u64 {
        self.reserve
            + self.release
            + self.reserve_address_space
            + self.release_address_space
            + self.map
            + self.unmap
            + self.remap
            + self.map_alias
            + self.unmap_alias
    }
}

#[derive(Debug, Default)]
struct SimState {
    next_addr: u64,
    used: usize,
    segments: BTreeMap<u64, usize>,
    reservations: BTreeMap<u64, usize>,
    /// Mapped pages, by page index (`address / page`), as runs.
    mapped_pages: PageRuns,
    /// Physical page numbers of mapped pages: `first page -> (end page, physical number of the
    /// first page)`, numbers rising by one a page within an entry.
    physical: BTreeMap<usize, (usize, u64)>,
    /// The next fresh physical page number.
    next_physical: u64,
    /// Alias mappings: `first alias page -> (end page, first page of the memory's own
    /// mapping)`. Their pages are in `mapped_pages` and `physical` too, but charge nothing.
    aliases: BTreeMap<usize, (usize, usize)>,
    events: Vec<Option<bool>>,
    calls: SimCalls,
}

/// A simulated address space with a capacity and an optional physical page granularity.
#[derive(Debug)]
pub struct SimBackend {
    capacity: usize,
    granularity: Option<usize>,
    page: usize,
    aliases: bool,
    state: Mutex<SimState>,
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to).saturating_mul(to)
}

impl SimBackend {
    /// A simulated device with `capacity` bytes; segments are charged their exact size and
    /// expandable segments map 2 MiB pages.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            granularity: None,
            page: SIM_DEFAULT_PAGE,
            aliases: true,
            state: Mutex::new(SimState {
                next_addr: 1 << 32,
                ..SimState::default()
            }),
        }
    }

    /// Charges every segment in whole pages of `page` bytes (like `cudaMalloc` does) and uses
    /// `page` as the expandable-segment page size. `page` must be a non-zero multiple of 512.
    pub fn with_page_granularity(mut self, page: usize) -> Self {
        let page = round_up(page.max(512), 512);
        self.granularity = Some(page);
        self.page = page;
        self
    }

    /// Offers no alias mappings (like a backend without multi-mapping, e.g. kiln-device's CUDA
    /// backend on a device without virtual memory management): page stitching then moves
    /// pages instead of keeping stitched blocks.
    pub fn without_aliases(mut self) -> Self {
        self.aliases = false;
        self
    }

    /// Counts of every backend call so far.
    pub fn calls(&self) -> SimCalls {
        self.lock().calls
    }

    /// Physical bytes in use (segments plus mapped pages).
    pub fn used_bytes(&self) -> usize {
        self.lock().used
    }

    /// Number of live segments, address-space reservations and mapped pages.
    pub fn live_ranges(&self) -> (usize, usize, usize) {
        let s = self.lock();
        (
            s.segments.len(),
            s.reservations.len(),
            s.mapped_pages.total(),
        )
    }

    /// The physical page number behind each page of `[addr, addr + bytes)` (page-aligned), in
    /// order; an error names the first page that is not mapped.
    pub fn physical_pages(&self, addr: u64, bytes: usize) -> Result<Vec<u64>, BackendError> {
        self.check_pages(addr, bytes)?;
        let (p0, p1) = self.page_range(addr, bytes)?;
        let s = self.lock();
        let mut out = Vec::with_capacity(p1 - p0);
        for p in p0..p1 {
            match s.physical.range(..=p).next_back() {
                Some((&start, &(end, first))) if p < end => out.push(first + (p - start) as u64),
                _ => {
                    return Err(BackendError::Driver(format!(
                        "sim: page {:#x} is not mapped",
                        p as u64 * self.page as u64
                    )))
                }
            }
        }
        Ok(out)
    }

    /// Marks `event` complete (what the device would do when the stream reaches it).
    pub fn complete_event(&self, event: EventId) {
        if let Some(Some(done)) = self.lock().events.get_mut(event.0 as usize) {
            *done = true;
        }
    }

    /// Marks every live event complete.
    pub fn complete_all_events(&self) {
        for e in self.lock().events.iter_mut().flatten() {
            *e = true;
        }
    }

    /// Events recorded and not yet destroyed.
    pub fn live_events(&self) -> Vec<EventId> {
        let s = self.lock();
        (0..s.events.len())
            .filter(|&i| s.events[i].is_some())
            .map(|i| EventId(i as u64))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn charge(&self, s: &mut SimState, bytes: usize) -> Result<(), BackendError> {
        if bytes > self.capacity - s.used {
            return Err(BackendError::OutOfMemory {
                requested: bytes,
                free: self.capacity - s.used,
            });
        }
        s.used += bytes;
        Ok(())
    }

    /// The next `bytes` of the simulated 64-bit address space (plus a guard page); an
    /// out-of-memory error once that space is used up (a capacity near `usize::MAX`).
    fn take_addresses(&self, s: &mut SimState, bytes: usize) -> Result<u64, BackendError> {
        let end = bytes
            .checked_next_multiple_of(self.page)
            .and_then(|b| b.checked_add(self.page))
            .and_then(|span| s.next_addr.checked_add(span as u64));
        let Some(end) = end else {
            return Err(BackendError::OutOfMemory {
                requested: bytes,
                free: usize::try_from(u64::MAX - s.next_addr).unwrap_or(usize::MAX),
            });
        };
        let addr = s.next_addr;
        s.next_addr = end;
        Ok(addr)
    }

    /// Page indices `[p0, p1)` of the range `addr..addr + bytes` (page-aligned by the caller).
    fn page_range(&self, addr: u64, bytes: usize) -> Result<(usize, usize), BackendError> {
        let page = self.page as u64;
        let end = addr.checked_add(bytes as u64).ok_or_else(|| {
            BackendError::Driver(format!(
                "sim: range {addr:#x}+{bytes} wraps the address space"
            ))
        })?;
        let index = |a: u64| usize::try_from(a / page).unwrap_or(usize::MAX);
        Ok((index(addr), index(end)))
    }

    fn check_pages(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        if bytes == 0 || !addr.is_multiple_of(self.page as u64) || !bytes.is_multiple_of(self.page)
        {
            return Err(BackendError::Driver(format!(
                "sim: range {addr:#x}+{bytes} is not a non-empty multiple of the {} byte page",
                self.page
            )));
        }
        Ok(())
    }
}

/// Takes the physical entries of `[p0, p1)` out, as `(first page, end page, physical number)`.
fn take_physical(s: &mut SimState, p0: usize, p1: usize) -> Vec<(usize, usize, u64)> {
    let mut met: Vec<(usize, usize, u64)> = Vec::new();
    if let Some((&a, &(e, f))) = s.physical.range(..p0).next_back() {
        if e > p0 {
            met.push((a, e, f));
        }
    }
    met.extend(s.physical.range(p0..p1).map(|(&a, &(e, f))| (a, e, f)));
    let mut taken = Vec::new();
    for (a, e, f) in met {
        s.physical.remove(&a);
        if a < p0 {
            s.physical.insert(a, (p0, f));
        }
        if e > p1 {
            s.physical.insert(p1, (e, f + (p1 - a) as u64));
        }
        let (lo, hi) = (a.max(p0), e.min(p1));
        taken.push((lo, hi, f + (lo - a) as u64));
    }
    taken
}

/// Whether any page of `[p0, p1)` is an alias, or the memory of an alias.
fn aliased(s: &SimState, p0: usize, p1: usize) -> bool {
    s.aliases
        .iter()
        .any(|(&a, &(e, src))| (a < p1 && p0 < e) || (src < p1 && p0 < src + (e - a)))
}

fn inside_reservation(s: &SimState, addr: u64, bytes: usize) -> bool {
    s.reservations
        .range(..=addr)
        .next_back()
        .is_some_and(|(&start, &len)| addr + bytes as u64 <= start + len as u64)
}

impl MemoryBackend for SimBackend {
    fn name(&self) -> &str {
        "sim"
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn free_bytes(&self) -> usize {
        self.capacity - self.lock().used
    }

    fn reserve(&self, bytes: usize) -> Result<u64, BackendError> {
        let mut s = self.lock();
        s.calls.reserve += 1;
        let charged = self.granularity.map_or(bytes, |g| round_up(bytes, g));
        if bytes == 0 {
            return Err(BackendError::Driver(
                "sim: zero-byte segment requested".into(),
            ));
        }
        self.charge(&mut s, charged)?;
        let addr = match self.take_addresses(&mut s, bytes) {
            Ok(addr) => addr,
            Err(e) => {
                s.used -= charged;
                return Err(e);
            }
        };
        s.segments.insert(addr, bytes);
        Ok(addr)
    }

    unsafe fn release(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let mut s = self.lock();
        s.calls.release += 1;
        match s.segments.get(&addr) {
            Some(&len) if len == bytes => {}
            other => {
                return Err(BackendError::Driver(format!(
                    "sim: release of {addr:#x}+{bytes} does not match a live segment ({other:?})"
                )))
            }
        }
        s.segments.remove(&addr);
        s.used -= self.granularity.map_or(bytes, |g| round_up(bytes, g));
        Ok(())
    }

    fn page_size(&self) -> Option<usize> {
        Some(self.page)
    }

    fn reserve_address_space(&self, bytes: usize) -> Result<u64, BackendError> {
        let mut s = self.lock();
        s.calls.reserve_address_space += 1;
        self.check_pages(0, bytes)?;
        let addr = self.take_addresses(&mut s, bytes)?;
        s.reservations.insert(addr, bytes);
        Ok(addr)
    }

    unsafe fn release_address_space(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let mut s = self.lock();
        s.calls.release_address_space += 1;
        if s.reservations.get(&addr) != Some(&bytes) {
            return Err(BackendError::Driver(format!(
                "sim: {addr:#x}+{bytes} is not a live address-space reservation"
            )));
        }
        let (p0, p1) = self.page_range(addr, bytes)?;
        if s.mapped_pages.count_in(p0, p1) > 0 {
            return Err(BackendError::Driver(format!(
                "sim: reservation {addr:#x}+{bytes} released with pages still mapped"
            )));
        }
        s.reservations.remove(&addr);
        Ok(())
    }

    fn map(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let mut s = self.lock();
        s.calls.map += 1;
        self.check_pages(addr, bytes)?;
        if !inside_reservation(&s, addr, bytes) {
            return Err(BackendError::Driver(format!(
                "sim: map of {addr:#x}+{bytes} outside any reservation"
            )));
        }
        let (p0, p1) = self.page_range(addr, bytes)?;
        if s.mapped_pages.count_in(p0, p1) > 0 {
            return Err(BackendError::Driver(format!(
                "sim: map of {addr:#x}+{bytes} overlaps"
            )));
        }
        self.charge(&mut s, bytes)?;
        s.mapped_pages.insert(p0, p1);
        let first = s.next_physical;
        s.next_physical += (p1 - p0) as u64;
        s.physical.insert(p0, (p1, first));
        Ok(())
    }

    unsafe fn unmap(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let mut s = self.lock();
        s.calls.unmap += 1;
        self.check_pages(addr, bytes)?;
        let (p0, p1) = self.page_range(addr, bytes)?;
        if !s.mapped_pages.covers(p0, p1) || aliased(&s, p0, p1) {
            return Err(BackendError::Driver(format!(
                "sim: unmap of {addr:#x}+{bytes} covers unmapped or aliased pages"
            )));
        }
        s.mapped_pages.remove(p0, p1);
        take_physical(&mut s, p0, p1);
        s.used -= bytes;
        Ok(())
    }

    unsafe fn remap(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        let mut s = self.lock();
        s.calls.remap += 1;
        self.check_pages(from, bytes)?;
        self.check_pages(to, bytes)?;
        let (p0, p1) = self.page_range(from, bytes)?;
        let (q0, q1) = self.page_range(to, bytes)?;
        if !s.mapped_pages.covers(p0, p1) || aliased(&s, p0, p1) {
            return Err(BackendError::Driver(format!(
                "sim: remap from {from:#x}+{bytes} covers unmapped or aliased pages"
            )));
        }
        if !inside_reservation(&s, to, bytes) || s.mapped_pages.count_in(q0, q1) > 0 {
            return Err(BackendError::Driver(format!(
                "sim: remap to {to:#x}+{bytes} is outside a reservation or overlaps a mapping"
            )));
        }
        s.mapped_pages.remove(p0, p1);
        s.mapped_pages.insert(q0, q1);
        for (a, e, f) in take_physical(&mut s, p0, p1) {
            s.physical.insert(q0 + (a - p0), (q0 + (e - p0), f));
        }
        Ok(())
    }

    fn supports_aliases(&self) -> bool {
        self.aliases
    }

    fn map_alias(&self, from: u64, to: u64, bytes: usize) -> Result<(), BackendError> {
        if !self.aliases {
            return Err(BackendError::Unsupported {
                backend: "sim".into(),
                what: "alias mappings (made without_aliases)",
            });
        }
        let mut s = self.lock();
        s.calls.map_alias += 1;
        self.check_pages(from, bytes)?;
        self.check_pages(to, bytes)?;
        let (p0, p1) = self.page_range(from, bytes)?;
        let (q0, q1) = self.page_range(to, bytes)?;
        let alias_pages = s.aliases.iter().any(|(&a, &(e, _))| a < p1 && p0 < e);
        if !s.mapped_pages.covers(p0, p1) || alias_pages {
            return Err(BackendError::Driver(format!(
                "sim: alias of {from:#x}+{bytes}: pages unmapped or aliases themselves"
            )));
        }
        if !inside_reservation(&s, to, bytes) || s.mapped_pages.count_in(q0, q1) > 0 {
            return Err(BackendError::Driver(format!(
                "sim: alias at {to:#x}+{bytes} is outside a reservation or overlaps a mapping"
            )));
        }
        let first = s.physical.range(..p0).next_back().map(|(&a, &v)| (a, v));
        let met: Vec<(usize, (usize, u64))> = first
            .into_iter()
            .chain(s.physical.range(p0..p1).map(|(&a, &v)| (a, v)))
            .collect();
        for (a, (e, f)) in met {
            let (lo, hi) = (a.max(p0), e.min(p1));
            if lo < hi {
                let entry = (q0 + (hi - p0), f + (lo - a) as u64);
                s.physical.insert(q0 + (lo - p0), entry);
            }
        }
        s.mapped_pages.insert(q0, q1);
        s.aliases.insert(q0, (q1, p0));
        Ok(())
    }

    unsafe fn unmap_alias(&self, addr: u64, bytes: usize) -> Result<(), BackendError> {
        let mut s = self.lock();
        s.calls.unmap_alias += 1;
        self.check_pages(addr, bytes)?;
        let (q0, q1) = self.page_range(addr, bytes)?;
        if s.aliases.get(&q0).map(|&(e, _)| e) != Some(q1) {
            return Err(BackendError::Driver(format!(
                "sim: {addr:#x}+{bytes} is not an alias made by one map_alias"
            )));
        }
        s.aliases.remove(&q0);
        s.mapped_pages.remove(q0, q1);
        take_physical(&mut s, q0, q1);
        Ok(())
    }

    fn record_event(&self, _stream: StreamId) -> Result<EventId, BackendError> {
        let mut s = self.lock();
        s.calls.record_event += 1;
        s.events.push(Some(false));
        Ok(EventId(s.events.len() as u64 - 1))
    }

    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        let mut s = self.lock();
        s.calls.query_event += 1;
        match s.events.get(event.0 as usize) {
            Some(Some(done)) => Ok(*done),
            _ => Err(BackendError::Driver(format!(
                "sim: query of dead event {}",
                event.0
            ))),
        }
    }

    fn synchronize_event(&self, event: EventId) -> Result<(), BackendError> {
        let mut s = self.lock();
        s.calls.synchronize_event += 1;
        match s.events.get_mut(event.0 as usize) {
            Some(Some(done)) => {
                *done = true;
                Ok(())
            }
            _ => Err(BackendError::Driver(format!(
                "sim: sync on dead event {}",
                event.0
            ))),
        }
    }

    fn destroy_event(&self, event: EventId) {
        if let Some(slot) = self.lock().events.get_mut(event.0 as usize) {
            *slot = None;
        }
    }
}
