//! Tests of the CPU multi-tensor kernels: norms against naive sums, bitwise determinism for
//! any thread count, batching, half-precision accumulation, NaN/inf propagation, in-place ops,
//! and Adam and SGD steps over tensors cut into chunks.

use super::*;
use crate::ops::multi_tensor::{AdamStepScalars, MultiTensorOps};
use crate::Layout;

fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        })
        .collect()
}

/// Values that exercise every rounding case of the optimizer steps: ordinary, tiny (subnormal
/// squares), huge (overflowing squares), zero, negative zero, infinities and NaN.
pub(super) fn special_values(seed: u32, n: usize) -> Vec<f32> {
    let special = [
        0.0,
        -0.0,
        1e-30,
        -3e-39,
        3e38,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if i % 37 == 0 {
                special[(x as usize) % special.len()]
            } else {
                (x as f32 / u32::MAX as f32 - 0.5) * 2f32.powi((x % 24) as i32 - 12)
            }
        })
        .collect()
}

/// The bits of `s` with every NaN as one pattern: which operand's NaN an instruction passes on
/// (its sign and payload) may differ between the scalar and the vector code of the same loop.
pub(super) fn canonical_bits(s: &[f32]) -> Vec<u32> {
    s.iter()
        .map(|f| {
            if f.is_nan() {
                f32::NAN.to_bits()
            } else {
                f.to_bits()
            }
        })
        .collect()
}

fn naive_norm(xs: &[f64], p: f64) -> f64 {
    xs.iter()
        .map(|x| x.abs().powf(p))
        .sum::<f64>()
        .powf(1.0 / p)
}

#[test]
fn norms_match_a_naive_sum_for_every_kind_and_odd_lengths() {
    let lens = [0usize, 1, 7, 9, 65_537, 200_003];
    let data: Vec<Vec<f32>> = lens.iter().map(|&n| pseudo_random(n, n as u64)).collect();
    let views: Vec<FloatSlice> = data.iter().map(|d| FloatSlice::F32(d)).collect();
    for p in [1.0, 2.0, 3.0, 0.5] {
        let kind = NormKind::from_norm_type(p).unwrap();
        let got = per_tensor_norms(&views, kind);
        for (d, g) in data.iter().zip(&got) {
            let wide: Vec<f64> = d.iter().map(|&x| f64::from(x)).collect();
            let want = naive_norm(&wide, p);
            // p = 1, 2 on f32 square and sum 16 terms per f32 lane before widening: f32 accuracy.
            let tol = if p == 1.0 || p == 2.0 { 2e-7 } else { 1e-12 };
            assert!(
                (g - want).abs() <= tol * want.max(1.0),
                "p={p}: {g} vs {want}"
            );
        }
    }
    let inf = per_tensor_norms(&views, NormKind::Inf);
    for (d, g) in data.iter().zip(&inf) {
        let want = d.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert_eq!(*g, f64::from(want));
    }
    let zero = per_tensor_norms(&[FloatSlice::F32(&[0.0, 1.0, -0.0, 2.0])], NormKind::Zero);
    assert_eq!(zero, vec![2.0]);
    let ninf = per_tensor_norms(&[FloatSlice::F32(&[3.0, -1.0, 2.0])], NormKind::NegInf);
    assert_eq!(ninf, vec![1.0]);
}

#[test]
fn result_is_bitwise_identical_for_any_thread_count() {
    let data: Vec<Vec<f32>> = (0..40)
        .map(|i| pseudo_random(1000 + i * 37_001, i as u64))
        .collect();
    let views: Vec<FloatSlice> = data.iter().map(|d| FloatSlice::F32(d)).collect();
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| per_tensor_norms(&views, NormKind::Two))
    };
    let one = run(1);
    for threads in [2, 3, 7] {
        let many = run(threads);
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&one), bits(&many), "{threads} threads");
    }
}

#[test]
fn batches_cover_every_item_once() {
    let r = batch_ranges([5usize, 1, 1, 9, 2, 2].into_iter(), 6);
    assert_eq!(r, vec![0..2, 2..4, 4..6]);
    assert!(batch_ranges(std::iter::empty(), 6).is_empty());
    assert_eq!(batch_ranges([100usize].into_iter(), 6), vec![0..1]);
}

