//! The emulator's directed-rounding intrinsics (`__fadd_rz`, `__fmul_rd`, `__fsqrt_ru`, ...,
//! `__dadd_rz`, ...), checked through the C++ probe (`tests/builtins_cpp/probe.cpp`). The float ones
//! bit for bit: the nearest result comes from Rust's own arithmetic, the exact value's side of it
//! from exact double arithmetic (TwoSum, exact products and residuals), and the directed result is
//! that nearest one or its neighbour. The double ones by their defining order: round-down <=
//! nearest <= round-up, at most one step apart, toward zero on the correct side.
//!
//! Invariants: finite operands only (infinities and NaN pass through IEEE operations unchanged
//! in every mode); IEEE's signed-zero rule for exact zero sums (-0 when rounding down) is part
//! of the expectation.

#[path = "builtins_cpp/support.rs"]
mod support;

use std::cmp::Ordering;
use support::{run, Rng};

const MODES: [&str; 3] = ["rz", "rd", "ru"];

fn two_sum(a: f64, b: f64) -> (f64, f64) {
    let s = a + b;
    let bv = s - a;
    (s, (a - (s - bv)) + (b - bv))
}

/// The float result in `mode`, from the nearest one and how it compares with the exact value.
fn directed(rn: f32, ord: Option<Ordering>, exact_neg: bool, mode: &str) -> u32 {
    let mode = match (mode, exact_neg) {
        ("rz", false) => "rd",
        ("rz", true) => "ru",
        (m, _) => m,
    };
    let bits = rn.to_bits();
    let step = |up: bool| match (bits & 0x7fff_ffff == 0, up, bits >> 31 == 1) {
        (true, true, _) => 1,
        (true, false, _) => 0x8000_0001,
        (false, up, neg) if up != neg => bits + 1,
        _ => bits - 1,
    };
    match (mode, ord) {
        ("rd", Some(Ordering::Greater)) => step(false),
        ("ru", Some(Ordering::Less)) => step(true),
        _ => bits,
    }
}

/// `rn` against an exact value s + e (e the exact remainder); overflow is past every finite value.
fn side(rn: f32, s: f64, e: f64) -> Option<Ordering> {
    if rn.is_infinite() {
        return Some(if rn > 0.0 {
            Ordering::Greater
        } else {
            Ordering::Less
        });
    }
    (rn as f64 - s).partial_cmp(&e)
}

/// An exactly zero sum: -0 when rounding down or when both addends are -0, else +0.
fn zero_sum(mode: &str, both_negative_zero: bool) -> u32 {
    if mode == "rd" || both_negative_zero {
        0x8000_0000
    } else {
        0
    }
}

fn inputs(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = Vec::with_capacity(n);
    while v.len() < n {
        let r = rng.next();
        let x = match v.len() % 4 {
            0 => f32::from_bits(r as u32),
            // The negated neighbour of its pair's first operand: cancellation.
            1 => -f32::from_bits(v[v.len() - 1].to_bits() ^ (r as u32 & 3)),
            2 => (r as f64 / u64::MAX as f64 - 0.5) as f32 * 8.0,
            // Subnormal, near 1 or near 2^125 (products overflow).
            _ => f32::from_bits((r as u32 & 0x807f_ffff) | ((r >> 40) as u32 % 3 * 0x3f00_0000)),
        };
        if x.is_finite() {
            v.push(x);
        }
    }
    v
}

