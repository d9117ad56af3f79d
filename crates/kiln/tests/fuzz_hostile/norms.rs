//! `batch_norm` (training and evaluation, with or without running statistics, weight and bias)
//! and `layer_norm` values, running-statistics updates and gradients against an f64 reference
//! written from PyTorch 2.15's definitions: random `[N, C, ...]` inputs (rank 2 to 4, an empty
//! batch, one value per channel), momentum and eps (sometimes 0, negative, NaN or huge), f32 or
//! f64.
//!
//! The check: where the reference refuses, kiln must return an error; otherwise the output and
//! the updated running statistics must equal the reference's (NaN or infinite where it is,
//! else f64 1e-9 / f32 1e-4 relative to the largest value), and in f64 the gradients of
//! `Σ G ⊙ output` with respect to the input, weight and bias must equal the reference's central
//! differences where the output is finite.
//!
//! The reference follows kiln where it refuses what PyTorch's functional API takes: a NaN or
//! negative `eps`.

use crate::harness::{refused, run, Outcome, Rng};
use crate::numeric::{assert_close, float_tensor, round_to, upstream};
use kiln::autograd::{BatchNormOptions, Device, Tensor};

#[derive(Debug, Clone)]
pub struct NormCase {
    layer: bool,
    f32: bool,
    shape: Vec<usize>,
    x: Vec<f64>,
    /// `layer_norm`: how many trailing dims are normalised.
    trailing: usize,
    weight: Option<Vec<f64>>,
    bias: Option<Vec<f64>>,
    /// `batch_norm`: running mean and variance.
    running: Option<(Vec<f64>, Vec<f64>)>,
    training: bool,
    momentum: f64,
    eps: f64,
}

/// Output, then (batch norm, training) the running statistics after the update.
type Expected = (Vec<f64>, Option<(Vec<f64>, Vec<f64>)>);

/// Mean and biased variance of `v`.
fn moments(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    (
        mean,
        v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n,
    )
}

fn batch_norm(case: &NormCase) -> Option<Expected> {
    let c = case.shape[1];
    let inner: usize = case.shape[2..].iter().product();
    let m = case.shape[0] * inner;
    if case.eps.is_nan() || case.eps < 0.0 || (!case.training && case.running.is_none()) {
        return None;
    }
    // PyTorch passes an input with no elements through, leaving the running statistics alone;
    // "Expected more than 1 value per channel when training" for one value.
    if case.training && case.x.is_empty() {
        return Some((Vec::new(), case.running.clone()));
    }
    if case.training && m < 2 {
        return None;
    }
    let idx = |n: usize, ch: usize, i: usize| (n * c + ch) * inner + i;
    let mut out = vec![0.0; case.x.len()];
    let mut running = case.running.clone();
    for ch in 0..c {
        let vals: Vec<f64> = (0..case.shape[0])
            .flat_map(|n| (0..inner).map(move |i| (n, i)))
            .map(|(n, i)| case.x[idx(n, ch, i)])
            .collect();
        let (mean, var) = match (case.training, &case.running) {
            (true, _) => moments(&vals),
            (false, Some((rm, rv))) => (rm[ch], rv[ch]),
            (false, None) => unreachable!("refused above"),
        };
        if case.training {
            if let Some((rm, rv)) = running.as_mut() {
                let unbiased = var * m as f64 / (m as f64 - 1.0);
                rm[ch] = (1.0 - case.momentum) * rm[ch] + case.momentum * mean;
                rv[ch] = (1.0 - case.momentum) * rv[ch] + case.momentum * unbiased;
            }
        }
        let rstd = 1.0 / (var + case.eps).sqrt();
        let w = case.weight.as_ref().map_or(1.0, |w| w[ch]);
        let b = case.bias.as_ref().map_or(0.0, |b| b[ch]);
        for (n, i) in (0..case.shape[0]).flat_map(|n| (0..inner).map(move |i| (n, i))) {
            let k = idx(n, ch, i);
            out[k] = (case.x[k] - mean) * rstd * w + b;
        }
    }
    let running = running.filter(|_| case.training);
    Some((out, running))
}