#[test]
fn half_types_accumulate_wide() {
    // 70,000 ones: an f16 accumulator would stop at 2048; the norm must be sqrt(70000).
    let h = vec![f16::ONE; 70_000];
    let b = vec![bf16::ONE; 70_000];
    let norms = per_tensor_norms(&[FloatSlice::F16(&h), FloatSlice::BF16(&b)], NormKind::Two);
    assert_eq!(norms, vec![70_000f64.sqrt(); 2]);
    // f16 values whose squares overflow f16 (300^2 > 65504) still give a finite norm.
    let big = vec![f16::from_f32(300.0); 4];
    assert_eq!(
        per_tensor_norms(&[FloatSlice::F16(&big)], NormKind::Two),
        vec![600.0]
    );
}

#[test]
fn nan_and_inf_propagate_like_pytorch() {
    let with_nan = [1.0f32, f32::NAN, 5.0];
    let with_inf = [1.0f32, f32::INFINITY];
    for kind in [
        NormKind::One,
        NormKind::Two,
        NormKind::Inf,
        NormKind::P(3.0),
    ] {
        assert!(per_tensor_norms(&[FloatSlice::F32(&with_nan)], kind)[0].is_nan());
        assert_eq!(
            per_tensor_norms(&[FloatSlice::F32(&with_inf)], kind)[0],
            f64::INFINITY
        );
    }
}

#[test]
fn scale_clamp_and_unscale_touch_every_element_once() {
    let mut a = pseudo_random(100_001, 3);
    let mut h: Vec<f16> = (0..5).map(|i| f16::from_f32(i as f32)).collect();
    let mut e: Vec<f64> = vec![];
    let a0 = a.clone();
    scale_(
        vec![
            FloatSliceMut::F32(&mut a),
            FloatSliceMut::F16(&mut h),
            FloatSliceMut::F64(&mut e),
        ],
        0.5,
    );
    assert!(a.iter().zip(&a0).all(|(x, y)| *x == y * 0.5));
    assert_eq!(h[3], f16::from_f32(1.5));
    clamp_(vec![FloatSliceMut::F32(&mut a)], 0.25);
    assert!(a
        .iter()
        .zip(&a0)
        .all(|(x, y)| *x == (y * 0.5).clamp(-0.25, 0.25)));
    let mut g = vec![2.0f32, 4.0];
    let mut bad = vec![bf16::from_f32(8.0), bf16::INFINITY];
    assert!(!unscale_and_check_(vec![FloatSliceMut::F32(&mut g)], 0.5));
    assert_eq!(g, vec![1.0, 2.0]);
    assert!(unscale_and_check_(
        vec![FloatSliceMut::F32(&mut g), FloatSliceMut::BF16(&mut bad)],
        0.5
    ));
    assert_eq!(bad[0], bf16::from_f32(4.0));
    // Finite before, infinite after (a scale below 1): flagged, in f32 and in f16.
    let mut big = vec![f32::MAX, 1.0];
    let mut half = vec![f16::from_f32(60000.0)];
    assert!(unscale_and_check_(vec![FloatSliceMut::F32(&mut big)], 2.0));
    assert!(unscale_and_check_(vec![FloatSliceMut::F16(&mut half)], 2.0));
    assert_eq!((big[0], half[0]), (f32::INFINITY, f16::INFINITY));
    assert_eq!(clip_coef(2.0, 1.0), 1.0);
}

