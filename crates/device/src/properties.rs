//! What a device is: name, memory, compute capability for a GPU; model, cores, RAM for the CPU.
//!
//! CPU facts come from `/proc/cpuinfo` and `/proc/meminfo` on Linux (parsed by small pure
//! functions, tested on fixtures); on other systems the model falls back to the target
//! architecture, the core count to `std::thread::available_parallelism` and the RAM to `None`.
//! CUDA facts are read from the driver once, when kiln's CUDA state is initialised
//! ([`crate::cuda_status`]); free memory is read on demand (`cuMemGetInfo`) because it changes.

use std::fmt;

/// Properties of a visible CUDA device, read from the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDeviceProperties {
    /// Logical ordinal: this is `Device::Cuda(logical)`.
    pub logical: usize,
    /// The driver's ordinal (after `CUDA_VISIBLE_DEVICES`), used to open contexts.
    pub driver_ordinal: usize,
    /// The physical ordinal (before any mask), when the masks name ordinals; `None` when a UUID
    /// selected the device (the driver hides the unmasked list).
    pub physical_ordinal: Option<usize>,
    /// Device name (`"NVIDIA H200"`).
    pub name: String,
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// Compute capability `(major, minor)`.
    pub compute_capability: (u32, u32),
    /// Number of streaming multiprocessors.
    pub sm_count: u32,
    /// UUID as `nvidia-smi -L` prints it (`"GPU-8932f937-d72c-…"`).
    pub uuid: String,
}

impl fmt::Display for CudaDeviceProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let physical = match self.physical_ordinal {
            Some(p) => p.to_string(),
            None => "?".to_string(),
        };
        let (major, minor) = self.compute_capability;
        write!(
            f,
            "cuda:{} (physical {physical}): {}, {}, compute capability {major}.{minor}, {} SMs, {}",
            self.logical,
            self.name,
            format_bytes(self.total_memory),
            self.sm_count,
            self.uuid
        )
    }
}

/// Properties of the host CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuProperties {
    /// Model name (`/proc/cpuinfo`), or the target architecture when unknown.
    pub model: String,
    /// Logical cores this process may run on (`available_parallelism`: affinity and cgroup
    /// quotas included), at least 1.
    pub logical_cores: usize,
    /// Total RAM in bytes (`MemTotal`), `None` where the OS is not supported.
    pub total_ram: Option<u64>,
}

impl CpuProperties {
    /// Reads the host's CPU properties.
    pub fn read() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Self {
            model: cpu_model_from_cpuinfo(&cpuinfo)
                .unwrap_or_else(|| format!("unknown {} CPU", std::env::consts::ARCH)),
            logical_cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            total_ram: meminfo_field_bytes(&meminfo, "MemTotal"),
        }
    }
}

impl fmt::Display for CpuProperties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ram = self
            .total_ram
            .map(format_bytes)
            .unwrap_or_else(|| "unknown".to_string());
        write!(
            f,
            "cpu: {}, {} logical cores, {ram} RAM",
            self.model, self.logical_cores
        )
    }
}

/// Properties of either kind of device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceProperties {
    /// The host CPU.
    Cpu(CpuProperties),
    /// A CUDA device.
    Cuda(CudaDeviceProperties),
}

/// Free and total memory of a device, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes free now (`cuMemGetInfo`; `MemAvailable` for the CPU).
    pub free: u64,
    /// Bytes in total.
    pub total: u64,
}

/// The CPU model from `/proc/cpuinfo` text: `model name` (x86), else `Model`/`Hardware` (ARM
/// boards), else `uarch`/`cpu` (RISC-V, POWER).
pub fn cpu_model_from_cpuinfo(text: &str) -> Option<String> {
    for key in ["model name", "Model", "Hardware", "uarch", "cpu"] {
        for line in text.lines() {
            if let Some((k, v)) = line.split_once(':') {
                if k.trim() == key && !v.trim().is_empty() {
                    return Some(v.trim().to_string());
                }
            }
        }
    }
    None
}

