//! CUDA backend parity: every op wired on `CudaStorage` against the CPU backend on the same
//! inputs (contiguous, transposed, narrowed and broadcast views; every dtype the op takes),
//! with the per-dtype tolerances of `kiln_device::testing::tolerance`.
//!
//! Each test starts with `cuda_device_or_skip()`: without a GPU it prints why and passes as a
//! skip; with `KILN_REQUIRE_CUDA=1` it fails instead.
#![cfg(feature = "cuda")]

use kiln_device::prelude::*;
mod common;

use kiln_device::testing::{close, cuda_device_or_skip};
use kiln_device::{
    BinaryOp, CmpOp, CpuStorage, CudaStorage, DType, Device, Layout, ReduceOp, UnaryOp,
};

const ALL: [DType; 7] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I64,
    DType::U8,
    DType::Bool,
];
const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

use common::{assert_match, both};

/// `n` varied values (negatives, fractions, a zero) as `dtype` on the CPU.
fn values(n: usize, dtype: DType) -> CpuStorage {
    common::pattern(n, dtype, 1, 0.37, -4.0)
}

/// Views of a `[4, 6]` buffer of 24 elements: contiguous, transposed, narrowed, broadcast.
fn views() -> Vec<Layout> {
    let base = Layout::contiguous(&[4, 6]);
    vec![
        base.clone(),
        base.transpose(0, 1),
        base.narrow(1, 1, 4).narrow(0, 1, 2),
        Layout::contiguous(&[6]).broadcast_to(&[3, 6]),
        Layout::new(vec![], vec![], 5),
    ]
}

#[test]
fn casts_and_copies_match_cpu_bit_for_bit() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    for src_dtype in ALL {
        let (c, g) = both(dev, &values(24, src_dtype));
        for view in views() {
            for dst_dtype in ALL {
                let what = format!("{src_dtype}->{dst_dtype} {view:?}");
                let want = c.to_dtype(&view, dst_dtype).unwrap();
                let got = g.to_dtype(&view, dst_dtype).unwrap();
                // casts are exact: compare with a zero tolerance whatever the dtype
                let (gv, wv) = (got.to_cpu(&Layout::contiguous(&[got.len()])).unwrap(), want);
                assert_eq!(gv.to_f64_vec().len(), wv.to_f64_vec().len(), "{what}");
                for (a, b) in gv.to_f64_vec().iter().zip(wv.to_f64_vec()) {
                    assert!(close(*a, b, (0.0, 0.0)), "{what}: {a} vs {b}");
                }
            }
            assert_match(
                "contiguous",
                &c.copy_contiguous(&view).unwrap(),
                &g.copy_contiguous(&view).unwrap(),
            );
            assert_eq!(
                g.to_cpu(&view).unwrap().to_f64_vec(),
                c.to_cpu(&view).unwrap().to_f64_vec()
            );
        }
    }
    // Special values: NaN, infinities, out-of-range to integers.
    let special = CpuStorage::from_vec(vec![f64::NAN, f64::INFINITY, -1e30, 1e30, -0.7, 300.5]);
    let (c, g) = both(dev, &special);
    let l = Layout::contiguous(&[6]);
    for dst in ALL {
        assert_match(
            &format!("special -> {dst}"),
            &c.to_dtype(&l, dst).unwrap(),
            &g.to_dtype(&l, dst).unwrap(),
        );
    }
}

#[test]
fn copy_into_writes_through_strided_destinations() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    for dtype in ALL {
        let (src_c, src_g) = both(dev, &values(12, dtype));
        let (mut dst_c, mut dst_g) =
            both(dev, &CpuStorage::full(Device::Cpu, 40, 0.0, dtype).unwrap());
        // [3, 4] source written transposed into columns 1..4 of a [5, 8] destination
        let src_l = Layout::contiguous(&[4, 3]).transpose(0, 1);
        let dst_l = Layout::contiguous(&[5, 8]).narrow(1, 1, 4).narrow(0, 1, 3);
        src_c.copy_into(&src_l, &mut dst_c, &dst_l).unwrap();
        src_g.copy_into(&src_l, &mut dst_g, &dst_l).unwrap();
        assert_match(&format!("copy_into {dtype}"), &dst_c, &dst_g);
    }
}