fn layer_norm(case: &NormCase) -> Option<Expected> {
    let r = case.shape.len();
    if case.trailing == 0 || case.trailing > r || case.eps.is_nan() || case.eps < 0.0 {
        return None;
    }
    let size: usize = case.shape[r - case.trailing..].iter().product();
    let mut out = vec![0.0; case.x.len()];
    if size == 0 {
        return Some((out, None));
    }
    for (row, chunk) in case.x.chunks(size).enumerate() {
        let (mean, var) = moments(chunk);
        let rstd = 1.0 / (var + case.eps).sqrt();
        for (j, &x) in chunk.iter().enumerate() {
            let w = case.weight.as_ref().map_or(1.0, |w| w[j]);
            let b = case.bias.as_ref().map_or(0.0, |b| b[j]);
            out[row * size + j] = (x - mean) * rstd * w + b;
        }
    }
    Some((out, None))
}

fn expected(case: &NormCase) -> Option<Expected> {
    match case.layer {
        true => layer_norm(case),
        false => batch_norm(case),
    }
}

fn generate(rng: &mut Rng) -> NormCase {
    let f32 = rng.chance(0.4);
    let rank = 2 + rng.below(3);
    let shape: Vec<usize> = (0..rank)
        .map(|d| match (d, rng.below(20)) {
            (0, 0) => 0,
            (0, 1..=3) => 1,
            _ => 1 + rng.below(4),
        })
        .collect();
    let value = |rng: &mut Rng, lo: f64, hi: f64| {
        round_to(
            f32,
            lo + (hi - lo) * rng.below(1 << 20) as f64 / (1 << 20) as f64,
        )
    };
    let n: usize = shape.iter().product();
    // Sometimes one value repeated (zero variance), as after a dead ReLU.
    let constant = rng.chance(0.05);
    let x = (0..n)
        .map(|_| if constant { 0.5 } else { value(rng, -2.0, 2.0) })
        .collect();
    let layer = rng.chance(0.4);
    let trailing = if rng.chance(0.05) {
        rng.pick(&[0, rank + 1])
    } else {
        1 + rng.below(rank)
    };
    let params = match layer {
        true => shape[rank - trailing.clamp(1, rank)..].iter().product(),
        false => shape[1],
    };
    let hostile = [0.0, -1e-3, f64::NAN, 1e6];
    let eps = match rng.chance(0.9) {
        true => rng.pick(&[1e-5, 1e-3, 0.1]),
        false => rng.pick(&hostile),
    };
    let momentum = match rng.chance(0.9) {
        true => rng.pick(&[0.1, 0.5, 1.0, 0.0]),
        false => rng.pick(&[-0.5, 2.0, f64::NAN]),
    };
    let weight = rng
        .chance(0.7)
        .then(|| (0..params).map(|_| value(rng, -2.0, 2.0)).collect());
    let bias = rng
        .chance(0.7)
        .then(|| (0..params).map(|_| value(rng, -1.0, 1.0)).collect());
    let running = (!layer && rng.chance(0.7)).then(|| {
        let mean = (0..params).map(|_| value(rng, -1.0, 1.0)).collect();
        let var = (0..params).map(|_| value(rng, 0.1, 2.0)).collect();
        (mean, var)
    });
    NormCase {
        layer,
        f32,
        shape,
        x,
        trailing,
        weight,
        bias,
        running,
        training: rng.chance(0.7),
        momentum,
        eps,
    }
}

/// The case's op on kiln tensors; the output and the running statistics it updated.
fn call(
    case: &NormCase,
    x: &Tensor,
    params: &[Option<Tensor>; 2],
) -> (kiln::autograd::Result<Tensor>, Option<[Tensor; 2]>) {
    let [w, b] = params;
    if case.layer {
        let r = case.shape.len();
        // Invalid counts become an empty shape, or one longer than the input.
        let normalized: Vec<usize> = match case.trailing {
            0 => vec![],
            t if t > r => [vec![1], case.shape.clone()].concat(),
            t => case.shape[r - t..].to_vec(),
        };
        return (
            x.layer_norm(&normalized, w.as_ref(), b.as_ref(), case.eps),
            None,
        );
    }
    let running = case.running.as_ref().map(|(m, v)| {
        let c = [case.shape[1]];
        [
            float_tensor(m, &c, case.f32, false),
            float_tensor(v, &c, case.f32, false),
        ]
    });
    let options = BatchNormOptions {
        training: case.training,
        momentum: case.momentum,
        eps: case.eps,
    };
    let [rm, rv] = match &running {
        Some([m, v]) => [Some(m), Some(v)],
        None => [None, None],
    };
    (
        x.batch_norm(rm, rv, w.as_ref(), b.as_ref(), options),
        running,
    )
}

