//! How a CUDA reduction is launched: pure functions of the shapes, the view and the device's SM
//! count, so every choice is unit-tested without a GPU.
//!
//! **Short groups.** Groups of at most [`WARP_GROUP_MAX`] elements (a softmax-sized row, a
//! layer-norm mean), unless read as `Outer` (below), take one warp each, eight per block, folded with shuffles only: a block per
//! output would leave most of its threads idle and pay a barrier per row.
//!
//! **Split heuristic.** A reduction has `n_out` outputs of `r` elements each. One block per
//! output fills the device only when `n_out` is large; a whole-tensor sum (`n_out = 1`) would run
//! on one SM. So when `n_out` is below [`BLOCKS_PER_SM`] x SMs and `r` is large, each output's
//! group is cut into `splits` consecutive chunks of `chunk` elements, one block each (pass 1
//! writes one partial state per chunk), and a second small kernel folds each output's partials in
//! chunk order (pass 2). The split count is the smallest that brings `n_out * splits` up to the
//! block target, but never so many that a chunk drops below [`MIN_CHUNK`] elements (a block must
//! stream enough bytes to hide its launch and final tree). Chunks are multiples of
//! [`CHUNK_ALIGN`] elements so every chunk of a vector-aligned row starts on a 16-byte boundary.
//! The plan is a function of the read, `n_out`, `r` and the SM count only, so the reduction
//! tree, and with it every floating-point sum, is the same run to run on a given device (a GPU
//! with another SM count may round a float sum differently, within the CPU-parity tolerances).
//!
//! **Reads.** [`read_for`] looks at the collapsed kept and reduced parts of the view:
//! - the reduced part is one unit-stride dim (rows reduced innermost): `Contiguous`, a straight
//!   `x[base + j]` read; `Vector` when in addition every output's row start is 16-byte aligned
//!   (buffer address plus offset, and every kept stride, multiples of 16 bytes);
//! - the outputs are one unit-stride dim and the reduced part one dim outside them (dim 0 of a
//!   `[rows, cols]` tensor, a bias gradient): `Outer`. One block per output would read one
//!   element per 32-byte sector, so a 2-D block takes a tile of up to 32 neighbouring outputs
//!   ([`plan_outer`]) and each warp reads contiguous row segments; tiles take the place of
//!   outputs in the split heuristic above;
//! - anything else goes through the strides (`Strided`).

use crate::cuda::launch::{grid_for, is_unit_stride, vector_aligned, StridedArgs};

/// Blocks per SM the split aims for. The pass-1 kernels declare `__launch_bounds__(256, 4)`, so
/// four 256-thread blocks are resident at once on any SM (ptxas keeps them at <= 64 registers;
/// sm_90 today: 42 to 48 for sums, 60 to 64 for extremes, no spills): a split runs as one wave,
/// with no half-empty tail wave, and 1024 threads x 4 vector loads (64 KiB per SM; 2 loads for
/// 1-byte dtypes) are in flight, more than the ~25 KiB per SM that HBM3 latency times bandwidth
/// asks for.
pub const BLOCKS_PER_SM: u64 = 4;

/// Fewest elements a split chunk holds (16 per thread of a 256-thread block).
pub const MIN_CHUNK: u64 = 4096;

/// Chunks are a multiple of this many elements (a 16-byte vector of the narrowest dtype).
pub const CHUNK_ALIGN: u64 = 16;

/// Longest group folded by one warp (blocks of 32 x 8: eight outputs per block); longer groups
/// take a block each (or several, split).
pub const WARP_GROUP_MAX: u64 = 1024;

/// How pass 1 reads the view (the `ACCESS_*` code of reduce.cu).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// Through the strides.
    Strided,
    /// Each output's group is one unit-stride row.
    Contiguous,
    /// Unit-stride rows starting on 16-byte boundaries: vector loads.
    Vector,
    /// Unit-stride outputs, the reduced dim outside them: tiles of outputs per block.
    Outer,
}

impl Read {
    /// The `ACCESS_*` code the kernels switch on.
    pub fn code(self) -> u32 {
        match self {
            Read::Strided => 0,
            Read::Contiguous => 1,
            Read::Vector => 2,
            Read::Outer => 3,
        }
    }
}

