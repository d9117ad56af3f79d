//! Shared helpers of the kernel tests: fixture access, tolerances, a seeded generator, a
//! central-difference gradient checker, and for the CUDA parity tests (`cuda_*.rs`) test data,
//! uploads and CPU-vs-CUDA comparisons. The closeness rules themselves are kiln-testkit's.
#![allow(dead_code)]

use kiln_device::{testing, CpuStorage, DType};
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

/// Asserts `|actual - expected| <= tol * (1 + |expected|)` elementwise (finite values only),
/// naming the first mismatch.
pub fn assert_close<T: Copy + Into<f64>>(what: &str, actual: &[T], expected: &[f64], tol: f64) {
    kiln_testkit::assert_close_finite(what, actual, expected, (tol, tol));
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
    let (inputs, grads) = ([x.to_vec()], [analytic.to_vec()]);
    kiln_testkit::gradcheck(what, &inputs, &grads, 1e-6, (tol, tol), |_, v| f(v));
}

/// `Σ a_i * b_i`.
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `n` varied values `((i * 37 + seed * 11) % 29) * step + offset` (negatives, fractions) as
/// `dtype` on the CPU.
pub fn pattern(n: usize, dtype: DType, seed: usize, step: f64, offset: f64) -> CpuStorage {
    let v = (0..n)
        .map(|i| ((i * 37 + seed * 11) % 29) as f64 * step + offset)
        .collect();
    testing::cpu_values(v, dtype).unwrap()
}

/// A copy of `c` on the CUDA device `dev`.
#[cfg(feature = "cuda")]
pub fn gpu(dev: kiln_device::Device, c: &CpuStorage) -> kiln_device::CudaStorage {
    <kiln_device::CudaStorage as kiln_device::prelude::BufferOps>::from_cpu(dev, c).unwrap()
}

/// Asserts `got` is of `dtype` and matches `want` elementwise within `tol` (NaN matches NaN,
/// infinities must be equal); the message names the first bad index.
pub fn assert_storage_close<S: kiln_device::BackendStorage>(
    what: &str,
    want: &CpuStorage,
    got: &S,
    dtype: DType,
    tol: (f64, f64),
) {
    assert_eq!(got.dtype(), dtype, "{what}: dtype");
    let got = testing::host_f64(got).unwrap();
    kiln_testkit::assert_close(what, &got, &want.to_f64_vec(), tol);
}

/// Asserts a CUDA result equals the CPU result within the dtype's
/// [`testing::tolerance`].
pub fn assert_match<S: kiln_device::BackendStorage>(what: &str, cpu: &CpuStorage, got: &S) {
    let dtype = kiln_device::prelude::BufferOps::dtype(cpu);
    assert_storage_close(what, cpu, got, dtype, testing::tolerance(dtype));
}

/// Both copies of `cpu`: itself and its upload to `dev`.
#[cfg(feature = "cuda")]
pub fn both(dev: kiln_device::Device, cpu: &CpuStorage) -> (CpuStorage, kiln_device::CudaStorage) {
    (cpu.clone(), gpu(dev, cpu))
}

/// The CPU operand of a 16-bit reference: f16/bf16 values widened (exactly) to f32, others as
/// they are.
pub fn widened(c: &CpuStorage) -> CpuStorage {
    match kiln_device::prelude::BufferOps::dtype(c) {
        DType::F16 | DType::BF16 => testing::cpu_values(c.to_f64_vec(), DType::F32).unwrap(),
        _ => c.clone(),
    }
}
