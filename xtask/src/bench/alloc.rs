//! The `alloc` benchmark group (issue 3): cache-hit latency, steady-state backend calls,
//! fragmentation of the shipped traces (recorded from kiln's and PyTorch's CPU training runs,
//! and the synthetic GPU-scale ones) next to the model of PyTorch's allocator, kiln's runs
//! trained for real in child processes (`alloc_real.rs`), and host allocate-touch-free through
//! the cache versus the system allocator.

use super::alloc_traces::{read_traces, FROM_PYTORCH, RECORDED, SYNTHETIC};
use super::harness::{err, Options, Row};
use kiln_alloc_cache::{
    replay_with, Allocation, AllocatorConfig, CachingAllocator, HostBackend, ReplayMode,
    ReplayPolicy, Replayer, StreamId,
};
use std::alloc::Layout;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

const GROUP: &str = "alloc";
const MIB: usize = 1 << 20;
/// Pairs timed together: one `Instant` read costs ~20 ns, so single pairs cannot be timed.
const PAIRS_PER_SAMPLE: u32 = 32;

/// Runs every case of the group.
pub fn run(options: &Options) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    if !options.gpu_only {
        hit_latency(options, &mut rows)?;
        history_overhead(options, &mut rows)?;
        steady_state(&mut rows)?;
        planned_steps(&mut rows)?;
        super::alloc_real::real_runs(options, &mut rows)?;
        fragmentation(&mut rows)?;
        tight_capacity(&mut rows)?;
        host_touch(options, &mut rows)?;
    }
    if options.gpu {
        gpu_hit_latency(options, &mut rows)?;
    }
    Ok(rows)
}

/// `--gpu`: a cache-hit pair through kiln's allocator on `CudaBackend` against a
/// `cuMemAlloc`+`cuMemFree` pair, for 1 KiB and 4 MiB, on cuda:0, with the same hit through the
/// host backend on the same machine beside it. Without a device it says why and reports no row.
fn gpu_hit_latency(options: &Options, rows: &mut Vec<Row>) -> Result<(), String> {
    use kiln_device::cuda::cudarc::driver::result;
    use kiln_device::cuda::CudaBackend;
    use kiln_device::Device;
    if let Some(reason) = kiln_device::cuda_status().reason() {
        eprintln!("bench alloc: --gpu cases skipped: CUDA unavailable: {reason}");
        return Ok(());
    }
    let device = Device::Cuda(0);
    let backend = CudaBackend::new(device).map_err(err)?;
    let alloc = Arc::new(CachingAllocator::new(backend, AllocatorConfig::default()).map_err(err)?);
    let ctx = kiln_device::cuda::context(device).map_err(err)?;
    ctx.bind_to_thread().map_err(err)?;
    let (samples, driver_samples) = if options.quick {
        (2_000, 20)
    } else {
        (50_000, 200)
    };
    // The same pairs through the host backend on this machine: whether a slower hit here is
    // the machine's or the CUDA backend's.
    let host = Arc::new(
        CachingAllocator::new(HostBackend::new(), AllocatorConfig::default()).map_err(err)?,
    );
    for (label, size) in [("1KiB", 1024usize), ("4MiB", 4 * MIB)] {
        let (neighbour, p50, p99) = hit_pairs(&alloc, size, samples)?;
        drop(neighbour);
        let (host_neighbour, host50, _) = hit_pairs(&host, size, samples)?;
        drop(host_neighbour);
        // Driver pairs are slow (tens of microseconds): time each one on its own.
        let mut t = Vec::with_capacity(driver_samples);
        for _ in 0..driver_samples {
            let start = Instant::now();
            // SAFETY: a plain allocation freed at once, never accessed.
            unsafe {
                let p = result::malloc_sync(black_box(size)).map_err(err)?;
                result::free_sync(black_box(p)).map_err(err)?;
            }
            t.push(start.elapsed().as_nanos() as f64);
        }
        t.sort_by(f64::total_cmp);
        let driver50 = percentile(&t, 0.5);
        let case = format!("gpu_hit_alloc_free_pair_{label}");
        rows.push(Row::new(
            GROUP,
            &case,
            "p50_ns",
            p50,
            format!(
                "cuMemAlloc+cuMemFree p50 {driver50:.0} ns; the same hit through the host \
                 backend here {host50:.0} ns"
            ),
            driver50 / p50,
        ));
        rows.push(Row::new(
            GROUP,
            &case,
            "p99_ns",
            p99,
            "PyTorch's CUDA allocator: about 1 us per hit",
            1000.0 / p99,
        ));
    }
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// p50 and p99 (ns per pair) of `samples` timings of `PAIRS_PER_SAMPLE` calls of `pair`.
fn time_pairs(samples: usize, mut pair: impl FnMut()) -> (f64, f64) {
    for _ in 0..samples / 10 + 100 {
        pair();
    }
    let mut t = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        for _ in 0..PAIRS_PER_SAMPLE {
            pair();
        }
        t.push(start.elapsed().as_nanos() as f64 / PAIRS_PER_SAMPLE as f64);
    }
    t.sort_by(f64::total_cmp);
    (percentile(&t, 0.5), percentile(&t, 0.99))
}