/// The reference's d(Σ G ⊙ output)/d(operand), by central differences.
fn differences(case: &NormCase, which: usize) -> Vec<f64> {
    let len = match which {
        0 => case.x.len(),
        1 => case.weight.as_ref().map_or(0, Vec::len),
        _ => case.bias.as_ref().map_or(0, Vec::len),
    };
    let h = 1e-6;
    (0..len)
        .map(|k| {
            let at = |delta: f64| {
                let mut c = case.clone();
                match which {
                    0 => c.x[k] += delta,
                    1 => c.weight.as_mut().unwrap()[k] += delta,
                    _ => c.bias.as_mut().unwrap()[k] += delta,
                }
                let (out, _) = expected(&c).expect("a valid call stays valid");
                out.iter()
                    .enumerate()
                    .map(|(i, v)| upstream(i) * v)
                    .sum::<f64>()
            };
            (at(h) - at(-h)) / (2.0 * h)
        })
        .collect()
}

fn check(case: &NormCase) -> Outcome {
    let want = expected(case);
    let params_shape = match case.layer {
        true => case.shape[case.shape.len() - case.trailing.clamp(1, case.shape.len())..].to_vec(),
        false => vec![case.shape[1]],
    };
    let x = float_tensor(&case.x, &case.shape, case.f32, true);
    let params = [&case.weight, &case.bias].map(|p| {
        p.as_ref()
            .map(|v| float_tensor(v, &params_shape, case.f32, true))
    });
    let (got, running) = call(case, &x, &params);
    let (out, want) = match (want, got) {
        (None, Err(e)) => return refused(e),
        (None, Ok(t)) => panic!("the reference refuses; kiln gave {:?}", t.shape()),
        (Some(_), Err(e)) => panic!("kiln refused a valid call: {e}"),
        (Some(w), Ok(t)) => (t, w),
    };
    assert_eq!(out.shape(), &case.shape[..], "output shape");
    let tol = if case.f32 { 1e-4 } else { 1e-9 };
    assert_close("output", &out.to_vec_f64().unwrap(), &want.0, tol);
    if let (Some([m, v]), Some((wm, wv))) = (&running, &want.1) {
        assert_close("running_mean", &m.to_vec_f64().unwrap(), wm, tol);
        assert_close("running_var", &v.to_vec_f64().unwrap(), wv, tol);
    }
    let g: Vec<f64> = (0..out.numel()).map(upstream).collect();
    let g = Tensor::from_vec(g, out.shape(), Device::Cpu)
        .unwrap()
        .to_dtype(out.dtype())
        .unwrap();
    out.mul(&g)
        .and_then(|l| l.sum_all())
        .and_then(|l| l.backward())
        .expect("backward");
    // Central differences in f64 where every output is finite and the variance is not so
    // small that a step of 1e-6 changes the normalisation's scale by much.
    let varied = case.x.iter().any(|&v| v != case.x[0]);
    let moderate =
        varied && (1e-5..=1.0).contains(&case.eps) && want.0.iter().all(|v| v.is_finite());
    if case.f32 || !moderate {
        return Outcome::Accepted;
    }
    let operands = [Some(&x), params[0].as_ref(), params[1].as_ref()];
    for (which, t) in operands.into_iter().enumerate() {
        let Some(t) = t else { continue };
        let got = t.grad().expect("a gradient").to_vec_f64().unwrap();
        for (k, (&g, &f)) in got.iter().zip(&differences(case, which)).enumerate() {
            let ok = (g - f).abs() <= 1e-5 * (1.0 + f.abs());
            assert!(
                ok,
                "gradient of operand {which} [{k}]: kiln {g}, differences {f}"
            );
        }
    }
    Outcome::Accepted
}

/// The normalisation fuzz target.
pub fn norm_calls(seed: u64, cases: usize) {
    run(
        "batch_norm and layer_norm vs an f64 reference",
        seed,
        cases,
        generate,
        check,
    );
}
