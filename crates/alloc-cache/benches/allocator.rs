//! Criterion micro-benchmarks of the caching allocator on host memory (`cargo bench -p
//! kiln-alloc-cache`): a cache hit (allocate + free of a block the cache holds), a miss
//! (allocate from an empty cache, which asks the backend for a segment, then free and
//! `empty_cache`), and a split (two blocks carved out of one cached segment, then freed, which
//! merges them back), and the hit with the allocation history off and on
//! (`record_memory_history`: off must cost nothing measurable; on, each pair records an alloc,
//! a free-requested and a free-completed event with the thread's attribution, in a full ring
//! that drops its oldest). `cargo xtask bench alloc` stays the side-by-side report.

// criterion_group! defines a public `fn benches` that cannot carry a doc comment.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use kiln_alloc_cache::{
    AllocContext, AllocatorConfig, CachingAllocator, HostBackend, MemoryCategory, StreamId,
};
use std::hint::black_box;
use std::sync::Arc;

const MIB: usize = 1 << 20;

fn allocator() -> Arc<CachingAllocator> {
    Arc::new(
        CachingAllocator::new(HostBackend::new(), AllocatorConfig::default())
            .expect("a host allocator"),
    )
}

fn hit(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_hit");
    for size in [1024usize, 4 * MIB] {
        let alloc = allocator();
        // Warm the cache: the timed pairs find this block.
        drop(alloc.allocate(size, StreamId::DEFAULT).expect("warm-up"));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| black_box(alloc.allocate(size, StreamId::DEFAULT).expect("hit")))
        });
    }
    group.finish();
}

fn miss(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_miss");
    for size in [1024usize, 4 * MIB] {
        let alloc = allocator();
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| {
                drop(black_box(
                    alloc.allocate(size, StreamId::DEFAULT).expect("miss"),
                ));
                alloc.empty_cache().expect("empty_cache")
            })
        });
    }
    group.finish();
}

fn split(c: &mut Criterion) {
    let alloc = allocator();
    // One cached 20 MiB segment that the timed allocations split.
    drop(
        alloc
            .allocate(20 * MIB, StreamId::DEFAULT)
            .expect("warm-up"),
    );
    c.bench_function("alloc_split_1m_3m_of_20m", |b| {
        b.iter(|| {
            let a = alloc.allocate(MIB, StreamId::DEFAULT).expect("split");
            let b = alloc.allocate(3 * MIB, StreamId::DEFAULT).expect("split");
            black_box((&a, &b));
        })
    });
}

fn history(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_hit_history");
    for (name, on) in [("off", false), ("on", true)] {
        let alloc = allocator();
        drop(alloc.allocate(1024, StreamId::DEFAULT).expect("warm-up"));
        if on {
            alloc.record_memory_history(true, 10_000).expect("history");
        }
        // Attribution as a training step declares it: a module path and an op.
        let _module = AllocContext::module("layer3");
        let _op = AllocContext::op("conv2d", MemoryCategory::Activation);
        group.bench_function(name, |b| {
            b.iter(|| black_box(alloc.allocate(1024, StreamId::DEFAULT).expect("hit")))
        });
        alloc.record_memory_history(false, 1).expect("history");
    }
    group.finish();
}

criterion_group!(benches, hit, miss, split, history);
criterion_main!(benches);
