//! The NCCL backend across two processes, one per CUDA device: each test launches this test
//! binary twice with `RANK` / `WORLD_SIZE` / `LOCAL_RANK` / `MASTER_ADDR` / `MASTER_PORT` set
//! (as torchrun does); the ranks run [`nccl_rank_entry`], which checks exact values on
//! `cuda:local_rank` and prints a line the launching test looks for. Without CUDA the tests
//! skip (and fail under `KILN_REQUIRE_CUDA=1`); CI runs them under the CUDA emulator, whose
//! NCCL works across processes (`cargo xtask emu-suite`).
#![cfg(feature = "cuda")]

mod common;

use kiln_autograd::{DType, Device, Tensor};
use kiln_device::testing::cuda_device_or_skip;
use kiln_distributed::{init_process_group, BackendKind, Error, ProcessGroup, ReduceOp};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SCENARIO: &str = "KILN_TEST_NCCL_SCENARIO";

/// True when two CUDA devices can take the two ranks: always under the emulator (each rank's
/// process emulates two), else when this machine has two.
fn two_devices() -> bool {
    if cuda_device_or_skip().is_none() {
        return false;
    }
    let emulated = std::env::var("KILN_EMULATED").is_ok_and(|v| v == "1");
    if !emulated && Device::cuda_device_count() < 2 {
        eprintln!("skipping: the two-rank NCCL tests need two CUDA devices");
        return false;
    }
    true
}

/// Runs `scenario` on two ranks; returns each rank's (success, output) and the seconds taken.
fn launch(scenario: &str, timeout_s: &str) -> (Vec<(bool, String)>, f64) {
    let exe = std::env::current_exe().unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let started = Instant::now();
    let children: Vec<_> = (0..2)
        .map(|rank| {
            Command::new(&exe)
                .args(["--ignored", "--exact", "nccl_rank_entry", "--nocapture"])
                .env(SCENARIO, scenario)
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("KILN_DIST_TIMEOUT", timeout_s)
                // Two devices for the two ranks (the emulator's count; a real machine ignores it).
                .env("KILN_EMU_DEVICES", "2")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (out.status.success(), text)
        })
        .collect();
    (outputs, started.elapsed().as_secs_f64())
}

#[test]
fn every_collective_gives_exact_values_on_two_devices() {
    if !two_devices() {
        return;
    }
    let (ranks, _) = launch("collectives", "60");
    for (r, (ok, log)) in ranks.iter().enumerate() {
        assert!(ok, "rank {r}: {log}");
        assert!(
            log.contains(&format!("rank {r}: nccl collectives ok")),
            "{log}"
        );
    }
}

#[test]
fn a_killed_rank_makes_the_other_fail_within_the_timeout() {
    if !two_devices() {
        return;
    }
    let (ranks, seconds) = launch("kill", "3");
    let (ok0, log0) = &ranks[0];
    assert!(!ranks[1].0, "{}", ranks[1].1);
    assert!(!ok0, "{log0}");
    assert!(
        log0.contains("rank 0 of 2: all_reduce did not finish within 3 s"),
        "{log0}"
    );
    assert!(log0.contains("rank 0: failed as expected"), "{log0}");
    assert!(seconds < 40.0, "took {seconds} s");
}

/// A rank that fetched NCCL's unique id but never calls `ncclCommInitRank` (stuck or gone
/// between the rendezvous and NCCL) makes the other's init fail within KILN_DIST_TIMEOUT with
/// a timeout naming it, instead of blocking in NCCL forever.
#[test]
fn a_rank_that_never_joins_nccl_makes_the_other_time_out_naming_it() {
    if !two_devices() {
        return;
    }
    let (ranks, seconds) = launch("never-joins", "3");
    let (ok0, log0) = &ranks[0];
    assert!(ok0, "{log0}");
    assert!(
        log0.contains("rank 0: init failed as expected: rank 0 of 2: ncclCommInitRank did not finish within 3 s"),
        "{log0}"
    );
    assert!(ranks[1].0, "{}", ranks[1].1);
    assert!(
        ranks[1].1.contains("rank 1: fetched the id"),
        "{}",
        ranks[1].1
    );
    assert!(seconds < 30.0, "took {seconds} s");
}

