//! Numeric helpers for kiln's tests, written once: closeness with an absolute and a relative
//! tolerance, errors in units in the last place, slice assertions that name the first bad
//! index, a central finite-difference gradient check, a check that an error message prints
//! its numbers readably, the fuzz suites' cap on their own address space, and a named pipe for
//! the tests of readers that must refuse one.
//!
//! Invariants: every numeric helper works on plain `f64` values, closures or message text (the
//! address-space cap on the test process itself), and none depends on a kiln crate (each kiln
//! crate's tests adapt their tensors or storages to it); a value `got` matches `want` within
//! `(atol, rtol)` when `|got - want| <= atol + rtol * |want|`, and the rule is written only in
//! [`close`] (and [`close_finite`] for comparisons that must fail on NaN).

mod address_limit;
pub use address_limit::{limit_address_space, FUZZ_ADDRESS_SPACE_BYTES};

/// An absolute and a relative tolerance, `(atol, rtol)`.
pub type Tol = (f64, f64);

/// True when `got` matches `want` within `(atol, rtol)`: NaN matches only NaN, an infinity
/// only the same infinity, anything else when `|got - want| <= atol + rtol * |want|`.
pub fn close(got: f64, want: f64, (atol, rtol): Tol) -> bool {
    if got.is_nan() || want.is_nan() {
        return got.is_nan() && want.is_nan();
    }
    if got.is_infinite() || want.is_infinite() {
        return got == want;
    }
    (got - want).abs() <= atol + rtol * want.abs()
}

/// How many units in the last place of `want` (`f64::EPSILON * |want|`) `got` is from it: the
/// error measure of a math function written to track libm (`want` a normal number).
pub fn ulps(got: f64, want: f64) -> f64 {
    (got - want).abs() / (want.abs() * f64::EPSILON)
}

/// [`close`] for values that must be finite: a NaN or an infinity on either side never matches.
pub fn close_finite(got: f64, want: f64, tol: Tol) -> bool {
    got.is_finite() && want.is_finite() && close(got, want, tol)
}

/// Index, got and want of the first element of `got` not [`close`] to `want`, compared with
/// `matches` (`close` or `close_finite`).
fn first_mismatch<T: Copy + Into<f64>>(
    got: &[T],
    want: &[f64],
    tol: Tol,
    matches: fn(f64, f64, Tol) -> bool,
) -> Option<(usize, f64, f64)> {
    got.iter()
        .zip(want)
        .enumerate()
        .map(|(i, (&g, &w))| (i, g.into(), w))
        .find(|&(_, g, w)| !matches(g, w, tol))
}

fn assert_all<T: Copy + Into<f64>>(
    what: &str,
    got: &[T],
    want: &[f64],
    tol: Tol,
    matches: fn(f64, f64, Tol) -> bool,
) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: length {} vs {}",
        got.len(),
        want.len()
    );
    if let Some((i, g, w)) = first_mismatch(got, want, tol, matches) {
        panic!(
            "{what}[{i}]: got {g:?}, want {w:?} (atol {:?}, rtol {:?}; {} elements)",
            tol.0,
            tol.1,
            got.len()
        );
    }
}

/// Asserts `got` and `want` have the same length and every element is [`close`] (NaN matches
/// NaN); the message names the first bad index.
pub fn assert_close<T: Copy + Into<f64>>(what: &str, got: &[T], want: &[f64], tol: Tol) {
    assert_all(what, got, want, tol, close);
}

/// [`assert_close`] where every value must be finite (a NaN or infinity fails).
pub fn assert_close_finite<T: Copy + Into<f64>>(what: &str, got: &[T], want: &[f64], tol: Tol) {
    assert_all(what, got, want, tol, close_finite);
}

/// Checks `analytic[i]`, the gradient of a scalar function with respect to input `i`, against
/// central differences with step `eps`. `inputs[i]` is input `i`'s values; `loss(i, values)`
/// evaluates the function with input `i` replaced by `values` and the others unchanged. An
/// element passes when `|analytic - numeric| <= atol + rtol * |numeric|` (finite values only);
/// the message names the input and element.
pub fn gradcheck(
    what: &str,
    inputs: &[Vec<f64>],
    analytic: &[Vec<f64>],
    eps: f64,
    tol: Tol,
    loss: impl Fn(usize, &[f64]) -> f64,
) {
    assert_eq!(inputs.len(), analytic.len(), "{what}: gradients per input");
    for (i, (x, grad)) in inputs.iter().zip(analytic).enumerate() {
        assert_eq!(x.len(), grad.len(), "{what}: input {i}: gradient length");
        let mut probe = x.clone();
        for j in 0..x.len() {
            probe[j] = x[j] + eps;
            let up = loss(i, &probe);
            probe[j] = x[j] - eps;
            let down = loss(i, &probe);
            probe[j] = x[j];
            let numeric = (up - down) / (2.0 * eps);
            assert!(
                close_finite(grad[j], numeric, tol),
                "{what}: d/d input {i}[{j}]: analytic {}, numeric {numeric}",
                grad[j]
            );
        }
    }
}

