//! Layer hyper-parameters: `Conv2d` (channels, kernel, stride, padding, dilation, groups) and
//! the pooling layers (kernel, stride, padding) with hostile values, then a forward pass on a
//! small input of a hostile shape, and backward. A layer that builds and runs must give the
//! output shape PyTorch's formula gives (computed here in `u128`, so it cannot overflow), and
//! the input's gradient the input's shape; every case must end in `Ok` or a typed error.

use crate::harness::{refused, run, Outcome, Rng};
use kiln::autograd::{DType, Device, Tensor};
use kiln::models::layers::{
    AvgPool2d, BatchNorm2d, Conv2d, Conv2dConfig, Dropout, Embedding, LayerNorm, Linear, MaxPool2d,
    MultiheadAttention,
};
use kiln::models::Layer;

#[derive(Debug)]
pub struct LayerCase {
    kind: usize,
    in_ch: usize,
    out_ch: usize,
    kernel: usize,
    stride: [usize; 2],
    padding: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
    input: [usize; 4],
}

/// PyTorch's output side `floor((side + 2 pad - dil (k - 1) - 1) / stride) + 1`, or `None`
/// where the window does not fit the padded input or a setting is 0 (no output then).
fn out_side(side: usize, k: usize, stride: usize, pad: usize, dil: usize) -> Option<usize> {
    if k == 0 || stride == 0 || dil == 0 {
        return None;
    }
    let padded = side as u128 + 2 * pad as u128;
    let span = dil as u128 * (k as u128 - 1) + 1;
    let out = padded.checked_sub(span)? / stride as u128 + 1;
    usize::try_from(out).ok()
}

pub fn layer_configs(seed: u64, cases: usize) {
    // Each setting usually one a model would use, else a hostile one.
    let pick = |rng: &mut Rng, usual: &[usize], hostile: &[usize]| match rng.chance(0.85) {
        true => rng.pick(usual),
        false => rng.pick(hostile),
    };
    let generate = |rng: &mut Rng| {
        let mut pair = |usual: &[usize], hostile: &[usize]| {
            [pick(rng, usual, hostile), pick(rng, usual, hostile)]
        };
        let stride = pair(&[1, 2, 3], &[0, 1 << 40]);
        let padding = pair(&[0, 1, 3], &[1 << 40, usize::MAX]);
        let dilation = pair(&[1, 2], &[0, 1 << 40]);
        let in_ch = rng.pick(&[1, 2, 3, 4]);
        LayerCase {
            kind: rng.below(3),
            in_ch,
            out_ch: pick(rng, &[1, 2, 4], &[0]),
            kernel: pick(rng, &[1, 2, 3, 7], &[0, 1 << 40]),
            stride,
            padding,
            dilation,
            groups: pick(rng, &[1, 2], &[0, 3]),
            input: [
                pick(rng, &[1, 2], &[0]),
                pick(rng, &[in_ch], &[5]),
                pick(rng, &[5, 9, 1], &[0]),
                pick(rng, &[5, 8, 1], &[0]),
            ],
        }
    };
    let check = |c: &LayerCase| {
        let x = Tensor::zeros(&c.input, DType::F32, Device::Cpu)
            .and_then(|x| x.set_requires_grad(true))
            .unwrap();
        let (result, want) = match c.kind {
            0 => {
                let config = Conv2dConfig {
                    stride: c.stride,
                    padding: c.padding,
                    dilation: c.dilation,
                    groups: c.groups,
                    bias: true,
                };
                let conv = match Conv2d::new(c.in_ch, c.out_ch, c.kernel, config) {
                    Ok(conv) => conv,
                    Err(e) => return Outcome::from(Err::<(), _>(e)),
                };
                let side = |a: usize| {
                    out_side(
                        c.input[2 + a],
                        c.kernel,
                        c.stride[a],
                        c.padding[a],
                        c.dilation[a],
                    )
                };
                let want = match (side(0), side(1)) {
                    (Some(h), Some(w)) => Some(vec![c.input[0], c.out_ch, h, w]),
                    _ => None,
                };
                (conv.forward(&x), want)
            }
            kind => {
                let (k, s, p) = (c.kernel, c.stride[0], c.padding[0]);
                let result = match kind {
                    1 => MaxPool2d::new(k, s, p).and_then(|l| l.forward(&x)),
                    _ => AvgPool2d::new(k, s, p).and_then(|l| l.forward(&x)),
                };
                let side = |a: usize| out_side(c.input[2 + a], k, s, p, 1);
                let want = match (side(0), side(1)) {
                    (Some(h), Some(w)) => Some(vec![c.input[0], c.input[1], h, w]),
                    _ => None,
                };
                (result, want)
            }
        };
        let y = match result {
            Ok(y) => y,
            Err(e) => return refused(e),
        };
        assert_eq!(Some(y.shape().to_vec()), want, "{c:?}");
        // Backward through the same geometry: the input's gradient has the input's shape.
        let backward = y.sum_all().and_then(|loss| loss.backward());
        if backward.is_ok() {
            let grad = x.grad().expect("a gradient after backward");
            assert_eq!(grad.shape(), &c.input[..], "{c:?}");
        }
        Outcome::from(backward)
    };
    run("layer hyper-parameters", seed, cases, generate, check);
}

