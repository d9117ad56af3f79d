//! Lists what kiln can run on: every visible CUDA device, the CPU, and the device
//! `Device::best()` picks, with the reason.
//!
//! ```text
//! cargo run --release --example devices
//! ```

use kiln::device::{cuda_status, format_bytes, CpuProperties, Device};

fn main() {
    let status = cuda_status();
    let devices = status.devices();
    println!("CUDA devices visible: {}", devices.len());
    for d in devices {
        let physical = d
            .physical_ordinal
            .map_or_else(|| "?".to_string(), |p| p.to_string());
        let free = match Device::Cuda(d.logical).memory_info() {
            Ok(mem) => format!(", {} free", format_bytes(mem.free)),
            Err(_) => String::new(),
        };
        let (major, minor) = d.compute_capability;
        println!(
            "  cuda:{} (physical {physical}): {}, {} total{free}, compute capability {major}.{minor}, \
             {} SMs, {}",
            d.logical,
            d.name,
            format_bytes(d.total_memory),
            d.sm_count,
            d.uuid
        );
    }
    for note in status.notes() {
        println!("  note: {note}");
    }
    if let Some(reason) = status.reason() {
        println!("  CUDA unavailable: {reason}");
    }

    let cpu = CpuProperties::read();
    let ram = cpu
        .total_ram
        .map_or_else(|| "unknown".to_string(), format_bytes);
    println!(
        "CPU: {}, {} logical cores, {ram} RAM",
        cpu.model, cpu.logical_cores
    );

    let choice = Device::best_with_reason();
    println!("Device::best() = {} ({})", choice.device, choice.reason);
}
