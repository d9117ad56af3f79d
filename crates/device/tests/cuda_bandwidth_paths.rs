//! CUDA parity for the bandwidth paths of reductions and elementwise ops: split reductions (one
//! output's group over many blocks, then a combine pass), a warp or a block per output, tiles of
//! outputs for outer reduced dims, the unit-stride and 16-byte vector reads, and the strided
//! fallback, each against the CPU backend with the per-dtype tolerances of
//! `kiln_device::testing::tolerance`. Sizes are chosen so the plan of
//! `kiln_device::ops::reduce::plan` really splits on the device under test (asserted), and ties
//! and NaNs sit in different chunks; no larger, since CI runs every test here on the CUDA
//! emulator, whose blocks' threads run as fibers on the machine's few cores.
//!
//! Each test starts with `cuda_device_or_skip()`: without a GPU it prints why and passes as a
//! skip; with `KILN_REQUIRE_CUDA=1` it fails instead.
#![cfg(feature = "cuda")]

mod common;

use common::{assert_match, both};
use kiln_device::ops::reduce::plan::{plan, Read, ReducePlan};
use kiln_device::prelude::*;
use kiln_device::testing::cuda_device_or_skip;
use kiln_device::{BinaryOp, CmpOp, CpuStorage, CudaStorage, DType, Layout, ReduceOp, UnaryOp};

const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::ArgMax,
    ReduceOp::ArgMin,
];

/// `n` values with mean zero over each period of 201 (so long sums stay small and f16 does not
/// overflow): -1.00 ..= 1.00 in steps of 0.01 for floats, -100 ..= 100 for integers (u8 takes
/// what the CPU cast makes of the negatives), as `dtype` on the CPU.
fn values(n: usize, dtype: DType) -> CpuStorage {
    let scale = if dtype.is_float() { 0.01 } else { 1.0 };
    let v: Vec<f64> = (0..n)
        .map(|i| (((i * 7919) % 201) as f64 - 100.0) * scale)
        .collect();
    to_dtype(v, dtype)
}

fn to_dtype(v: Vec<f64>, dtype: DType) -> CpuStorage {
    kiln_device::testing::cpu_values(v, dtype).unwrap()
}

/// The device's plan for `n_out` outputs of `r` elements read as `read`.
fn device_plan(read: Read, n_out: usize, r: usize) -> ReducePlan {
    let sms = kiln_device::cuda_status().devices()[0].sm_count;
    plan(read, n_out as u64, r as u64, sms)
}

/// The tolerance of `op` over groups of `terms` elements of `dtype`: the dtype's, except that an
/// f64 sum also allows `terms` units of 2^-53 absolute, the error a summation order may make on
/// `terms` values of magnitude <= 1. The CPU adds in sequence and the device in a tree; for
/// short groups the extra is below 1e-13, but over millions of terms the CPU's own sum drifts
/// further from the exact one (the device's tree is closer) than the bare f64 tolerance (1e-12)
/// covers.
fn reduce_tolerance(op: ReduceOp, dtype: DType, terms: usize) -> (f64, f64) {
    let (atol, rtol) = kiln_device::testing::tolerance(dtype);
    if dtype == DType::F64 && op == ReduceOp::Sum {
        (atol + terms as f64 * f64::EPSILON / 2.0, rtol)
    } else {
        (atol, rtol)
    }
}

/// Every reduction of `dims` of `l`, CUDA against CPU (arg ops only for one dim).
fn check_reductions(what: &str, (c, g): (&CpuStorage, &CudaStorage), l: &Layout, dims: &[usize]) {
    let terms: usize = dims.iter().map(|&d| l.shape()[d]).product();
    for op in OPS {
        if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) && dims.len() != 1 {
            continue;
        }
        let want = c.reduce(l, dims, op).unwrap();
        let dtype = kiln_device::prelude::BufferOps::dtype(&want);
        common::assert_storage_close(
            &format!("{what} {op:?} {dims:?} {l:?}"),
            &want,
            &g.reduce(l, dims, op).unwrap(),
            dtype,
            reduce_tolerance(op, dtype, terms),
        );
    }
}

#[test]
fn whole_tensor_sums_split_across_blocks_match_cpu_and_repeat_bit_for_bit() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    // Not a multiple of any vector width: the last chunk ends in an element-wise tail.
    let n = 300_001;
    assert!(device_plan(Read::Vector, 1, n).splits > 1);
    let all = Layout::contiguous(&[n]);
    for dtype in [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::U8,
    ] {
        let (c, g) = both(dev, &values(n, dtype));
        check_reductions(&format!("whole {dtype}"), (&c, &g), &all, &[0]);
        // offset by one element: unit-stride reads, no vectors
        let shifted = all.narrow(0, 1, n - 1);
        check_reductions(&format!("offset 1 {dtype}"), (&c, &g), &shifted, &[0]);
        // deterministic: the same bits twice
        let first = g.reduce(&all, &[0], ReduceOp::Sum).unwrap();
        let second = g.reduce(&all, &[0], ReduceOp::Sum).unwrap();
        let one = Layout::contiguous(&[1]);
        assert_eq!(
            first.to_cpu(&one).unwrap().to_f64_vec()[0].to_bits(),
            second.to_cpu(&one).unwrap().to_f64_vec()[0].to_bits(),
            "{dtype}: two runs of the same sum differ"
        );
    }
}