/// A `kB` field of `/proc/meminfo` text, in bytes.
pub fn meminfo_field_bytes(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        if k.trim() != field {
            return None;
        }
        let mut parts = v.split_whitespace();
        let value: u64 = parts.next()?.parse().ok()?;
        match parts.next() {
            Some("kB") => value.checked_mul(1024),
            None => Some(value),
            Some(_) => None,
        }
    })
}

/// Host memory now free (`MemAvailable`) and total, where the OS reports them.
pub(crate) fn host_memory_info() -> Option<MemoryInfo> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    Some(MemoryInfo {
        free: meminfo_field_bytes(&meminfo, "MemAvailable")?,
        total: meminfo_field_bytes(&meminfo, "MemTotal")?,
    })
}

/// Formats a byte count in GiB/MiB with two decimals (`"139.72 GiB"`).
pub fn format_bytes(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.2} GiB", b / GIB)
    } else {
        format!("{:.2} MiB", b / MIB)
    }
}

/// Formats a 16-byte CUDA UUID the way `nvidia-smi -L` does (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-…`).
pub fn format_uuid(prefix: &str, bytes: &[u8; 16]) -> String {
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{prefix}{}-{}-{}-{}-{}",
        hex[0..4].concat(),
        hex[4..6].concat(),
        hex[6..8].concat(),
        hex[8..10].concat(),
        hex[10..16].concat()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const X86_CPUINFO: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel\t\t: 143\n\
        model name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu vme\n\nprocessor\t: 1\n\
        model name\t: Intel(R) Xeon(R) Platinum 8480+\n";
    const ARM_CPUINFO: &str = "processor\t: 0\nBogoMIPS\t: 108.00\nCPU part\t: 0xd0c\n\n\
        Hardware\t: BCM2835\nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n";
    const MEMINFO: &str = "MemTotal:       24576000 kB\nMemFree:         1000 kB\n\
        MemAvailable:   20000000 kB\nHugePages_Total:       0\n";

    #[test]
    fn cpu_model_is_read_from_cpuinfo() {
        assert_eq!(
            cpu_model_from_cpuinfo(X86_CPUINFO).as_deref(),
            Some("Intel(R) Xeon(R) Platinum 8480+")
        );
        assert_eq!(
            cpu_model_from_cpuinfo(ARM_CPUINFO).as_deref(),
            Some("Raspberry Pi 4 Model B Rev 1.4")
        );
        assert_eq!(cpu_model_from_cpuinfo(""), None);
    }

    #[test]
    fn meminfo_fields_are_bytes() {
        assert_eq!(
            meminfo_field_bytes(MEMINFO, "MemTotal"),
            Some(24_576_000 * 1024)
        );
        assert_eq!(
            meminfo_field_bytes(MEMINFO, "MemAvailable"),
            Some(20_000_000 * 1024)
        );
        assert_eq!(meminfo_field_bytes(MEMINFO, "HugePages_Total"), Some(0));
        assert_eq!(meminfo_field_bytes(MEMINFO, "SwapTotal"), None);
    }

    #[test]
    fn host_cpu_properties_are_sane() {
        let cpu = CpuProperties::read();
        assert!(cpu.logical_cores >= 1);
        assert!(!cpu.model.is_empty());
        if cfg!(target_os = "linux") {
            assert!(cpu.total_ram.unwrap() > 0);
            let mem = host_memory_info().unwrap();
            assert!(mem.free > 0 && mem.free <= mem.total);
            assert_eq!(Some(mem.total), cpu.total_ram);
        }
    }

    #[test]
    fn uuid_and_bytes_format_like_nvidia_smi() {
        let bytes = [
            0x89, 0x32, 0xf9, 0x37, 0xd7, 0x2c, 0x41, 0x06, 0xc1, 0x2f, 0x20, 0xbd, 0x9f, 0xae,
            0xd9, 0xf6,
        ];
        assert_eq!(
            format_uuid("GPU-", &bytes),
            "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"
        );
        assert_eq!(format_bytes(150_000_000_000), "139.70 GiB");
        assert_eq!(format_bytes(3 << 20), "3.00 MiB");
    }
}
