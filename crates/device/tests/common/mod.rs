//! Shared helpers of the kernel tests: fixture access, tolerances, a seeded generator and a
//! central-difference gradient checker.
#![allow(dead_code)]

use serde_json::Value;

/// Parses a fixture file's text.
pub fn parse(text: &str) -> Value {
    serde_json::from_str(text).expect("fixture files are valid JSON")
}

/// The cases of `op` in a fixture file.
pub fn cases<'a>(fixture: &'a Value, op: &str) -> &'a [Value] {
    fixture[op]
        .as_array()
        .unwrap_or_else(|| panic!("fixture has no `{op}` cases"))
}

/// A tensor stored in a fixture case.
pub struct Stored {
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its values, row-major.
    pub data: Vec<f64>,
}

impl Stored {
    /// The values as `f32`.
    pub fn f32(&self) -> Vec<f32> {
        self.data.iter().map(|&v| v as f32).collect()
    }

    /// The values as `i64` (index tensors).
    pub fn i64(&self) -> Vec<i64> {
        self.data.iter().map(|&v| v as i64).collect()
    }

    /// The shape as a fixed-size array.
    pub fn shape4(&self) -> [usize; 4] {
        self.shape.clone().try_into().expect("a 4-d tensor")
    }
}

/// Tensor `key` of `case`.
pub fn tensor(case: &Value, key: &str) -> Stored {
    let t = &case[key];
    let shape = t["shape"]
        .as_array()
        .unwrap_or_else(|| panic!("case {} has no tensor `{key}`", case["name"]))
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let data = t["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    Stored { shape, data }
}

/// True when `case` has a tensor `key`.
pub fn has(case: &Value, key: &str) -> bool {
    case.get(key).is_some_and(|v| !v.is_null())
}

/// A `[usize; 2]` parameter.
pub fn pair(case: &Value, key: &str) -> [usize; 2] {
    let v = case[key].as_array().unwrap();
    [
        v[0].as_u64().unwrap() as usize,
        v[1].as_u64().unwrap() as usize,
    ]
}

/// Asserts `|actual - expected| <= tol * (1 + |expected|)` elementwise, naming the first
/// mismatch.
pub fn assert_close<T: Copy + Into<f64>>(what: &str, actual: &[T], expected: &[f64], tol: f64) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let a: f64 = a.into();
        assert!(
            (a - e).abs() <= tol * (1.0 + e.abs()),
            "{what}: element {i}: got {a}, expected {e} (tol {tol})"
        );
    }
}

/// Tolerance for kernels run in `f64` against fixtures rounded to 12 significant digits.
pub const F64_TOL: f64 = 1e-10;
/// Tolerance for kernels run in `f32`.
pub const F32_TOL: f64 = 2e-5;

/// A small seeded generator (SplitMix64) for test data.
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    /// `n` values uniform in `[-1, 1)`.
    pub fn vec(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.uniform()).collect()
    }

    /// Uniform integer in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Checks `analytic` against the central difference of the scalar function `f` at `x`
/// (step 1e-6), elementwise with tolerance `tol * (1 + |numeric|)`.
pub fn check_gradient(
    what: &str,
    f: impl Fn(&[f64]) -> f64,
    x: &[f64],
    analytic: &[f64],
    tol: f64,
) {
    assert_eq!(x.len(), analytic.len(), "{what}: gradient length");
    let h = 1e-6;
    let mut probe = x.to_vec();
    for i in 0..x.len() {
        probe[i] = x[i] + h;
        let up = f(&probe);
        probe[i] = x[i] - h;
        let down = f(&probe);
        probe[i] = x[i];
        let numeric = (up - down) / (2.0 * h);
        assert!(
            (numeric - analytic[i]).abs() <= tol * (1.0 + numeric.abs()),
            "{what}: element {i}: analytic {}, numeric {numeric}",
            analytic[i]
        );
    }
}

/// `Σ a_i * b_i`.
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}
