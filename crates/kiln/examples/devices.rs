//! Lists what kiln can run on: every visible CUDA device, the CPU, and the device
//! `Device::best()` picks, with the reason; and, per device, the memory its caching allocator
//! has handed to tensors (allocated) and holds from the driver or system (reserved).
//!
//! ```text
//! cargo run --release --example devices
//! ```

use kiln::device::{
    cuda_status, format_bytes, memory_allocated, memory_reserved, CpuProperties, Device,
};

/// `allocated X, reserved Y` for `device`'s caching allocator, or why it cannot be read.
fn allocator_line(device: Device) -> String {
    match (memory_allocated(device), memory_reserved(device)) {
        (Ok(a), Ok(r)) => format!(
            "allocated {}, reserved {}",
            format_bytes(a as u64),
            format_bytes(r as u64)
        ),
        (Err(e), _) | (_, Err(e)) => format!("unavailable ({e})"),
    }
}

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
        println!(
            "    caching allocator: {}",
            allocator_line(Device::Cuda(d.logical))
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
    // one live 4 MiB tensor, to show the allocator at work
    let x = kiln::autograd::Tensor::zeros(&[1024, 1024], kiln::autograd::DType::F32, Device::Cpu);
    println!(
        "  caching allocator (one 4 MiB tensor live): {}",
        allocator_line(Device::Cpu)
    );
    drop(x);

    let choice = Device::best_with_reason();
    println!("Device::best() = {} ({})", choice.device, choice.reason);
}
