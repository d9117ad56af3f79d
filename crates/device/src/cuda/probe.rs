//! The CUDA probe: loads nothing it has not checked, calls the driver, and turns every outcome
//! into a [`CudaStatus`]. Runs once per process, from [`crate::cuda_status`].

use std::sync::OnceLock;

use cudarc::driver::{result, sys};

use crate::properties::{format_uuid, CudaDeviceProperties};
use crate::status::reason::{CudaStatus, CudaUnavailable};
use crate::visibility::{parse_selectors, DeviceSelector, VisibleDevices};

/// True when `libcuda` can be loaded (checked once; cudarc panics on a missing library).
pub(crate) fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the library's candidate names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// True when `libnvrtc` can be loaded (checked once).
pub(crate) fn nvrtc_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the library's candidate names.
    *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
}

/// The driver's name for an error (`CUDA_ERROR_NO_DEVICE`).
pub(crate) fn code_name(err: &result::DriverError) -> String {
    format!("{:?}", err.0)
}

/// Probes the driver; `programmatic_mask` is what `set_visible_devices` asked for, joined by commas.
pub(crate) fn probe(programmatic_mask: Option<String>) -> CudaStatus {
    if !driver_present() {
        return CudaStatus::unavailable(CudaUnavailable::DriverNotFound, Vec::new(), Vec::new());
    }
    // cudarc panics when a driver symbol is missing (a driver older than the CUDA version kiln is
    // built for); that is a reason to fall back, not to abort.
    match std::panic::catch_unwind(|| probe_driver(programmatic_mask)) {
        Ok(status) => status,
        Err(payload) => {
            let detail = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a driver function is missing".to_string());
            CudaStatus::unavailable(
                CudaUnavailable::DriverTooOld { detail },
                Vec::new(),
                Vec::new(),
            )
        }
    }
}

fn unavailable(reason: CudaUnavailable) -> CudaStatus {
    CudaStatus::unavailable(reason, Vec::new(), Vec::new())
}

/// The reason for a driver that found no device under `CUDA_VISIBLE_DEVICES=value`. The detail
/// is given only when the value selects nothing by itself (empty, `-1`, a duplicate, garbage);
/// otherwise its entries name devices that do not exist, which only the driver knows.
fn hidden_by_env(value: &str) -> CudaUnavailable {
    let selectors = parse_selectors(value);
    let detail = if selectors.entries.is_empty() {
        selectors.stop.map(|s| s.to_string())
    } else {
        None
    };
    CudaUnavailable::HiddenByEnv {
        value: value.to_string(),
        detail,
    }
}

fn probe_driver(programmatic_mask: Option<String>) -> CudaStatus {
    let env = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    if let Err(e) = result::init() {
        let code = code_name(&e);
        return match &env {
            Some(value) if code == "CUDA_ERROR_NO_DEVICE" => unavailable(hidden_by_env(value)),
            _ => unavailable(CudaUnavailable::Driver {
                call: "cuInit",
                code,
            }),
        };
    }
    let count = match result::device::get_count() {
        Ok(n) => n.max(0) as usize,
        Err(e) => {
            let code = code_name(&e);
            return unavailable(CudaUnavailable::Driver {
                call: "cuDeviceGetCount",
                code,
            });
        }
    };
    if count == 0 {
        return unavailable(match &env {
            Some(value) => hidden_by_env(value),
            None => CudaUnavailable::NoDevices,
        });
    }
    let env_selectors = env.as_deref().map(parse_selectors);
    let mut all = Vec::with_capacity(count);
    for driver_ordinal in 0..count {
        let entry = env_selectors
            .as_ref()
            .and_then(|s| s.entries.get(driver_ordinal));
        match read_device(driver_ordinal, entry) {
            Ok(props) => all.push(props),
            Err((call, e)) => {
                return unavailable(CudaUnavailable::Driver {
                    call,
                    code: code_name(&e),
                });
            }
        }
    }
    assemble(all, env.as_deref(), programmatic_mask, nvrtc_present())
}

