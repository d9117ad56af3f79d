//! The one list of NVRTC options every kiln kernel is compiled with.
//!
//! The runtime (first-use compilation for the device's arch) and `cargo xtask kernels` (the CI
//! check for compute_80 / compute_90) both call [`nvrtc_options`], so CI compiles exactly what a
//! GPU will. No `--use_fast_math`: kiln's numbers must match PyTorch's, and fast math changes
//! `expf`, division and denormal handling.

/// NVRTC options for a device of compute capability `major.minor` (e.g. `(9, 0)` for an H100/H200).
pub fn nvrtc_options(major: u32, minor: u32) -> Vec<String> {
    vec![
        format!("--gpu-architecture=compute_{major}{minor}"),
        "--std=c++17".to_string(),
        "--device-as-default-execution-space".to_string(),
        "-lineinfo".to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_flag_names_the_virtual_architecture() {
        let opts = nvrtc_options(9, 0);
        assert_eq!(opts[0], "--gpu-architecture=compute_90");
        assert!(!opts.iter().any(|o| o.contains("fast_math")));
        assert_eq!(nvrtc_options(8, 0)[0], "--gpu-architecture=compute_80");
    }
}
