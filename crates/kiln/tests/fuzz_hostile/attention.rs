//! `MultiheadAttention::attend` against an f64 reference written from PyTorch 2.15's
//! `multi_head_attention_forward`: random batch, query and key lengths (0 included), one or two
//! heads, self-attention or separate key and value tensors (of right and wrong shapes), random
//! weights and biases, and every mask kind: bool or float `attn_mask` of rank 2, 3 (PyTorch's
//! `[B * H, T, S]`) or 4, of right and wrong shapes, with -inf, +inf or NaN entries; a bool
//! `key_padding_mask`; `is_causal`.
//!
//! The check: where the reference refuses, kiln must return an error; otherwise the output
//! must equal the reference's (not finite where it is not; else 1e-4 relative to its largest
//! value, in f32), and where the output is finite the gradients of `Σ G ⊙ output` with
//! respect to the query, key, value and every parameter must equal the reference's central
//! differences (1e-3 relative to the largest).
//!
//! The reference follows kiln where kiln deliberately differs from PyTorch:
//! - a row whose every score is masked gets weights 0 (the output is the output projection's
//!   bias), as PyTorch's `scaled_dot_product_attention` path (`need_weights=False`, the one
//!   its Transformer layers take) does; its `need_weights=True` path gives NaN;
//! - `is_causal` needs no `attn_mask` (kiln builds the causal mask; with one, both apply);
//! - rank-2 and rank-4 masks broadcast (to `[T, S]` and `[B, H, T, S]`; PyTorch takes only
//!   `[T, S]` and no rank 4); a rank-3 mask is exactly `[B * H, T, S]`, as in PyTorch;
//! - the `key_padding_mask` is bool (PyTorch also adds a float one);
//! - inputs are batched `[B, L, E]` (PyTorch also takes unbatched `[L, E]`).

use crate::harness::{refused, run, Outcome, Rng};
use crate::numeric::{assert_close, upstream};
use crate::reference::broadcast_shape;
use kiln::autograd::{DType, Device, Module, NoGradGuard, Tensor};
use kiln::models::layers::{AttentionMasks, MultiheadAttention};

#[derive(Debug, Clone)]
pub struct Mask {
    shape: Vec<usize>,
    /// Bool masks: 1.0 is true (blocked).
    values: Vec<f64>,
    bool: bool,
}

#[derive(Debug, Clone)]
pub struct AttentionCase {
    embed: usize,
    heads: usize,
    query: (Vec<usize>, Vec<f64>),
    /// `None`: self-attention (key and value are the query tensor).
    key_value: Option<[(Vec<usize>, Vec<f64>); 2]>,
    /// `in_proj_weight`, `in_proj_bias`, `out_proj.weight`, `out_proj.bias`.
    params: [Vec<f64>; 4],
    attn_mask: Option<Mask>,
    key_padding_mask: Option<Mask>,
    causal: bool,
    /// Dropout of the layer (evaluation mode when positive, so it must not apply).
    dropout: f64,
}

fn grid(rng: &mut Rng, n: usize) -> Vec<f64> {
    (0..n).map(|_| (rng.below(17) as f64 - 8.0) / 8.0).collect()
}

fn mask(rng: &mut Rng, shape: Vec<usize>, bool: bool) -> Mask {
    let n = shape.iter().product();
    let values = (0..n)
        .map(|_| match bool {
            true => rng.chance(0.35) as u8 as f64,
            false => match rng.below(12) {
                0 | 1 => f64::NEG_INFINITY,
                2 if rng.chance(0.2) => rng.pick(&[f64::INFINITY, f64::NAN]),
                _ => (rng.below(9) as f64 - 4.0) / 2.0,
            },
        })
        .collect();
    Mask {
        shape,
        values,
        bool,
    }
}