/// Builds the status from the devices the driver lists (in driver order, with their physical
/// ordinals already read from `CUDA_VISIBLE_DEVICES`): applies the programmatic mask, collects
/// notes about lists that stopped early, and checks NVRTC. Pure, so it is tested without a GPU.
fn assemble(
    all: Vec<CudaDeviceProperties>,
    env: Option<&str>,
    programmatic_mask: Option<String>,
    nvrtc: bool,
) -> CudaStatus {
    let mut notes = Vec::new();
    if let Some(value) = env {
        if let Some(stop) = parse_selectors(value).stop {
            notes.push(format!(
                "CUDA_VISIBLE_DEVICES={value:?}: {stop}; later entries are ignored"
            ));
        }
    }
    let uuids: Vec<String> = all.iter().map(|p| p.uuid.clone()).collect();
    let visible = VisibleDevices::parse(programmatic_mask.as_deref(), &uuids);
    if visible.is_empty() {
        let ids = programmatic_mask.unwrap_or_default();
        let detail = visible.stop.map(|s| s.to_string());
        let reason = CudaUnavailable::HiddenByProgram { ids, detail };
        return CudaStatus::unavailable(reason, Vec::new(), notes);
    }
    if let (Some(ids), Some(stop)) = (&programmatic_mask, &visible.stop) {
        notes.push(format!(
            "set_visible_devices([{ids}]): {stop}; later entries are ignored"
        ));
    }
    let devices: Vec<CudaDeviceProperties> = visible
        .ordinals
        .iter()
        .enumerate()
        .map(|(logical, &d)| CudaDeviceProperties {
            logical,
            ..all[d].clone()
        })
        .collect();
    if !nvrtc {
        return CudaStatus::unavailable(CudaUnavailable::NvrtcNotFound, devices, notes);
    }
    CudaStatus::available(devices, notes)
}

