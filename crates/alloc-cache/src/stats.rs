//! Allocator statistics with PyTorch's names (`torch.cuda.memory_stats`), and the text table of
//! `memory_summary()`.
//!
//! Every byte/count statistic is a [`Stat`] (current, peak, cumulative allocated, cumulative
//! freed) kept three times: for all pools together, for the small pool and for the large pool.

use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One statistic: its current value, its peak since the last `reset_peak_stats`, and the
/// cumulative amounts added and removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Stat {
    /// Current value.
    pub current: i64,
    /// Largest value since creation or the last `reset_peak_stats()`.
    pub peak: i64,
    /// Sum of all increases.
    pub allocated: i64,
    /// Sum of all decreases.
    pub freed: i64,
}

impl Stat {
    /// Adds `delta` (which may be negative), tracking the peak and the cumulative counters.
    pub fn update(&mut self, delta: i64) {
        self.current += delta;
        self.peak = self.peak.max(self.current);
        if delta > 0 {
            self.allocated += delta;
        } else {
            self.freed -= delta;
        }
    }
}

/// Which pool a block or segment belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// Requests of at most 256 KiB ([`SMALL_SIZE`](crate::SMALL_SIZE)), packed into 2 MiB segments.
    Small,
    /// Everything larger.
    Large,
}

impl PoolKind {
    /// PyTorch's name for the pool in `memory_stats` keys.
    pub fn stat_name(self) -> &'static str {
        match self {
            PoolKind::Small => "small_pool",
            PoolKind::Large => "large_pool",
        }
    }
}

/// A statistic kept for all pools and for each pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StatArray {
    /// Both pools together (PyTorch's `all`).
    pub all: Stat,
    /// The small pool.
    pub small_pool: Stat,
    /// The large pool.
    pub large_pool: Stat,
}

impl StatArray {
    /// Adds `delta` to the aggregate and to `pool`'s statistic.
    pub fn update(&mut self, pool: PoolKind, delta: i64) {
        if delta == 0 {
            return;
        }
        self.all.update(delta);
        match pool {
            PoolKind::Small => self.small_pool.update(delta),
            PoolKind::Large => self.large_pool.update(delta),
        }
    }

    /// The statistic of one pool.
    pub fn pool(&self, pool: PoolKind) -> &Stat {
        match pool {
            PoolKind::Small => &self.small_pool,
            PoolKind::Large => &self.large_pool,
        }
    }

    fn reset_peak(&mut self) {
        for s in [&mut self.all, &mut self.small_pool, &mut self.large_pool] {
            s.peak = s.current;
        }
    }

    fn entries(&self) -> [(&'static str, &Stat); 3] {
        [
            ("all", &self.all),
            ("small_pool", &self.small_pool),
            ("large_pool", &self.large_pool),
        ]
    }
}

/// Everything `memory_stats()` reports. Names follow `torch.cuda.memory_stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MemoryStats {
    /// Blocks handed to callers and not yet freed.
    pub allocation: StatArray,
    /// Segments obtained from the backend (an expandable segment counts once).
    pub segment: StatArray,
    /// Blocks allocated or freed but still waiting on a stream event.
    pub active: StatArray,
    /// Free blocks inside a segment that also holds other blocks (cannot be released).
    pub inactive_split: StatArray,
    /// Bytes of allocated blocks (after rounding).
    pub allocated_bytes: StatArray,
    /// Bytes held from the backend (mapped bytes for expandable segments).
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks.
    pub active_bytes: StatArray,
    /// Bytes of inactive split blocks.
    pub inactive_split_bytes: StatArray,
    /// Bytes callers asked for (before rounding) in allocated blocks.
    pub requested_bytes: StatArray,
    /// Allocations that failed at the backend, released cached memory and retried.
    pub num_alloc_retries: u64,
    /// Allocations that ended in `Error::OutOfMemory`.
    pub num_ooms: u64,
    /// Times `empty_cache`/`trim_to` waited on outstanding stream events.
    pub num_sync_all_streams: u64,
    /// Backend calls that obtained memory (`reserve` and `map`).
    pub num_device_alloc: u64,
    /// Backend calls that returned memory (`release` and `unmap`).
    pub num_device_free: u64,
    /// The `max_split_size` setting in bytes, -1 when unlimited (as PyTorch reports it).
    pub max_split_size: i64,
}

