//! The size policy of the caching allocator: the rounding granularity, the pool boundary and
//! segment sizes, in one place so the allocator, the free index and the slow paths read the
//! same numbers.
//!
//! Invariants: every block size is a multiple of [`MIN_BLOCK`]; [`round_size`] never returns 0;
//! requests above [`MAX_REQUEST`] are refused before any arithmetic on them.

/// Every request is rounded up to a multiple of this many bytes.
pub const MIN_BLOCK: usize = 512;
/// Largest request served from the small pool: 256 KiB (PyTorch: 1 MiB). A 2 MiB small segment
/// holds only two requests of 683 KiB to 1 MiB and loses the rest; larger requests go to the
/// large pool, whose 20 MiB segments pack them (see the design note in `allocator.rs`).
pub const SMALL_SIZE: usize = 256 << 10;
/// Size of a small-pool segment.
pub const SMALL_SEGMENT: usize = 2 << 20;
/// Size of a large-pool segment for requests between 1 and 10 MiB.
pub const LARGE_SEGMENT: usize = 20 << 20;
/// Requests at least this big get a segment of their own size (rounded to [`ROUND_LARGE`]).
pub const MIN_LARGE_ALLOC: usize = 10 << 20;
/// Rounding of large segments.
pub const ROUND_LARGE: usize = 2 << 20;
/// A fixed segment made for a request of at least [`MIN_LARGE_ALLOC`] holds as many copies of
/// the request as fit in the large pool's reserved bytes divided by this (at least one, rounded
/// to [`ROUND_LARGE`]): segments grow geometrically, by at most 1/16 of what is reserved.
pub const GROWTH_DIVISOR: usize = 16;
/// A request of at least [`MIN_LARGE_ALLOC`] whose own segment would lose more than this
/// fraction (1/32) of it to rounding gets a segment for two copies instead (when the request is
/// at most 1/8 of the large pool), so the rounding is paid once per pair.
pub(crate) const PAIR_ROUNDING_WASTE: usize = 32;
/// Largest request accepted (anything larger cannot be a real buffer and would overflow).
pub const MAX_REQUEST: usize = 1 << 50;

/// `size` rounded up to the block granularity (at least one [`MIN_BLOCK`]).
pub fn round_size(size: usize) -> usize {
    size.max(1).div_ceil(MIN_BLOCK) * MIN_BLOCK
}