/// In-place binary ops: a destination of every dtype, contiguous and strided (columns 1..4 of
/// rows 1..4 of a [5, 8] buffer), updated by a transposed right operand, a broadcast row and a
/// broadcast scalar,
/// on both backends; what the CPU refuses (integer `Pow`, the activation backwards on
/// integers) CUDA refuses too, leaving the destination as it was. The fused `add_scaled_into`
/// gives the same bits on both.
#[test]
fn binary_into_updates_destinations_in_place_like_cpu() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let ops = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::ReluBackward,
    ];
    let dst_layouts = [
        Layout::contiguous(&[5, 8]).narrow(1, 1, 4).narrow(0, 1, 3),
        Layout::contiguous(&[3, 4]),
    ];
    let rhs_layouts = [
        Layout::contiguous(&[4, 3]).transpose(0, 1),
        Layout::contiguous(&[4]).broadcast_to(&[3, 4]),
        // One value everywhere (`relu_` as `Maximum` with 0, `mul_scalar_`).
        Layout::contiguous(&[1]).broadcast_to(&[3, 4]),
    ];
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64] {
        let (rc, rg) = both(dev, &values(12, dtype));
        for dst_l in &dst_layouts {
            for rhs_l in &rhs_layouts {
                for op in ops {
                    let (mut dc, mut dg) = both(dev, &common::pattern(40, dtype, 3, 0.61, 1.5));
                    let what = format!("{op:?} {dtype} into {dst_l:?} from {rhs_l:?}");
                    match (
                        rc.binary_into(rhs_l, &mut dc, dst_l, op),
                        rg.binary_into(rhs_l, &mut dg, dst_l, op),
                    ) {
                        (Ok(()), Ok(())) => assert_match(&what, &dc, &dg),
                        (Err(_), Err(_)) => assert_match(&what, &dc, &dg),
                        (want, got) => panic!("{what}: cpu {want:?} vs cuda {got:?}"),
                    }
                }
                // The fused `dst += alpha * rhs`: bit for bit (one rounding on both; integers
                // refused on both).
                let (mut dc, mut dg) = both(dev, &common::pattern(40, dtype, 3, 0.61, 1.5));
                let what = format!("add_scaled_into {dtype} into {dst_l:?} from {rhs_l:?}");
                match (
                    rc.add_scaled_into(rhs_l, &mut dc, dst_l, 0.1),
                    rg.add_scaled_into(rhs_l, &mut dg, dst_l, 0.1),
                ) {
                    (Ok(()), Ok(())) => {
                        let (c, g) = (
                            kiln_device::testing::host_f64(&dc).unwrap(),
                            kiln_device::testing::host_f64(&dg).unwrap(),
                        );
                        assert_eq!(c, g, "{what}");
                    }
                    (Err(_), Err(_)) => assert_eq!(dtype, DType::I64, "{what}"),
                    (want, got) => panic!("{what}: cpu {want:?} vs cuda {got:?}"),
                }
            }
        }
    }
}

#[test]
fn full_and_arange_match_cpu() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    for dtype in ALL {
        for value in [0.0, -2.75, 1e3, 300.0] {
            assert_match(
                &format!("full {value} {dtype}"),
                &CpuStorage::full(Device::Cpu, 1001, value, dtype).unwrap(),
                &CudaStorage::full(dev, 1001, value, dtype).unwrap(),
            );
        }
        assert_match(
            &format!("arange {dtype}"),
            &CpuStorage::arange(Device::Cpu, -3.0, 0.1, 777, dtype).unwrap(),
            &CudaStorage::arange(dev, -3.0, 0.1, 777, dtype).unwrap(),
        );
    }
}

#[test]
fn philox_draws_match_cpu() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let n = 100_003;
    for dtype in ALL {
        let c = CpuStorage::rand_uniform(Device::Cpu, n, -2.0, 3.0, 1234, 77, dtype).unwrap();
        let g = CudaStorage::rand_uniform(dev, n, -2.0, 3.0, 1234, 77, dtype).unwrap();
        // uniforms are integer work and exact double arithmetic: bit-identical
        let got = g.to_cpu(&Layout::contiguous(&[n])).unwrap();
        assert_eq!(got, c, "uniform {dtype}");
    }
    for dtype in FLOATS {
        let c = CpuStorage::rand_normal(Device::Cpu, n, 0.5, 2.0, 99, 1 << 40, dtype).unwrap();
        let g = CudaStorage::rand_normal(dev, n, 0.5, 2.0, 99, 1 << 40, dtype).unwrap();
        // normals use the device's log/cos: equal up to their last-bit differences
        assert_match(&format!("normal {dtype}"), &c, &g);
    }
}

