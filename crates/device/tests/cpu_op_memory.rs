//! CPU op outputs are written in place into one block of the CPU caching allocator: no output
//! goes through a system-allocator `Vec` and no copy is made, and large kernel scratch (conv2d's
//! im2col columns) is counted by the allocator's statistics while the op runs.
//!
//! Its own test binary with a single test, because the CPU allocator and the counting global
//! allocator below are process-wide: no other test may allocate while an op is measured.

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use kiln_device::ops::conv::{Conv2dGeometry, Conv2dParams};
use kiln_device::prelude::*;
use kiln_device::{allocator, BinaryOp, CpuStorage, DType, Device, Layout, ReduceOp, Result};

/// The system allocator, counting the largest single request while `COUNTING` is on.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn note(size: usize) {
    if COUNTING.load(Ordering::Relaxed) {
        LARGEST.fetch_max(size, Ordering::Relaxed);
    }
}

// SAFETY: every call forwards to `System` unchanged; counting only reads the size.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: AllocLayout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: AllocLayout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// What one run of an op cost.
#[derive(Debug, PartialEq)]
struct Cost {
    /// Blocks handed out by the CPU caching allocator.
    blocks: i64,
    /// Segments the allocator had to get from the system (0 once the cache is warm).
    segments: u64,
    /// `memory_allocated` after minus before (the output, still alive).
    kept_bytes: i64,
    /// `max_memory_allocated` during the op minus `memory_allocated` before.
    peak_bytes: i64,
    /// The largest single system-allocator request during the op.
    largest_system_request: usize,
}

/// Runs `op` twice (the first run warms the allocator's cache, so the second takes no new
/// segment and its system requests are the op's own) and measures the second run.
fn measure(op: impl Fn() -> Result<CpuStorage>) -> (CpuStorage, Cost) {
    drop(op().unwrap());
    let cpu = allocator(Device::Cpu).unwrap();
    cpu.reset_peak_stats();
    let before = cpu.memory_stats();
    LARGEST.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::SeqCst);
    let out = op().unwrap();
    COUNTING.store(false, Ordering::SeqCst);
    let after = cpu.memory_stats();
    let base = before.allocated_bytes.all.current;
    let cost = Cost {
        blocks: after.allocation.all.allocated - before.allocation.all.allocated,
        segments: after.num_device_alloc - before.num_device_alloc,
        kept_bytes: after.allocated_bytes.all.current - base,
        peak_bytes: after.allocated_bytes.all.peak - base,
        largest_system_request: LARGEST.load(Ordering::Relaxed),
    };
    (out, cost)
}

/// Bytes of the allocator block for `n` `f32`s (requests round up to 512 bytes).
fn block_of_f32s(n: usize) -> i64 {
    (n * 4).div_ceil(512) as i64 * 512
}

fn f32_storage(n: usize) -> CpuStorage {
    CpuStorage::from_vec(
        (0..n)
            .map(|i| (i % 13) as f32 * 0.25 - 1.0)
            .collect::<Vec<f32>>(),
    )
}

/// The output cost of a kernel that writes straight into its block: one block, kept; the peak
/// is that block alone; no system request as large as the output.
fn one_block_in_place(out_elems: usize, cost: &Cost) {
    let out_bytes = block_of_f32s(out_elems);
    assert_eq!(cost.blocks, 1, "{cost:?}");
    assert_eq!(cost.segments, 0, "{cost:?}");
    assert_eq!(cost.kept_bytes, out_bytes, "{cost:?}");
    assert_eq!(cost.peak_bytes, out_bytes, "{cost:?}");
    assert!(
        (cost.largest_system_request as i64) < out_bytes / 4,
        "a system allocation of {} bytes during an op with a {out_bytes}-byte output: {cost:?}",
        cost.largest_system_request
    );
}

