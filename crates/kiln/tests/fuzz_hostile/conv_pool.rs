//! `conv2d`, `max_pool2d`, `avg_pool2d` and `adaptive_avg_pool2d` values and gradients against
//! naive f64 loops written from PyTorch 2.15's definitions: random geometry (kernel, stride,
//! padding, dilation, groups, `ceil_mode`, `count_include_pad`, a divisor override, output
//! sizes; sometimes invalid), random `[N, C, H, W]` inputs (an empty batch, sides up to 12 so
//! the CPU kernels' size-specific paths run), f32 or f64.
//!
//! The check: where the reference refuses, kiln must return an error; otherwise kiln's output
//! must equal the reference's, and the gradients of `Σ G ⊙ output` (a fixed varied `G`) with
//! respect to the input, the weight and the bias must equal the reference's adjoint loops
//! (f64 1e-10, f32 1e-4 relative to the largest term). Max pooling sends each window's gradient
//! to its first maximum in scan order (a NaN wins), as PyTorch does.
//!
//! Where kiln refuses what PyTorch accepts, the reference says so: a max-pooling window that
//! covers only padding (PyTorch returns -inf there); an adaptive output side of 0 (PyTorch
//! returns an empty tensor). An input plane with a zero side is refused by both.

use crate::harness::{refused, run, Outcome, Rng};
use crate::numeric::{assert_close, float_tensor, upstream};
use kiln::autograd::{AvgPool2dParams, Conv2dParams, Device, MaxPool2dParams, Tensor};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Conv {
        out_ch: usize,
        groups: usize,
        weight_in: usize,
        bias: bool,
    },
    Max {
        ceil: bool,
    },
    Avg {
        ceil: bool,
        count_include_pad: bool,
        divisor: Option<usize>,
    },
    Adaptive {
        out: [usize; 2],
    },
}

#[derive(Debug, Clone)]
pub struct ConvPoolCase {
    kind: Kind,
    f32: bool,
    input: [usize; 4],
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    x: Vec<f64>,
    w: Vec<f64>,
    b: Vec<f64>,
}

/// The reference's output and the gradients of `Σ G ⊙ output` (input, weight, bias).
struct Reference {
    shape: [usize; 4],
    out: Vec<f64>,
    gx: Vec<f64>,
    gw: Vec<f64>,
    gb: Vec<f64>,
}

/// PyTorch's pooling output side (`pooling_output_shape`, floor division of a signed
/// numerator: in `ceil_mode` a kernel longer than the padded input still gives one window), or
/// `None` where it raises ("Output size is too small").
fn pool_side(side: usize, k: usize, s: usize, p: usize, d: usize, ceil: bool) -> Option<usize> {
    let (side, k, s, p, d) = (side as i64, k as i64, s as i64, p as i64, d as i64);
    let num = side + 2 * p - d * (k - 1) - 1 + if ceil { s - 1 } else { 0 };
    let mut out = num.div_euclid(s) + 1;
    if ceil && (out - 1) * s >= side + p {
        out -= 1;
    }
    usize::try_from(out).ok().filter(|&o| o >= 1)
}

/// `x[n, c, h, w]` flat offset.
fn at(shape: [usize; 4], n: usize, c: usize, h: usize, w: usize) -> usize {
    ((n * shape[1] + c) * shape[2] + h) * shape[3] + w
}

/// The input row/column of tap `k` of output position `o`, if inside the input.
fn tap(o: usize, k: usize, s: usize, p: usize, d: usize, side: usize) -> Option<usize> {
    (o * s + k * d).checked_sub(p).filter(|&i| i < side)
}