/// The two sides of [`a_rank_that_never_joins_nccl_makes_the_other_time_out_naming_it`].
fn never_joins(local: usize, device: Device) {
    let env = kiln_distributed::LaunchEnv::from_process_env().unwrap();
    let timeout = Duration::from_secs(3);
    if local == 1 {
        // The rendezvous NcclGroup::new runs (rank 0's unique id, 128 bytes), then nothing.
        let id = kiln_distributed::store::share_from_rank0(&env, None, 128, timeout).unwrap();
        assert_eq!(id.len(), 128);
        println!("rank 1: fetched the id, never joining");
        std::thread::sleep(Duration::from_secs(6));
        return;
    }
    let started = Instant::now();
    let err = init_process_group(device).err().unwrap();
    assert!(
        matches!(
            err,
            Error::Timeout {
                rank: 0,
                op: "ncclCommInitRank",
                ..
            }
        ),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(10), "{err}");
    println!("rank 0: init failed as expected: {err}");
}

/// DDP on `--device cuda`: two ranks, one per device, each on its half of every batch, end
/// bit-identical to each other and where one CPU process over the whole batches ends. The
/// tolerance is looser than tests/ddp.rs's 1e-6 (same device) because the two sides also run
/// different GEMM kernels (cuBLAS's against kiln's CPU gemm): 1e-5 relative.
#[test]
fn ddp_on_cuda_equals_one_process_over_the_concatenated_batches() {
    if !two_devices() {
        return;
    }
    let (ranks, _) = launch("ddp", "60");
    for (r, (ok, log)) in ranks.iter().enumerate() {
        assert!(ok, "rank {r}: {log}");
        assert!(log.contains(&format!("rank {r}: ddp ranks agree")), "{log}");
    }
    assert!(
        ranks[0].1.contains("rank 0: ddp matches one process"),
        "{}",
        ranks[0].1
    );
}

fn cuda_f32(v: &[f32], device: Device) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()], device).unwrap()
}

