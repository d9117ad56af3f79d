//! Shared test helpers: the device list every op test runs over, and the finite-difference
//! gradient checker.
#![allow(dead_code)]

use kiln_autograd::testing::grad_probe;
use kiln_autograd::{DType, Device, Generator, Result, Tensor};

/// The devices op tests run over (the CPU, and `cuda:0` when usable).
// Not every test binary loops over devices, and `dead_code` does not cover re-exports.
#[allow(unused_imports)]
pub use kiln_device::testing::devices;

/// Deterministic f64 test data of `shape` (normal, seeded).
pub fn data(seed: u64, shape: &[usize]) -> Tensor {
    Generator::new(seed)
        .normal(shape, 0.0, 1.0, DType::F64, Device::Cpu)
        .unwrap()
}

/// Checks `f`'s analytic gradients against central finite differences in f64 (step 1e-6):
/// an element passes when `|analytic - numeric| <= 1e-6 + 1e-4 * |numeric|`.
///
/// The scalar checked is `sum(f(inputs) * w)` with a fixed random `w` (see
/// `kiln_autograd::testing`), so a gradient that mixes elements up is caught.
pub fn gradcheck(name: &str, inputs: &[Tensor], f: impl Fn(&[Tensor]) -> Result<Tensor>) {
    let probe = grad_probe(inputs, f).unwrap_or_else(|e| panic!("{name}: {e}"));
    kiln_testkit::gradcheck(
        name,
        &probe.values,
        &probe.analytic,
        1e-6,
        (1e-6, 1e-4),
        |i, v| probe.loss(i, v).unwrap(),
    );
}

/// Asserts two f64 slices agree to `tol` absolute plus `tol` relative (finite values only).
pub fn assert_close(name: &str, got: &[f64], want: &[f64], tol: f64) {
    kiln_testkit::assert_close_finite(name, got, want, (tol, tol));
}