/// p50 and p99 (ns per pair) of cache-hit `allocate_raw` + `free_raw` pairs of `size` bytes,
/// with one neighbour block kept live so every hit splits a block and every free coalesces it
/// (the common case inside a busy segment, not the cheapest one). The neighbour is returned:
/// the caller keeps it live for as long as its other measurements need the same layout.
fn hit_pairs(
    alloc: &Arc<CachingAllocator>,
    size: usize,
    samples: usize,
) -> Result<(Allocation, f64, f64), String> {
    let neighbour = alloc.allocate(size, StreamId::DEFAULT).map_err(err)?;
    let (p50, p99) = time_pairs(samples, || {
        let r = alloc
            .allocate_raw(black_box(size), StreamId::DEFAULT)
            .expect("cache hit");
        alloc.free_raw(black_box(r)).expect("free");
    });
    Ok((neighbour, p50, p99))
}

/// The cost of recording the allocation history (issue 20): the same 1 KiB cache-hit pair with
/// `record_memory_history` off (a fresh allocator that never recorded) and on (a ring of
/// 10000 events, full after the warm-up, so every pair also drops the oldest events).
fn history_overhead(options: &Options, rows: &mut Vec<Row>) -> Result<(), String> {
    let samples = if options.quick { 2_000 } else { 50_000 };
    let fresh = || -> Result<Arc<CachingAllocator>, String> {
        Ok(Arc::new(
            CachingAllocator::new(HostBackend::new(), AllocatorConfig::default()).map_err(err)?,
        ))
    };
    let off = fresh()?;
    let (_n_off, off50, _) = hit_pairs(&off, 1024, samples)?;
    let on = fresh()?;
    on.record_memory_history(true, 10_000).map_err(err)?;
    let (_n_on, on50, on99) = hit_pairs(&on, 1024, samples)?;
    let recorded = on.memory_history();
    on.record_memory_history(false, 0).map_err(err)?;
    if recorded.events.len() != 10_000 || recorded.dropped == 0 {
        return Err(format!(
            "history bench: expected a full ring of 10000 events with drops, got {} events, {} dropped",
            recorded.events.len(),
            recorded.dropped
        ));
    }
    rows.push(Row::new(
        GROUP,
        "hit_alloc_free_pair_1KiB_history_off",
        "p50_ns",
        off50,
        "recording never enabled: one relaxed load per call",
        1.0,
    ));
    rows.push(Row::new(
        GROUP,
        "hit_alloc_free_pair_1KiB_history_on",
        "p50_ns",
        on50,
        format!("history off p50 {off50:.0} ns; on p99 {on99:.0} ns (3 events per pair)"),
        off50 / on50,
    ));
    Ok(())
}

