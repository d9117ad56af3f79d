//! The MPI backend under a real `mpirun -np 2`: each test below launches this test binary under
//! `mpirun` with one scenario, and the two ranks run [`mpi_rank_entry`], which checks exact
//! values on each rank and prints a line the launching test looks for.
//!
//! Needs Open MPI (`mpirun` on the PATH): the `mpi` feature is only built where it is
//! installed (`.ci/run` installs it). As root, `OMPI_ALLOW_RUN_AS_ROOT` is set for the ranks.
#![cfg(feature = "mpi")]

mod common;

use kiln_autograd::{DType, Device, Tensor};
use kiln_distributed::env::{timeout_from_vars, LaunchEnv};
use kiln_distributed::{Error, MpiGroup, ProcessGroup, ReduceOp};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SCENARIO: &str = "KILN_TEST_MPI_SCENARIO";
/// Launches so far, numbering their Open MPI session folders.
static SESSIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Runs `scenario` on two ranks under mpirun; returns (success, combined output, seconds).
fn launch(scenario: &str, timeout_s: &str) -> (bool, String, f64) {
    let exe = std::env::current_exe().unwrap();
    // Each launch gets its own Open MPI session folder: tests run in parallel, and two mpiruns
    // creating the shared default (`$TMPDIR/ompi.<host>.<uid>`) at once can fail with "File
    // exists" (seen in CI).
    let session = std::env::temp_dir().join(format!(
        "kiln-ompi-{}-{scenario}-{}",
        std::process::id(),
        SESSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&session).unwrap();
    let started = Instant::now();
    let out = Command::new("mpirun")
        .args(["-np", "2", "--oversubscribe"])
        .arg(exe)
        .args(["--ignored", "--exact", "mpi_rank_entry", "--nocapture"])
        .env(SCENARIO, scenario)
        .env("KILN_DIST_TIMEOUT", timeout_s)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_orte_tmpdir_base", &session)
        .env("PRTE_MCA_prte_tmpdir_base", &session)
        .output()
        .expect("mpirun must be installed to test the mpi feature (apt-get install openmpi-bin)");
    let _ = std::fs::remove_dir_all(&session);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text, started.elapsed().as_secs_f64())
}

#[test]
fn every_collective_gives_exact_values_on_two_ranks() {
    let (ok, log, _) = launch("collectives", "60");
    assert!(ok, "{log}");
    for r in 0..2 {
        assert!(log.contains(&format!("rank {r}: collectives ok")), "{log}");
    }
}

/// DDP over MPI: N steps on two processes, each on its half of every batch, end where one
/// process over the whole batches ends (tolerance as in tests/ddp.rs: 1e-6 relative, the
/// difference being the order of the f32 gradient sums), and bit-identical on both ranks.
#[test]
fn ddp_over_mpi_equals_one_process_over_the_concatenated_batches() {
    let (ok, log, _) = launch("ddp", "60");
    assert!(ok, "{log}");
    assert!(log.contains("rank 0: ddp matches one process"), "{log}");
    assert!(log.contains("rank 1: ddp ranks agree"), "{log}");
}

#[test]
fn a_hung_peer_makes_the_other_rank_fail_within_the_timeout() {
    let (ok, log, seconds) = launch("hang", "3");
    assert!(!ok, "{log}");
    assert!(
        log.contains("rank 0 of 2: all_reduce did not finish within 3 s"),
        "{log}"
    );
    assert!(log.contains("rank 0: timed out as expected"), "{log}");
    assert!(seconds < 40.0, "took {seconds} s: {log}");
}

#[test]
fn a_killed_rank_stops_the_job_with_its_rank_named() {
    let (ok, log, seconds) = launch("kill", "30");
    assert!(!ok, "{log}");
    // mpirun notices the dead rank and stops the job, naming it.
    assert!(log.contains("process rank 1"), "{log}");
    assert!(log.contains("signal 9") || log.contains("Killed"), "{log}");
    assert!(!log.contains("rank 0: all_reduce returned"), "{log}");
    assert!(seconds < 30.0, "took {seconds} s: {log}");
}

fn f32s(v: &[f32]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()], Device::Cpu).unwrap()
}