fn generate(rng: &mut Rng) -> AttentionCase {
    let heads = 1 + rng.below(2);
    let embed = heads * (1 + rng.below(2));
    let (b, t, s) = (rng.below(3), rng.below(4), rng.below(4));
    let wrong = |rng: &mut Rng, d: usize| if rng.chance(0.05) { d + 1 } else { d };
    let q_shape = match rng.chance(0.04) {
        true => vec![t, embed],
        false => vec![b, t, wrong(rng, embed)],
    };
    let key_value = rng.chance(0.6).then(|| {
        let k = vec![wrong(rng, b), s, wrong(rng, embed)];
        let v = vec![b, wrong(rng, s), embed];
        let (nk, nv) = (k.iter().product(), v.iter().product());
        [(k, grid(rng, nk)), (v, grid(rng, nv))]
    });
    let s = if key_value.is_some() { s } else { t };
    let nq = q_shape.iter().product();
    let e = embed;
    let attn_mask = rng.chance(0.6).then(|| {
        let pick = |rng: &mut Rng, d: usize| if rng.chance(0.3) { 1 } else { d };
        let shape = match rng.below(8) {
            0 | 1 => vec![t, s],
            2 => vec![pick(rng, t), pick(rng, s)],
            3 => vec![b * heads, t, s],
            4 => vec![heads, t, s],
            5 => vec![pick(rng, b), pick(rng, heads), pick(rng, t), pick(rng, s)],
            6 => vec![s, t],
            _ => vec![b + 1, heads, t, s],
        };
        let bool = rng.chance(0.5);
        mask(rng, shape, bool)
    });
    let key_padding_mask = rng.chance(0.4).then(|| {
        let shape = match rng.below(6) {
            0 => vec![s, b],
            1 => vec![b, s, 1],
            _ => vec![b, s],
        };
        let bool = rng.chance(0.9);
        mask(rng, shape, bool)
    });
    AttentionCase {
        embed,
        heads,
        query: (q_shape, grid(rng, nq)),
        key_value,
        params: [
            grid(rng, 3 * e * e),
            grid(rng, 3 * e),
            grid(rng, e * e),
            grid(rng, e),
        ],
        attn_mask,
        key_padding_mask,
        causal: rng.chance(0.3),
        dropout: rng.pick(&[0.0, 0.0, 0.5]),
    }
}

/// The query, key and value (self-attention: the query three times).
fn qkv(case: &AttentionCase) -> [&(Vec<usize>, Vec<f64>); 3] {
    match &case.key_value {
        Some([k, v]) => [&case.query, k, v],
        None => [&case.query; 3],
    }
}

/// The shape the attention mask is read with against the scores `[B, H, T, S]` (broadcasting),
/// if kiln takes the mask: a rank-3 mask is exactly `[B * H, T, S]`, others broadcast.
fn mask_shape(m: &Mask, full: [usize; 4]) -> Option<Vec<usize>> {
    if m.shape.len() == 3 {
        return (m.shape == [full[0] * full[1], full[2], full[3]]).then(|| full.to_vec());
    }
    (broadcast_shape(&m.shape, &full)? == full).then(|| m.shape.clone())
}

/// The flat position that score `at` reads in a mask of `shape` (right-aligned, broadcast).
fn mask_position(shape: &[usize], at: [usize; 4]) -> usize {
    let skip = 4 - shape.len();
    shape.iter().enumerate().fold(0, |flat, (k, &d)| {
        flat * d + if d == 1 { 0 } else { at[skip + k] }
    })
}