const UNARY: [UnaryOp; 16] = [
    UnaryOp::Neg,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Abs,
    UnaryOp::Relu,
    UnaryOp::GeluErf,
    UnaryOp::GeluTanh,
    UnaryOp::Sigmoid,
    UnaryOp::Tanh,
    UnaryOp::Silu,
    UnaryOp::Sign,
    UnaryOp::Erf,
    UnaryOp::Recip,
    UnaryOp::Square,
];

#[test]
fn unary_ops_match_cpu() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    for dtype in ALL {
        let (c, g) = both(dev, &values(24, dtype));
        for view in views() {
            for op in UNARY {
                match (c.unary(&view, op), g.unary(&view, op)) {
                    (Ok(want), Ok(got)) => assert_match(&format!("{op:?} {dtype}"), &want, &got),
                    (Err(_), Err(_)) => {}
                    (want, got) => panic!("{op:?} {dtype}: cpu {want:?} vs cuda {got:?}"),
                }
            }
        }
    }
}

#[test]
fn binary_ops_comparisons_and_where_broadcast_like_cpu() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let ops = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::ReluBackward,
        BinaryOp::GeluErfBackward,
        BinaryOp::GeluTanhBackward,
        BinaryOp::SiluBackward,
        BinaryOp::SigmoidBackward,
        BinaryOp::TanhBackward,
    ];
    let cmps = [
        CmpOp::Eq,
        CmpOp::Ne,
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
    ];
    // [4, 6] (transposed storage) against a [6] row broadcast to [4, 6]
    let la = Layout::contiguous(&[6, 4]).transpose(0, 1);
    let lb = Layout::contiguous(&[6]).broadcast_to(&[4, 6]);
    for dtype in ALL {
        let (ac, ag) = both(dev, &values(24, dtype));
        let (bc, bg) = both(
            dev,
            &values(6, dtype)
                .to_dtype(&Layout::contiguous(&[6]), dtype)
                .unwrap(),
        );
        for op in ops {
            match (ac.binary(&la, &bc, &lb, op), ag.binary(&la, &bg, &lb, op)) {
                (Ok(want), Ok(got)) => assert_match(&format!("{op:?} {dtype}"), &want, &got),
                (Err(_), Err(_)) => {}
                (want, got) => panic!("{op:?} {dtype}: cpu {want:?} vs cuda {got:?}"),
            }
        }
        for op in cmps {
            assert_match(
                &format!("{op:?} {dtype}"),
                &ac.compare(&la, &bc, &lb, op).unwrap(),
                &ag.compare(&la, &bg, &lb, op).unwrap(),
            );
        }
        let cond_c = ac.compare(&la, &bc, &lb, CmpOp::Gt).unwrap();
        let cond_g = ag.compare(&la, &bg, &lb, CmpOp::Gt).unwrap();
        let lc = Layout::contiguous(&[4, 6]);
        assert_match(
            &format!("where {dtype}"),
            &cond_c.where_cond(&lc, &ac, &la, &bc, &lb).unwrap(),
            &cond_g.where_cond(&lc, &ag, &la, &bg, &lb).unwrap(),
        );
    }
}

#[test]
fn reductions_match_cpu_on_every_dim_set() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let ops = [
        ReduceOp::Sum,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::ArgMax,
        ReduceOp::ArgMin,
    ];
    let base = Layout::contiguous(&[3, 5, 7]);
    let layouts = [base.clone(), base.permute(&[2, 0, 1]), base.narrow(2, 2, 4)];
    let dim_sets: [&[usize]; 5] = [&[0], &[1], &[2], &[0, 2], &[0, 1, 2]];
    for dtype in ALL {
        let (c, g) = both(dev, &values(105, dtype));
        for l in &layouts {
            for dims in dim_sets {
                for op in ops {
                    if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) && dims.len() != 1 {
                        continue;
                    }
                    let what = format!("{op:?} {dims:?} {dtype} {l:?}");
                    assert_match(
                        &what,
                        &c.reduce(l, dims, op).unwrap(),
                        &g.reduce(l, dims, op).unwrap(),
                    );
                }
            }
        }
    }
    // A long row (many threads per block, every warp) with a NaN and a repeated maximum.
    let n = 100_000;
    let mut v: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32).collect();
    let (c, g) = both(dev, &CpuStorage::from_vec(v.clone()));
    let l = Layout::contiguous(&[n]);
    for op in ops {
        assert_match(
            &format!("long {op:?}"),
            &c.reduce(&l, &[0], op).unwrap(),
            &g.reduce(&l, &[0], op).unwrap(),
        );
    }
    v[70_001] = f32::NAN;
    v[90_000] = f32::NAN;
    let (c, g) = both(dev, &CpuStorage::from_vec(v));
    for op in ops {
        assert_match(
            &format!("NaN {op:?}"),
            &c.reduce(&l, &[0], op).unwrap(),
            &g.reduce(&l, &[0], op).unwrap(),
        );
    }
}

