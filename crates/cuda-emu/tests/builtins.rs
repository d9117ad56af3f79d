//! The emulator's CUDA built-in headers (`include/`), checked bit for bit: a C++ probe
//! (`tests/builtins_cpp/probe.cpp`, compiled with g++ as kernels are) applies each built-in to large
//! input sets, and the results are compared with the `half` crate (round to nearest even),
//! Rust's own IEEE arithmetic and saturating casts, and exact integer references.
//!
//! Invariants: every reference is computed independently of the headers; a mismatch names the
//! op, the input bits, the result and the expectation. CUDA behaviour the `half` crate does not
//! share is spelled out where it is expected: a NaN narrows to the canonical 0x7fff,
//! `__bfloat162float` is a plain shift (a signalling NaN stays signalling), and double converts to
//! 16 bits directly (the crate's `from_f64` drops the low 32 mantissa bits first, so the reference
//! restores them as a sticky bit).

#[path = "builtins_cpp/support.rs"]
mod support;

use half::{bf16, f16};
use std::cmp::Ordering;
use support::{run, Rng};

const MODES: [&str; 4] = ["rn", "rz", "rd", "ru"];

fn to_bytes<T: Copy, const N: usize>(values: &[T], le: fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|v| le(*v)).collect()
}
fn from_bytes<T, const N: usize>(bytes: &[u8], from: fn([u8; N]) -> T) -> Vec<T> {
    assert_eq!(bytes.len() % N, 0, "probe wrote a partial record");
    bytes
        .chunks(N)
        .map(|c| from(c.try_into().unwrap()))
        .collect()
}