fn collectives(g: &MpiGroup) {
    let r = g.rank();
    let rf = r as f32;
    assert_eq!(g.world_size(), 2);
    // all_reduce: sum, avg, max over f32, f64 and i64.
    let t = f32s(&[1.0 + rf, 10.0 * (1.0 + rf), -0.5]);
    g.all_reduce(&t, ReduceOp::Sum).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![3.0, 30.0, -1.0]);
    let d = Tensor::from_vec(vec![r as f64, 1.0], &[2], Device::Cpu).unwrap();
    g.all_reduce(&d, ReduceOp::Avg).unwrap();
    assert_eq!(d.to_vec::<f64>().unwrap(), vec![0.5, 1.0]);
    let i = Tensor::from_vec(vec![r as i64 * 7, 5 - r as i64], &[2], Device::Cpu).unwrap();
    g.all_reduce(&i, ReduceOp::Max).unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![7, 5]);
    // A view with an offset reduces only its own elements.
    let base = f32s(&[100.0, 1.0 + rf, 2.0, 100.0]);
    g.all_reduce(&base.narrow(0, 1, 2).unwrap(), ReduceOp::Sum)
        .unwrap();
    assert_eq!(base.to_vec::<f32>().unwrap(), vec![100.0, 3.0, 4.0, 100.0]);
    // broadcast from rank 1.
    let b = f32s(&[rf, rf + 0.25]);
    g.broadcast(&b, 1).unwrap();
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![1.0, 1.25]);
    // all_gather: rank r's elements at r * n.
    let input = Tensor::from_vec(vec![r as f64, 10.0 + r as f64], &[2], Device::Cpu).unwrap();
    let output = Tensor::zeros(&[4], DType::F64, Device::Cpu).unwrap();
    g.all_gather(&input, &output).unwrap();
    assert_eq!(output.to_vec::<f64>().unwrap(), vec![0.0, 10.0, 1.0, 11.0]);
    // reduce_scatter: the r-th chunk of the sum.
    let input = f32s(&[1.0, 2.0 + rf, 3.0, 4.0 * (1.0 + rf)]);
    let output = Tensor::zeros(&[2], DType::F32, Device::Cpu).unwrap();
    g.reduce_scatter(&input, &output, ReduceOp::Sum).unwrap();
    let want = [[2.0, 5.0], [6.0, 12.0]][r];
    assert_eq!(output.to_vec::<f32>().unwrap(), want.to_vec());
    g.reduce_scatter(&input, &output, ReduceOp::Avg).unwrap();
    assert_eq!(
        output.to_vec::<f32>().unwrap(),
        vec![want[0] / 2.0, want[1] / 2.0]
    );
    g.barrier().unwrap();
    // Async works complete in start order: once the second is waited for, the first is done.
    let big = Tensor::full(&[1 << 16], 1.0 + rf as f64, DType::F32, Device::Cpu).unwrap();
    let small = f32s(&[rf]);
    let first = g.start_all_reduce(&big, ReduceOp::Sum).unwrap();
    let second = g.start_all_reduce(&small, ReduceOp::Sum).unwrap();
    second.wait().unwrap();
    assert!(big.to_vec::<f32>().unwrap().iter().all(|&v| v == 3.0));
    first.wait().unwrap();
    assert_eq!(small.to_vec::<f32>().unwrap(), vec![1.0]);
    // A shape mismatch fails on both ranks, naming rank 1, and leaves the group usable.
    let mismatched = f32s(&vec![1.0; 4 + 2 * r]);
    let err = g.all_reduce(&mismatched, ReduceOp::Sum).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Collective { .. }), "{msg}");
    assert!(
        msg.starts_with(&format!("rank {r} of 2: all_reduce")),
        "{msg}"
    );
    assert!(msg.contains("rank(s) 1 differ"), "{msg}");
    assert!(
        msg.contains("rank 1: all_reduce of 6 F32 elements"),
        "{msg}"
    );
    assert_eq!(mismatched.to_vec::<f32>().unwrap(), vec![1.0; 4 + 2 * r]);
    // A rank refusing its own arguments (non-contiguous on rank 1) fails both at once.
    let m = Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0], &[2, 2], Device::Cpu).unwrap();
    let arg = if r == 1 { m.t().unwrap() } else { m.clone() };
    let msg = g.all_reduce(&arg, ReduceOp::Sum).unwrap_err().to_string();
    if r == 1 {
        assert!(msg.contains("not contiguous"), "{msg}");
    } else {
        assert!(msg.contains("rank 1: refused its own arguments"), "{msg}");
    }
    let after = f32s(&[1.0]);
    g.all_reduce(&after, ReduceOp::Sum).unwrap();
    assert_eq!(after.to_vec::<f32>().unwrap(), vec![2.0]);
    // The i64 average is refused (it would truncate).
    let msg = g.all_reduce(&i, ReduceOp::Avg).unwrap_err().to_string();
    assert!(
        msg.contains("would truncate") || msg.contains("refused"),
        "{msg}"
    );
    // A CUDA-less mistake: a root outside the group is refused.
    assert!(g
        .broadcast(&b, 2)
        .unwrap_err()
        .to_string()
        .contains("root rank 2"));
    g.barrier().unwrap();
}

/// The ranks' side of the tests above (launched by them under mpirun; ignored otherwise).
#[test]
#[ignore = "the entry point of the ranks that the other tests launch under mpirun"]
fn mpi_rank_entry() {
    let scenario = std::env::var(SCENARIO).expect("launched by the tests of this file");
    let vars = kiln_distributed::env::process_vars();
    let env = LaunchEnv::from_vars(&vars).unwrap();
    let timeout = timeout_from_vars(&vars).unwrap();
    let g = MpiGroup::new(&env, timeout).unwrap();
    let r = g.rank();
    assert_eq!((r, g.local_rank()), (env.rank, env.local_rank));
    match scenario.as_str() {
        "collectives" => {
            collectives(&g);
            println!("rank {r}: collectives ok");
        }
        "ddp" => common::ddp_against_one_process(Arc::new(g), Device::Cpu, 1e-6),
        "hang" => {
            g.barrier().unwrap();
            if r == 1 {
                // A hung peer: it never issues the next collective.
                std::thread::sleep(Duration::from_secs(120));
                return;
            }
            let started = Instant::now();
            let err = g.all_reduce(&f32s(&[1.0]), ReduceOp::Sum).unwrap_err();
            assert!(matches!(err, Error::Timeout { rank: 0, .. }), "{err}");
            assert!(started.elapsed() < Duration::from_secs(10));
            println!("rank 0: timed out as expected: {err}");
            // What a training loop does with the error: exit non-zero, so mpirun stops the job.
            std::process::exit(3);
        }
        "kill" => {
            g.barrier().unwrap();
            if r == 1 {
                let pid = std::process::id().to_string();
                let _ = Command::new("kill").args(["-9", &pid]).status();
                std::thread::sleep(Duration::from_secs(60));
            }
            let result = g.all_reduce(&f32s(&[1.0]), ReduceOp::Sum);
            println!("rank 0: all_reduce returned {result:?}");
        }
        other => panic!("unknown scenario {other}"),
    }
}
