//! The emulator's arithmetic built-ins (`include/`), checked bit for bit by the C++ probe
//! (`tests/builtins_cpp/probe.cpp`): the `_rn` float and double intrinsics against Rust's IEEE
//! arithmetic (which never fuses), 16-bit arithmetic against the `half` crate and, for the
//! fused multiply-add, an exact fixed-point reference; the integer intrinsics against Rust's; and
//! the `_rn` intrinsics staying unfused when g++ is told to contract.
//!
//! Invariants: references are independent of the headers; NaN results compare as "both NaN"
//! (payloads are the host's, see kiln_emu_builtins.h), everything else by bits.

#[path = "builtins_cpp/support.rs"]
mod support;

use half::{bf16, f16};
use support::{run, Rng};

fn floats(rng: &mut Rng, n: usize) -> Vec<u32> {
    // Half arbitrary patterns (NaN, inf, subnormal included), half moderate values.
    (0..n)
        .map(|i| {
            let r = rng.next();
            if i % 2 == 0 {
                r as u32
            } else {
                ((r as f64 / u64::MAX as f64 - 0.5) as f32 * 8.0).to_bits()
            }
        })
        .collect()
}
fn doubles(rng: &mut Rng, n: usize) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let r = rng.next();
            if i % 2 == 0 {
                r
            } else {
                ((r as f64 / u64::MAX as f64 - 0.5) * 8.0).to_bits()
            }
        })
        .collect()
}
fn le32(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn le64(v: &[u64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn le16(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn words<const N: usize>(b: &[u8]) -> Vec<[u8; N]> {
    b.chunks(N).map(|c| c.try_into().unwrap()).collect()
}

/// Compares results with a reference, records of `arity` operands each.
fn check<T: Copy + std::fmt::Debug>(
    op: &str,
    ins: &[T],
    arity: usize,
    got: &[T],
    want: impl Fn(&[T]) -> T,
    same: impl Fn(T, T) -> bool,
) {
    assert_eq!(ins.len() / arity, got.len(), "{op}: result count");
    let bad: Vec<String> = ins
        .chunks(arity)
        .zip(got)
        .filter(|(i, g)| !same(want(i), **g))
        .map(|(i, g)| format!("{op}{i:x?} = {g:x?}, want {:x?}", want(i)))
        .collect();
    assert!(
        bad.is_empty(),
        "{} mismatches, first: {:#?}",
        bad.len(),
        &bad[..bad.len().min(8)]
    );
}
fn same32(a: u32, b: u32) -> bool {
    a == b || (f32::from_bits(a).is_nan() && f32::from_bits(b).is_nan())
}
fn same64(a: u64, b: u64) -> bool {
    a == b || (f64::from_bits(a).is_nan() && f64::from_bits(b).is_nan())
}

#[test]
fn rn_intrinsics_are_single_ieee_operations() {
    let mut rng = Rng(7);
    let f = floats(&mut rng, 300_000);
    let fb = le32(&f);
    type F2 = fn(f32, f32) -> f32;
    let ops2: [(&str, F2); 4] = [
        ("fadd", |a, b| a + b),
        ("fsub", |a, b| a - b),
        ("fmul", |a, b| a * b),
        ("fdiv", |a, b| a / b),
    ];
    let b32 = |x: &u32| f32::from_bits(*x);
    for (op, r) in ops2 {
        let got: Vec<u32> = words::<4>(&run(op, &fb))
            .into_iter()
            .map(u32::from_le_bytes)
            .collect();
        check(
            op,
            &f,
            2,
            &got,
            |i| r(b32(&i[0]), b32(&i[1])).to_bits(),
            same32,
        );
    }
    let got: Vec<u32> = words::<4>(&run("frcp", &fb))
        .into_iter()
        .map(u32::from_le_bytes)
        .collect();
    check(
        "frcp",
        &f,
        1,
        &got,
        |i| (1.0 / b32(&i[0])).to_bits(),
        same32,
    );
    let got: Vec<u32> = words::<4>(&run("fsqrt", &fb))
        .into_iter()
        .map(u32::from_le_bytes)
        .collect();
    check(
        "fsqrt",
        &f,
        1,
        &got,
        |i| b32(&i[0]).sqrt().to_bits(),
        same32,
    );
    let f3 = &f[..f.len() / 3 * 3];
    let fb3 = le32(f3);
    let got: Vec<u32> = words::<4>(&run("fmaf", &fb3))
        .into_iter()
        .map(u32::from_le_bytes)
        .collect();
    check(
        "fmaf",
        f3,
        3,
        &got,
        |i| b32(&i[0]).mul_add(b32(&i[1]), b32(&i[2])).to_bits(),
        same32,
    );
    let got: Vec<u32> = words::<4>(&run("fmul_add", &fb3))
        .into_iter()
        .map(u32::from_le_bytes)
        .collect();
    check(
        "fmul_add",
        f3,
        3,
        &got,
        |i| (b32(&i[0]) * b32(&i[1]) + b32(&i[2])).to_bits(),
        same32,
    );

    let d = doubles(&mut rng, 300_000);
    let db = le64(&d);
    type D2 = fn(f64, f64) -> f64;
    let ops2: [(&str, D2); 4] = [
        ("dadd", |a, b| a + b),
        ("dsub", |a, b| a - b),
        ("dmul", |a, b| a * b),
        ("ddiv", |a, b| a / b),
    ];
    let b64 = |x: &u64| f64::from_bits(*x);
    for (op, r) in ops2 {
        let got: Vec<u64> = words::<8>(&run(op, &db))
            .into_iter()
            .map(u64::from_le_bytes)
            .collect();
        check(
            op,
            &d,
            2,
            &got,
            |i| r(b64(&i[0]), b64(&i[1])).to_bits(),
            same64,
        );
    }
    let got: Vec<u64> = words::<8>(&run("dsqrt", &db))
        .into_iter()
        .map(u64::from_le_bytes)
        .collect();
    check(
        "dsqrt",
        &d,
        1,
        &got,
        |i| b64(&i[0]).sqrt().to_bits(),
        same64,
    );
    let d3 = &d[..d.len() / 3 * 3];
    let db3 = le64(d3);
    let got: Vec<u64> = words::<8>(&run("dfma", &db3))
        .into_iter()
        .map(u64::from_le_bytes)
        .collect();
    check(
        "dfma",
        d3,
        3,
        &got,
        |i| b64(&i[0]).mul_add(b64(&i[1]), b64(&i[2])).to_bits(),
        same64,
    );
    let got: Vec<u64> = words::<8>(&run("dmul_add", &db3))
        .into_iter()
        .map(u64::from_le_bytes)
        .collect();
    check(
        "dmul_add",
        d3,
        3,
        &got,
        |i| (b64(&i[0]) * b64(&i[1]) + b64(&i[2])).to_bits(),
        same64,
    );
}

/// a * b + c rounded once to a 16-bit format, exactly: the operands as integers times 2^-unit
/// (every input here is a multiple of 2^-unit/2), the sum in i128, then rounded to `sig`
/// significant bits but never below the format's smallest subnormal 2^-`tiny`.
fn fma_exact(a: f64, b: f64, c: f64, unit: i32, sig: u32, tiny: i32) -> f64 {
    let fixed = |x: f64, scale: i32| (x * f64::powi(2.0, scale)) as i128; // exact by construction
    let (p, q) = (fixed(a, unit / 2) * fixed(b, unit / 2), fixed(c, unit));
    let s = p + q;
    if s == 0 {
        let neg =
            (p == 0 && (a.is_sign_negative() != b.is_sign_negative())) && (c.is_sign_negative());
        return if neg { -0.0 } else { 0.0 };
    }
    let mag = s.unsigned_abs();
    let len = 128 - mag.leading_zeros();
    let shift = (len.saturating_sub(sig) as i32).max(unit - tiny);
    let rounded = if shift <= 0 {
        mag
    } else {
        let (q, rem, half) = (mag >> shift, mag & ((1 << shift) - 1), 1u128 << (shift - 1));
        (q + (rem > half || (rem == half && q & 1 == 1)) as u128) << shift
    };
    let v = rounded as f64 * f64::powi(2.0, -unit);
    if s < 0 {
        -v
    } else {
        v
    }
}

fn finite16(rng: &mut Rng, n: usize, is_ok: impl Fn(u16) -> bool) -> Vec<u16> {
    std::iter::repeat_with(|| rng.next() as u16)
        .filter(|b| is_ok(*b))
        .take(n)
        .collect()
}

#[test]
fn half_and_bfloat16_arithmetic_rounds_once() {
    let mut rng = Rng(11);
    let hs: Vec<u16> = (0..200_000).map(|_| rng.next() as u16).collect();
    let hb = le16(&hs);
    let same16 =
        |a: u16, b: u16| a == b || (f16::from_bits(a).is_nan() && f16::from_bits(b).is_nan());
    let sameb =
        |a: u16, b: u16| a == b || (bf16::from_bits(a).is_nan() && bf16::from_bits(b).is_nan());
    let h = |b: u16| f16::from_bits(b);
    let bf = |b: u16| bf16::from_bits(b);
    let res = |op: &str, input: &[u8]| -> Vec<u16> {
        words::<2>(&run(op, input))
            .into_iter()
            .map(u16::from_le_bytes)
            .collect()
    };
    type H2 = fn(f16, f16) -> f16;
    let hops: [(&str, H2); 4] = [
        ("hadd", |a, b| a + b),
        ("hsub", |a, b| a - b),
        ("hmul", |a, b| a * b),
        ("hdiv", |a, b| a / b),
    ];
    for (op, r) in hops {
        check(
            op,
            &hs,
            2,
            &res(op, &hb),
            |i| r(h(i[0]), h(i[1])).to_bits(),
            same16,
        );
    }
    type B2 = fn(bf16, bf16) -> bf16;
    let bops: [(&str, B2); 3] = [
        ("badd", |a, b| a + b),
        ("bmul", |a, b| a * b),
        ("bdiv", |a, b| a / b),
    ];
    for (op, r) in bops {
        check(
            op,
            &hs,
            2,
            &res(op, &hb),
            |i| r(bf(i[0]), bf(i[1])).to_bits(),
            sameb,
        );
    }
    check(
        "hlt",
        &hs,
        2,
        &res("hlt", &hb),
        |i| (h(i[0]) < h(i[1])) as u16,
        |a, b| a == b,
    );
    // __hmax: a NaN operand yields the other (both NaN: 0x7fff); +0 is above -0.
    check(
        "hmax",
        &hs,
        2,
        &res("hmax", &hb),
        |i| match (h(i[0]).is_nan(), h(i[1]).is_nan()) {
            (true, true) => 0x7fff,
            (true, false) => i[1],
            (false, true) => i[0],
            _ if h(i[0]) == h(i[1]) => {
                if h(i[0]).is_sign_negative() {
                    i[1]
                } else {
                    i[0]
                }
            }
            _ => {
                if h(i[0]) > h(i[1]) {
                    i[0]
                } else {
                    i[1]
                }
            }
        },
        |a, b| a == b,
    );
    // Fused multiply-add: finite operands; f16 over its whole range, bf16 with exponents
    // within 2^±20 (so the fixed-point reference fits in i128).
    let ht = finite16(&mut rng, 150_000, |b| h(b).is_finite());
    check(
        "hfma",
        &ht,
        3,
        &res("hfma", &le16(&ht)),
        |i| {
            f16::from_f64(fma_exact(
                h(i[0]).to_f64(),
                h(i[1]).to_f64(),
                h(i[2]).to_f64(),
                48,
                11,
                24,
            ))
            .to_bits()
        },
        |a, b| a == b,
    );
    let mut bt = finite16(&mut rng, 150_000, |b| {
        bf(b).to_f64().abs() < 1048576.0
            && (b & 0x7fff == 0 || bf(b).to_f64().abs() >= 1.0 / 1048576.0)
    });
    // Products near 2^39 plus an addend near 2^-20: the addend vanishes from the double sum, so
    // where the product lies on a halfway point only the round-to-odd step breaks the tie.
    for _ in 0..60_000 {
        let r = rng.next();
        let big = |x: u64| (0x4900 | (x & 0x7f)) as u16 | ((x as u16 >> 7) & 1) << 15; // 2^19..2^20
        let tiny = (0x3580 | (r >> 32) & 0x7f) as u16 | ((r >> 40) as u16 & 1) << 15; // 2^-20
        bt.extend([big(r), big(r >> 8), tiny]);
    }
    check(
        "bfma",
        &bt,
        3,
        &res("bfma", &le16(&bt)),
        |i| {
            bf16::from_f64(fma_exact(
                bf(i[0]).to_f64(),
                bf(i[1]).to_f64(),
                bf(i[2]).to_f64(),
                54,
                8,
                133,
            ))
            .to_bits()
        },
        |a, b| a == b,
    );
}

#[test]
fn integer_intrinsics_match_rust() {
    let mut rng = Rng(13);
    let mut w: Vec<u64> = (0..100_000).map(|i| rng.next() >> (i % 64)).collect();
    w.extend([0, 1, u64::MAX, 1 << 63, 1 << 31, u32::MAX as u64]);
    let w32: Vec<u32> = w.iter().map(|x| *x as u32).collect();
    let (b32, b64) = (le32(&w32), le64(&w));
    let r32 = |op: &str, b: &[u8]| -> Vec<u32> {
        words::<4>(&run(op, b))
            .into_iter()
            .map(u32::from_le_bytes)
            .collect()
    };
    let r64 = |op: &str, b: &[u8]| -> Vec<u64> {
        words::<8>(&run(op, b))
            .into_iter()
            .map(u64::from_le_bytes)
            .collect()
    };
    let eq32 = |a: u32, b: u32| a == b;
    let eq64 = |a: u64, b: u64| a == b;
    check(
        "popc",
        &w32,
        1,
        &r32("popc", &b32),
        |i| i[0].count_ones(),
        eq32,
    );
    check(
        "clz",
        &w32,
        1,
        &r32("clz", &b32),
        |i| i[0].leading_zeros(),
        eq32,
    );
    check(
        "ffs",
        &w32,
        1,
        &r32("ffs", &b32),
        |i| {
            if i[0] == 0 {
                0
            } else {
                i[0].trailing_zeros() + 1
            }
        },
        eq32,
    );
    check(
        "brev",
        &w32,
        1,
        &r32("brev", &b32),
        |i| i[0].reverse_bits(),
        eq32,
    );
    check(
        "umulhi",
        &w32,
        2,
        &r32("umulhi", &b32),
        |i| ((i[0] as u64 * i[1] as u64) >> 32) as u32,
        eq32,
    );
    check(
        "mulhi",
        &w32,
        2,
        &r32("mulhi", &b32),
        |i| ((i[0] as i32 as i64 * i[1] as i32 as i64) >> 32) as u32,
        eq32,
    );
    let w3 = &w32[..w32.len() / 3 * 3];
    check(
        "byte_perm",
        w3,
        3,
        &r32("byte_perm", &le32(w3)),
        |i| {
            let bytes = ((i[1] as u64) << 32 | i[0] as u64).to_le_bytes();
            (0..4).fold(0, |r, k| {
                r | (bytes[((i[2] >> (4 * k)) & 7) as usize] as u32) << (8 * k)
            })
        },
        eq32,
    );
    let p: Vec<u64> = r32("popcll", &b64).into_iter().map(u64::from).collect();
    check("popcll", &w, 1, &p, |i| i[0].count_ones() as u64, eq64);
    let c: Vec<u64> = r32("clzll", &b64).into_iter().map(u64::from).collect();
    check("clzll", &w, 1, &c, |i| i[0].leading_zeros() as u64, eq64);
    check(
        "brevll",
        &w,
        1,
        &r64("brevll", &b64),
        |i| i[0].reverse_bits(),
        eq64,
    );
    check(
        "umul64hi",
        &w,
        2,
        &r64("umul64hi", &b64),
        |i| ((i[0] as u128 * i[1] as u128) >> 64) as u64,
        eq64,
    );
    check(
        "mul64hi",
        &w,
        2,
        &r64("mul64hi", &b64),
        |i| ((i[0] as i64 as i128 * i[1] as i64 as i128) >> 64) as u64,
        eq64,
    );
}

/// With contraction on and an FMA-capable target, g++ fuses the plain a * b + c but never the
/// intrinsics. Runs where the host CPU has FMA (x86-64); says so and returns elsewhere.
#[test]
fn rn_intrinsics_stay_unfused_when_gxx_contracts() {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    if !cfg!(target_arch = "x86_64") || !cpu.split_whitespace().any(|w| w == "fma") {
        eprintln!("skipped: the host CPU has no x86 FMA to contract into");
        return;
    }
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kiln-emu-builtins");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let exe = dir.join(format!("contract-{}", std::process::id()));
    let src = support::crate_dir().join("tests/builtins_cpp/contract.cpp");
    let inc = format!("-I{}", support::include_dir().display());
    let args: [&std::ffi::OsStr; 8] = [
        "-std=c++17".as_ref(),
        "-O2".as_ref(),
        "-mfma".as_ref(),
        "-ffp-contract=fast".as_ref(),
        inc.as_ref(),
        src.as_os_str(),
        "-o".as_ref(),
        exe.as_os_str(),
    ];
    support::compile(&args, "tests/builtins_cpp/contract.cpp");
    let mut rng = Rng(17);
    let moderate: Vec<u32> = (0..30_000)
        .map(|_| ((rng.next() as f64 / u64::MAX as f64 - 0.5) as f32 * 3.0).to_bits())
        .collect();
    let (ok, out) = support::run_program(&exe, "", &le32(&moderate));
    let _ = std::fs::remove_file(&exe);
    assert!(ok, "contract probe failed");
    let got: Vec<u32> = words::<4>(&out)
        .into_iter()
        .map(u32::from_le_bytes)
        .collect();
    let rn: Vec<u32> = got.iter().step_by(2).copied().collect();
    let f = |b: u32| f32::from_bits(b);
    check(
        "rn under -ffp-contract=fast",
        &moderate,
        3,
        &rn,
        |i| (f(i[0]) * f(i[1]) + f(i[2])).to_bits(),
        same32,
    );
    let fused = moderate
        .chunks(3)
        .zip(got.iter().skip(1).step_by(2))
        .filter(|(i, g)| {
            f(i[0]).mul_add(f(i[1]), f(i[2])).to_bits() == **g
                && (f(i[0]) * f(i[1]) + f(i[2])).to_bits() != **g
        });
    assert!(
        fused.count() > 0,
        "g++ fused no plain a*b+c: the check above proves nothing here"
    );
}