fn hit_latency(options: &Options, rows: &mut Vec<Row>) -> Result<(), String> {
    let samples = if options.quick { 2_000 } else { 50_000 };
    let alloc = Arc::new(
        CachingAllocator::new(HostBackend::new(), AllocatorConfig::default()).map_err(err)?,
    );
    for (label, size) in [("1KiB", 1024usize), ("4MiB", 4 * MIB)] {
        let (neighbour, p50, p99) = hit_pairs(&alloc, size, samples)?;
        // The same through the RAII handle tensor storage uses (adds an `Arc` clone and drop).
        let (raii50, _) = time_pairs(samples, || {
            let a = alloc
                .allocate(black_box(size), StreamId::DEFAULT)
                .expect("cache hit");
            drop(black_box(a));
        });
        // And with a process-wide allocator, as kiln-device keeps one per device.
        let static_alloc: &'static CachingAllocator = Box::leak(Box::new(
            CachingAllocator::new(HostBackend::new(), AllocatorConfig::default()).map_err(err)?,
        ));
        let static_neighbour = static_alloc
            .allocate_static(size, StreamId::DEFAULT)
            .map_err(err)?;
        let (static50, _) = time_pairs(samples, || {
            let a = static_alloc
                .allocate_static(black_box(size), StreamId::DEFAULT)
                .expect("cache hit");
            drop(black_box(a));
        });
        drop(static_neighbour);
        drop(neighbour);
        let layout = Layout::from_size_align(size, 512).expect("layout");
        let (sys50, _) = time_pairs(samples, || {
            // SAFETY: non-zero size; freed with the same layout.
            unsafe {
                let p = std::alloc::alloc(black_box(layout));
                std::alloc::dealloc(black_box(p), layout);
            }
        });
        let case = format!("hit_alloc_free_pair_{label}");
        rows.push(Row::new(
            GROUP,
            &case,
            "p50_ns",
            p50,
            "target <= 100 ns",
            100.0 / p50,
        ));
        rows.push(Row::new(
            GROUP,
            &case,
            "p50_ns_raii_handle",
            raii50,
            "target <= 100 ns",
            100.0 / raii50,
        ));
        rows.push(Row::new(
            GROUP,
            &case,
            "p50_ns_static_handle",
            static50,
            "target <= 100 ns",
            100.0 / static50,
        ));
        rows.push(Row::new(
            GROUP,
            &case,
            "p99_ns",
            p99,
            "PyTorch CUDA hit ~1000 ns",
            1000.0 / p99,
        ));
        rows.push(Row::new(
            GROUP,
            &case,
            "p50_ns_vs_system",
            p50,
            format!("std::alloc pair p50 {sys50:.1} ns (same run)"),
            sys50 / p50,
        ));
    }
    Ok(())
}

/// Whether every step of the trace repeats the same shapes.
fn fixed_shapes(name: &str) -> bool {
    !name.contains("varlen") && !name.contains("varbatch")
}

/// Backend calls once a fixed-shape trace repeats. A trace of one step is replayed ten times
/// (target 0 after the first replay). A recorded run (`# step` lines: the model's build, the
/// steps, the end of training) is replayed once and counted per step: step 1 also creates the
/// optimizer's state, so step 2 is the first to repeat a step's allocations and step 3 the
/// first to find the cache as step 2 left it (target 0 from step 3). Replaying a whole run
/// again would measure another thing: a second run starting from the first one's cache.
fn steady_state(rows: &mut Vec<Row>) -> Result<(), String> {
    let texts = RECORDED
        .iter()
        .chain(FROM_PYTORCH.iter())
        .chain(SYNTHETIC.iter());
    for (name, text) in texts {
        if !fixed_shapes(name) {
            continue;
        }
        let steps = kiln_alloc_cache::planned::steps_of(text).map_err(err)?;
        for mode in [ReplayMode::Default, ReplayMode::Expandable] {
            let capacity = kiln_alloc_cache::replay::DEFAULT_REPLAY_CAPACITY;
            let mut r = Replayer::new(mode, capacity).map_err(err)?;
            let (case, metric, later, reference) = if steps.len() == 1 {
                r.run(&steps[0]).map_err(err)?;
                let first = r.sim().calls().memory_calls();
                for _ in 1..10 {
                    r.run(&steps[0]).map_err(err)?;
                }
                let later = r.sim().calls().memory_calls() - first;
                let reference = format!("target 0 (step 1 made {first})");
                (
                    format!("{name}_x10_{}", mode.name()),
                    "backend_calls_after_step_1",
                    later,
                    reference,
                )
            } else {
                let mut per_step = Vec::with_capacity(steps.len());
                for step in &steps {
                    let before = r.sim().calls().memory_calls();
                    r.run(step).map_err(err)?;
                    per_step.push(r.sim().calls().memory_calls() - before);
                }
                let later: u64 = per_step.iter().skip(3).sum();
                let reference = format!(
                    "target 0 over steps 3-{} (build made {}, step 1 {}, step 2 {})",
                    steps.len() - 1,
                    per_step[0],
                    per_step[1],
                    per_step.get(2).copied().unwrap_or(0)
                );
                (
                    format!("{name}_steps_{}", mode.name()),
                    "backend_calls_after_step_2",
                    later,
                    reference,
                )
            };
            rows.push(Row::new(
                GROUP,
                case,
                metric,
                later as f64,
                reference,
                1.0 / (1.0 + later as f64),
            ));
        }
    }
    Ok(())
}

