//! The one way tests get a CUDA device.
//!
//! A GPU test starts with `let Some(dev) = kiln_device::testing::cuda_device_or_skip() else {
//! return };`. Where no device is usable it prints why and the test passes as a skip; with
//! `KILN_REQUIRE_CUDA=1` (set by the GPU run script) it panics with the reason instead, so a GPU
//! run can never pass by skipping everything.

use crate::Device;

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
    fn helper_agrees_with_status() {
        if cuda_required() && !crate::cuda_status().is_available() {
            return; // the helper would panic, as it must; covered by the test above
        }
        let got = cuda_device_or_skip();
        assert_eq!(got.is_some(), crate::cuda_status().is_available());
    }
}