/// The launch of a reduction of `n_out` groups of `r` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReducePlan {
    /// Block shape of pass 1: `(threads, 1)` with one block per output and chunk; `(32, 8)`,
    /// one warp per output, for groups of at most [`WARP_GROUP_MAX`]; `(columns, row lanes)`
    /// for [`Read::Outer`].
    pub block: (u32, u32),
    /// Blocks of pass 1 (grid-stride over the work items: outputs or tiles, times `splits`).
    pub grid: u32,
    /// Chunks per output; 1 means pass 1 writes the outputs and there is no pass 2.
    pub splits: u64,
    /// Elements (rows, for [`Read::Outer`]) per chunk; `r` when not split.
    pub chunk: u64,
    /// Threads per block of pass 2 (one block per output, folding `splits` partials).
    pub combine_threads: u32,
}

/// Threads for folding `len` items per block: 32 to 256, a power of two.
fn threads_for(len: u64) -> u32 {
    len.next_power_of_two().clamp(32, 256) as u32
}

/// `(splits, chunk)` for `units` blocks' worth of work (outputs or tiles) over `r` elements
/// (rows), chunks of at least `min_chunk` and a multiple of `align`.
fn split(units: u64, r: u64, sm_count: u32, min_chunk: u64, align: u64) -> (u64, u64) {
    let target = BLOCKS_PER_SM * u64::from(sm_count.max(1));
    let splits = if units >= target || r < 2 * min_chunk {
        1
    } else {
        target.div_ceil(units.max(1)).min(r / min_chunk)
    };
    if splits <= 1 {
        return (1, r);
    }
    let chunk = r.div_ceil(splits).next_multiple_of(align);
    (r.div_ceil(chunk), chunk)
}

/// The plan for `n_out` outputs of `r` elements read as `read` on a device with `sm_count` SMs.
pub fn plan(read: Read, n_out: u64, r: u64, sm_count: u32) -> ReducePlan {
    if read == Read::Outer {
        return plan_outer(n_out, r, sm_count);
    }
    if r <= WARP_GROUP_MAX {
        return ReducePlan {
            block: (32, 8),
            grid: grid_for(n_out, 8),
            splits: 1,
            chunk: r,
            combine_threads: 32,
        };
    }
    let (splits, chunk) = split(n_out, r, sm_count, MIN_CHUNK, CHUNK_ALIGN);
    ReducePlan {
        block: (256, 1), // groups here are longer than WARP_GROUP_MAX
        grid: grid_for(n_out * splits, 1),
        splits,
        chunk,
        combine_threads: threads_for(splits),
    }
}

/// The [`Read::Outer`] plan: 256-thread blocks of `cols` (up to 32, a power of two) neighbouring
/// outputs by `256 / cols` row lanes; chunks of rows hold at least [`MIN_CHUNK`] elements.
pub fn plan_outer(n_out: u64, r: u64, sm_count: u32) -> ReducePlan {
    let cols = n_out.next_power_of_two().clamp(1, 32);
    let tiles = n_out.div_ceil(cols);
    let (splits, chunk) = split(tiles, r, sm_count, MIN_CHUNK.div_ceil(cols), 1);
    ReducePlan {
        block: (cols as u32, (256 / cols) as u32),
        grid: grid_for(tiles * splits, 1),
        splits,
        chunk,
        combine_threads: threads_for(splits),
    }
}