/// Planned steps (`planned_steps:True`, a marker at each `# step` line) on the recorded
/// fixed-shape runs (kiln's and PyTorch's): backend calls in the steps a plan serves from step
/// 3 on, each a repeat of the step before (target 0; step 2, planned from step 1, may reserve
/// the plan's spare bin, as the cache alone grows there), with how many steps the plan served
/// and the run's reserved/live.
fn planned_steps(rows: &mut Vec<Row>) -> Result<(), String> {
    for (name, text) in RECORDED.iter().chain(FROM_PYTORCH.iter()) {
        if !fixed_shapes(name) {
            continue;
        }
        let config = AllocatorConfig {
            planned_steps: true,
            ..AllocatorConfig::default()
        };
        let capacity = kiln_alloc_cache::replay::DEFAULT_REPLAY_CAPACITY;
        let mut r = Replayer::with_config(config, capacity).map_err(err)?;
        let steps = kiln_alloc_cache::planned::steps_of(text).map_err(err)?;
        let mut calls = 0;
        // `steps[0]` is what comes before step 1.
        for (i, step) in steps.iter().enumerate() {
            r.allocator().mark_step().map_err(err)?;
            let planned = i >= 3 && r.allocator().plan_counts().1 > 0;
            let before = r.sim().calls().memory_calls();
            r.run(step).map_err(err)?;
            if planned {
                calls += r.sim().calls().memory_calls() - before;
            }
        }
        r.allocator().mark_step().map_err(err)?;
        let served = r.allocator().plan_counts().0.planned_steps;
        rows.push(Row::new(
            GROUP,
            format!("{name}_planned_steps"),
            "backend_calls_in_planned_steps",
            calls as f64,
            format!(
                "target 0; {served} of {} steps planned, reserved/live {:.3}",
                steps.len() - 1,
                r.report().reserved_over_live
            ),
            1.0 / (1.0 + calls as f64),
        ));
    }
    Ok(())
}

/// Peak reserved over peak live of every trace in each mode, kiln's allocator next to the model
/// of PyTorch's on the same trace (`ratio`: target / kiln's figure), and the backend calls each
/// made.
fn fragmentation(rows: &mut Vec<Row>) -> Result<(), String> {
    let capacity = kiln_alloc_cache::replay::DEFAULT_REPLAY_CAPACITY;
    for (name, trace) in read_traces()? {
        for mode in [ReplayMode::Default, ReplayMode::Expandable] {
            let target = match mode {
                ReplayMode::Default => 1.10,
                ReplayMode::Expandable => 1.03,
            };
            let kiln = replay_with(&trace, ReplayPolicy::Kiln, mode, capacity).map_err(err)?;
            let torch = replay_with(&trace, ReplayPolicy::PyTorch, mode, capacity).map_err(err)?;
            rows.push(Row::new(
                GROUP,
                format!("{name}_{}", mode.name()),
                "reserved_over_live",
                kiln.reserved_over_live,
                format!(
                    "target <= {target}; PyTorch's policy {:.3}",
                    torch.reserved_over_live
                ),
                target / kiln.reserved_over_live,
            ));
            rows.push(Row::new(
                GROUP,
                format!("{name}_{}_pytorch_policy", mode.name()),
                "reserved_over_live",
                torch.reserved_over_live,
                "model of PyTorch's allocator (ratio: PyTorch / kiln)",
                torch.reserved_over_live / kiln.reserved_over_live,
            ));
            rows.push(Row::new(
                GROUP,
                format!("{name}_{}", mode.name()),
                "backend_calls",
                (kiln.device_allocs + kiln.device_frees) as f64,
                format!(
                    "PyTorch's policy {} (ratio: PyTorch / kiln)",
                    torch.device_allocs + torch.device_frees
                ),
                (torch.device_allocs + torch.device_frees) as f64
                    / (kiln.device_allocs + kiln.device_frees).max(1) as f64,
            ));
        }
        let config = AllocatorConfig {
            page_stitching: true,
            ..AllocatorConfig::expandable()
        };
        // CUDA's 2 MiB pages, then the host backend's.
        let pages = [
            (kiln_alloc_cache::replay::DEFAULT_REPLAY_PAGE, ""),
            (kiln_alloc_cache::DEFAULT_HOST_PAGE, "_host_page"),
        ];
        for (page, suffix) in pages {
            let mut stitched = Replayer::with_page(config.clone(), capacity, page).map_err(err)?;
            stitched.run(&trace).map_err(err)?;
            let report = stitched.report();
            let calls = stitched.sim().calls();
            rows.push(Row::new(
                GROUP,
                format!("{name}_expandable_page_stitching{suffix}"),
                "reserved_over_live",
                report.reserved_over_live,
                format!(
                    "target <= 1.03; page_stitching:True on {} KiB pages, {} backend memory \
                     calls ({} aliases, {} remaps)",
                    page >> 10,
                    calls.memory_calls(),
                    calls.map_alias,
                    calls.remap
                ),
                1.03 / report.reserved_over_live,
            ));
        }
    }
    Ok(())
}