/// The output `[B, T, E]`, or `None` where kiln refuses.
fn reference(case: &AttentionCase) -> Option<Vec<f64>> {
    let [(qs, q), (ks, k), (vs, v)] = qkv(case);
    let e = case.embed;
    let ok = qs.len() == 3
        && ks.len() == 3
        && vs.len() == 3
        && [qs[2], ks[2], vs[2]] == [e; 3]
        && ks[0] == qs[0]
        && vs[..2] == ks[..2];
    if !ok {
        return None;
    }
    let (b, t, s, h) = (qs[0], qs[1], ks[1], case.heads);
    let dims = [b, h, t, s];
    let attn = match &case.attn_mask {
        Some(m) => Some((mask_shape(m, dims)?, m)),
        None => None,
    };
    if let Some(m) = &case.key_padding_mask {
        if !m.bool || m.shape != [b, s] {
            return None;
        }
    }
    let [w_in, b_in, w_out, b_out] = &case.params;
    let project = |x: &[f64], rows: usize, part: usize| -> Vec<f64> {
        let mut y = vec![0.0; rows * e];
        for r in 0..rows {
            for o in 0..e {
                let w = &w_in[(part * e + o) * e..][..e];
                let dot: f64 = (0..e).map(|i| x[r * e + i] * w[i]).sum();
                y[r * e + o] = dot + b_in[part * e + o];
            }
        }
        y
    };
    let (pq, pk, pv) = (
        project(q, b * t, 0),
        project(k, b * s, 1),
        project(v, b * s, 2),
    );
    let hd = e / h;
    let mut ctx = vec![0.0; b * t * e];
    for bi in 0..b {
        for hi in 0..h {
            for ti in 0..t {
                let scores: Vec<f64> = (0..s)
                    .map(|si| {
                        let dot: f64 = (0..hd)
                            .map(|c| {
                                pq[(bi * t + ti) * e + hi * hd + c]
                                    * pk[(bi * s + si) * e + hi * hd + c]
                            })
                            .sum();
                        let mut x = dot / (hd as f64).sqrt();
                        if case.causal && si > ti {
                            x = f64::NEG_INFINITY;
                        }
                        if let Some((shape, m)) = &attn {
                            let mv = m.values[mask_position(shape, [bi, hi, ti, si])];
                            x = match m.bool {
                                true if mv != 0.0 => f64::NEG_INFINITY,
                                true => x,
                                false => x + mv,
                            };
                        }
                        if let Some(m) = &case.key_padding_mask {
                            if m.values[bi * s + si] != 0.0 {
                                x = f64::NEG_INFINITY;
                            }
                        }
                        x
                    })
                    .collect();
                let p = safe_softmax(&scores);
                for c in 0..hd {
                    ctx[(bi * t + ti) * e + hi * hd + c] = (0..s)
                        .map(|si| p[si] * pv[(bi * s + si) * e + hi * hd + c])
                        .sum();
                }
            }
        }
    }
    let mut out = vec![0.0; b * t * e];
    for r in 0..b * t {
        for o in 0..e {
            let dot: f64 = (0..e).map(|i| ctx[r * e + i] * w_out[o * e + i]).sum();
            out[r * e + o] = dot + b_out[o];
        }
    }
    Some(out)
}

/// Softmax that gives 0 for a row whose every entry is -inf (PyTorch's `_safe_softmax`), NaN
/// for a row holding NaN or +inf.
fn safe_softmax(x: &[f64]) -> Vec<f64> {
    if x.iter().all(|&v| v == f64::NEG_INFINITY) {
        return vec![0.0; x.len()];
    }
    if x.iter().any(|v| v.is_nan()) {
        return vec![f64::NAN; x.len()];
    }
    let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let ex: Vec<f64> = x.iter().map(|&v| (v - m).exp()).collect();
    let sum: f64 = ex.iter().sum();
    ex.iter().map(|v| v / sum).collect()
}

fn floats(shape: &[usize], values: &[f64]) -> Tensor {
    let t = Tensor::from_vec(values.to_vec(), shape, Device::Cpu).unwrap();
    t.to_dtype(DType::F32).unwrap()
}

fn mask_tensor(m: &Mask) -> Tensor {
    let t = floats(&m.shape, &m.values);
    match m.bool {
        true => t.gt_scalar(0.5).unwrap(),
        false => t,
    }
}

