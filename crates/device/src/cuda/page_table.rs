//! The CUDA backend's record of which physical handle is mapped at which page, for the
//! allocator's page operations ([`super::CudaBackend`]): `map`/`unmap`, `remap` (a page moves)
//! and `map_alias`/`unmap_alias` (GMLake's multi-mapping: a page's memory mapped a second time
//! at an address of another reservation). Pure bookkeeping, no driver call, so every rule of the
//! `MemoryBackend` contract is checked here, before the backend touches the driver.
//!
//! Invariants:
//! - Every address in `pages` or `aliases` is a multiple of `page`, and no address is in both:
//!   a page address is either mapped by `map` (its own memory, `pages`), an alias
//!   (`aliases`), or unmapped.
//! - Each handle is the memory of exactly one entry of `pages`; `aliases` maps an address to
//!   the handle of some entry of `pages` (never to another alias).
//! - `alias_count[h]` is the number of entries of `aliases` whose handle is `h`, and is absent
//!   when that number is 0.
//! - A page with aliases is neither unmapped nor moved (the contract: aliases go first), so no
//!   alias ever outlives the page whose memory it reaches. The driver itself would allow it
//!   (memory stays while any mapping of it exists); the allocator's contract does not.
//! - Range arguments are checked (page-aligned, non-empty, no address overflow) before any
//!   entry changes; a refused call changes nothing.

use std::collections::HashMap;

/// A physical allocation handle (`CUmemGenericAllocationHandle`).
pub(crate) type Handle = u64;

/// Which handle is mapped at which page, and which pages are aliases.
#[derive(Debug, Default)]
pub(crate) struct PageTable {
    page: u64,
    pages: HashMap<u64, Handle>,
    aliases: HashMap<u64, Handle>,
    alias_count: HashMap<Handle, usize>,
}

impl PageTable {
    /// An empty table for pages of `page` bytes (> 0).
    pub(crate) fn new(page: usize) -> Self {
        Self {
            page: page.max(1) as u64,
            ..Self::default()
        }
    }

    /// The page addresses of `[addr, addr + bytes)`: page-aligned, non-empty, in the address
    /// space; else the reason.
    pub(crate) fn range(&self, addr: u64, bytes: usize) -> Result<Vec<u64>, String> {
        let bytes = bytes as u64;
        let end = addr.checked_add(bytes);
        if bytes == 0
            || !addr.is_multiple_of(self.page)
            || !bytes.is_multiple_of(self.page)
            || end.is_none()
        {
            return Err(format!(
                "{addr:#x} + {bytes} is not a non-empty range of whole {}-byte pages",
                self.page
            ));
        }
        Ok((0..bytes / self.page)
            .map(|i| addr + i * self.page)
            .collect())
    }

    /// Records `handle` as mapped at page `at` by `map`.
    pub(crate) fn insert(&mut self, at: u64, handle: Handle) {
        self.pages.insert(at, handle);
    }

    /// Forgets the page mapped at `at` by `map` (for its unmap), if any; a page with aliases
    /// is kept and `None` returned (see [`check_unaliased`](Self::check_unaliased)).
    pub(crate) fn remove(&mut self, at: u64) -> Option<Handle> {
        let h = *self.pages.get(&at)?;
        if self.alias_count.contains_key(&h) {
            return None;
        }
        self.pages.remove(&at)
    }

    /// Ok when no page of `addrs` that `map` mapped has an alias (so they may be unmapped).
    pub(crate) fn check_unaliased(&self, addrs: &[u64]) -> Result<(), String> {
        match addrs.iter().find(|a| {
            self.pages
                .get(a)
                .is_some_and(|h| self.alias_count.contains_key(h))
        }) {
            Some(a) => Err(format!(
                "page {a:#x} still has an alias mapping (unmap_alias comes first)"
            )),
            None => Ok(()),
        }
    }

    /// Ok when no page of `addrs` is mapped, by `map` or as an alias (so they may be mapped).
    pub(crate) fn check_unmapped(&self, addrs: &[u64]) -> Result<(), String> {
        let taken = |a: &&u64| self.pages.contains_key(a) || self.aliases.contains_key(a);
        match addrs.iter().find(taken) {
            Some(a) => Err(format!("page {a:#x} is already mapped")),
            None => Ok(()),
        }
    }

    /// The handles of pages `from` (each mapped by `map`, with no alias) when they may move to
    /// pages `to` (each unmapped), page for page.
    pub(crate) fn check_move(&self, from: &[u64], to: &[u64]) -> Result<Vec<Handle>, String> {
        self.check_unaliased(from)?;
        self.sources(from, to)
    }

    /// The handles of pages `from` (each mapped by `map`) when they may also be mapped at
    /// pages `to` (each unmapped), page for page.
    pub(crate) fn check_alias(&self, from: &[u64], to: &[u64]) -> Result<Vec<Handle>, String> {
        self.sources(from, to)
    }

    fn sources(&self, from: &[u64], to: &[u64]) -> Result<Vec<Handle>, String> {
        if from.len() != to.len() {
            return Err(format!(
                "{} source pages, {} target pages",
                from.len(),
                to.len()
            ));
        }
        self.check_unmapped(to)?;
        from.iter()
            .map(|f| {
                self.pages.get(f).copied().ok_or_else(|| {
                    let what = if self.aliases.contains_key(f) {
                        "an alias, not memory of its own"
                    } else {
                        "not mapped"
                    };
                    format!("source page {f:#x} is {what}")
                })
            })
            .collect()
    }

