//! Run-time choice of vector instructions for kiln's hand-vectorised CPU loops.
//!
//! kiln builds for the x86-64 baseline (128-bit SSE), where loops such as AdamW's update, max
//! pooling's compare-and-select and the direct convolution's tiles stay narrow. Each is written
//! once, as a portable `#[inline(always)]` body; [`simd_dispatch!`] compiles that body again
//! inside `#[target_feature]` wrappers, one per [`Isa`], and writes the function that calls the
//! wrapper for the instruction set it is given ([`isa`]: the best this CPU has, found once).
//!
//! `KILN_CPU_CAPABILITY` caps the choice, as `ATEN_CPU_CAPABILITY` does for PyTorch: `avx512`,
//! `avx2` or `default` (the portable build), to reproduce what a smaller machine computes or to
//! compare speeds. It does not reach `gemm`, which picks its own kernels. A value that is not
//! one of those, or asks for more than the CPU has, is reported on stderr (naming the variable
//! and the fix) and the best the CPU has, or the requested cap's best below it, is used.
//!
//! Invariants: a wrapper is only called with an [`Isa`] this CPU has ([`isa`] and
//! [`available`] only return detected ones), which is what makes its `unsafe` call sound; every
//! build compiles the same body with the same operations in the same order (Rust never fuses a
//! multiply and an add unless the body calls `mul_add`, which rounds exactly once on every
//! path), so the paths agree bit for bit except in a NaN's sign and payload, and each user
//! tests that on every instruction set the CPU has. Off x86-64 there is no wrapper: the
//! portable body runs.

/// The instruction sets the loops are also compiled for, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AVX-512F (32 registers of 16 f32 lanes; FMA with it).
    Avx512,
    /// AVX2 with FMA (16 registers of 8 f32 lanes).
    Avx2,
}

impl Isa {
    /// Every instruction set, best first.
    const ALL: [Isa; 2] = [Isa::Avx512, Isa::Avx2];

    /// Whether this CPU has the instruction set (`std` caches the CPU check).
    fn detected(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let fma = std::arch::is_x86_feature_detected!("fma");
            match self {
                Isa::Avx512 => fma && std::arch::is_x86_feature_detected!("avx512f"),
                Isa::Avx2 => fma && std::arch::is_x86_feature_detected!("avx2"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }
}

/// The instruction set the loops run with: the best this CPU has under `KILN_CPU_CAPABILITY`,
/// or `None` (the portable bodies run). Found once per process.
pub(crate) fn isa() -> Option<Isa> {
    use std::sync::OnceLock;
    static CHOSEN: OnceLock<Option<Isa>> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let raw = std::env::var("KILN_CPU_CAPABILITY").ok();
        let (isa, warning) = resolve_capability(raw.as_deref(), &available());
        if let Some(w) = warning {
            eprintln!("{w}");
        }
        isa
    })
}

/// The instruction set kiln's hand-vectorised CPU loops run with in this process, named as
/// `KILN_CPU_CAPABILITY` names it: `"avx512"`, `"avx2"` or `"default"` (the portable build).
/// What a CPU kernel's own scratch can depend on (`cargo xtask record-traces` needs `"avx2"`).
pub fn cpu_capability() -> &'static str {
    capability_name(isa())
}

/// The `KILN_CPU_CAPABILITY` value that selects `isa`.
fn capability_name(isa: Option<Isa>) -> &'static str {
    match isa {
        Some(Isa::Avx512) => "avx512",
        Some(Isa::Avx2) => "avx2",
        None => "default",
    }
}

/// The instruction set to run from a raw `KILN_CPU_CAPABILITY` value on a CPU that has
/// `detected` (best first): `(isa, warning)`. Unset: the best detected. `avx512` / `avx2`: the
/// best detected at or below it. `default`: none. Anything else: the best detected, with a
/// warning naming the accepted values; a cap above what the CPU has also warns.
fn resolve_capability(raw: Option<&str>, detected: &[Isa]) -> (Option<Isa>, Option<String>) {
    let best = detected.first().copied();
    let Some(text) = raw else {
        return (best, None);
    };
    let cap = match text.trim().to_ascii_lowercase().as_str() {
        "avx512" => Isa::Avx512,
        "avx2" => Isa::Avx2,
        "default" => return (None, None),
        _ => {
            let shown: String = text.chars().take(40).collect();
            let warning = format!(
                "kiln: ignoring KILN_CPU_CAPABILITY={shown:?}: expected avx512, avx2 or default; \
                 using {}",
                describe(best)
            );
            return (best, Some(warning));
        }
    };
    // `Isa::ALL` is best first, so the cap and everything after it are allowed.
    let allowed = &Isa::ALL[Isa::ALL.iter().position(|&i| i == cap).unwrap_or(0)..];
    let chosen = detected.iter().copied().find(|i| allowed.contains(i));
    let warning = (chosen != Some(cap)).then(|| {
        format!(
            "kiln: KILN_CPU_CAPABILITY={} asks for {cap:?}, which this CPU does not have; using \
             {}: set it to one this CPU has, or unset it",
            text.trim(),
            describe(chosen)
        )
    });
    (chosen, warning)
}

/// How a choice reads in a message.
fn describe(isa: Option<Isa>) -> String {
    isa.map_or_else(|| "the portable build".into(), |i| format!("{i:?}"))
}