/// The `f32` sums and the scale map give the same bits on the portable build and on every
/// instruction set this CPU has, at lengths around the lane count and the sub-block, and a
/// slice shorter than the lanes (one padded row) sums as it does padded by hand.
#[test]
fn every_instruction_set_gives_the_same_bits() {
    let isas: Vec<Option<crate::ops::simd::Isa>> = std::iter::once(None)
        .chain(crate::ops::simd::available().into_iter().map(Some))
        .collect();
    for n in [0usize, 1, 5, 63, 64, 65, 1023, 1024, 1025, 5000] {
        let data = pseudo_random(n, 7 + n as u64);
        for isa in &isas {
            assert_eq!(
                sum_f32_lanes::<true>(*isa, &data).to_bits(),
                sum_f32_body::<true>(&data).to_bits(),
                "squares, {n} elements, {isa:?}"
            );
            assert_eq!(
                sum_f32_lanes::<false>(*isa, &data).to_bits(),
                sum_f32_body::<false>(&data).to_bits(),
                "absolute values, {n} elements, {isa:?}"
            );
            let mut scaled = data.clone();
            map_f32(*isa, &Scale(0.3, 0.3), &mut scaled);
            assert!(scaled.iter().zip(&data).all(|(s, x)| *s == x * 0.3f32));
        }
    }
    // 63 elements are one padded row; padded with a zero by hand they are one full row.
    let short = pseudo_random(63, 11);
    let mut padded = short.clone();
    padded.push(0.0);
    assert_eq!(
        sum_f32_body::<true>(&short).to_bits(),
        sum_f32_body::<true>(&padded).to_bits()
    );
    if crate::ops::simd::available().is_empty() {
        eprintln!("only the portable build is checked: no AVX-512F or AVX2 + FMA here");
    }
}

/// The documented order, written as plainly as possible: per sub-block of 1,024 elements,
/// element `j` into `f32` lane `j % 64`, lane `i` into `f64` sum `i % 8` in lane order, the
/// eight sums in a tree, the sub-blocks' trees added in order. The vector body (its padded
/// last row, its row-wise fold) must give these bits.
#[test]
fn the_sum_follows_the_documented_order() {
    fn reference(s: &[f32], square: bool) -> f64 {
        let term = |x: f32| if square { x * x } else { x.abs() };
        let mut total = 0f64;
        for block in s.chunks(1024) {
            let mut acc = [0f32; 64];
            for (j, x) in block.iter().enumerate() {
                acc[j % 64] += term(*x);
            }
            let mut f = [0f64; 8];
            for (i, a) in acc.iter().enumerate() {
                f[i % 8] += f64::from(*a);
            }
            total += ((f[0] + f[1]) + (f[2] + f[3])) + ((f[4] + f[5]) + (f[6] + f[7]));
        }
        total
    }
    for n in [5usize, 63, 64, 100, 1000, 1024, 1090, 2047, 4100] {
        // Magnitudes from 2^-30 to 2^29, so that the f64 additions round and their order shows.
        let data: Vec<f32> = pseudo_random(n, 3 + n as u64)
            .iter()
            .enumerate()
            .map(|(j, x)| x * 2f32.powi((j * 37 % 60) as i32 - 30))
            .collect();
        assert_eq!(
            sum_f32_body::<true>(&data).to_bits(),
            reference(&data, true).to_bits(),
            "squares, {n} elements"
        );
        assert_eq!(
            sum_f32_body::<false>(&data).to_bits(),
            reference(&data, false).to_bits(),
            "absolute values, {n} elements"
        );
    }
}