    /// Records that the page at `from` now lives at `to` (after the driver moved it).
    pub(crate) fn move_page(&mut self, from: u64, to: u64) {
        if let Some(h) = self.pages.remove(&from) {
            self.pages.insert(to, h);
        }
    }

    /// Records `handle` (the memory of a page `map` mapped) as also mapped at alias page `at`.
    pub(crate) fn add_alias(&mut self, at: u64, handle: Handle) {
        if self.aliases.insert(at, handle).is_none() {
            *self.alias_count.entry(handle).or_insert(0) += 1;
        }
    }

    /// Ok when every page of `addrs` is an alias (so `unmap_alias` may unmap them).
    pub(crate) fn check_aliases(&self, addrs: &[u64]) -> Result<(), String> {
        match addrs.iter().find(|a| !self.aliases.contains_key(a)) {
            Some(a) => Err(format!("page {a:#x} is not an alias mapping")),
            None => Ok(()),
        }
    }

    /// Forgets alias page `at` (after the driver unmapped it).
    pub(crate) fn remove_alias(&mut self, at: u64) {
        let Some(h) = self.aliases.remove(&at) else {
            return;
        };
        if let Some(n) = self.alias_count.get_mut(&h) {
            *n -= 1;
            if *n == 0 {
                self.alias_count.remove(&h);
            }
        }
    }

    /// How many pages are mapped by `map` and how many are aliases.
    pub(crate) fn counts(&self) -> (usize, usize) {
        (self.pages.len(), self.aliases.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 2 << 20;

    fn table() -> PageTable {
        let mut t = PageTable::new(P as usize);
        for (i, h) in [(0u64, 10u64), (1, 11), (2, 12)] {
            t.insert(0x1000_0000 + i * P, h);
        }
        t
    }

    #[test]
    fn ranges_are_whole_pages_without_overflow() {
        let t = table();
        assert_eq!(t.range(4 * P, 2 * P as usize).unwrap(), vec![4 * P, 5 * P]);
        assert!(t.range(4 * P + 512, P as usize).is_err());
        assert!(t.range(4 * P, P as usize + 512).is_err());
        assert!(t.range(4 * P, 0).is_err());
        assert!(t.range(u64::MAX - P + 1, 2 * P as usize).is_err());
    }

    #[test]
    fn an_alias_reaches_a_mapped_page_and_pins_it_until_it_goes() {
        let mut t = table();
        let from = t.range(0x1000_0000, 2 * P as usize).unwrap();
        let to = t.range(0x9000_0000, 2 * P as usize).unwrap();
        assert_eq!(t.check_alias(&from, &to).unwrap(), vec![10, 11]);
        for (&a, h) in to.iter().zip([10, 11]) {
            t.add_alias(a, h);
        }
        assert_eq!(t.counts(), (3, 2));
        // Neither unmapped nor moved while aliased; the unaliased third page may go.
        let err = t.check_unaliased(&from[1..]).unwrap_err();
        assert!(err.contains("0x10200000") && err.contains("alias"), "{err}");
        assert_eq!(t.remove(from[0]), None);
        assert!(t.check_move(&from[..1], &[0x5000_0000]).is_err());
        assert!(t.check_unaliased(&[0x1000_0000 + 2 * P]).is_ok());
        // No alias of an alias, of an unmapped page, or onto a mapped page.
        let err = t.check_alias(&to[..1], &[0x7000_0000]).unwrap_err();
        assert!(err.contains("an alias"), "{err}");
        let err = t.check_alias(&[0x3000_0000], &[0x7000_0000]).unwrap_err();
        assert!(err.contains("not mapped"), "{err}");
        let err = t
            .check_alias(&from[..1], &[0x1000_0000 + 2 * P])
            .unwrap_err();
        assert!(err.contains("already mapped"), "{err}");
        assert!(t.check_unmapped(&to[1..]).is_err());
        assert!(t.check_unmapped(&[0x7000_0000]).is_ok());
        assert!(t.check_alias(&from[..1], &to[..1]).is_err());
        // unmap_alias takes alias pages only; once both are gone the pages are free to go.
        assert!(t.check_aliases(&from[..1]).is_err());
        t.check_aliases(&to).unwrap();
        t.remove_alias(to[0]);
        assert!(t.check_unaliased(&from[..1]).is_ok());
        assert!(t.check_unaliased(&from[1..2]).is_err());
        t.remove_alias(to[1]);
        assert_eq!(t.counts(), (3, 0));
        assert_eq!(t.remove(from[0]), Some(10));
        assert_eq!(t.check_move(&from[1..2], &[0x5000_0000]).unwrap(), vec![11]);
        t.move_page(from[1], 0x5000_0000);
        assert_eq!(
            t.check_alias(&[0x5000_0000], &[0x7000_0000]).unwrap(),
            vec![11]
        );
    }

    #[test]
    fn two_aliases_of_one_page_both_pin_it() {
        let mut t = table();
        t.add_alias(0x9000_0000, 10);
        t.add_alias(0x9000_0000 + P, 10);
        t.remove_alias(0x9000_0000);
        assert!(t.check_unaliased(&[0x1000_0000]).is_err());
        t.remove_alias(0x9000_0000 + P);
        assert!(t.check_unaliased(&[0x1000_0000]).is_ok());
        // Forgetting an address that is no alias changes nothing.
        t.remove_alias(0x9000_0000);
        assert_eq!(t.counts(), (3, 0));
    }
}