/// Asks the CPU to bring the cache line holding `value` into L1 ahead of a read: for access
/// patterns its own prefetchers miss (reads that jump farther than a page each time). A hint
/// with no effect on any value; nothing off x86-64.
#[inline(always)]
pub(crate) fn prefetch_read<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: SSE is part of x86-64's baseline, and a prefetch never faults or writes; the
        // pointer comes from a reference anyway.
        unsafe { _mm_prefetch::<_MM_HINT_T0>((value as *const T).cast::<i8>()) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// Every instruction set this CPU has, best first (the tests run each).
pub(crate) fn available() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|isa| isa.detected()).collect()
}

/// Writes `fn name<generics>(isa: Option<Isa>, args..) -> ret`, which runs `body::<targs>` compiled
/// for `isa` (or as built, for `None`). `isa` must come from [`isa`] or [`available`].
///
/// ```ignore
/// simd_dispatch! {
///     /// Docs of the dispatching function.
///     fn max_taps[T: KernelFloat](out: &mut [T], k: i64) => max_taps_body[T];
/// }
/// ```
macro_rules! simd_dispatch {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident [$($generics:tt)*] ($($arg:ident : $ty:ty),* $(,)?)
            $(-> $ret:ty)? => $body:ident [$($targs:tt)*];
    ) => {
        $(#[$meta])*
        $vis fn $name<$($generics)*>(
            isa: Option<$crate::ops::simd::Isa>,
            $($arg: $ty),*
        ) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,fma")]
                unsafe fn avx512<$($generics)*>($($arg: $ty),*) $(-> $ret)? {
                    $body::<$($targs)*>($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2<$($generics)*>($($arg: $ty),*) $(-> $ret)? {
                    $body::<$($targs)*>($($arg),*)
                }
                match isa {
                    // SAFETY: `isa` came from `simd::isa` or `simd::available`, which only
                    // return instruction sets this CPU has.
                    Some($crate::ops::simd::Isa::Avx512) => {
                        return unsafe { avx512::<$($targs)*>($($arg),*) }
                    }
                    // SAFETY: as above.
                    Some($crate::ops::simd::Isa::Avx2) => {
                        return unsafe { avx2::<$($targs)*>($($arg),*) }
                    }
                    None => {}
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = isa;
            $body::<$($targs)*>($($arg),*)
        }
    };
}
pub(crate) use simd_dispatch;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_capability_names_what_kiln_cpu_capability_accepts() {
        // Each name, given as KILN_CPU_CAPABILITY on a CPU with everything, selects the
        // instruction set it names, with no warning.
        for name in ["avx512", "avx2", "default"] {
            let (isa, warning) = resolve_capability(Some(name), &Isa::ALL);
            assert_eq!((capability_name(isa), warning), (name, None));
        }
        assert_eq!(cpu_capability(), capability_name(isa()));
    }

    #[inline(always)]
    fn dot_body<const N: usize>(a: &[f32; N], b: &[f32; N]) -> f32 {
        a.iter().zip(b).fold(0.0, |s, (x, y)| x.mul_add(*y, s))
    }

    simd_dispatch! {
        /// A dot product through every build.
        fn dot[const N: usize](a: &[f32; N], b: &[f32; N]) -> f32 => dot_body[N];
    }

    /// `KILN_CPU_CAPABILITY`: unset or capped, the best the CPU has within the cap; a cap the
    /// CPU lacks, or a value that is not one, warns and still chooses.
    #[test]
    fn the_capability_variable_caps_the_choice() {
        use Isa::{Avx2, Avx512};
        let both = [Avx512, Avx2];
        let resolve = |raw: Option<&str>, detected: &[Isa]| resolve_capability(raw, detected);
        assert_eq!(resolve(None, &both), (Some(Avx512), None));
        assert_eq!(resolve(None, &[]), (None, None));
        assert_eq!(resolve(Some("avx512"), &both), (Some(Avx512), None));
        assert_eq!(resolve(Some(" AVX2 "), &both), (Some(Avx2), None));
        assert_eq!(resolve(Some("default"), &both), (None, None));
        let (isa, warning) = resolve(Some("avx512"), &[Avx2]);
        assert_eq!(isa, Some(Avx2));
        let warning = warning.unwrap();
        assert!(warning.contains("KILN_CPU_CAPABILITY=avx512") && warning.contains("Avx2"));
        let (isa, warning) = resolve(Some("avx2"), &[]);
        assert_eq!(isa, None);
        assert!(warning.unwrap().contains("the portable build"));
        let (isa, warning) = resolve(Some("sse9"), &both);
        assert_eq!(isa, Some(Avx512));
        assert!(warning
            .unwrap()
            .contains("expected avx512, avx2 or default"));
    }

    /// The chosen instruction set is one the CPU has; a dispatched call gives the
    /// portable body's bits on every instruction set this CPU has.
    #[test]
    fn every_instruction_set_runs_the_same_body() {
        let found = available();
        assert!(isa().is_none_or(|chosen| found.contains(&chosen)));
        assert!(found.iter().all(|isa| isa.detected()));
        if found.is_empty() {
            eprintln!("only the portable build is checked: no AVX-512F or AVX2 + FMA here");
        }
        let a: [f32; 37] = std::array::from_fn(|i| (i as f32 * 0.37).sin());
        let b: [f32; 37] = std::array::from_fn(|i| (i as f32 * 1.3).cos());
        let want = dot_body(&a, &b).to_bits();
        assert_eq!(dot(None, &a, &b).to_bits(), want);
        for isa in found {
            assert_eq!(dot(Some(isa), &a, &b).to_bits(), want, "{isa:?}");
        }
    }
}