#[test]
fn op_outputs_take_exactly_one_allocator_block_and_no_system_buffer() {
    // One worker thread: the `gemm` crate gives each thread that packs matrices its own
    // lazily allocated scratch (about the L2 size, 1 MiB here). With several workers, a thread
    // that sat out the warm-up run but joins the measured one makes that request mid-op, which
    // is the library's scratch, not an output buffer, and made this test flaky under load.
    // Set before kiln's pool exists (this binary holds this one test).
    std::env::set_var("KILN_NUM_THREADS", "1");
    assert_eq!(kiln_device::threads::num_threads(), 1);
    // Elementwise binary, broadcasting a row over a [256, 1024] matrix.
    let (m, n) = (256, 1024);
    let (a, b) = (f32_storage(m * n), f32_storage(n));
    let la = Layout::contiguous(&[m, n]);
    let lb = Layout::contiguous(&[1, n]).broadcast_to(&[m, n]);
    let (sum, cost) = measure(|| a.binary(&la, &b, &lb, BinaryOp::Add));
    one_block_in_place(m * n, &cost);
    let (av, bv, sv) = (
        a.to_vec::<f32>().unwrap(),
        b.to_vec::<f32>().unwrap(),
        sum.to_vec::<f32>().unwrap(),
    );
    assert_eq!(sv[5 * n + 7], av[5 * n + 7] + bv[7]);

    // Reduction over the leading dim of a [4, 65536] matrix (strided groups).
    let (r, c) = (4, 1 << 16);
    let x = f32_storage(r * c);
    let lx = Layout::contiguous(&[r, c]);
    let (total, cost) = measure(|| x.reduce(&lx, &[0], ReduceOp::Sum));
    one_block_in_place(c, &cost);
    let xv = x.to_vec::<f32>().unwrap();
    let want: f32 = (0..r).map(|i| xv[i * c + 3]).sum();
    assert_eq!(total.to_vec::<f32>().unwrap()[3], want);

    // Matmul [128, 96] @ [96, 512].
    let (m, k, n) = (128, 96, 512);
    let (a, b) = (f32_storage(m * k), f32_storage(k * n));
    let (la, lb) = (Layout::contiguous(&[m, k]), Layout::contiguous(&[k, n]));
    let (prod, cost) = measure(|| a.matmul(&la, &b, &lb));
    one_block_in_place(m * n, &cost);
    let (av, bv) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    let want: f64 = (0..k)
        .map(|p| av[9 * k + p] as f64 * bv[p * n + 11] as f64)
        .sum();
    assert!((prod.to_vec::<f32>().unwrap()[9 * n + 11] as f64 - want).abs() < 1e-3);

    // conv2d 3x3, padding 1, one image (the padded-row path, `cpu_rows.rs`): the output block
    // plus its scratch blocks, all from the allocator; only the output is kept. With a column
    // matrix: the zero-bordered image (8 channels of 34 rows of pitch 33, plus 2 elements of
    // slack), the column matrix over rows of 33 (72 x 32·33) and the product over the same rows
    // (16 x 32·33). Without one (f32 on a CPU with AVX-512F or AVX2 + FMA, `cpu_direct.rs`):
    // the zero-bordered image with 16 more zeros and the product in strips of 64 positions (17
    // strips x 16 x 64); the weight is read in place.
    let params = Conv2dParams {
        padding: [1, 1],
        ..Conv2dParams::default()
    };
    let g = Conv2dGeometry::new([1, 8, 32, 32], [16, 8, 3, 3], params).unwrap();
    let (x, w) = (f32_storage(8 * 32 * 32), f32_storage(16 * 8 * 9));
    let (lx, lw) = (
        Layout::contiguous(&g.input_shape()),
        Layout::contiguous(&g.weight_shape()),
    );
    let (y, cost) = measure(|| x.conv2d(&lx, (&w, &lw), None, &g));
    let out_elems = 16 * 32 * 32;
    let scratch_elems: &[_] = if direct_conv_kernel() {
        &[8 * 34 * 33 + 2 + 16, 17 * 16 * 64]
    } else {
        &[8 * 34 * 33 + 2, 8 * 9 * 32 * 33, 16 * 32 * 33]
    };
    let out_bytes = block_of_f32s(out_elems);
    assert_eq!(
        cost.blocks,
        1 + scratch_elems.len() as i64,
        "output + scratch blocks: {cost:?}"
    );
    assert_eq!(cost.segments, 0, "{cost:?}");
    assert_eq!(cost.kept_bytes, out_bytes, "{cost:?}");
    assert_eq!(
        cost.peak_bytes,
        out_bytes + scratch_elems.iter().map(|&n| block_of_f32s(n)).sum::<i64>(),
        "{cost:?}"
    );
    assert!(
        (cost.largest_system_request as i64) < out_bytes / 4,
        "{cost:?}"
    );
    // Output (o=2, y=0, x=0): the 3x3 window clipped by the padding to its 2x2 lower-right part.
    let (xv, wv) = (x.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
    let mut want = 0.0f64;
    for ci in 0..8 {
        for (ky, kx) in [(1, 1), (1, 2), (2, 1), (2, 2)] {
            let input = xv[ci * 1024 + (ky - 1) * 32 + (kx - 1)] as f64;
            want += input * wv[((2 * 8 + ci) * 3 + ky) * 3 + kx] as f64;
        }
    }
    assert!((y.to_vec::<f32>().unwrap()[2 * 1024] as f64 - want).abs() < 1e-4);

    // Batch norm (evaluation) of a bf16 [4, 16, 32, 32] input with f32 weight, bias and
    // running statistics (autocast's mixed case): the kernel reads the bf16 input and writes
    // the bf16 output in place, element by element, with no f32 copy of either.
    let (n, c) = (4 * 16 * 32 * 32, 16);
    let lx = Layout::contiguous(&[4, 16, 32, 32]);
    let lc = Layout::contiguous(&[c]);
    let x = f32_storage(n)
        .to_dtype(&Layout::contiguous(&[n]), DType::BF16)
        .unwrap();
    let (w, b, rm) = (f32_storage(c), f32_storage(c), f32_storage(c));
    let rv = CpuStorage::from_vec(vec![2.0f32; c]);
    let (y, cost) = measure(|| {
        x.batch_norm_eval(
            &lx,
            Some((&w, &lc)),
            Some((&b, &lc)),
            (&rm, &lc),
            (&rv, &lc),
            1e-5,
        )
    });
    assert_eq!(y.dtype(), DType::BF16);
    one_block_in_place(n / 2, &cost); // n bf16 values fill the block of n / 2 f32s
    let (xv, wv, bv, mv) = (
        x.to_f64_vec(),
        w.to_vec::<f32>().unwrap(),
        b.to_vec::<f32>().unwrap(),
        rm.to_vec::<f32>().unwrap(),
    );
    // element 3 of image 1, channel 5
    let at = (16 + 5) * 1024 + 3;
    let want = (xv[at] - mv[5] as f64) / (2.0f64 + 1e-5).sqrt() * wv[5] as f64 + bv[5] as f64;
    assert!((y.to_f64_vec()[at] - want).abs() <= 8e-3 * (1.0 + want.abs()));
}

/// Whether the CPU runs the padded-row forward's f32 kernel without a column matrix
/// (`cpu_direct.rs`): AVX-512F or AVX2, with FMA.
fn direct_conv_kernel() -> bool {
    // `KILN_CPU_CAPABILITY=default` turns the hand-vectorised kernels off (`ops/simd.rs`).
    let portable = std::env::var("KILN_CPU_CAPABILITY")
        .is_ok_and(|v| v.trim().eq_ignore_ascii_case("default"));
    #[cfg(target_arch = "x86_64")]
    {
        !portable
            && std::arch::is_x86_feature_detected!("fma")
            && (std::arch::is_x86_feature_detected!("avx512f")
                || std::arch::is_x86_feature_detected!("avx2"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = portable;
        false
    }
}