/// One Adam (amsgrad, decoupled decay) and one SGD (momentum, Nesterov) step over `lens`-long
/// `f32` tensors cut from the same data, in list order; returns every buffer, concatenated.
fn steps_over(lens: &[usize], data: &[Vec<f32>; 5]) -> Vec<Vec<f32>> {
    let cut = |v: &[f32]| -> Vec<CpuStorage> {
        let mut at = 0;
        lens.iter()
            .map(|&n| {
                at += n;
                CpuStorage::from_vec(v[at - n..at].to_vec())
            })
            .collect()
    };
    let [p, g, m, v, x] = data;
    let (mut p, g, mut m, mut v, mut x) = (cut(p), cut(g), cut(m), cut(v), cut(x));
    let layouts: Vec<Layout> = lens.iter().map(|&n| Layout::contiguous(&[n])).collect();
    let scalars = AdamStepScalars {
        step_size: 1e-3 / (1.0 - 0.9f64.powi(3)),
        bias_correction2_sqrt: (1.0 - 0.999f64.powi(3)).sqrt(),
    };
    let mut adam: Vec<AdamOperands<'_, CpuStorage>> = (p.iter_mut().zip(&g).zip(&mut m))
        .zip(v.iter_mut().zip(&mut x))
        .zip(&layouts)
        .map(|((((p, g), m), (v, x)), l)| AdamOperands {
            param: (p, l),
            grad: (g, l),
            exp_avg: (m, l),
            exp_avg_sq: (v, l),
            max_exp_avg_sq: Some((x, l)),
            scalars,
        })
        .collect();
    let hyper = AdamHyper {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        decoupled: true,
        maximize: false,
        grad_scale: 0.75,
    };
    CpuStorage::adam_step("AdamW", &mut adam, &hyper).unwrap();
    drop(adam);
    // SGD moves the parameters again, with the first moments as its momentum buffers.
    let mut sgd: Vec<SgdOperands<'_, CpuStorage>> = (p.iter_mut().zip(&g).zip(&mut m))
        .zip(&layouts)
        .map(|(((p, g), m), l)| SgdOperands {
            param: (p, l),
            grad: (g, l),
            momentum_buffer: Some((m, l)),
            first_momentum_step: false,
        })
        .collect();
    let hyper = SgdHyper {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.1,
        weight_decay: 1e-4,
        nesterov: true,
        maximize: false,
        grad_scale: 0.5,
    };
    CpuStorage::sgd_step("SGD", &mut sgd, &hyper).unwrap();
    drop(sgd);
    [p, m, v, x]
        .iter()
        .map(|list| {
            list.iter()
                .flat_map(|s| s.to_vec::<f32>().unwrap())
                .collect()
        })
        .collect()
}

/// A tensor longer than a chunk is cut into `CHUNK_ELEMS` pieces whose parameter, gradient and
/// state slices must stay aligned: the same data as tensors that each fit one chunk updates to
/// the same bits, element for element.
#[test]
fn long_tensors_cut_into_chunks_update_as_tensors_of_one_chunk() {
    let long = 2 * CHUNK_ELEMS + 1_001;
    let total = 3 + long + 5;
    let data: [Vec<f32>; 5] = [
        pseudo_random(total, 1),
        pseudo_random(total, 2),
        pseudo_random(total, 3),
        pseudo_random(total, 4).iter().map(|v| v * v).collect(),
        pseudo_random(total, 5).iter().map(|v| v * v).collect(),
    ];
    let chunked = steps_over(&[3, long, 5], &data);
    let short = CHUNK_ELEMS / 2;
    let pieces = [3, short, short, short, short, long - 4 * short, 5];
    assert!(pieces.iter().all(|&n| n <= CHUNK_ELEMS));
    assert_eq!(pieces.iter().sum::<usize>(), total);
    let whole = steps_over(&pieces, &data);
    for (name, (a, b)) in ["param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"]
        .iter()
        .zip(chunked.iter().zip(&whole))
    {
        let first_diff = a
            .iter()
            .zip(b)
            .position(|(x, y)| x.to_bits() != y.to_bits());
        assert_eq!(first_diff, None, "{name}");
    }
    // And the step moved every parameter.
    assert!(chunked[0].iter().zip(&data[0]).all(|(a, b)| a != b));
}