impl MemoryStats {
    pub(crate) fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ]
    }

    /// Resets every peak to its current value (`torch.cuda.reset_peak_memory_stats`).
    pub fn reset_peak(&mut self) {
        for s in [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ] {
            s.reset_peak();
        }
    }

    /// The flat `"allocated_bytes.all.current"`-style map that `torch.cuda.memory_stats()`
    /// returns, for users and tools that expect PyTorch's keys.
    pub fn to_flat(&self) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        for (name, array) in self.arrays() {
            for (pool, stat) in array.entries() {
                for (field, value) in [
                    ("current", stat.current),
                    ("peak", stat.peak),
                    ("allocated", stat.allocated),
                    ("freed", stat.freed),
                ] {
                    out.insert(format!("{name}.{pool}.{field}"), value);
                }
            }
        }
        for (name, value) in [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_sync_all_streams", self.num_sync_all_streams),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
        ] {
            out.insert(name.to_string(), value as i64);
        }
        out.insert("max_split_size".to_string(), self.max_split_size);
        out
    }

    /// A readable table in the spirit of `torch.cuda.memory_summary()`.
    pub fn summary(&self, backend: &str, largest_free_block: usize) -> String {
        let mut s = String::new();
        let rule = "=".repeat(79);
        let thin = "-".repeat(79);
        let _ = writeln!(s, "{rule}");
        let _ = writeln!(
            s,
            " kiln caching allocator memory summary (backend: {backend})"
        );
        let _ = writeln!(s, "{thin}");
        let _ = writeln!(
            s,
            " {:<29}| {:>11} | {:>11} | {:>11} | {:>11}",
            "Metric", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed"
        );
        let rows: [(&str, &StatArray, bool); 9] = [
            ("Allocated memory", &self.allocated_bytes, true),
            ("Active memory", &self.active_bytes, true),
            ("Requested memory", &self.requested_bytes, true),
            ("Reserved memory", &self.reserved_bytes, true),
            ("Non-releasable memory", &self.inactive_split_bytes, true),
            ("Allocations", &self.allocation, false),
            ("Active allocs", &self.active, false),
            ("Reserved segments", &self.segment, false),
            ("Non-releasable allocs", &self.inactive_split, false),
        ];
        for (title, array, bytes) in rows {
            let _ = writeln!(s, "{thin}");
            for (label, stat) in [
                (title.to_string(), &array.all),
                ("      from large pool".to_string(), &array.large_pool),
                ("      from small pool".to_string(), &array.small_pool),
            ] {
                let f = |v: i64| {
                    if bytes {
                        format_bytes(v)
                    } else {
                        v.to_string()
                    }
                };
                let _ = writeln!(
                    s,
                    " {:<29}| {:>11} | {:>11} | {:>11} | {:>11}",
                    label,
                    f(stat.current),
                    f(stat.peak),
                    f(stat.allocated),
                    f(stat.freed)
                );
            }
        }
        let _ = writeln!(s, "{thin}");
        let _ = writeln!(
            s,
            " Largest free block: {}   Device allocs/frees: {}/{}",
            format_bytes(largest_free_block as i64),
            self.num_device_alloc,
            self.num_device_free
        );
        let _ = writeln!(
            s,
            " Alloc retries: {}   OOMs: {}   Syncs: {}",
            self.num_alloc_retries, self.num_ooms, self.num_sync_all_streams
        );
        let _ = writeln!(s, "{rule}");
        s
    }
}

/// `1536` -> `"1.50 KiB"`; exact bytes below 1 KiB.
pub fn format_bytes(bytes: i64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes.unsigned_abs() < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}
