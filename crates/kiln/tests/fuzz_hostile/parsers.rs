//! String parsers and size arguments: `CUDA_VISIBLE_DEVICES`, `KILN_NUM_THREADS`, memory sizes,
//! `--data`, `--optimizer`, allocation traces (replayed on hostile capacities), memory-plan
//! budgets and summary shapes, `KILN_ALLOC_CONF` settings (used by an allocator), launch
//! environments (torchrun, MPI and Slurm variables), each checked against a reference where
//! there is one.

use crate::harness::{run, Outcome, Rng};
use kiln::alloc::Error as AllocError;
use kiln::alloc::{
    replay, AllocatorConfig, CachingAllocator, HostBackend, ReplayMode, StreamId, Trace,
    DEFAULT_HOST_PAGE,
};
use kiln::autograd::DType;
use kiln::data::{DataSource, NormalizeChoice};
use kiln::device::threads::{resolve_num_threads, MAX_THREADS_PER_CORE};
use kiln::device::visibility::parse_selectors;
use kiln::device::VisibleDevices;
use kiln::distributed::env::timeout_from_vars;
use kiln::distributed::{LaunchEnv, Launcher};
use kiln::models::models::mlp;
use kiln::models::{parse_memory_size, plan, summary, OptimizerKind};
use std::collections::BTreeMap;

/// A string from hostile pieces: digits, signs, separators, units, non-ASCII, long numbers.
fn hostile_text(rng: &mut Rng, pieces: &[&str]) -> String {
    let mut s = String::new();
    for _ in 0..rng.below(6) {
        match rng.below(4) {
            0 => s.push_str(rng.pick(pieces)),
            1 => s.push_str(&rng.size().to_string()),
            2 => s.push(char::from_u32(rng.below(0x3000) as u32).unwrap_or('x')),
            _ => s.push_str(rng.pick(&[
                ",",
                " ",
                "-",
                ".",
                "e",
                "+",
                "\0",
                "١",
                "99999999999999999999999",
            ])),
        }
    }
    s
}

pub fn strings(seed: u64, cases: usize) {
    let generate = |rng: &mut Rng| {
        let pieces = [
            "GPU-",
            "MIG-",
            "0",
            "1",
            "-1",
            "GB",
            "GiB",
            "KB",
            "MiB",
            "TB",
            "B",
            "NaN",
            "inf",
            "1e30",
            "synthetic",
            "synthetic:",
            "mnist:",
            "cifar10:",
            "folder:",
            "imagenet",
            "sgd",
            "adamw",
            "0x10",
        ];
        (hostile_text(rng, &pieces), rng.below(70))
    };
    let uuids: Vec<String> = (0..3).map(|i| format!("GPU-{i}0000000-0000")).collect();
    let check = |(text, cores): &(String, usize)| {
        let _ = parse_selectors(text);
        let visible = VisibleDevices::parse(Some(text), &uuids);
        assert!(
            visible.len() <= uuids.len(),
            "{text:?} made {} devices visible",
            visible.len()
        );
        let (threads, _) = resolve_num_threads(Some(text), *cores);
        let limit = (*cores).max(1) * MAX_THREADS_PER_CORE;
        assert!(
            threads.is_none_or(|n| (1..=limit).contains(&n)),
            "{text:?}: {threads:?}"
        );
        let _ = text.parse::<DataSource>();
        let _ = text.parse::<NormalizeChoice>();
        let _ = text.parse::<OptimizerKind>();
        let size = parse_memory_size(text);
        if let Ok(bytes) = size {
            // Reference: a plain integer parses to itself.
            if let Ok(n) = text.trim().parse::<usize>() {
                assert_eq!(bytes, n, "{text:?}");
            }
        }
        Outcome::from(size)
    };
    run(
        "strings (devices, threads, sizes, --data, --normalize, --optimizer)",
        seed,
        cases,
        generate,
        check,
    );
}

