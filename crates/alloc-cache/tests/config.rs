//! Allocator settings: PyTorch-style parsing, validation and rounding.

use kiln_alloc_cache::*;

const MIB: usize = 1 << 20;

#[test]
fn config_parsing_and_validation() {
    let c = AllocatorConfig::parse(
        "expandable_segments:True, max_split_size_mb:128,garbage_collection_threshold:0.8",
    )
    .unwrap();
    assert!(c.expandable_segments);
    assert_eq!(c.max_split_size, Some(128 * MIB));
    assert_eq!(c.garbage_collection_threshold, Some(0.8));
    let e = AllocatorConfig::parse("max_split_size_mb:10")
        .unwrap_err()
        .to_string();
    assert!(e.contains("must exceed 20 MiB"), "{e}");
    let e = AllocatorConfig::parse("garbage_collection_threshold:1.5")
        .unwrap_err()
        .to_string();
    assert!(e.contains("strictly between 0 and 1"), "{e}");
    let e = AllocatorConfig::parse("garbage_collection_threshold:-1e300")
        .unwrap_err()
        .to_string();
    assert!(e.contains("threshold -1e300 must"), "{e}");
    let e = AllocatorConfig::parse("roundup_power2:4")
        .unwrap_err()
        .to_string();
    assert!(e.contains("known keys are"), "{e}");
    // Only this test touches KILN_ALLOC_CONF.
    std::env::set_var("KILN_ALLOC_CONF", "expandable_segments:True");
    assert!(AllocatorConfig::from_env().unwrap().expandable_segments);
    std::env::set_var("KILN_ALLOC_CONF", "expandable_segments:maybe");
    let e = AllocatorConfig::from_env().unwrap_err().to_string();
    assert!(
        e.contains("KILN_ALLOC_CONF: `expandable_segments:maybe`: expected True or False"),
        "{e}"
    );
    std::env::remove_var("KILN_ALLOC_CONF");
    assert_eq!(
        AllocatorConfig::from_env().unwrap(),
        AllocatorConfig::default()
    );
    let e = CachingAllocator::new(HostBackend::new(), AllocatorConfig::expandable()).unwrap_err();
    assert!(
        e.to_string().contains("turn expandable_segments off"),
        "{e}"
    );
}

#[test]
fn roundup_power2_divisions_rounds_to_power_of_two_steps() {
    let plain = AllocatorConfig::default();
    assert_eq!(plain.rounded_size(1200 * MIB + 1), 1200 * MIB + 512);
    let c = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
    assert_eq!(c.roundup_power2_divisions, Some(4));
    // 1024 MiB .. 2048 MiB in steps of 256 MiB.
    assert_eq!(c.rounded_size(1200 * MIB), 1280 * MIB);
    assert_eq!(c.rounded_size(1280 * MIB), 1280 * MIB);
    assert_eq!(c.rounded_size(1024 * MIB), 1024 * MIB);
    // 4 KiB .. 8 KiB in steps of 1 KiB; at or below 512 * 4 bytes plain rounding applies.
    assert_eq!(c.rounded_size(4097), 5120);
    assert_eq!(c.rounded_size(2000), 2048);
    assert_eq!(c.rounded_size(700), 1024);
    let e = AllocatorConfig::parse("roundup_power2_divisions:3")
        .unwrap_err()
        .to_string();
    assert!(e.contains("must be a power of two from 1 to 64"), "{e}");
    let sim = SimBackend::new(1 << 30);
    let a = CachingAllocator::new(sim, c).unwrap();
    let r = a.allocate_raw(3 * MIB - 100, StreamId::DEFAULT).unwrap();
    assert_eq!((r.size(), r.block_size()), (3 * MIB - 100, 3 * MIB));
    a.free_raw(r).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn recommended_settings_use_expandable_segments_where_pages_map() {
    let sim = SimBackend::new(1 << 30);
    let c = AllocatorConfig::recommended_for(&sim);
    assert_eq!(c, AllocatorConfig::expandable());
    assert!(CachingAllocator::new(sim, c).is_ok());
    let host = HostBackend::new();
    let c = AllocatorConfig::recommended_for(&host);
    assert_eq!(c, AllocatorConfig::default());
    assert!(CachingAllocator::new(host, c).is_ok());
}
