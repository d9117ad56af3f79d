//! What the planned-steps tests share: an allocator with `planned_steps` on a simulated device
//! of 2 MiB pages.

use kiln_alloc_cache::{AllocatorConfig, CachingAllocator, SimBackend, StreamId};
use std::sync::Arc;

/// The stream every planned-steps test allocates on.
pub const S0: StreamId = StreamId::DEFAULT;
/// One MiB.
pub const MIB: usize = 1 << 20;

/// `config` with planned steps on, on a simulated device of `capacity` bytes.
pub fn planned_on(capacity: usize, config: AllocatorConfig) -> (Arc<SimBackend>, CachingAllocator) {
    let sim = Arc::new(SimBackend::new(capacity).with_page_granularity(2 * MIB));
    let config = AllocatorConfig {
        planned_steps: true,
        ..config
    };
    let a = CachingAllocator::new(Arc::clone(&sim), config).unwrap();
    (sim, a)
}

/// [`planned_on`] a 1 GiB device, which no test fills.
#[allow(dead_code)] // `planned_pressure` sizes its devices itself
pub fn sim_alloc(config: AllocatorConfig) -> (Arc<SimBackend>, CachingAllocator) {
    planned_on(1 << 30, config)
}