#[test]
fn few_long_groups_split_over_rows_and_columns() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    for dtype in [DType::F32, DType::BF16, DType::I64] {
        // dim 0 of [big, small]: the reduced dim is outer (tiles of columns), 5 outputs
        let (rows, cols) = (20_003, 5);
        assert!(device_plan(Read::Outer, cols, rows).splits > 1);
        let (c, g) = both(dev, &values(rows * cols, dtype));
        let l = Layout::contiguous(&[rows, cols]);
        check_reductions(&format!("[big, small] {dtype}"), (&c, &g), &l, &[0]);
        // last dim of [small, big]: rows 16-byte aligned (vectors), then not (straight reads)
        for (rows, cols) in [(4, 32_768), (3, 30_011)] {
            assert!(device_plan(Read::Contiguous, rows, cols).splits > 1);
            let (c, g) = both(dev, &values(rows * cols, dtype));
            let l = Layout::contiguous(&[rows, cols]);
            check_reductions(&format!("[small, big] {dtype}"), (&c, &g), &l, &[1]);
            // the transposed view reduced over dim 0 reads the same rows
            check_reductions(
                &format!("[big, small]^T {dtype}"),
                (&c, &g),
                &l.transpose(0, 1),
                &[0],
            );
        }
    }
}

#[test]
fn short_medium_and_long_rows_take_warp_block_and_split_paths() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    // (rows, cols, pass-1 block): a warp per row, a block per row, blocks per row (split)
    for (rows, cols, block) in [
        (2_000, 100, (32, 8)),
        (3, 1000, (32, 8)),
        (700, 1500, (256, 1)),
        (2, 20_000, (256, 1)),
    ] {
        assert_eq!(device_plan(Read::Contiguous, rows, cols).block, block);
        for dtype in [DType::F32, DType::F16, DType::I64] {
            let (c, g) = both(dev, &values(rows * cols, dtype));
            let l = Layout::contiguous(&[rows, cols]);
            check_reductions(&format!("rows {dtype}"), (&c, &g), &l, &[1]);
            // one element in: every row start misaligned
            let shifted = l.narrow(1, 1, cols - 1);
            check_reductions(&format!("shifted rows {dtype}"), (&c, &g), &shifted, &[1]);
        }
    }
}

#[test]
fn strided_and_offset_views_take_the_strided_path() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let (a, b) = (600, 700);
    let (c, g) = both(dev, &values(a * b + 3, DType::F32));
    let base = Layout::new(vec![a, b], vec![b, 1], 3);
    // transposed: reducing everything walks the buffer through two strides
    check_reductions("transposed all", (&c, &g), &base.transpose(0, 1), &[0, 1]);
    // every other column, offset: the reduced dim has stride 2
    let every_other = Layout::new(vec![a, b / 2], vec![b, 2], 1);
    check_reductions("stride 2", (&c, &g), &every_other, &[1]);
    check_reductions("stride 2 all", (&c, &g), &every_other, &[0, 1]);
    // a narrowed block: rows of 650 from offset 3 + 20 (unit stride, unaligned rows)
    let narrowed = base.narrow(1, 20, 650);
    check_reductions("narrowed", (&c, &g), &narrowed, &[1]);
    // its columns: outer reads from an offset, 650 outputs (21 tiles)
    check_reductions("narrowed columns", (&c, &g), &narrowed, &[0]);
    check_reductions("narrowed all", (&c, &g), &narrowed, &[0, 1]);
}