/// The element count of `shape`, saturating (hostile shapes overflow).
fn numel(shape: &[usize]) -> usize {
    shape.iter().fold(1usize, |n, &d| n.saturating_mul(d))
}

/// One of the other layers with a size, a second size and a float setting, and its input.
#[derive(Debug)]
pub struct OtherLayerCase {
    kind: usize,
    size: usize,
    other: usize,
    setting: f64,
    input: Vec<usize>,
    /// Embedding ids (a hostile one among them sometimes).
    ids: Vec<i64>,
}

/// `Linear`, `Embedding`, `LayerNorm`, `BatchNorm2d`, `MultiheadAttention` and `Dropout` with
/// hostile sizes and settings, forward (and backward where it runs) on a small input: the
/// output shape is the layer's documented one.
pub fn other_layers(seed: u64, cases: usize) {
    let pick = |rng: &mut Rng, usual: &[usize], hostile: &[usize]| match rng.chance(0.85) {
        true => rng.pick(usual),
        false => rng.pick(hostile),
    };
    let generate = |rng: &mut Rng| {
        let size = pick(rng, &[1, 2, 4, 6], &[0, usize::MAX / 2, usize::MAX]);
        let other = pick(rng, &[1, 2, 3], &[0, 1 << 40]);
        let last = pick(rng, &[size], &[size.wrapping_add(1), 0]);
        let input = match rng.below(3) {
            0 => vec![pick(rng, &[2, 1], &[0]), last],
            1 => vec![pick(rng, &[2], &[0]), pick(rng, &[3, 1], &[0]), last],
            _ => vec![2, last, pick(rng, &[2, 1], &[0]), 2],
        };
        OtherLayerCase {
            kind: rng.below(6),
            size,
            other,
            setting: rng.pick(&[0.0, 0.1, 0.5, 1e-5, 1.0, -0.5, f64::NAN, f64::INFINITY]),
            ids: (0..numel(&input).min(8))
                .map(|_| match rng.chance(0.9) {
                    true => rng.below(2) as i64,
                    false => rng.pick(&[-1, i64::MAX, size as i64]),
                })
                .collect(),
            input,
        }
    };
    let check = |c: &OtherLayerCase| {
        // An input as large as a hostile size is refused when made.
        let x = match Tensor::zeros(&c.input, DType::F32, Device::Cpu) {
            Ok(x) => x.set_requires_grad(true).unwrap(),
            Err(e) => return Outcome::from(Err::<(), _>(e)),
        };
        let with_last = |last: usize| {
            let mut s = c.input.clone();
            *s.last_mut().unwrap() = last;
            s
        };
        let (result, want) = match c.kind {
            0 => (
                Linear::new(c.size, c.other, true).and_then(|l| l.forward(&x)),
                with_last(c.other),
            ),
            1 => {
                if numel(&c.input) != c.ids.len() {
                    return Outcome::Refused;
                }
                let ids = Tensor::from_vec(c.ids.clone(), &c.input, Device::Cpu).unwrap();
                let mut want = c.input.clone();
                want.push(c.other);
                let y = Embedding::new(c.size, c.other).and_then(|l| l.forward(&ids));
                // Every id must index a row: an id out of range must be refused.
                if y.is_ok() {
                    assert!(
                        c.ids.iter().all(|&i| i >= 0 && (i as usize) < c.size),
                        "{c:?}"
                    );
                }
                (y, want)
            }
            2 => (
                LayerNorm::new(&[c.size], c.setting).and_then(|l| l.forward(&x)),
                c.input.clone(),
            ),
            3 => (
                BatchNorm2d::new(c.size).and_then(|l| l.forward(&x)),
                c.input.clone(),
            ),
            4 => (
                MultiheadAttention::new(c.size, c.other, 0.0).and_then(|l| l.forward(&x)),
                c.input.clone(),
            ),
            _ => (
                Dropout::new(c.setting).and_then(|l| l.forward(&x)),
                c.input.clone(),
            ),
        };
        let y = match result {
            Ok(y) => y,
            Err(e) => return refused(e),
        };
        assert_eq!(y.shape(), &want[..], "{c:?}");
        if y.requires_grad() {
            let backward = y.sum_all().and_then(|loss| loss.backward());
            return Outcome::from(backward);
        }
        Outcome::Accepted
    };
    run(
        "other layers' sizes and settings",
        seed,
        cases,
        generate,
        check,
    );
}
