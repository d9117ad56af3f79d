//! The one way tests get a CUDA device, and the device-level helpers every test suite shares
//! (the devices a both-devices test runs over, storages built from and read back as `f64`).
//!
//! A GPU test starts with `let Some(dev) = kiln_device::testing::cuda_device_or_skip() else {
//! return };`. Where no device is usable it prints why and the test passes as a skip; with
//! `KILN_REQUIRE_CUDA=1` (set by the GPU run script) it panics with the reason instead, so a GPU
//! run can never pass by skipping everything.

use crate::prelude::*;
use crate::{CpuStorage, DType, Device, Layout, Result};

/// Name of the env var that turns skips into failures.
pub const REQUIRE_CUDA_VAR: &str = "KILN_REQUIRE_CUDA";

/// True when `KILN_REQUIRE_CUDA=1`: GPU tests must fail rather than skip.
pub fn cuda_required() -> bool {
    std::env::var(REQUIRE_CUDA_VAR).is_ok_and(|v| v == "1")
}

fn current_test() -> String {
    std::thread::current().name().unwrap_or("test").to_string()
}

/// What to do when no device is usable: `Err(message)` to panic with, `Ok(line)` to print.
fn skip_or_fail(test: &str, reason: &str, required: bool) -> Result<String, String> {
    if required {
        Err(format!(
            "{test}: {REQUIRE_CUDA_VAR}=1 but CUDA is unavailable: {reason}"
        ))
    } else {
        Ok(format!("skipping {test}: CUDA unavailable: {reason}"))
    }
}

/// `Some(Device::Cuda(0))` when CUDA is usable; otherwise prints
/// `skipping <test>: CUDA unavailable: <reason>` and returns `None`, or panics with the reason when
/// `KILN_REQUIRE_CUDA=1`.
pub fn cuda_device_or_skip() -> Option<Device> {
    let status = crate::cuda_status();
    match status.reason() {
        None => Some(Device::Cuda(0)),
        Some(reason) => match skip_or_fail(&current_test(), &reason.to_string(), cuda_required()) {
            Ok(line) => {
                eprintln!("{line}");
                None
            }
            Err(message) => panic!("{message}"),
        },
    }
}

/// The devices a both-devices test runs over: the CPU always, and `cuda:0` when
/// [`cuda_device_or_skip`] finds it usable (so without a GPU the CUDA half skips, or fails
/// under `KILN_REQUIRE_CUDA=1`). A test checks every device against the same reference values,
/// so a GPU run compares CUDA results with what the CPU must produce.
pub fn devices() -> Vec<Device> {
    let mut devices = vec![Device::Cpu];
    devices.extend(cuda_device_or_skip());
    devices
}

/// `values` as a contiguous CPU storage of `dtype` (cast as `to_dtype` casts).
pub fn cpu_values(values: Vec<f64>, dtype: DType) -> Result<CpuStorage> {
    let n = values.len();
    CpuStorage::from_vec(values).to_dtype(&Layout::contiguous(&[n]), dtype)
}

/// Every element of a contiguous storage on any device, read back to the host as `f64`.
pub fn host_f64<S: BackendStorage>(storage: &S) -> Result<Vec<f64>> {
    Ok(storage
        .to_cpu(&Layout::contiguous(&[storage.len()]))?
        .to_f64_vec())
}

/// The tolerances a device's result must meet against the CPU reference, per dtype: the one
/// place they are written down. A value `got` matches `want` when
/// `|got - want| <= atol + rtol * |want|` (NaN matches NaN, infinities must be equal).
///
/// Integer and bool results, copies, casts and the Philox uniforms must be exact (0, 0). Float
/// tolerances cover a different summation order (tree vs sequential) and device math functions
/// that differ from the host libm by a few ulps; for f16/bf16 they are one unit in the last
/// place of the type, since both sides round the same f32 value but that value may differ.
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 => (1e-12, 1e-12),
        DType::F32 => (1e-5, 1e-5),
        DType::F16 => (1e-3, 1e-3),
        DType::BF16 => (8e-3, 8e-3),
        DType::I64 | DType::U8 | DType::Bool => (0.0, 0.0),
    }
}

/// The tolerance for a 16-bit result that is a sum of `terms` products of O(1) values, where
/// the device may round intermediate partial results to the dtype (the CPU rounds only the
/// final result): `(atol * terms, rtol)` of [`tolerance`] for f16/bf16, [`tolerance`] unchanged
/// for every other dtype.
///
/// Why scale `atol` by the length of the reduction: an intermediate's rounding error is one unit
/// of the dtype relative to the intermediate's own magnitude, and after cancellation that can be
/// far larger than the final sum, which `rtol` is relative to. With O(1) terms an intermediate
/// is at most about `terms` in size, so `atol * terms` bounds that error. CUDA conv2d is the
/// user: its forward output rounds the GEMM result before adding the bias (`terms` =
/// `C_in / groups * kH * kW`), its input gradient adds up to `kH * kW` column gradients that the
/// GEMM rounded (`terms` = `C_out / groups * kH * kW`); the weight and bias gradients round
/// once, so they use `terms` = 1.
pub fn sum_tolerance(dtype: DType, terms: usize) -> (f64, f64) {
    let (atol, rtol) = tolerance(dtype);
    match dtype {
        DType::F16 | DType::BF16 => (atol * terms.max(1) as f64, rtol),
        _ => (atol, rtol),
    }
}

/// True when `got` matches `want` within `(atol, rtol)` (see [`tolerance`]).
pub fn close(got: f64, want: f64, (atol, rtol): (f64, f64)) -> bool {
    if got.is_nan() || want.is_nan() {
        return got.is_nan() && want.is_nan();
    }
    if got.is_infinite() || want.is_infinite() {
        return got == want;
    }
    (got - want).abs() <= atol + rtol * want.abs()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_line_names_test_and_reason() {
        let line = skip_or_fail("ops::fill::gpu", "libcuda.so not found", false).unwrap();
        assert_eq!(
            line,
            "skipping ops::fill::gpu: CUDA unavailable: libcuda.so not found"
        );
        let fail = skip_or_fail("ops::fill::gpu", "libcuda.so not found", true).unwrap_err();
        assert_eq!(
            fail,
            "ops::fill::gpu: KILN_REQUIRE_CUDA=1 but CUDA is unavailable: libcuda.so not found"
        );
    }

    #[test]
    fn cpu_values_round_trip_through_host_f64() {
        let s = cpu_values(vec![1.5, -2.0, 3.25], DType::F32).unwrap();
        assert_eq!(s.dtype(), DType::F32);
        assert_eq!(host_f64(&s).unwrap(), vec![1.5, -2.0, 3.25]);
        assert_eq!(devices()[0], Device::Cpu);
    }

    #[test]
    fn sum_tolerance_scales_only_16_bit_atol() {
        assert_eq!(sum_tolerance(DType::BF16, 27), (8e-3 * 27.0, 8e-3));
        assert_eq!(sum_tolerance(DType::F16, 0), tolerance(DType::F16));
        assert_eq!(sum_tolerance(DType::F32, 27), tolerance(DType::F32));
        assert_eq!(sum_tolerance(DType::F64, 9), tolerance(DType::F64));
    }

    #[test]
    fn helper_agrees_with_status() {
        if cuda_required() && !crate::cuda_status().is_available() {
            return; // the helper would panic, as it must; covered by the test above
        }
        let got = cuda_device_or_skip();
        assert_eq!(got.is_some(), crate::cuda_status().is_available());
    }
}