type ProbeError = (&'static str, result::DriverError);

/// Reads one device's properties; `env_entry` is the `CUDA_VISIBLE_DEVICES` entry that selected it.
fn read_device(
    driver_ordinal: usize,
    env_entry: Option<&DeviceSelector>,
) -> Result<CudaDeviceProperties, ProbeError> {
    use sys::CUdevice_attribute as A;
    let dev = result::device::get(driver_ordinal as i32).map_err(|e| ("cuDeviceGet", e))?;
    let attr = |a: A, call: &'static str| -> Result<u32, ProbeError> {
        // SAFETY: `dev` is a valid device handle from cuDeviceGet.
        let v = unsafe { result::device::get_attribute(dev, a) }.map_err(|e| (call, e))?;
        Ok(v.max(0) as u32)
    };
    let name = result::device::get_name(dev).map_err(|e| ("cuDeviceGetName", e))?;
    // SAFETY: as above.
    let total = unsafe { result::device::total_mem(dev) }.map_err(|e| ("cuDeviceTotalMem", e))?;
    let uuid = result::device::get_uuid(dev).map_err(|e| ("cuDeviceGetUuid", e))?;
    let bytes: [u8; 16] = uuid.bytes.map(|b| b as u8);
    let (prefix, physical_ordinal) = match env_entry {
        None => ("GPU-", Some(driver_ordinal)),
        Some(DeviceSelector::Ordinal(n)) => ("GPU-", Some(*n)),
        Some(DeviceSelector::Uuid(u)) if u.starts_with("MIG-") => ("MIG-", None),
        Some(DeviceSelector::Uuid(_)) => ("GPU-", None),
    };
    Ok(CudaDeviceProperties {
        logical: driver_ordinal,
        driver_ordinal,
        physical_ordinal,
        name,
        total_memory: total as u64,
        compute_capability: (
            attr(
                A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                "cuDeviceGetAttribute",
            )?,
            attr(
                A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                "cuDeviceGetAttribute",
            )?,
        ),
        sm_count: attr(
            A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            "cuDeviceGetAttribute",
        )?,
        uuid: format_uuid(prefix, &bytes),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three GPUs as the driver lists them under `CUDA_VISIBLE_DEVICES=5,2,7`.
    fn driver_devices() -> Vec<CudaDeviceProperties> {
        [5, 2, 7]
            .iter()
            .enumerate()
            .map(|(d, &physical)| CudaDeviceProperties {
                logical: d,
                driver_ordinal: d,
                physical_ordinal: Some(physical),
                name: format!("GPU {physical}"),
                total_memory: 80 << 30,
                compute_capability: (9, 0),
                sm_count: 132,
                uuid: format!(
                    "GPU-{physical}{physical}{physical}{physical}0000-0000-0000-0000-000000000000"
                ),
            })
            .collect()
    }

    #[test]
    fn no_mask_keeps_driver_order() {
        let status = assemble(driver_devices(), Some("5,2,7"), None, true);
        assert!(status.is_available());
        let got: Vec<_> = status
            .devices()
            .iter()
            .map(|p| (p.logical, p.driver_ordinal, p.physical_ordinal))
            .collect();
        assert_eq!(got, vec![(0, 0, Some(5)), (1, 1, Some(2)), (2, 2, Some(7))]);
        assert!(status.notes().is_empty());
    }

    #[test]
    fn programmatic_mask_composes_with_the_env_mask() {
        // cuda:0 -> driver 2 -> physical 7; cuda:1 -> driver 0 -> physical 5.
        let status = assemble(driver_devices(), Some("5,2,7"), Some("2,0".into()), true);
        let got: Vec<_> = status
            .devices()
            .iter()
            .map(|p| (p.logical, p.driver_ordinal, p.physical_ordinal))
            .collect();
        assert_eq!(got, vec![(0, 2, Some(7)), (1, 0, Some(5))]);
        let by_uuid = assemble(driver_devices(), None, Some("GPU-2222".into()), true);
        assert_eq!(by_uuid.devices().len(), 1);
        assert_eq!(by_uuid.devices()[0].name, "GPU 2");
    }

    #[test]
    fn lists_that_stop_early_leave_notes() {
        let status = assemble(
            driver_devices(),
            Some("5,2,7,-1,3"),
            Some("1,9".into()),
            true,
        );
        assert_eq!(status.device_count(), 1);
        assert_eq!(
            status.notes(),
            [
                "CUDA_VISIBLE_DEVICES=\"5,2,7,-1,3\": entry 3 (\"-1\") is negative; later entries are ignored",
                "set_visible_devices([1,9]): entry 1 (\"9\") is out of range: 3 device(s); later entries are ignored",
            ]
        );
    }

    #[test]
    fn masks_hiding_everything_and_missing_nvrtc_are_reasons() {
        let empty = assemble(driver_devices(), None, Some(String::new()), true);
        assert!(matches!(
            empty.reason(),
            Some(CudaUnavailable::HiddenByProgram { .. })
        ));
        let dup = assemble(driver_devices(), None, Some("1,1".into()), true);
        let msg = dup.reason().unwrap().to_string();
        assert!(
            msg.starts_with("set_visible_devices([1,1]) hides all devices (entry 1"),
            "{msg}"
        );
        let no_nvrtc = assemble(driver_devices(), None, None, false);
        assert_eq!(no_nvrtc.reason(), Some(&CudaUnavailable::NvrtcNotFound));
        assert_eq!(no_nvrtc.devices().len(), 3, "devices are still listed");
        assert_eq!(no_nvrtc.device_count(), 0, "but none is usable");
    }

    #[test]
    fn env_values_hiding_everything_say_why() {
        let reason = hidden_by_env("");
        assert_eq!(
            reason.to_string(),
            "CUDA_VISIBLE_DEVICES=\"\" hides all devices (entry 0 (\"\") is not a device ordinal or UUID); \
             unset it or name a device `nvidia-smi -L` lists"
        );
        let dup = hidden_by_env("0,0");
        assert!(
            dup.to_string().contains("names the same device as entry 0"),
            "{dup}"
        );
    }
}