/// Checks `got[i] == want(inputs[i])` for all i, reporting the first few mismatches.
fn check<I: std::fmt::Debug, O: PartialEq + std::fmt::Debug>(
    op: &str,
    inputs: &[I],
    got: &[O],
    want: impl Fn(&I) -> O,
) {
    assert_eq!(inputs.len(), got.len(), "{op}: result count");
    let bad: Vec<String> = inputs
        .iter()
        .zip(got)
        .filter_map(|(i, g)| {
            let w = want(i);
            (w != *g).then(|| format!("{op}({i:x?}) = {g:x?}, want {w:x?}"))
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{} mismatches, first: {:#?}",
        bad.len(),
        &bad[..bad.len().min(8)]
    );
}

/// The neighbour of an IEEE pattern one step up or down (`sign` is its sign bit).
fn step(bits: u64, up: bool, sign: u64) -> u64 {
    let neg = bits & sign != 0;
    if bits & (sign - 1) == 0 {
        return if up { 1 } else { sign | 1 };
    }
    if up != neg {
        bits + 1
    } else {
        bits - 1
    }
}

/// The result in rounding mode `mode` from the round-to-nearest-even one, given how that one
/// compares with the exact value and the exact value's sign.
fn directed(rne: u64, ord: Option<Ordering>, exact_neg: bool, mode: &str, sign: u64) -> u64 {
    let mode = match (mode, exact_neg) {
        ("rz", false) => "rd",
        ("rz", true) => "ru",
        (m, _) => m,
    };
    match (mode, ord) {
        ("rd", Some(Ordering::Greater)) => step(rne, false, sign),
        ("ru", Some(Ordering::Less)) => step(rne, true, sign),
        _ => rne,
    }
}

/// `x` to f16 / bf16 by round to nearest even, directly from the double: the crate's
/// `from_f64` after the dropped low 32 bits are folded into a sticky bit (round to odd).
fn sticky(x: f64) -> f64 {
    let b = x.to_bits();
    f64::from_bits(if b & 0xffff_ffff != 0 {
        (b & !0xffff_ffff) | (1 << 32)
    } else {
        b
    })
}
fn f16_of(x: f64, mode: &str) -> u16 {
    if x.is_nan() {
        return 0x7fff;
    }
    let r = f16::from_f64(sticky(x)).to_bits();
    let ord = f16::from_bits(r).to_f64().partial_cmp(&x);
    directed(r as u64, ord, x < 0.0, mode, 0x8000) as u16
}
fn bf16_of(x: f64, mode: &str) -> u16 {
    if x.is_nan() {
        return 0x7fff;
    }
    let r = bf16::from_f64(sticky(x)).to_bits();
    let ord = bf16::from_bits(r).to_f64().partial_cmp(&x);
    directed(r as u64, ord, x < 0.0, mode, 0x8000) as u16
}

/// f32 patterns: every exponent with edge mantissas, the halfway points (and their neighbours)
/// of every f16 and bf16 value, NaNs, infinities, and random patterns.
fn f32_inputs() -> Vec<u32> {
    let mut v = Vec::new();
    let edges = [
        0, 1, 2, 3, 0xfff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000, 0x7fff, 0x8000, 0x8001, 0xffff,
        0x10000, 0x18000, 0x3fffff, 0x400000, 0x400001, 0x7ffffe, 0x7fffff,
    ];
    for exp in 0..256u32 {
        for m in edges {
            v.push(exp << 23 | m);
        }
    }
    for h in 0..0x7c00u16 {
        let mid = (f16::from_bits(h).to_f64() + f16::from_bits(h + 1).to_f64()) / 2.0;
        let b = (mid as f32).to_bits();
        v.extend([b - 1, b, b + 1]);
    }
    for hi in 0..0x8000u32 {
        v.extend([hi << 16 | 0x7fff, hi << 16 | 0x8000, hi << 16 | 0x8001]);
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    v.extend((0..100_000).map(|_| rng.next() as u32));
    let negated: Vec<u32> = v.iter().map(|b| b ^ 0x8000_0000).collect();
    v.extend(negated);
    v
}

/// f64 patterns: every exponent with edge mantissas (the low 32 bits included), the halfway
/// points of every f16 value, of a spread of bf16 values and of random f32 values, with
/// neighbours one ulp and 2^-40 relative away, and random patterns.
fn f64_inputs() -> Vec<u64> {
    let mut v = Vec::new();
    let edges = [
        0u64,
        1,
        0xffff_ffff,
        1 << 32,
        1 << 41,
        1 << 44,
        0x8_0000_0000_0001,
    ];
    for exp in 0..2048u64 {
        for m in edges
            .iter()
            .chain(&[0xf_ffff_ffff_ffff, 0x7_ffff_ffff_ffff])
        {
            v.push(exp << 52 | m);
        }
    }
    let mut near = |mid: f64| {
        let b = mid.to_bits();
        let tiny = mid * f64::powi(2.0, -40);
        v.extend([
            b - 1,
            b,
            b + 1,
            (mid + tiny).to_bits(),
            (mid - tiny).to_bits(),
        ]);
    };
    for h in 0..0x7c00u16 {
        near((f16::from_bits(h).to_f64() + f16::from_bits(h + 1).to_f64()) / 2.0);
    }
    for h in (0..0x7f80u16).step_by(7) {
        near((bf16::from_bits(h).to_f64() + bf16::from_bits(h + 1).to_f64()) / 2.0);
    }
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for _ in 0..20_000 {
        let f = f32::from_bits(rng.next() as u32 & 0x7f7f_ffff);
        near((f as f64 + f32::from_bits(f.to_bits() + 1) as f64) / 2.0);
    }
    v.extend((0..100_000).map(|_| rng.next()));
    let negated: Vec<u64> = v.iter().map(|b| b ^ (1 << 63)).collect();
    v.extend(negated);
    v
}

#[test]
fn every_16_bit_pattern_widens_exactly() {
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let input = to_bytes(&all, u16::to_le_bytes);
    for op in ["h2f", "h2f_op"] {
        let got = from_bytes(&run(op, &input), u32::from_le_bytes);
        check(op, &all, &got, |h| f16::from_bits(*h).to_f32().to_bits());
    }
    let got = from_bytes(&run("b2f", &input), u32::from_le_bytes);
    check("b2f", &all, &got, |b| (*b as u32) << 16);
    check("b2f vs half", &all, &got, |b| {
        let crate_bits = bf16::from_bits(*b).to_f32().to_bits();
        if bf16::from_bits(*b).is_nan() {
            (*b as u32) << 16
        } else {
            crate_bits
        }
    });
}

#[test]
fn floats_narrow_to_16_bits_as_cuda_rounds() {
    let inputs = f32_inputs();
    let bytes = to_bytes(&inputs, u32::to_le_bytes);
    // Round to nearest even is the crate's from_f32 itself, but for NaN (CUDA: 0x7fff).
    let nearest_f16 = |b: &u32| {
        let x = f32::from_bits(*b);
        if x.is_nan() {
            0x7fff
        } else {
            f16::from_f32(x).to_bits()
        }
    };
    let nearest_bf16 = |b: &u32| {
        let x = f32::from_bits(*b);
        if x.is_nan() {
            0x7fff
        } else {
            bf16::from_f32(x).to_bits()
        }
    };
    for op in ["f2h", "f2h_ctor", "f2h_rn"] {
        check(
            op,
            &inputs,
            &from_bytes(&run(op, &bytes), u16::from_le_bytes),
            nearest_f16,
        );
    }
    for op in ["f2b", "f2b_ctor", "f2b_rn"] {
        check(
            op,
            &inputs,
            &from_bytes(&run(op, &bytes), u16::from_le_bytes),
            nearest_bf16,
        );
    }
    for mode in MODES {
        let op = format!("f2h_{mode}");
        let got = from_bytes(&run(&op, &bytes), u16::from_le_bytes);
        check(&op, &inputs, &got, |b| {
            f16_of(f32::from_bits(*b) as f64, mode)
        });
        let op = format!("f2b_{mode}");
        let got = from_bytes(&run(&op, &bytes), u16::from_le_bytes);
        check(&op, &inputs, &got, |b| {
            bf16_of(f32::from_bits(*b) as f64, mode)
        });
    }
}

#[test]
fn doubles_narrow_to_16_bits_directly() {
    let inputs = f64_inputs();
    let bytes = to_bytes(&inputs, u64::to_le_bytes);
    let got = from_bytes(&run("d2h", &bytes), u16::from_le_bytes);
    check("d2h", &inputs, &got, |b| f16_of(f64::from_bits(*b), "rn"));
    let got = from_bytes(&run("d2b", &bytes), u16::from_le_bytes);
    check("d2b", &inputs, &got, |b| bf16_of(f64::from_bits(*b), "rn"));
    // Where the low 32 bits are zero, the crate's own from_f64 is exact and must agree too.
    let short: Vec<u64> = inputs
        .iter()
        .copied()
        .filter(|b| b & 0xffff_ffff == 0)
        .collect();
    let got = from_bytes(
        &run("d2b", &to_bytes(&short, u64::to_le_bytes)),
        u16::from_le_bytes,
    );
    check("d2b vs bf16::from_f64", &short, &got, |b| {
        let x = f64::from_bits(*b);
        if x.is_nan() {
            0x7fff
        } else {
            bf16::from_f64(x).to_bits()
        }
    });
}

/// Rust's saturating float-to-int `as` after rounding in `mode` (PTX cvt.rni/rzi/rmi/rpi).
fn round_mode(x: f64, mode: &str) -> f64 {
    match mode {
        "rn" => x.round_ties_even(),
        "rz" => x.trunc(),
        "rd" => x.floor(),
        _ => x.ceil(),
    }
}

#[test]
fn floats_convert_to_integers_saturating() {
    // Every other pattern of each set (rounding to an integer has fewer edges than to 16 bits;
    // a stride of 3 would skip whole members of the halfway triples).
    let f32s: Vec<u32> = f32_inputs().into_iter().step_by(2).collect();
    let fb = to_bytes(&f32s, u32::to_le_bytes);
    let f64s: Vec<u64> = f64_inputs().into_iter().step_by(2).collect();
    let db = to_bytes(&f64s, u64::to_le_bytes);
    let all16: Vec<u16> = (0..=u16::MAX).collect();
    let hb = to_bytes(&all16, u16::to_le_bytes);
    for mode in MODES {
        let r32 = |b: &u32| round_mode(f32::from_bits(*b) as f64, mode);
        let r64 = |b: &u64| round_mode(f64::from_bits(*b), mode);
        let op = format!("f2i_{mode}");
        check(
            &op,
            &f32s,
            &from_bytes(&run(&op, &fb), i32::from_le_bytes),
            |b| r32(b) as i32,
        );
        let op = format!("f2u_{mode}");
        check(
            &op,
            &f32s,
            &from_bytes(&run(&op, &fb), u32::from_le_bytes),
            |b| r32(b) as u32,
        );
        let op = format!("f2ll_{mode}");
        check(
            &op,
            &f32s,
            &from_bytes(&run(&op, &fb), i64::from_le_bytes),
            |b| r32(b) as i64,
        );
        let op = format!("d2i_{mode}");
        check(
            &op,
            &f64s,
            &from_bytes(&run(&op, &db), i32::from_le_bytes),
            |b| r64(b) as i32,
        );
        let op = format!("d2u_{mode}");
        check(
            &op,
            &f64s,
            &from_bytes(&run(&op, &db), u32::from_le_bytes),
            |b| r64(b) as u32,
        );
        let op = format!("d2ll_{mode}");
        check(
            &op,
            &f64s,
            &from_bytes(&run(&op, &db), i64::from_le_bytes),
            |b| r64(b) as i64,
        );
        let op = format!("d2ull_{mode}");
        check(
            &op,
            &f64s,
            &from_bytes(&run(&op, &db), u64::from_le_bytes),
            |b| r64(b) as u64,
        );
        let h = |b: &u16| round_mode(f16::from_bits(*b).to_f64(), mode);
        let op = format!("h2i_{mode}");
        check(
            &op,
            &all16,
            &from_bytes(&run(&op, &hb), i32::from_le_bytes),
            |b| h(b) as i32,
        );
        let op = format!("h2us_{mode}");
        check(
            &op,
            &all16,
            &from_bytes(&run(&op, &hb), u16::from_le_bytes),
            |b| h(b) as u16,
        );
        let b16 = |b: &u16| round_mode(bf16::from_bits(*b).to_f64(), mode);
        let op = format!("b2ll_{mode}");
        check(
            &op,
            &all16,
            &from_bytes(&run(&op, &hb), i64::from_le_bytes),
            |b| b16(b) as i64,
        );
    }
}

#[test]
fn doubles_narrow_to_float_in_every_mode() {
    let inputs = f64_inputs();
    let bytes = to_bytes(&inputs, u64::to_le_bytes);
    for mode in MODES {
        let op = format!("d2f_{mode}");
        let got = from_bytes(&run(&op, &bytes), u32::from_le_bytes);
        check(&op, &inputs, &got, |b| {
            let x = f64::from_bits(*b);
            if x.is_nan() {
                return 0x7fff_ffff;
            }
            let r = x as f32;
            directed(
                r.to_bits() as u64,
                (r as f64).partial_cmp(&x),
                x < 0.0,
                mode,
                1 << 31,
            ) as u32
        });
    }
}

/// Integer inputs: small values and those around f16's largest, both ends, powers of two with
/// their neighbours and halfway points at several precisions, random values.
fn i64_inputs() -> Vec<i64> {
    let mut v: Vec<i64> = (-5_000..5_000).chain(60_000..70_000).collect();
    v.extend([
        i64::MIN,
        i64::MIN + 1,
        i64::MAX,
        i64::MAX - 1,
        65_504,
        65_519,
        65_520,
        65_536,
    ]);
    for s in 0..63 {
        for extra in [-1i64, 0, 1] {
            let p = 1i64 << s;
            v.extend([
                p + extra,
                p + (p >> 8) + extra,
                p + (p >> 11) + extra,
                p + (p >> 24) + extra,
            ]);
            v.extend([p + (p >> 53) + extra, p + (p >> 7) * 3 + extra]);
        }
    }
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    v.extend((0..40_000).map(|i| (rng.next() >> (i % 64)) as i64));
    let negated: Vec<i64> = v.iter().map(|x| x.wrapping_neg()).collect();
    v.extend(negated);
    v
}

/// `mag` (the magnitude of an integer) rounded to nearest even with `sig` significant bits.
fn round_sig(mag: u128, sig: u32) -> u128 {
    let len = 128 - mag.leading_zeros();
    if len <= sig {
        return mag;
    }
    let shift = len - sig;
    let (q, rem, half) = (mag >> shift, mag & ((1 << shift) - 1), 1u128 << (shift - 1));
    let up = rem > half || (rem == half && q & 1 == 1);
    (q + up as u128) << shift
}

/// An integer in a 16-bit format: `sig` significant bits, `to_bits` of the exact rounded
/// magnitude (at most 2^65, exact in f64); an infinite result compares above every integer.
fn int_to_16(
    v: i128,
    mode: &str,
    sig: u32,
    to_bits: fn(f64) -> u16,
    to_f64: fn(u16) -> f64,
) -> u16 {
    let mag = v.unsigned_abs();
    let rounded = round_sig(mag, sig);
    let signed = if v < 0 {
        -(rounded as f64)
    } else {
        rounded as f64
    };
    let r = to_bits(signed);
    let ord = if to_f64(r).is_infinite() {
        Some(if v < 0 {
            Ordering::Less
        } else {
            Ordering::Greater
        })
    } else {
        let back = to_f64(r) as i128;
        Some(back.cmp(&v))
    };
    directed(r as u64, ord, v < 0, mode, 0x8000) as u16
}

#[test]
fn integers_convert_to_16_bits_and_floats_in_every_mode() {
    let i64s = i64_inputs();
    let i32s: Vec<i32> = i64s.iter().map(|v| *v as i32).collect();
    let u64s: Vec<u64> = i64s.iter().map(|v| *v as u64).collect();
    let (lb, ib, ub) = (
        to_bytes(&i64s, i64::to_le_bytes),
        to_bytes(&i32s, i32::to_le_bytes),
        to_bytes(&u64s, u64::to_le_bytes),
    );
    let f16b = |x: f64| f16::from_f64(x).to_bits();
    let f16f = |b: u16| f16::from_bits(b).to_f64();
    let bf16b = |x: f64| bf16::from_f64(x).to_bits();
    let bf16f = |b: u16| bf16::from_bits(b).to_f64();
    for mode in MODES {
        let op = format!("i2h_{mode}");
        let got = from_bytes(&run(&op, &ib), u16::from_le_bytes);
        check(&op, &i32s, &got, |v| {
            int_to_16(*v as i128, mode, 11, f16b, f16f)
        });
        let op = format!("ull2h_{mode}");
        let got = from_bytes(&run(&op, &ub), u16::from_le_bytes);
        check(&op, &u64s, &got, |v| {
            int_to_16(*v as i128, mode, 11, f16b, f16f)
        });
        let op = format!("ll2b_{mode}");
        let got = from_bytes(&run(&op, &lb), u16::from_le_bytes);
        check(&op, &i64s, &got, |v| {
            int_to_16(*v as i128, mode, 8, bf16b, bf16f)
        });
        // To float and double: Rust's `as` rounds to nearest even; the exact value decides the
        // directed modes.
        let op = format!("ll2f_{mode}");
        check(
            &op,
            &i64s,
            &from_bytes(&run(&op, &lb), u32::from_le_bytes),
            |v| {
                let r = *v as f32;
                directed(
                    r.to_bits() as u64,
                    Some((r as i128).cmp(&(*v as i128))),
                    *v < 0,
                    mode,
                    1 << 31,
                ) as u32
            },
        );
        let op = format!("ull2f_{mode}");
        check(
            &op,
            &u64s,
            &from_bytes(&run(&op, &ub), u32::from_le_bytes),
            |v| {
                let r = *v as f32;
                directed(
                    r.to_bits() as u64,
                    Some((r as u128).cmp(&(*v as u128))),
                    false,
                    mode,
                    1 << 31,
                ) as u32
            },
        );
        let op = format!("ll2d_{mode}");
        check(
            &op,
            &i64s,
            &from_bytes(&run(&op, &lb), u64::from_le_bytes),
            |v| {
                let r = *v as f64;
                directed(
                    r.to_bits(),
                    Some((r as i128).cmp(&(*v as i128))),
                    *v < 0,
                    mode,
                    1 << 63,
                )
            },
        );
        let op = format!("ull2d_{mode}");
        check(
            &op,
            &u64s,
            &from_bytes(&run(&op, &ub), u64::from_le_bytes),
            |v| {
                let r = *v as f64;
                directed(
                    r.to_bits(),
                    Some((r as u128).cmp(&(*v as u128))),
                    false,
                    mode,
                    1 << 63,
                )
            },
        );
    }
}

#[test]
fn atomics_from_several_threads_are_exact() {
    let (ok, out) = support::run_program(support::probe(), "atomics", &[]);
    let out = String::from_utf8_lossy(&out);
    assert!(ok && out.trim() == "ok", "{out}");
}