/// kiln's output, and the leaves whose gradients are checked: the query (key, value) and the
/// parameters, in the reference's order.
fn actual(case: &AttentionCase) -> (kiln::models::Result<Tensor>, Vec<Tensor>) {
    let mut mha = MultiheadAttention::new(case.embed, case.heads, case.dropout).unwrap();
    if case.dropout > 0.0 {
        mha.eval();
    }
    let params = [
        mha.in_proj_weight.tensor().clone(),
        mha.in_proj_bias.tensor().clone(),
        mha.out_proj.weight.tensor().clone(),
        mha.out_proj.bias.as_ref().unwrap().tensor().clone(),
    ];
    {
        let _g = NoGradGuard::new();
        for (p, v) in params.iter().zip(&case.params) {
            p.copy_(&floats(p.shape(), v)).unwrap();
        }
    }
    let leaf = |(shape, values): &(Vec<usize>, Vec<f64>)| {
        floats(shape, values).set_requires_grad(true).unwrap()
    };
    let q = leaf(&case.query);
    let (k, v) = match &case.key_value {
        Some([k, v]) => (leaf(k), leaf(v)),
        None => (q.clone(), q.clone()),
    };
    let (attn, pad) = (
        case.attn_mask.as_ref().map(mask_tensor),
        case.key_padding_mask.as_ref().map(mask_tensor),
    );
    let masks = AttentionMasks {
        attn_mask: attn.as_ref(),
        key_padding_mask: pad.as_ref(),
        is_causal: case.causal,
    };
    let out = mha.attend(&q, &k, &v, masks);
    let mut leaves = vec![q];
    if case.key_value.is_some() {
        leaves.extend([k, v]);
    }
    leaves.extend(params);
    (out, leaves)
}

/// The reference's operands in the order of [`actual`]'s leaves.
fn operands_mut(case: &mut AttentionCase) -> Vec<&mut Vec<f64>> {
    let mut out = vec![&mut case.query.1];
    if let Some([k, v]) = &mut case.key_value {
        out.extend([&mut k.1, &mut v.1]);
    }
    out.extend(case.params.iter_mut());
    out
}

fn check(case: &AttentionCase) -> Outcome {
    let (got, leaves) = actual(case);
    let y = match (reference(case), got) {
        (None, Err(e)) => return refused(e),
        (None, Ok(y)) => panic!("the reference refuses, kiln returned {:?}", y.shape()),
        (Some(_), Err(e)) => panic!("kiln refused a valid call: {e}"),
        (Some(want), Ok(y)) => {
            let t = case.query.0[1];
            assert_eq!(y.shape(), &[case.query.0[0], t, case.embed], "shape");
            assert_close("output", &y.to_vec_f64().unwrap(), &want, 1e-4);
            if !want.iter().all(|v| v.is_finite()) {
                return Outcome::Accepted;
            }
            y
        }
    };
    let g = (0..y.numel()).map(upstream).collect::<Vec<_>>();
    y.mul(&floats(y.shape(), &g))
        .and_then(|l| l.sum_all())
        .and_then(|l| l.backward())
        .expect("backward");
    let weighted = |c: &AttentionCase| -> f64 {
        let out = reference(c).expect("a valid call stays valid");
        out.iter().enumerate().map(|(i, v)| upstream(i) * v).sum()
    };
    let h = 1e-6;
    for (n, leaf) in leaves.iter().enumerate() {
        let len = operands_mut(&mut case.clone())[n].len();
        let want: Vec<f64> = (0..len)
            .map(|j| {
                let at = |d: f64| {
                    let mut c = case.clone();
                    operands_mut(&mut c)[n][j] += d;
                    weighted(&c)
                };
                (at(h) - at(-h)) / (2.0 * h)
            })
            .collect();
        let got = match leaf.grad() {
            Some(g) => g.to_vec_f64().unwrap(),
            None => vec![0.0; len],
        };
        assert_close(&format!("gradient of operand {n}"), &got, &want, 1e-3);
    }
    Outcome::Accepted
}

pub fn attention_calls(seed: u64, cases: usize) {
    run(
        "multi-head attention calls vs an f64 reference",
        seed,
        cases,
        generate,
        check,
    );
}