fn conv(case: &ConvPoolCase, out_ch: usize, groups: usize, weight_in: usize) -> Option<Reference> {
    let [n, c, h, w] = case.input;
    let ([kh, kw], [sh, sw], [ph, pw], [dh, dw]) =
        (case.kernel, case.stride, case.padding, case.dilation);
    let fits = |side: usize, k: usize, p: usize, d: usize| side + 2 * p > d * (k - 1);
    let valid = groups >= 1
        && c.is_multiple_of(groups)
        && out_ch.is_multiple_of(groups)
        && weight_in == c / groups
        && fits(h, kh, ph, dh)
        && fits(w, kw, pw, dw);
    if !valid {
        return None;
    }
    let (oh, ow) = (
        (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1,
        (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1,
    );
    let shape = [n, out_ch, oh, ow];
    let wshape = [out_ch, weight_in, kh, kw];
    let mut r = Reference {
        shape,
        out: vec![0.0; n * out_ch * oh * ow],
        gx: vec![0.0; case.x.len()],
        gw: vec![0.0; case.w.len()],
        gb: vec![0.0; case.b.len()],
    };
    let per_group = out_ch / groups;
    for (ni, co, y, z) in (0..n).flat_map(|a| {
        (0..out_ch).flat_map(move |b| (0..oh).flat_map(move |y| (0..ow).map(move |z| (a, b, y, z))))
    }) {
        let o = at(shape, ni, co, y, z);
        let g = upstream(o);
        let mut acc = case.b.get(co).copied().unwrap_or(0.0);
        if !case.b.is_empty() {
            r.gb[co] += g;
        }
        for ci in 0..weight_in {
            let cin = co / per_group * weight_in + ci;
            for (a, b) in (0..kh).flat_map(|a| (0..kw).map(move |b| (a, b))) {
                let (Some(iy), Some(ix)) = (tap(y, a, sh, ph, dh, h), tap(z, b, sw, pw, dw, w))
                else {
                    continue;
                };
                let (xi, wi) = (at(case.input, ni, cin, iy, ix), at(wshape, co, ci, a, b));
                acc += case.x[xi] * case.w[wi];
                r.gx[xi] += g * case.w[wi];
                r.gw[wi] += g * case.x[xi];
            }
        }
        r.out[o] = acc;
    }
    Some(r)
}

/// Max, average or adaptive average pooling.
fn pool(case: &ConvPoolCase) -> Option<Reference> {
    let [n, c, h, w] = case.input;
    let ([kh, kw], [sh, sw], [ph, pw], [dh, dw]) =
        (case.kernel, case.stride, case.padding, case.dilation);
    let (oh, ow) = match case.kind {
        Kind::Adaptive { out } => (out[0], out[1]),
        Kind::Max { ceil } | Kind::Avg { ceil, .. } => {
            if ph > kh / 2 || pw > kw / 2 {
                return None;
            }
            (
                pool_side(h, kh, sh, ph, dh, ceil)?,
                pool_side(w, kw, sw, pw, dw, ceil)?,
            )
        }
        Kind::Conv { .. } => unreachable!("not a pooling"),
    };
    match case.kind {
        Kind::Avg {
            divisor: Some(0), ..
        } => return None,
        // kiln refuses an adaptive output side of 0 (PyTorch returns an empty tensor).
        Kind::Adaptive { out } if out.contains(&0) => return None,
        // A max-pooling window of padding only along either axis is refused, whatever N is.
        Kind::Max { .. } => {
            let covers = |o: usize, k: usize, s: usize, p: usize, d: usize, side: usize| {
                (0..k).any(|t| tap(o, t, s, p, d, side).is_some())
            };
            let rows = (0..oh).all(|y| covers(y, kh, sh, ph, dh, h));
            if !rows || !(0..ow).all(|z| covers(z, kw, sw, pw, dw, w)) {
                return None;
            }
        }
        _ => {}
    }
    let shape = [n, c, oh, ow];
    let mut r = Reference {
        shape,
        out: vec![0.0; n * c * oh * ow],
        gx: vec![0.0; case.x.len()],
        gw: vec![],
        gb: vec![],
    };
    for (ni, ci, y, z) in (0..n).flat_map(|a| {
        (0..c).flat_map(move |b| (0..oh).flat_map(move |y| (0..ow).map(move |z| (a, b, y, z))))
    }) {
        let o = at(shape, ni, ci, y, z);
        let g = upstream(o);
        let x_at = |iy: usize, ix: usize| at(case.input, ni, ci, iy, ix);
        match case.kind {
            Kind::Max { .. } => {
                // The first maximum in scan order; a NaN wins (PyTorch's `val > max || isnan`).
                let mut best: Option<usize> = None;
                for (a, b) in (0..kh).flat_map(|a| (0..kw).map(move |b| (a, b))) {
                    if let (Some(iy), Some(ix)) =
                        (tap(y, a, sh, ph, dh, h), tap(z, b, sw, pw, dw, w))
                    {
                        let i = x_at(iy, ix);
                        let better = best.is_none_or(|bi| {
                            !case.x[bi].is_nan() && (case.x[i] > case.x[bi] || case.x[i].is_nan())
                        });
                        if better {
                            best = Some(i);
                        }
                    }
                }
                let best = best?; // a window of padding only: refused (see the module docs)
                r.out[o] = case.x[best];
                r.gx[best] += g;
            }
            Kind::Avg {
                count_include_pad,
                divisor,
                ..
            } => {
                let (y0, z0) = (
                    (y * sh) as isize - ph as isize,
                    (z * sw) as isize - pw as isize,
                );
                let y1 = (y0 + kh as isize).min((h + ph) as isize);
                let z1 = (z0 + kw as isize).min((w + pw) as isize);
                let pool_size = (y1 - y0) * (z1 - z0);
                let (y0, z0) = (y0.max(0) as usize, z0.max(0) as usize);
                let (y1, z1) = (y1.min(h as isize) as usize, z1.min(w as isize) as usize);
                let div = match (divisor, count_include_pad) {
                    (Some(d), _) => d as f64,
                    (None, true) => pool_size as f64,
                    (None, false) => ((y1 - y0) * (z1 - z0)) as f64,
                };
                for (iy, ix) in (y0..y1).flat_map(|a| (z0..z1).map(move |b| (a, b))) {
                    r.out[o] += case.x[x_at(iy, ix)] / div;
                    r.gx[x_at(iy, ix)] += g / div;
                }
            }
            Kind::Adaptive { .. } => {
                let range = |o: usize, out: usize, side: usize| {
                    (o * side / out)..(((o + 1) * side).div_ceil(out))
                };
                let (ys, zs) = (range(y, oh, h), range(z, ow, w));
                let count = (ys.len() * zs.len()) as f64;
                for (iy, ix) in ys.flat_map(|a| zs.clone().map(move |b| (a, b))) {
                    r.out[o] += case.x[x_at(iy, ix)] / count;
                    r.gx[x_at(iy, ix)] += g / count;
                }
            }
            Kind::Conv { .. } => unreachable!("not a pooling"),
        }
    }
    Some(r)
}

fn reference(case: &ConvPoolCase) -> Option<Reference> {
    let [_, _, h, w] = case.input;
    let settings = [case.kernel, case.stride, case.dilation].concat();
    let zero_setting = !matches!(case.kind, Kind::Adaptive { .. }) && settings.contains(&0);
    if h == 0 || w == 0 || zero_setting {
        return None;
    }
    match case.kind {
        Kind::Conv {
            out_ch,
            groups,
            weight_in,
            ..
        } => conv(case, out_ch, groups, weight_in),
        _ => pool(case),
    }
}

fn generate(rng: &mut Rng) -> ConvPoolCase {
    let f32 = rng.chance(0.4);
    let side = |rng: &mut Rng| match rng.below(40) {
        0 => 0,
        1..=8 => 8 + rng.below(5),
        _ => 1 + rng.below(7),
    };
    let input = [
        rng.pick(&[0, 1, 1, 2]),
        1 + rng.below(4),
        side(rng),
        side(rng),
    ];
    let small = |rng: &mut Rng, hi: usize| {
        if rng.chance(0.03) {
            0
        } else {
            1 + rng.below(hi)
        }
    };
    let kernel = [small(rng, 4), small(rng, 4)];
    let stride = [small(rng, 3), small(rng, 3)];
    let padding = [rng.below(3), rng.below(3)];
    let kind = match rng.below(4) {
        0 => {
            let c = input[1];
            // Usually a divisor of the channels; sometimes not, or 0.
            let divisors: Vec<usize> = (1..=c).filter(|&g| c.is_multiple_of(g)).collect();
            let groups = match rng.below(10) {
                0 => rng.pick(&[0, 3, 4]),
                1..=4 => rng.pick(&divisors),
                _ => 1,
            };
            let out_ch = groups * (1 + rng.below(2)) + usize::from(rng.chance(0.05));
            let weight_in = c / groups.max(1) + usize::from(rng.chance(0.05));
            Kind::Conv {
                out_ch,
                groups,
                weight_in,
                bias: rng.chance(0.6),
            }
        }
        1 => Kind::Max {
            ceil: rng.chance(0.4),
        },
        2 => Kind::Avg {
            ceil: rng.chance(0.4),
            count_include_pad: rng.chance(0.6),
            divisor: rng.chance(0.1).then(|| rng.below(4)),
        },
        _ => {
            let mut side = || {
                if rng.chance(0.03) {
                    0
                } else {
                    1 + rng.below(6)
                }
            };
            Kind::Adaptive {
                out: [side(), side()],
            }
        }
    };
    // Sometimes a kernel far larger than the plane, mostly over padding (the CPU max-pooling
    // kernel visits such windows one by one instead of through a padded frame).
    let (kernel, padding) = match kind {
        Kind::Max { .. } | Kind::Avg { .. } if rng.chance(0.08) => {
            let k = [64 + rng.below(40), 64 + rng.below(40)];
            let pad = |rng: &mut Rng, k: usize| k / 2 - rng.below(3);
            (k, [pad(rng, k[0]), pad(rng, k[1])])
        }
        _ => (kernel, padding),
    };
    let with_dilation = matches!(kind, Kind::Conv { .. } | Kind::Max { .. });
    let dilation = match with_dilation {
        true => [small(rng, 3), small(rng, 3)],
        false => [1, 1],
    };
    let value = |rng: &mut Rng| {
        let v = -1.0 + 2.0 * rng.below(1 << 20) as f64 / (1 << 20) as f64;
        if f32 {
            v as f32 as f64
        } else {
            v
        }
    };
    let count = |s: &[usize]| s.iter().product::<usize>();
    let (w_len, b_len) = match kind {
        Kind::Conv {
            out_ch,
            weight_in,
            bias,
            ..
        } => (
            out_ch * weight_in * kernel[0] * kernel[1],
            if bias { out_ch } else { 0 },
        ),
        _ => (0, 0),
    };
    // Max pooling sometimes meets ties (equal values), as after a ReLU.
    let ties = matches!(kind, Kind::Max { .. }) && rng.chance(0.3);
    let x = (0..count(&input))
        .map(|_| {
            if ties {
                rng.below(3) as f64
            } else {
                value(rng)
            }
        })
        .collect();
    ConvPoolCase {
        kind,
        f32,
        input,
        kernel,
        stride,
        padding,
        dilation,
        x,
        w: (0..w_len).map(|_| value(rng)).collect(),
        b: (0..b_len).map(|_| value(rng)).collect(),
    }
}

fn check(case: &ConvPoolCase) -> Outcome {
    let want = reference(case);
    let tol = if case.f32 { 1e-4 } else { 1e-10 };
    let x = float_tensor(&case.x, &case.input, case.f32, true);
    let (k, s, p, d) = (case.kernel, case.stride, case.padding, case.dilation);
    let mut params = vec![];
    let got = match case.kind {
        Kind::Conv {
            out_ch,
            groups,
            weight_in,
            bias,
        } => {
            let w = float_tensor(&case.w, &[out_ch, weight_in, k[0], k[1]], case.f32, true);
            let b = bias.then(|| float_tensor(&case.b, &[out_ch], case.f32, true));
            let conv = Conv2dParams {
                stride: s,
                padding: p,
                dilation: d,
                groups,
            };
            let out = x.conv2d(&w, b.as_ref(), conv);
            params.push(w);
            params.extend(b);
            out
        }
        Kind::Max { ceil } => x.max_pool2d(MaxPool2dParams {
            kernel_size: k,
            stride: s,
            padding: p,
            dilation: d,
            ceil_mode: ceil,
        }),
        Kind::Avg {
            ceil,
            count_include_pad,
            divisor,
        } => x.avg_pool2d(AvgPool2dParams {
            kernel_size: k,
            stride: s,
            padding: p,
            ceil_mode: ceil,
            count_include_pad,
            divisor_override: divisor,
        }),
        Kind::Adaptive { out } => x.adaptive_avg_pool2d(out),
    };
    let want = match (want, got) {
        (None, Err(e)) => return refused(e),
        (None, Ok(t)) => panic!("the reference refuses; kiln gave {:?}", t.shape()),
        (Some(r), Err(e)) => panic!("kiln refused a valid call (reference {:?}): {e}", r.shape),
        (Some(r), Ok(out)) => {
            assert_eq!(out.shape(), &r.shape[..], "output shape");
            assert_close("output", &out.to_vec_f64().unwrap(), &r.out, tol);
            let n = out.numel();
            let g: Vec<f64> = (0..n).map(upstream).collect();
            let g = Tensor::from_vec(g, out.shape(), Device::Cpu).unwrap();
            let g = g.to_dtype(out.dtype()).unwrap();
            out.mul(&g)
                .and_then(|l| l.sum_all())
                .and_then(|l| l.backward())
                .expect("backward");
            r
        }
    };
    let grad = |t: &Tensor| t.grad().expect("a gradient").to_vec_f64().unwrap();
    assert_close("d/dinput", &grad(&x), &want.gx, tol);
    if let Some(w) = params.first() {
        assert_close("d/dweight", &grad(w), &want.gw, tol);
    }
    if let Some(b) = params.get(1) {
        assert_close("d/dbias", &grad(b), &want.gb, tol);
    }
    Outcome::Accepted
}

/// The convolution and pooling fuzz target.
pub fn conv_and_pool_calls(seed: u64, cases: usize) {
    run(
        "conv2d and pooling vs f64 loops",
        seed,
        cases,
        generate,
        check,
    );
}