fn collectives(g: &dyn ProcessGroup, device: Device) {
    let r = g.rank();
    let rf = r as f32;
    let t = cuda_f32(&[1.0 + rf, 10.0 * (1.0 + rf), -0.5], device);
    g.all_reduce(&t, ReduceOp::Sum).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![3.0, 30.0, -1.0]);
    let d = Tensor::from_vec(vec![r as f64, 1.0], &[2], device).unwrap();
    g.all_reduce(&d, ReduceOp::Avg).unwrap();
    assert_eq!(d.to_vec::<f64>().unwrap(), vec![0.5, 1.0]);
    let i = Tensor::from_vec(vec![r as i64 * 7, 5 - r as i64], &[2], device).unwrap();
    g.all_reduce(&i, ReduceOp::Max).unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![7, 5]);
    let base = cuda_f32(&[100.0, 1.0 + rf, 2.0, 100.0], device);
    g.all_reduce(&base.narrow(0, 1, 2).unwrap(), ReduceOp::Sum)
        .unwrap();
    assert_eq!(base.to_vec::<f32>().unwrap(), vec![100.0, 3.0, 4.0, 100.0]);
    let b = cuda_f32(&[rf, rf + 0.25], device);
    g.broadcast(&b, 1).unwrap();
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![1.0, 1.25]);
    let input = Tensor::from_vec(vec![r as f64, 10.0 + r as f64], &[2], device).unwrap();
    let output = Tensor::zeros(&[4], DType::F64, device).unwrap();
    g.all_gather(&input, &output).unwrap();
    assert_eq!(output.to_vec::<f64>().unwrap(), vec![0.0, 10.0, 1.0, 11.0]);
    let input = cuda_f32(&[1.0, 2.0 + rf, 3.0, 4.0 * (1.0 + rf)], device);
    let output = Tensor::zeros(&[2], DType::F32, device).unwrap();
    g.reduce_scatter(&input, &output, ReduceOp::Sum).unwrap();
    let want = [[2.0, 5.0], [6.0, 12.0]][r];
    assert_eq!(output.to_vec::<f32>().unwrap(), want.to_vec());
    g.barrier().unwrap();
    // Async works complete in start order; the collective sees what was queued before start.
    let big = Tensor::full(&[1 << 14], 1.0 + rf as f64, DType::F32, device).unwrap();
    let small = cuda_f32(&[rf], device);
    let first = g.start_all_reduce(&big, ReduceOp::Sum).unwrap();
    let second = g.start_all_reduce(&small, ReduceOp::Sum).unwrap();
    second.wait().unwrap();
    first.wait().unwrap();
    assert!(big.to_vec::<f32>().unwrap().iter().all(|&v| v == 3.0));
    assert_eq!(small.to_vec::<f32>().unwrap(), vec![1.0]);
    // A shape mismatch fails on both ranks, naming rank 1, and the group stays usable.
    let mismatched = cuda_f32(&vec![1.0; 4 + 2 * r], device);
    let err = g.all_reduce(&mismatched, ReduceOp::Sum).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Collective { .. }), "{msg}");
    assert!(
        msg.starts_with(&format!("rank {r} of 2: all_reduce")),
        "{msg}"
    );
    assert!(
        msg.contains("rank 1: all_reduce of 6 F32 elements"),
        "{msg}"
    );
    // A CPU tensor on rank 1 is refused there and fails rank 0 at once.
    let arg = if r == 1 {
        cuda_f32(&[1.0], Device::Cpu)
    } else {
        cuda_f32(&[1.0], device)
    };
    let msg = g.all_reduce(&arg, ReduceOp::Sum).unwrap_err().to_string();
    if r == 1 {
        assert!(msg.contains("is on Cpu"), "{msg}");
    } else {
        assert!(msg.contains("rank 1: refused its own arguments"), "{msg}");
    }
    let after = cuda_f32(&[1.0], device);
    g.all_reduce(&after, ReduceOp::Sum).unwrap();
    assert_eq!(after.to_vec::<f32>().unwrap(), vec![2.0]);
    g.barrier().unwrap();
}

/// The ranks' side of the tests above (launched by them; ignored otherwise).
#[test]
#[ignore = "the entry point of the ranks that the other tests of this file launch"]
fn nccl_rank_entry() {
    let scenario = std::env::var(SCENARIO).expect("launched by the tests of this file");
    let local: usize = std::env::var("LOCAL_RANK").unwrap().parse().unwrap();
    let device = Device::Cuda(local);
    if scenario == "never-joins" {
        return never_joins(local, device);
    }
    let g = init_process_group(device).unwrap();
    assert_eq!(g.backend(), BackendKind::Nccl);
    let r = g.rank();
    match scenario.as_str() {
        "collectives" => {
            collectives(g.as_ref(), device);
            println!("rank {r}: nccl collectives ok");
        }
        "ddp" => common::ddp_against_one_process(g.clone(), device, 1e-5),
        "kill" => {
            g.barrier().unwrap();
            if r == 1 {
                let pid = std::process::id().to_string();
                let _ = Command::new("kill").args(["-9", &pid]).status();
                std::thread::sleep(Duration::from_secs(60));
            }
            let started = Instant::now();
            let err = g
                .all_reduce(&cuda_f32(&[1.0], device), ReduceOp::Sum)
                .unwrap_err();
            let named = matches!(err, Error::Timeout { rank: 0, .. })
                || matches!(err, Error::Collective { rank: 0, .. });
            assert!(named, "{err}");
            assert!(started.elapsed() < Duration::from_secs(10), "{err}");
            println!("rank 0: failed as expected: {err}");
            std::process::exit(3);
        }
        other => panic!("unknown scenario {other}"),
    }
}