/// The longest run of digits an error message may print. Integers (a size, an index, a step,
/// an i128 read from a file) have at most 39; a float printed with `{}` (Display) writes every
/// digit of its integer part or every leading zero (1e300 as 301 digits), where `{:?}` writes
/// `1e300`.
pub const LONGEST_DIGIT_RUN: usize = 40;

/// Panics when `message` prints a number as a run of more than [`LONGEST_DIGIT_RUN`] digits,
/// outside double quotes and backticks (text the caller gave, such as an environment
/// variable's value or a setting, is quoted back as it was; inside double quotes a backslash
/// escapes the next character, as `{:?}` writes a quote in the text).
pub fn assert_readable(message: &str) {
    let (mut run, mut open, mut escaped) = (0, None, false);
    for c in message.chars() {
        match open {
            Some('"') if escaped => escaped = false,
            Some('"') if c == '\\' => escaped = true,
            Some(q) if c == q => open = None,
            None if c == '"' || c == '`' => open = Some(c),
            _ => {}
        }
        run = if c.is_ascii_digit() && open.is_none() {
            run + 1
        } else {
            0
        };
        assert!(
            run <= LONGEST_DIGIT_RUN,
            "an error message prints a number as more than {LONGEST_DIGIT_RUN} digits (a float \
             shown with {{}} rather than {{:?}}): {message}"
        );
    }
}

/// Makes a named pipe at `path` (the `mkfifo` command), for the tests of readers that must
/// refuse one rather than wait for its writer. Panics when it cannot.
pub fn make_fifo(path: &std::path::Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(made, "mkfifo {} failed", path.display());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_treats_nan_and_infinity_exactly() {
        assert!(close(f64::NAN, f64::NAN, (0.0, 0.0)));
        assert!(!close(f64::NAN, 1.0, (1.0, 1.0)));
        assert!(close(f64::INFINITY, f64::INFINITY, (0.0, 0.0)));
        assert!(!close(f64::INFINITY, f64::NEG_INFINITY, (1.0, 1.0)));
        assert!(close(1.0 + 1e-9, 1.0, (0.0, 1e-8)));
        assert!(!close(1.1, 1.0, (0.05, 0.04)));
        assert!(!close_finite(f64::NAN, f64::NAN, (1.0, 1.0)));
    }

    #[test]
    fn assert_close_names_the_first_bad_index() {
        let err = std::panic::catch_unwind(|| {
            assert_close(
                "v",
                &[1.0f32, 2.0, 5.0, 9.0],
                &[1.0, 2.0, 3.0, 4.0],
                (0.1, 0.0),
            )
        })
        .unwrap_err();
        let msg = err.downcast_ref::<String>().unwrap();
        assert!(msg.starts_with("v[2]: got 5.0, want 3.0"), "{msg}");
        // Huge values read as exponents, not as 200 digits.
        let err = std::panic::catch_unwind(|| assert_close("h", &[f64::NAN], &[1e200], (0.0, 0.0)))
            .unwrap_err();
        let msg = err.downcast_ref::<String>().unwrap();
        assert!(msg.starts_with("h[0]: got NaN, want 1e200"), "{msg}");
        assert_readable(msg);
    }

    #[test]
    fn gradcheck_accepts_the_true_gradient_and_rejects_a_wrong_one() {
        // f(a, b) = sum(a^2) + 3 * sum(a * b)
        let f = |a: &[f64], b: &[f64]| -> f64 {
            a.iter().zip(b).map(|(x, y)| x * x + 3.0 * x * y).sum()
        };
        let (a, b) = (vec![0.5, -1.0], vec![2.0, 0.25]);
        let loss = |i: usize, v: &[f64]| if i == 0 { f(v, &b) } else { f(&a, v) };
        let da: Vec<f64> = a.iter().zip(&b).map(|(x, y)| 2.0 * x + 3.0 * y).collect();
        let db: Vec<f64> = a.iter().map(|x| 3.0 * x).collect();
        let inputs = [a.clone(), b.clone()];
        gradcheck(
            "f",
            &inputs,
            &[da.clone(), db.clone()],
            1e-6,
            (1e-6, 1e-5),
            loss,
        );
        let wrong = std::panic::catch_unwind(|| {
            gradcheck(
                "f",
                &inputs,
                &[da, vec![0.0, 0.0]],
                1e-6,
                (1e-6, 1e-5),
                loss,
            )
        });
        assert!(wrong.is_err());
    }

    #[test]
    fn assert_readable_fails_a_float_shown_in_full_but_not_quoted_text() {
        assert_readable(&format!("factor {:?} in (0, 1)", 1e300));
        assert_readable(&format!("size {} is too large", u128::MAX));
        assert_readable(&format!("KILN_X=\"{}\" is not a number", "9".repeat(60)));
        // A quote inside the caller's text, escaped by {:?}, does not end the quotation.
        assert_readable(&format!(
            "{:?} is not a number",
            format!("\"{}", "9".repeat(60))
        ));
        let shown = std::panic::catch_unwind(|| assert_readable(&format!("factor {}", 1e300)));
        assert!(shown.is_err(), "1e300 written as 301 digits must fail");
        let zeros = std::panic::catch_unwind(|| assert_readable(&format!("lr {}", 1e-300)));
        assert!(zeros.is_err(), "1e-300 written with 300 zeros must fail");
    }
}