#[derive(Debug)]
pub struct Replay {
    text: String,
    expandable: bool,
    capacity: usize,
}

pub fn traces(seed: u64, cases: usize) {
    let generate = |rng: &mut Rng| {
        let mut text = String::new();
        for _ in 0..rng.below(12) {
            let id = rng.below(5);
            let any = rng.size();
            let bytes = rng.pick(&[1, 512, 1 << 20, 3 << 21, 1 << 40, any]);
            text.push_str(&match rng.below(5) {
                0..=2 => format!("a {id} {bytes}\n"),
                3 => format!("f {id}\n"),
                _ => hostile_text(rng, &["a", "f", "#", " ", "\n"]) + "\n",
            });
        }
        let capacity = rng.pick(&[0, 1, 4096, 1 << 21, 80 << 30, 1 << 62, usize::MAX]);
        Replay {
            text,
            expandable: rng.chance(0.5),
            capacity,
        }
    };
    let check = |r: &Replay| {
        let Ok(trace) = Trace::parse(&r.text) else {
            return Outcome::Refused;
        };
        let mode = if r.expandable {
            ReplayMode::Expandable
        } else {
            ReplayMode::Default
        };
        Outcome::from(replay(&trace, mode, r.capacity))
    };
    run(
        "allocation traces on hostile capacities",
        seed,
        cases,
        generate,
        check,
    );
}

pub fn budgets(seed: u64, cases: usize) {
    let model = mlp(&[8, 16, 4], 0.0).unwrap();
    let p = plan(&model, &[8], DType::F32, OptimizerKind::Adam).unwrap();
    let generate = |rng: &mut Rng| (rng.size(), rng.size());
    let check = |(budget, batch): &(usize, usize)| {
        let _ = p.peak_bytes(*batch);
        let fits = p.max_batch_size(*budget);
        if let Ok(b) = fits {
            // Reference: the answer fits and the next batch does not.
            assert!(p.peak_bytes(b) <= *budget, "budget {budget}: batch {b}");
            let next = p.peak_bytes(b.saturating_add(1));
            assert!(next > *budget || next == usize::MAX, "budget {budget}: {b}");
        }
        // Summaries of hostile batches: mult-adds are (weights + biases) x batch, or an error.
        let small = mlp(&[8, 4], 0.0).unwrap();
        let reference = batch.checked_mul(36);
        match summary(&small, &[*batch, 8]) {
            Ok(s) => assert_eq!(Some(s.total_mult_adds), reference, "batch {batch}"),
            Err(e) => assert!(reference.is_none(), "batch {batch}: {e}"),
        }
        Outcome::from(fits)
    };
    run(
        "memory-plan budgets and summary batches",
        seed,
        cases,
        generate,
        check,
    );
}