/// Replays each trace on a device only 5% larger than its peak of live bytes: how many
/// allocations fail where fragmentation, not live data, is the limit.
fn tight_capacity(rows: &mut Vec<Row>) -> Result<(), String> {
    for (name, trace) in read_traces()? {
        let capacity = (trace.peak_live_bytes() as f64 * 1.05) as usize;
        let capacity = capacity.div_ceil(2 * MIB) * 2 * MIB;
        for mode in [ReplayMode::Default, ReplayMode::Expandable] {
            let report = kiln_alloc_cache::replay(&trace, mode, capacity).map_err(err)?;
            rows.push(Row::new(
                GROUP,
                format!("{name}_{}_capacity_1.05x_live", mode.name()),
                "ooms",
                report.ooms as f64,
                format!("target 0 ({} retries)", report.alloc_retries),
                1.0 / (1.0 + report.ooms as f64),
            ));
        }
    }
    Ok(())
}

/// Writes one byte per 4 KiB page, as a first use of a fresh buffer would.
fn touch(ptr: *mut u8, len: usize) {
    for offset in (0..len).step_by(4096) {
        // SAFETY: `offset < len` and the caller owns `len` bytes at `ptr`.
        unsafe { ptr.add(offset).write_volatile(offset as u8) };
    }
}

fn host_touch(options: &Options, rows: &mut Vec<Row>) -> Result<(), String> {
    let alloc = Arc::new(
        CachingAllocator::new(HostBackend::new(), AllocatorConfig::default()).map_err(err)?,
    );
    for mib in [1usize, 4, 16, 64] {
        let size = mib * MIB;
        let iterations = (if options.quick { 64 } else { 512 }) / mib.min(16) + 4;
        // One untimed round each first: the steady state of a training loop is what counts.
        let mut start = Instant::now();
        for i in 0..=iterations {
            if i == 1 {
                start = Instant::now();
            }
            let a = alloc.allocate(size, StreamId::DEFAULT).map_err(err)?;
            touch(a.as_ptr(), size);
            drop(black_box(a));
        }
        let cached = start.elapsed().as_nanos() as f64 / iterations as f64;
        let layout = Layout::from_size_align(size, 4096).expect("layout");
        for i in 0..=iterations {
            if i == 1 {
                start = Instant::now();
            }
            // SAFETY: non-zero size; freed with the same layout.
            unsafe {
                let p = std::alloc::alloc(layout);
                assert!(!p.is_null(), "system allocator out of memory");
                touch(p, size);
                std::alloc::dealloc(black_box(p), layout);
            }
        }
        let system = start.elapsed().as_nanos() as f64 / iterations as f64;
        rows.push(Row::new(
            GROUP,
            format!("host_alloc_touch_free_{mib}MiB"),
            "us_per_iter",
            cached / 1000.0,
            format!("system allocator {:.1} us/iter (same run)", system / 1000.0),
            system / cached,
        ));
    }
    alloc.empty_cache().map_err(err)?;
    Ok(())
}
