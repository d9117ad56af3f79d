//! Allocator settings, with PyTorch's names (`PYTORCH_CUDA_ALLOC_CONF`).

use crate::error::{Error, Result};

/// Settings of a [`CachingAllocator`](crate::CachingAllocator).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AllocatorConfig {
    /// Blocks of at least this many bytes are never split for a smaller request, and a request of
    /// at least this size only takes a cached block less than 20 MiB larger. `None`: unlimited.
    /// Must exceed 20 MiB (the large-segment size), as in PyTorch.
    pub max_split_size: Option<usize>,
    /// When reserved memory would exceed this fraction of the backend capacity, a cache miss
    /// first releases the oldest fully free segments. `None`: off. Must lie in (0, 1).
    pub garbage_collection_threshold: Option<f64>,
    /// Grow one segment per stream and pool by mapping pages into reserved address space instead
    /// of reserving fixed-size segments (needs a backend with [`page_size`]).
    ///
    /// [`page_size`]: crate::MemoryBackend::page_size
    pub expandable_segments: bool,
    /// Round requests above `512 * n` bytes up to one of `n` equal steps between consecutive
    /// powers of two (PyTorch's `roundup_power2_divisions`): varying shapes then share block
    /// sizes, at the cost of up to `1/n` internal waste. `None`: plain 512-byte rounding. Must be
    /// a power of two from 1 to 64.
    pub roundup_power2_divisions: Option<usize>,
    /// Expandable segments only: GMLake-style page stitching (`stitch.rs`, `stitched.rs`). On a
    /// backend that can alias pages, a large request that fits no free block gets a *stitched
    /// block*: the whole free pages of its stream's segment mapped a second time as one range
    /// (topped up with new pages when they are not enough), kept cached after it is freed, so
    /// a repeating step reuses it without backend calls. Without aliases, a request that sets a
    /// new peak of allocated bytes gets the pages of free gaps moved to it. Costs backend calls
    /// (aliases or moves) in the first steps of a loop, until its layout settles. Off, pages
    /// move only when the backend is out of memory.
    pub page_stitching: bool,
    /// Planned steps (`planner.rs`): with [`CachingAllocator::mark_step`] called at the start of
    /// every training step, the first step's blocks that it freed again are packed offline
    /// into the cache's free blocks (and one new segment for those with no room, reserved when
    /// first asked for) and the following steps are served from that plan (no search); a step
    /// that deviates falls back to the cache without failing and the plan is dropped at its
    /// end, and once two steps in a row make the same requests they are planned again.
    ///
    /// [`CachingAllocator::mark_step`]: crate::CachingAllocator::mark_step
    pub planned_steps: bool,
    /// Page of host expandable segments, in bytes (`host_page_kb`): what kiln-device's CPU
    /// allocator passes to [`HostBackend::with_page_mapping_of`]. `None`:
    /// [`DEFAULT_HOST_PAGE`](crate::DEFAULT_HOST_PAGE). Other backends have a page of their own
    /// (CUDA's granularity) and ignore it. Must be a power of two from 4 KiB to 1 GiB.
    ///
    /// [`HostBackend::with_page_mapping_of`]: crate::HostBackend::with_page_mapping_of
    pub host_page: Option<usize>,
}

impl AllocatorConfig {
    /// Expandable segments on, everything else default.
    pub fn expandable() -> Self {
        Self {
            expandable_segments: true,
            ..Self::default()
        }
    }

    /// The settings that fragment least on `backend`: expandable segments where it can map
    /// pages, fixed segments otherwise (reserved/live on the traces recorded from kiln's runs:
    /// the table in `docs/ARCHITECTURE.md`). [`Default`] keeps PyTorch's default (fixed
    /// segments), so that setting nothing behaves the same on every backend.
    pub fn recommended_for(backend: &dyn crate::MemoryBackend) -> Self {
        Self {
            expandable_segments: backend.page_size().is_some(),
            ..Self::default()
        }
    }

    /// The settings in the `KILN_ALLOC_CONF` environment variable (same syntax as
    /// [`parse`](Self::parse)); defaults when it is unset or empty.
    pub fn from_env() -> Result<Self> {
        match std::env::var("KILN_ALLOC_CONF") {
            Ok(text) => Self::parse(&text).map_err(|e| match e {
                Error::InvalidConfig(m) => Error::InvalidConfig(format!("KILN_ALLOC_CONF: {m}")),
                other => other,
            }),
            Err(_) => Ok(Self::default()),
        }
    }