/// How pass 1 reads the view: `kept` and `red` are the collapsed kept and reduced parts (the
/// offset is on `kept`), `base` the buffer's device address, `elem_bytes` the element size.
pub fn read_for(kept: &StridedArgs, red: &StridedArgs, base: u64, elem_bytes: usize) -> Read {
    if !is_unit_stride(red) {
        let outer = kept.ndim == 1 && kept.strides[0] == 1 && red.ndim == 1;
        return if outer { Read::Outer } else { Read::Strided };
    }
    let rows_aligned = red.ndim == 1
        && vector_aligned(base, kept.offset, elem_bytes)
        && kept.strides[..kept.ndim as usize]
            .iter()
            .all(|&s| vector_aligned(0, s, elem_bytes));
    if rows_aligned {
        Read::Vector
    } else {
        Read::Contiguous
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::launch::collapse;
    use crate::Layout;

    const H200_SMS: u32 = 132;
    const ROWS: Read = Read::Contiguous;

    #[test]
    fn whole_tensor_sums_fill_the_device() {
        // 2^28 elements, one output: 528 chunks (4 per SM) of 508 416 elements (a multiple of 16)
        let p = plan(ROWS, 1, 1 << 28, H200_SMS);
        assert_eq!((p.splits, p.chunk), (528, 508_416));
        assert!(p.splits * p.chunk >= 1 << 28 && (p.splits - 1) * p.chunk < 1 << 28);
        assert_eq!((p.block, p.grid, p.combine_threads), ((256, 1), 528, 256));
        // 100M elements; the same through the strides
        let p = plan(ROWS, 1, 100_000_000, H200_SMS);
        assert_eq!((p.splits, p.chunk, p.grid), (528, 189_408, 528));
        assert_eq!(plan(Read::Strided, 1, 100_000_000, H200_SMS), p);
    }

    #[test]
    fn splits_stop_at_the_minimum_chunk() {
        // 64K elements: at most 16 chunks of 4096
        let p = plan(ROWS, 1, 65_536, H200_SMS);
        assert_eq!(
            (p.splits, p.chunk, p.grid, p.combine_threads),
            (16, 4096, 16, 32)
        );
        // a ragged length: 7 chunks, the last one short
        let p = plan(ROWS, 1, 30_000, H200_SMS);
        assert_eq!((p.splits, p.chunk), (7, 4288));
        // below two minimum chunks: no split
        let p = plan(ROWS, 1, 8191, H200_SMS);
        assert_eq!((p.splits, p.chunk, p.block, p.grid), (1, 8191, (256, 1), 1));
        let p = plan(ROWS, 1, 1025, H200_SMS);
        assert_eq!((p.splits, p.block, p.grid), (1, (256, 1), 1));
    }

    #[test]
    fn few_long_rows_split_many_rows_do_not() {
        // 8 outputs of 2^20: 66 chunks each (528 blocks in all)
        let p = plan(ROWS, 8, 1 << 20, H200_SMS);
        assert_eq!((p.splits, p.chunk, p.grid), (66, 15_888, 528));
        // 2^14 rows of 2^14: enough outputs, one block each
        let p = plan(Read::Vector, 1 << 14, 1 << 14, H200_SMS);
        assert_eq!(
            (p.splits, p.chunk, p.block, p.grid),
            (1, 1 << 14, (256, 1), 1 << 14)
        );
        // 700 rows of 3000: a block each
        let p = plan(ROWS, 700, 3000, H200_SMS);
        assert_eq!(
            (p.splits, p.chunk, p.block, p.grid),
            (1, 3000, (256, 1), 700)
        );
        // short rows: a warp each, eight per block, capped grid
        let p = plan(Read::Strided, 20_000, 100, H200_SMS);
        assert_eq!(
            (p.splits, p.chunk, p.block, p.grid),
            (1, 100, (32, 8), 2500)
        );
        let p = plan(ROWS, 3, 1024, H200_SMS);
        assert_eq!((p.splits, p.block, p.grid), (1, (32, 8), 1));
        let p = plan(ROWS, 1 << 30, 4, H200_SMS);
        assert_eq!((p.splits, p.block, p.grid), (1, (32, 8), 1 << 16));
        // empty groups and a device the driver reported without SMs
        assert_eq!(plan(ROWS, 5, 0, H200_SMS).splits, 1);
        assert_eq!(plan(ROWS, 1, 1 << 20, 0).splits, 4);
    }

    #[test]
    fn outer_reductions_tile_the_outputs() {
        let o = Read::Outer;
        // [2^24, 16] over dim 0: one tile of 16 columns x 16 row lanes, 528 chunks of rows
        let p = plan(o, 16, 1 << 24, H200_SMS);
        assert_eq!(
            (p.block, p.grid, p.splits, p.chunk),
            ((16, 16), 528, 528, 31_776)
        );
        // 3 columns: tiles of 4 (one idle lane), chunks of at least 1024 rows
        let p = plan(o, 3, 300_000, H200_SMS);
        assert_eq!(
            (p.block, p.grid, p.splits, p.chunk),
            ((4, 64), 292, 292, 1028)
        );
        // [64, 2^20]: 32 768 tiles of 32 columns fill the device unsplit
        let p = plan(o, 1 << 20, 64, H200_SMS);
        assert_eq!(
            (p.block, p.grid, p.splits, p.chunk),
            ((32, 8), 32_768, 1, 64)
        );
        // 100 columns: 4 tiles, 39 chunks of >= 128 rows
        let p = plan(o, 100, 5000, H200_SMS);
        assert_eq!(
            (p.block, p.grid, p.splits, p.chunk),
            ((32, 8), 156, 39, 129)
        );
        assert_eq!(p.combine_threads, 64);
        // short columns are not split
        assert_eq!(plan(o, 8, 1000, H200_SMS).splits, 1);
    }

    #[test]
    fn reads_follow_the_reduced_dims_and_alignment() {
        let base = 0x7f00_0000_0000u64;
        let pick = |l: &Layout, dims: &[usize], elem: usize| {
            let kept_dims: Vec<usize> = (0..l.rank()).filter(|d| !dims.contains(d)).collect();
            let sub = |ds: &[usize], off: usize| {
                let shape = ds.iter().map(|&d| l.shape()[d]).collect();
                let strides = ds.iter().map(|&d| l.strides()[d]).collect();
                Layout::new(shape, strides, off)
            };
            let [k] = collapse([&sub(&kept_dims, l.offset())]).unwrap();
            let [r] = collapse([&sub(dims, 0)]).unwrap();
            read_for(&k, &r, base, elem)
        };
        let rows = Layout::contiguous(&[64, 128]);
        assert_eq!(pick(&rows, &[1], 4), Read::Vector);
        assert_eq!(pick(&rows, &[0, 1], 4), Read::Vector);
        assert_eq!(pick(&rows, &[0], 4), Read::Outer);
        assert_eq!(pick(&rows.transpose(0, 1), &[0], 4), Read::Vector);
        assert_eq!(pick(&rows.transpose(0, 1), &[1], 4), Read::Outer);
        // the reduced dim between kept ones, and transposed wholes: through the strides
        assert_eq!(
            pick(&Layout::contiguous(&[4, 5, 6]), &[1], 4),
            Read::Strided
        );
        assert_eq!(pick(&rows.transpose(0, 1), &[0, 1], 4), Read::Strided);
        assert_eq!(pick(&rows.narrow(1, 0, 64), &[0], 4), Read::Outer);
        assert_eq!(
            pick(&Layout::new(vec![64, 32], vec![128, 2], 0), &[0], 4),
            Read::Strided
        );
        // offset by one element: straight reads, no vectors
        let shifted = Layout::contiguous(&[1 + 64 * 128]).narrow(0, 1, 64 * 128);
        assert_eq!(pick(&shifted, &[0], 4), Read::Contiguous);
        assert_eq!(pick(&shifted, &[0], 1), Read::Contiguous);
        // rows of 6 f32 (24 bytes): the second row is misaligned
        assert_eq!(
            pick(&Layout::contiguous(&[5, 6]), &[1], 4),
            Read::Contiguous
        );
        // rows of 6 f64 narrowed to 4: unit stride, row starts 48 bytes apart
        let narrowed = Layout::contiguous(&[5, 6]).narrow(1, 0, 4);
        assert_eq!(pick(&narrowed, &[1], 8), Read::Vector);
        assert_eq!(pick(&narrowed.narrow(1, 1, 3), &[1], 8), Read::Contiguous);
        // a reduced group of one element
        assert_eq!(
            pick(&Layout::contiguous(&[7, 1]), &[1], 4),
            Read::Contiguous
        );
        assert_eq!(
            [Read::Strided, Read::Contiguous, Read::Vector, Read::Outer].map(Read::code),
            [0, 1, 2, 3]
        );
    }
}