#[test]
fn extremes_keep_first_ties_and_nans_across_chunks() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let n = 1 << 17;
    let p = device_plan(Read::Vector, 1, n);
    assert!(p.splits >= 4, "plan {p:?} does not split 2^17 elements");
    let chunk = p.chunk as usize;
    let base: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64).collect();
    for dtype in [DType::F32, DType::BF16, DType::F64, DType::I64] {
        // ties: the maximum and the minimum twice each, in chunks 1 and 3 (the later one first
        // in chunk order would not matter: the lower index must win)
        let mut v = base.clone();
        for (at, value) in [
            (chunk + 5, 5000.0),
            (3 * chunk + 7, 5000.0),
            (chunk + 9, -5000.0),
            (3 * chunk + 1, -5000.0),
        ] {
            v[at] = value;
        }
        let (c, g) = both(dev, &to_dtype(v.clone(), dtype));
        let l = Layout::contiguous(&[n]);
        check_reductions(&format!("ties {dtype}"), (&c, &g), &l, &[0]);
        let argmax = g.reduce(&l, &[0], ReduceOp::ArgMax).unwrap();
        let got = argmax
            .to_cpu(&Layout::contiguous(&[1]))
            .unwrap()
            .to_f64_vec();
        assert_eq!(got[0] as usize, chunk + 5, "{dtype}: first maximum");
        if dtype.is_float() {
            // NaNs in chunks 2 and 3 and a larger value in chunk 0: the first NaN wins both ways
            v[2 * chunk + 11] = f64::NAN;
            v[3 * chunk + 2] = f64::NAN;
            v[3] = 9000.0;
            let (c, g) = both(dev, &to_dtype(v, dtype));
            check_reductions(&format!("NaN {dtype}"), (&c, &g), &l, &[0]);
            let argmin = g.reduce(&l, &[0], ReduceOp::ArgMin).unwrap();
            let got = argmin
                .to_cpu(&Layout::contiguous(&[1]))
                .unwrap()
                .to_f64_vec();
            assert_eq!(got[0] as usize, 2 * chunk + 11, "{dtype}: first NaN");
        }
    }
    // ties down the columns of [big, small] (outer, split into chunks of rows): rows far apart
    let (rows, cols) = (30_000, 3);
    let chunk = device_plan(Read::Outer, cols, rows).chunk as usize;
    let mut v: Vec<f64> = (0..rows * cols).map(|i| (i % 97) as f64).collect();
    v[(chunk + 2) * cols + 1] = 500.0;
    v[(2 * chunk + 3) * cols + 1] = 500.0;
    v[(2 * chunk + 3) * cols + 2] = f64::NAN;
    let (c, g) = both(dev, &to_dtype(v, DType::F32));
    let l = Layout::contiguous(&[rows, cols]);
    check_reductions("column ties", (&c, &g), &l, &[0]);
}

#[test]
fn elementwise_flat_and_vector_paths_match_cpu_at_any_offset() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    // Odd length: a tail after the last whole vector; offsets 0 (vectors), 1 (misaligned:
    // straight reads) and a whole vector's worth.
    let n = 100_003;
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64] {
        let (c, g) = both(dev, &values(n + 16, dtype));
        let view = |offset: usize| Layout::contiguous(&[n + 16]).narrow(0, offset, n);
        for (oa, ob) in [(0, 0), (1, 1), (0, 1), (16, 8), (2, 0)] {
            let (la, lb) = (view(oa), view(ob));
            for op in [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Maximum] {
                let what = format!("{op:?} {dtype} offsets {oa}/{ob}");
                assert_match(
                    &what,
                    &c.binary(&la, &c, &lb, op).unwrap(),
                    &g.binary(&la, &g, &lb, op).unwrap(),
                );
            }
            // comparisons and where: flat (no vectors) for unit-stride operands
            let what = format!("compare/where {dtype} offsets {oa}/{ob}");
            let (mask_c, mask_g) = (
                c.compare(&la, &c, &lb, CmpOp::Lt).unwrap(),
                g.compare(&la, &g, &lb, CmpOp::Lt).unwrap(),
            );
            assert_match(&what, &mask_c, &mask_g);
            let lm = Layout::contiguous(&[n]);
            assert_match(
                &what,
                &mask_c.where_cond(&lm, &c, &la, &c, &lb).unwrap(),
                &mask_g.where_cond(&lm, &g, &la, &g, &lb).unwrap(),
            );
            for op in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Square] {
                let what = format!("{op:?} {dtype} offset {oa}");
                assert_match(
                    &what,
                    &c.unary(&la, op).unwrap(),
                    &g.unary(&la, op).unwrap(),
                );
            }
        }
        // a broadcast operand keeps the strided path
        let row = Layout::contiguous(&[7]).broadcast_to(&[n / 7, 7]);
        let full = Layout::contiguous(&[n / 7, 7]);
        assert_match(
            &format!("broadcast add {dtype}"),
            &c.binary(&full, &c, &row, BinaryOp::Add).unwrap(),
            &g.binary(&full, &g, &row, BinaryOp::Add).unwrap(),
        );
    }
    // float-only unary ops through the vector path of every float dtype
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (c, g) = both(dev, &values(n, dtype));
        let l = Layout::contiguous(&[n]);
        for op in [UnaryOp::Exp, UnaryOp::Sigmoid, UnaryOp::GeluTanh] {
            assert_match(
                &format!("{op:?} {dtype}"),
                &c.unary(&l, op).unwrap(),
                &g.unary(&l, op).unwrap(),
            );
        }
    }
}