    /// Parses PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax, e.g.
    /// `"expandable_segments:True,max_split_size_mb:128,garbage_collection_threshold:0.8"`.
    pub fn parse(text: &str) -> Result<Self> {
        let mut config = Self::default();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item.split_once(':').ok_or_else(|| {
                Error::InvalidConfig(format!(
                    "`{item}` is not `key:value`; write e.g. `max_split_size_mb:128`"
                ))
            })?;
            let (key, value) = (key.trim(), value.trim());
            let bad = |what: &str| Error::InvalidConfig(format!("`{key}:{value}`: {what}"));
            match key {
                "max_split_size_mb" => {
                    let mb: usize = value.parse().map_err(|_| bad("expected whole MiB"))?;
                    config.max_split_size = Some(mb.saturating_mul(1 << 20));
                }
                "garbage_collection_threshold" => {
                    let t: f64 = value
                        .parse()
                        .map_err(|_| bad("expected a number in (0, 1)"))?;
                    config.garbage_collection_threshold = Some(t);
                }
                "roundup_power2_divisions" => {
                    let n: usize = value
                        .parse()
                        .map_err(|_| bad("expected a power of two, 1 to 64"))?;
                    config.roundup_power2_divisions = Some(n);
                }
                "host_page_kb" => {
                    let kb: usize = value
                        .parse()
                        .map_err(|_| bad("expected whole KiB, a power of two from 4 to 1048576"))?;
                    config.host_page = Some(kb.saturating_mul(1 << 10));
                }
                "expandable_segments" | "page_stitching" | "planned_steps" => {
                    let on = match value {
                        "True" | "true" | "1" => true,
                        "False" | "false" | "0" => false,
                        _ => return Err(bad("expected True or False")),
                    };
                    match key {
                        "page_stitching" => config.page_stitching = on,
                        "planned_steps" => config.planned_steps = on,
                        _ => config.expandable_segments = on,
                    }
                }
                _ => {
                    return Err(bad("unknown key; known keys are max_split_size_mb, \
                         garbage_collection_threshold, expandable_segments, \
                         roundup_power2_divisions, page_stitching, planned_steps, \
                         host_page_kb"))
                }
            }
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks every setting is in range.
    pub fn validate(&self) -> Result<()> {
        if let Some(m) = self.max_split_size {
            if m <= crate::LARGE_SEGMENT {
                return Err(Error::InvalidConfig(format!(
                    "max_split_size {m} bytes must exceed 20 MiB ({} bytes), the large-segment \
                     size; use e.g. 128 MiB, or None for unlimited",
                    crate::LARGE_SEGMENT
                )));
            }
        }
        if let Some(t) = self.garbage_collection_threshold {
            if !(t > 0.0 && t < 1.0) {
                return Err(Error::InvalidConfig(format!(
                    "garbage_collection_threshold {t:?} must lie strictly between 0 and 1; \
                     0.8 is a common choice"
                )));
            }
        }
        if self.page_stitching && !self.expandable_segments {
            return Err(Error::InvalidConfig(
                "page_stitching moves pages of expandable segments; turn expandable_segments \
                 on with it, or page_stitching off"
                    .into(),
            ));
        }
        if let Some(p) = self.host_page {
            if !p.is_power_of_two() || !(4 << 10..=crate::MAX_HOST_PAGE).contains(&p) {
                return Err(Error::InvalidConfig(format!(
                    "host page of {p} bytes must be a power of two from 4 KiB to 1 GiB; 64 KiB \
                     (host_page_kb:64, the default) follows live memory closely, 2 MiB \
                     (host_page_kb:2048) makes fewer mappings"
                )));
            }
        }
        if let Some(n) = self.roundup_power2_divisions {
            if !n.is_power_of_two() || n > 64 {
                return Err(Error::InvalidConfig(format!(
                    "roundup_power2_divisions {n} must be a power of two from 1 to 64; 4 is a \
                     common choice"
                )));
            }
        }
        Ok(())
    }

    /// The block size for a request of `size` bytes under these settings.
    pub fn rounded_size(&self, size: usize) -> usize {
        let base = crate::round_size(size);
        match self.roundup_power2_divisions {
            Some(n) if n > 1 && base > crate::MIN_BLOCK * n => {
                let floor = 1usize << (usize::BITS - 1 - base.leading_zeros());
                let step = floor / n;
                base.div_ceil(step) * step
            }
            _ => base,
        }
    }
}