/// A list of f32 and f64 parameters steps each parameter as a list of its dtype alone would
/// (an all-f32 or all-f64 list goes to its pass as it is, a mixed one is split by dtype), and
/// a parameter of another dtype is refused by name of the op.
#[test]
fn mixed_dtype_lists_step_each_parameter_as_its_own_dtype_would() {
    let layout = Layout::contiguous(&[7]);
    let f32s = |seed| CpuStorage::from_vec(pseudo_random(7, seed));
    let f64s = |seed| {
        CpuStorage::from_vec(
            pseudo_random(7, seed)
                .iter()
                .map(|&v| f64::from(v))
                .collect(),
        )
    };
    let hyper = SgdHyper {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.0,
        weight_decay: 1e-2,
        nesterov: false,
        maximize: false,
        grad_scale: 1.0,
    };
    // (param, grad, buffer) per parameter, f32 ones at even places and f64 ones at odd places.
    let make = || -> Vec<[CpuStorage; 3]> {
        (0..4u64)
            .map(|i| {
                if i.is_multiple_of(2) {
                    [f32s(i), f32s(10 + i), f32s(20 + i)]
                } else {
                    [f64s(i), f64s(10 + i), f64s(20 + i)]
                }
            })
            .collect()
    };
    let step = |bufs: &mut [[CpuStorage; 3]]| {
        let mut list: Vec<SgdOperands<'_, CpuStorage>> = bufs
            .iter_mut()
            .map(|[p, g, b]| SgdOperands {
                param: (p, &layout),
                grad: (&*g, &layout),
                momentum_buffer: Some((b, &layout)),
                first_momentum_step: false,
            })
            .collect();
        CpuStorage::sgd_step("SGD", &mut list, &hyper)
    };
    let mut mixed = make();
    step(&mut mixed).unwrap();
    let mut alone = make();
    for one in alone.chunks_mut(1) {
        step(one).unwrap();
    }
    for (m, a) in mixed.iter().zip(&alone) {
        assert_eq!(m[0], a[0]);
        assert_eq!(m[2], a[2]);
    }
    // The same for Adam, with the moments as state.
    let adam = |bufs: &mut [[CpuStorage; 3]], v: &mut [CpuStorage]| {
        let scalars = AdamStepScalars {
            step_size: 1e-3,
            bias_correction2_sqrt: 0.5,
        };
        let mut list: Vec<AdamOperands<'_, CpuStorage>> = bufs
            .iter_mut()
            .zip(v.iter_mut())
            .map(|([p, g, m], v)| AdamOperands {
                param: (p, &layout),
                grad: (&*g, &layout),
                exp_avg: (m, &layout),
                exp_avg_sq: (v, &layout),
                max_exp_avg_sq: None,
                scalars,
            })
            .collect();
        let hyper = AdamHyper {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decoupled: true,
            maximize: false,
            grad_scale: 1.0,
        };
        CpuStorage::adam_step("AdamW", &mut list, &hyper)
    };
    let squares = |i: u64| {
        if i.is_multiple_of(2) {
            CpuStorage::from_vec(vec![0.25f32; 7])
        } else {
            CpuStorage::from_vec(vec![0.25f64; 7])
        }
    };
    let (mut mixed, mut mixed_v) = (make(), (0..4).map(squares).collect::<Vec<_>>());
    adam(&mut mixed, &mut mixed_v).unwrap();
    let (mut alone, mut alone_v) = (make(), (0..4).map(squares).collect::<Vec<_>>());
    for (one, v) in alone.chunks_mut(1).zip(alone_v.chunks_mut(1)) {
        adam(one, v).unwrap();
    }
    assert_eq!((mixed, mixed_v), (alone, alone_v));
    // Half-precision parameters are refused, alone or in a list.
    let mut half = vec![[
        CpuStorage::from_vec(vec![half::f16::ONE; 7]),
        CpuStorage::from_vec(vec![half::f16::ONE; 7]),
        CpuStorage::from_vec(vec![half::f16::ONE; 7]),
    ]];
    assert!(matches!(
        step(&mut half),
        Err(Error::UnsupportedDType { op: "SGD", .. })
    ));
}

/// A parameter whose layout claims far more elements than its buffer holds is a typed error of
/// the step, never a huge reservation or a panic.
#[test]
fn a_layout_past_its_buffer_is_an_error_not_a_reservation() {
    let huge = Layout::new(vec![1 << 60], vec![1], 0);
    let (mut p, g, mut b) = (
        CpuStorage::from_vec(vec![1f32; 2]),
        CpuStorage::from_vec(vec![1f32; 2]),
        CpuStorage::from_vec(vec![1f32; 2]),
    );
    let mut list = [SgdOperands {
        param: (&mut p, &huge),
        grad: (&g, &huge),
        momentum_buffer: Some((&mut b, &huge)),
        first_momentum_step: false,
    }];
    let hyper = SgdHyper {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.0,
        weight_decay: 0.0,
        nesterov: false,
        maximize: false,
        grad_scale: 1.0,
    };
    let err = CpuStorage::sgd_step("SGD", &mut list, &hyper).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Kernel(crate::ops::KernelError::BufferLength { .. })
        ),
        "{err}"
    );
}