#[test]
fn softmax_and_log_softmax_match_cpu() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    for dtype in FLOATS {
        let (c, g) = both(dev, &values(3 * 1000, dtype));
        let layouts = [
            Layout::contiguous(&[3, 1000]),
            Layout::contiguous(&[1000, 3]).transpose(0, 1),
            Layout::contiguous(&[30, 100]).narrow(1, 5, 90),
        ];
        for l in &layouts {
            for log in [false, true] {
                assert_match(
                    &format!("softmax log={log} {dtype} {l:?}"),
                    &c.softmax_last_dim(l, log).unwrap(),
                    &g.softmax_last_dim(l, log).unwrap(),
                );
            }
        }
    }
}

#[test]
fn matmul_matches_cpu_for_transposed_broadcast_and_half_operands() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let cases: Vec<(Layout, Layout)> = vec![
        (Layout::contiguous(&[7, 5]), Layout::contiguous(&[5, 3])),
        (
            Layout::contiguous(&[5, 7]).transpose(0, 1),
            Layout::contiguous(&[3, 5]).transpose(0, 1),
        ),
        (
            Layout::contiguous(&[2, 7, 5]),
            Layout::contiguous(&[5, 3])
                .unsqueeze(0)
                .broadcast_to(&[2, 5, 3]),
        ),
        // neither row- nor column-major: copied first
        (
            Layout::new(vec![7, 5], vec![10, 2], 0),
            Layout::contiguous(&[5, 3]),
        ),
        // batch dims that do not flatten
        (
            Layout::contiguous(&[4, 3, 7, 5]).narrow(1, 0, 2),
            Layout::contiguous(&[4, 2, 5, 3]),
        ),
        // k = 0
        (Layout::contiguous(&[3, 0]), Layout::contiguous(&[0, 4])),
    ];
    for dtype in FLOATS {
        for (la, lb) in &cases {
            let (ac, ag) = both(dev, &values(la.required_len().max(1), dtype));
            let (bc, bg) = both(dev, &values(lb.required_len().max(1) + 3, dtype));
            let want = ac.matmul(la, &bc, lb).unwrap();
            let got = ag.matmul(la, &bg, lb).unwrap();
            assert_match(&format!("matmul {dtype} {la:?} {lb:?}"), &want, &got);
        }
    }
    let (ic, ig) = both(dev, &values(4, DType::I64));
    let l = Layout::contiguous(&[2, 2]);
    assert!(ic.matmul(&l, &ic, &l).is_err() && ig.matmul(&l, &ig, &l).is_err());
}

#[test]
fn views_past_the_buffer_are_typed_errors_not_reads() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let g = CudaStorage::from_cpu(dev, &values(10, DType::F32)).unwrap();
    let too_far = Layout::new(vec![4], vec![3], 1);
    assert!(matches!(
        g.unary(&too_far, UnaryOp::Exp),
        Err(kiln_device::Error::LengthMismatch { .. })
    ));
}

/// Issue 18: sizes computed from shapes are checked before anything is allocated or launched.
/// Two empty operands `[2^32, 0] @ [0, 2^32]` make a 2^64-element output (it wrapped to 0), and
/// an output whose byte count passes `isize::MAX` is refused, not wrapped into a small buffer.
#[test]
fn cuda_sizes_that_overflow_are_typed_errors() {
    let Some(dev) = cuda_device_or_skip() else {
        return;
    };
    let g = CudaStorage::from_cpu(dev, &values(4, DType::F32)).unwrap();
    let (la, lb) = (
        Layout::new(vec![1 << 32, 0], vec![0, 1], 0),
        Layout::new(vec![0, 1 << 32], vec![1, 0], 0),
    );
    let e = g.matmul(&la, &g, &lb).unwrap_err();
    assert!(
        matches!(e, kiln_device::Error::SizeOverflow { op: "matmul", .. }),
        "{e}"
    );
    assert!(e.to_string().contains("the output's element count"), "{e}");
    // 2^61 f32 elements are 2^63 bytes: past isize::MAX.
    let e = CudaStorage::full(dev, 1 << 61, 0.0, DType::F32).unwrap_err();
    assert!(matches!(e, kiln_device::Error::SizeOverflow { .. }), "{e}");
}