/// `KILN_ALLOC_CONF` texts: parsed, and when accepted, used by a host allocator for three
/// steps of allocations (planned steps, expandable pages and stitching included), checked
/// against its own statistics: every block holds its request, and freeing all of them leaves
/// nothing allocated.
pub fn allocator_settings(seed: u64, cases: usize) {
    let pieces = [
        "expandable_segments:",
        "page_stitching:",
        "planned_steps:",
        "max_split_size_mb:",
        "roundup_power2_divisions:",
        "garbage_collection_threshold:",
        "host_page_kb:",
        "True",
        "False",
        "1",
        "0.8",
        "4",
        "64",
        "2048",
        "21",
        ":",
        ",",
    ];
    let generate = |rng: &mut Rng| {
        let mut text = match rng.chance(0.5) {
            true => hostile_text(rng, &pieces),
            false => String::new(),
        };
        // Then well-formed settings, so that many texts reach the allocator.
        for _ in 0..rng.below(4) {
            let key = rng.pick(&pieces[..7]);
            let value = rng.pick(&pieces[7..15]);
            text = format!("{text},{key}{value}");
        }
        text
    };
    let sizes = [0, 1, 700, 300 << 10, 3 << 20, 25 << 20];
    let check = |text: &String| {
        let config = match AllocatorConfig::parse(text) {
            Ok(c) => c,
            Err(e) => return Outcome::from(Err::<(), _>(e)),
        };
        // The CPU device's allocator, built as kiln-device builds it from the same settings.
        let backend = match config.expandable_segments {
            true => HostBackend::new()
                .with_page_mapping_of(config.host_page.unwrap_or(DEFAULT_HOST_PAGE))
                .unwrap(),
            false => HostBackend::new(),
        };
        let alloc = CachingAllocator::new(backend, config).unwrap();
        for _ in 0..3 {
            let mut live = Vec::new();
            for &size in &sizes {
                let raw = match alloc.allocate_raw(size, StreamId::DEFAULT) {
                    Ok(raw) => raw,
                    // Under the address-space limit the harness sets, the address space of an
                    // expandable segment is refused, and the report must say that, not "memory".
                    Err(AllocError::OutOfMemory(r)) if r.address_space > 0 => {
                        assert!(r.to_string().contains("`ulimit -v`"), "{text:?}");
                        return Outcome::Refused;
                    }
                    Err(e) => panic!("{text:?}: {size} bytes: {e}"),
                };
                assert!(raw.block_size() >= size, "{text:?}: {size} got {raw:?}");
                live.push(raw);
            }
            let held: usize = live.iter().map(|r| r.block_size()).sum();
            let stats = alloc.memory_stats();
            assert_eq!(stats.allocated_bytes.all.current, held as i64, "{text:?}");
            for raw in live {
                alloc.free_raw(raw).unwrap();
            }
            assert_eq!(
                alloc.memory_stats().allocated_bytes.all.current,
                0,
                "{text:?}"
            );
            alloc.mark_step().unwrap();
        }
        alloc.empty_cache().unwrap();
        Outcome::Accepted
    };
    run(
        "allocator settings (KILN_ALLOC_CONF)",
        seed,
        cases,
        generate,
        check,
    );
}

/// Launch environments: any subset of the variables torchrun, Open MPI, PMI and Slurm set,
/// and `MASTER_ADDR` / `MASTER_PORT` / `KILN_DIST_TIMEOUT`, with hostile values. An accepted
/// environment keeps `LaunchEnv`'s invariants (`rank < world_size`, `local_rank < world_size`,
/// no launcher at all is rank 0 of 1), and a timeout is positive.
pub fn launch_environments(seed: u64, cases: usize) {
    let names = [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "PMI_RANK",
        "PMI_SIZE",
        "MPI_LOCALRANKID",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
        "MASTER_ADDR",
        "MASTER_PORT",
        kiln::distributed::env::TIMEOUT_VAR,
    ];
    let pieces = [
        "0", "1", "2", "3", "-1", "65535", "65536", "0.5", "1e3", "1e-300", "inf", "nan",
    ];
    let generate = |rng: &mut Rng| {
        (0..rng.below(8))
            .map(|_| {
                let value = match rng.chance(0.6) {
                    true => rng.pick(&pieces).to_string(),
                    false => hostile_text(rng, &pieces),
                };
                (rng.pick(&names).to_string(), value)
            })
            .collect::<BTreeMap<String, String>>()
    };
    let check = |vars: &BTreeMap<String, String>| {
        if let Ok(t) = timeout_from_vars(vars) {
            assert!(!t.is_zero(), "{vars:?}: timeout {t:?}");
        }
        let env = LaunchEnv::from_vars(vars);
        if let Ok(env) = &env {
            assert!(
                env.rank < env.world_size && env.local_rank < env.world_size,
                "{vars:?}: {env:?}"
            );
            if env.launcher == Launcher::Single {
                assert_eq!((env.rank, env.world_size), (0, 1), "{vars:?}");
            }
        }
        Outcome::from(env)
    };
    run("launch environments", seed, cases, generate, check);
}