fn results(op: &str, input: &[u8]) -> Vec<u32> {
    let out = run(op, input);
    out.chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn check(op: &str, ins: &[f32], arity: usize, got: &[u32], want: impl Fn(&[f32]) -> u32) {
    let bad: Vec<String> = ins
        .chunks(arity)
        .zip(got)
        .filter(|(i, g)| want(i) != **g)
        .map(|(i, g)| {
            format!(
                "{op}{i:?} = {:e} ({g:#x}), want {:#x}",
                f32::from_bits(*g),
                want(i)
            )
        })
        .collect();
    assert_eq!(ins.len() / arity, got.len(), "{op}: result count");
    assert!(
        bad.is_empty(),
        "{} mismatches, first: {:#?}",
        bad.len(),
        &bad[..bad.len().min(8)]
    );
}

#[test]
fn float_directed_rounding_is_exact() {
    let mut rng = Rng(23);
    let v = inputs(&mut rng, 240_000);
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    for mode in MODES {
        let sum = |a: f32, b: f32| {
            let (s, e) = two_sum(a as f64, b as f64);
            if s == 0.0 && e == 0.0 {
                return zero_sum(
                    mode,
                    a.to_bits() == 0x8000_0000 && b.to_bits() == 0x8000_0000,
                );
            }
            directed(a + b, side(a + b, s, e), s < 0.0, mode)
        };
        check(
            &format!("fadd_{mode}"),
            &v,
            2,
            &results(&format!("fadd_{mode}"), &bytes),
            |i| sum(i[0], i[1]),
        );
        check(
            &format!("fsub_{mode}"),
            &v,
            2,
            &results(&format!("fsub_{mode}"), &bytes),
            |i| sum(i[0], -i[1]),
        );
        check(
            &format!("fmul_{mode}"),
            &v,
            2,
            &results(&format!("fmul_{mode}"), &bytes),
            |i| {
                let (rn, p) = (i[0] * i[1], i[0] as f64 * i[1] as f64);
                directed(rn, side(rn, p, 0.0), p < 0.0, mode)
            },
        );
        check(
            &format!("fdiv_{mode}"),
            &v,
            2,
            &results(&format!("fdiv_{mode}"), &bytes),
            |i| {
                let (a, b) = (i[0], i[1]);
                let rn = a / b;
                if b == 0.0 || a == 0.0 {
                    return rn.to_bits(); // inf, NaN or a signed zero: exact in every mode
                }
                let ord = if rn.is_infinite() {
                    side(rn, 0.0, 0.0)
                } else {
                    let o = (rn as f64 * b as f64).partial_cmp(&(a as f64));
                    if b < 0.0 {
                        o.map(Ordering::reverse)
                    } else {
                        o
                    }
                };
                directed(rn, ord, (a < 0.0) != (b < 0.0), mode)
            },
        );
        let nonneg: Vec<f32> = v.iter().map(|x| x.abs()).collect();
        let nb: Vec<u8> = nonneg.iter().flat_map(|x| x.to_le_bytes()).collect();
        check(
            &format!("fsqrt_{mode}"),
            &nonneg,
            1,
            &results(&format!("fsqrt_{mode}"), &nb),
            |i| {
                let rn = i[0].sqrt();
                directed(
                    rn,
                    (rn as f64 * rn as f64).partial_cmp(&(i[0] as f64)),
                    false,
                    mode,
                )
            },
        );
        let v3 = &v[..v.len() / 3 * 3];
        let b3: Vec<u8> = v3.iter().flat_map(|x| x.to_le_bytes()).collect();
        check(
            &format!("fmaf_{mode}"),
            v3,
            3,
            &results(&format!("fmaf_{mode}"), &b3),
            |i| {
                let p = i[0] as f64 * i[1] as f64;
                let (s, e) = two_sum(p, i[2] as f64);
                if s == 0.0 && e == 0.0 {
                    let product_neg_zero =
                        p == 0.0 && (i[0].is_sign_negative() != i[1].is_sign_negative());
                    return zero_sum(mode, product_neg_zero && i[2].to_bits() == 0x8000_0000);
                }
                let rn = i[0].mul_add(i[1], i[2]);
                directed(rn, side(rn, s, e), s < 0.0, mode)
            },
        );
    }
}

/// The next double above a finite `x`.
fn next_up(x: f64) -> f64 {
    match x {
        0.0 => f64::from_bits(1),
        _ if x > 0.0 => f64::from_bits(x.to_bits() + 1),
        _ => f64::from_bits(x.to_bits() - 1),
    }
}

#[test]
fn double_directed_rounding_brackets_the_nearest_result() {
    let mut rng = Rng(29);
    let v: Vec<f64> = (0..200_000)
        .map(|i| {
            let r = rng.next();
            if i % 2 == 0 {
                f64::from_bits(r & 0xbfff_ffff_ffff_ffff)
            } else {
                r as f64 / 3.0e18 - 3.0
            }
        })
        .collect();
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let sqrt_in: Vec<f64> = v.iter().map(|x| x.abs()).collect();
    let sqrt_bytes: Vec<u8> = sqrt_in.iter().flat_map(|x| x.to_le_bytes()).collect();
    type Op = fn(&[f64]) -> f64;
    let ops: [(&str, usize, Op); 4] = [
        ("dadd", 2, |i| i[0] + i[1]),
        ("dmul", 2, |i| i[0] * i[1]),
        ("ddiv", 2, |i| i[0] / i[1]),
        ("dsqrt", 1, |i| i[0].sqrt()),
    ];
    for (op, arity, nearest) in ops {
        let (ins, input) = if op == "dsqrt" {
            (&sqrt_in, &sqrt_bytes)
        } else {
            (&v, &bytes)
        };
        let get = |mode: &str| -> Vec<f64> {
            let out = run(&format!("{op}_{mode}"), input);
            out.chunks(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        let (rz, rd, ru) = (get("rz"), get("rd"), get("ru"));
        for (k, i) in ins.chunks(arity).enumerate() {
            let rn = nearest(i);
            if !rn.is_finite() || rn == 0.0 {
                continue;
            }
            let ok = rd[k] <= rn
                && rn <= ru[k]
                && (rd[k] == ru[k] || (next_up(rd[k]) == ru[k] && (rn == rd[k] || rn == ru[k])))
                && rz[k] == if rn > 0.0 { rd[k] } else { ru[k] };
            assert!(
                ok,
                "{op}{i:?}: rz {:e} rd {:e} ru {:e}, nearest {rn:e}",
                rz[k], rd[k], ru[k]
            );
        }
    }
}
