//! Collectives on host buffers: 2–4 ranks on threads and ranks in two processes (this test
//! binary re-executes itself as the peer), every operation, type and operator with exact
//! expected results, chunked and in-place calls, mismatched calls, a rank that never arrives
//! (timeout), one that leaves and one that dies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use half::{bf16, f16};

use super::clique::{new_id_name, CommError};
use super::collective::{unguarded, Collective, Kind};
use super::comm::Comm;
use super::p2p::P2pOp;
use super::reduce::{DType, RedOp};

const TIMEOUT: Duration = Duration::from_secs(20);
/// Small slots, so a few dozen elements already take several chunks.
const SLOT_BYTES: usize = 48;
const DTYPES: [DType; 10] = [
    DType::I8,
    DType::U8,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::U64,
    DType::F16,
    DType::F32,
    DType::F64,
    DType::BF16,
];
const OPS: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];
const KINDS: [Kind; 5] = [
    Kind::AllReduce,
    Kind::Broadcast,
    Kind::Reduce,
    Kind::AllGather,
    Kind::ReduceScatter,
];

/// Rank r's element j: small integers, exact in every type.
fn val(r: usize, j: usize) -> i64 {
    ((r * 7 + j * 3) % 5) as i64 + 1
}

fn encode(dtype: DType, v: f64) -> Vec<u8> {
    match dtype {
        DType::I8 => (v as i64 as i8).to_ne_bytes().to_vec(),
        DType::U8 => (v as i64 as u8).to_ne_bytes().to_vec(),
        DType::I32 => (v as i64 as i32).to_ne_bytes().to_vec(),
        DType::U32 => (v as i64 as u32).to_ne_bytes().to_vec(),
        DType::I64 => (v as i64).to_ne_bytes().to_vec(),
        DType::U64 => (v as i64 as u64).to_ne_bytes().to_vec(),
        DType::F16 => f16::from_f64(v).to_bits().to_ne_bytes().to_vec(),
        DType::BF16 => bf16::from_f64(v).to_bits().to_ne_bytes().to_vec(),
        DType::F32 => (v as f32).to_ne_bytes().to_vec(),
        DType::F64 => v.to_ne_bytes().to_vec(),
    }
}

/// The expected bytes of one reduced element.
fn expected(dtype: DType, op: RedOp, vals: &[i64]) -> Vec<u8> {
    let n = vals.len() as i64;
    let exact: i64 = match op {
        RedOp::Sum | RedOp::Avg => vals.iter().sum(),
        RedOp::Prod => vals.iter().product(),
        RedOp::Max => *vals.iter().max().unwrap(),
        RedOp::Min => *vals.iter().min().unwrap(),
    };
    if op != RedOp::Avg {
        return encode(dtype, exact as f64);
    }
    match dtype {
        DType::F64 => encode(dtype, exact as f64 / n as f64),
        // f32 division, then (for the 16-bit types) one rounding.
        DType::F32 | DType::F16 | DType::BF16 => encode(dtype, (exact as f32 / n as f32) as f64),
        _ => encode(dtype, (exact / n) as f64),
    }
}

fn fill(dtype: DType, rank: usize, len: usize) -> Vec<u8> {
    (0..len)
        .flat_map(|j| encode(dtype, val(rank, j) as f64))
        .collect()
}

/// Runs one collective as `rank` and checks its result exactly.
fn check_case(comm: &Comm, kind: Kind, dtype: DType, op: RedOp, count: usize, in_place: bool) {
    let (rank, n) = (comm.rank, comm.nranks);
    let root = 1 % n;
    let c = Collective {
        kind,
        count,
        dtype,
        op,
        root,
    };
    let size = dtype.size();
    let send_len = c.send_elems(rank, n).unwrap().max(count);
    let recv_len = c.recv_elems(rank, n).unwrap().max(count);
    let send = fill(dtype, rank, send_len);
    let sentinel = 0xa5u8;
    let mut buf = vec![sentinel; recv_len.max(send_len) * size];
    let result = if in_place {
        // NCCL's in-place forms: recv == send, all-gather's send = recv + rank·count,
        // reduce-scatter's recv = send + rank·count.
        let (send_off, recv_off) = match kind {
            Kind::AllGather => (rank * count * size, 0),
            Kind::ReduceScatter => (0, rank * count * size),
            _ => (0, 0),
        };
        buf[send_off..send_off + send.len()].copy_from_slice(&send);
        let base = buf.as_mut_ptr() as u64;
        // SAFETY: both ranges lie in `buf`.
        let r = unsafe { comm.run_now(&c, base + send_off as u64, base + recv_off as u64) };
        buf.drain(..recv_off);
        r
    } else {
        // SAFETY: `send` and `buf` hold the sizes the collective reads and writes.
        unsafe { comm.run_now(&c, send.as_ptr() as u64, buf.as_mut_ptr() as u64) }
    };
    result.unwrap_or_else(|e| panic!("rank {rank} {kind:?} {dtype:?} {op:?}: {e}"));
    let all = |j: usize| (0..n).map(|r| val(r, j)).collect::<Vec<_>>();
    let want: Vec<u8> = match kind {
        Kind::AllReduce => (0..count)
            .flat_map(|j| expected(dtype, op, &all(j)))
            .collect(),
        Kind::Reduce if rank == root => (0..count)
            .flat_map(|j| expected(dtype, op, &all(j)))
            .collect(),
        Kind::Reduce if !in_place => vec![sentinel; count * size],
        Kind::Reduce => send[..count * size].to_vec(),
        Kind::Broadcast => fill(dtype, root, count),
        Kind::AllGather => (0..n).flat_map(|q| fill(dtype, q, count)).collect(),
        Kind::ReduceScatter => (0..count)
            .flat_map(|i| expected(dtype, op, &all(rank * count + i)))
            .collect(),
    };
    let got = &buf[..want.len()];
    if got != want.as_slice() {
        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
        panic!("rank {rank} of {n} {kind:?} {dtype:?} {op:?} count {count} in_place {in_place}: byte {at} differs");
    }
}

/// The whole sequence of cases every rank runs, in the same order.
fn run_all_cases(comm: &Comm) {
    for kind in KINDS {
        let ops: &[RedOp] = match kind {
            Kind::Broadcast | Kind::AllGather => &[RedOp::Sum],
            _ => &OPS,
        };
        for dtype in DTYPES {
            for &op in ops {
                check_case(comm, kind, dtype, op, 7, false);
            }
        }
        // Several chunks (and, for reduce-scatter, blocks split across chunks), and in place.
        check_case(comm, kind, DType::U8, RedOp::Sum, SLOT_BYTES + 3, false);
        check_case(comm, kind, DType::F16, RedOp::Max, SLOT_BYTES / 3, false);
        check_case(comm, kind, DType::F32, RedOp::Sum, 11, true);
        check_case(
            comm,
            kind,
            DType::BF16,
            RedOp::Avg,
            SLOT_BYTES / 2 + 1,
            true,
        );
    }
    run_p2p_cases(comm);
    // count 0 is a no-op.
    let c = Collective {
        kind: Kind::AllReduce,
        count: 0,
        dtype: DType::F32,
        op: RedOp::Sum,
        root: 0,
    };
    // SAFETY: nothing is read or written.
    unsafe { comm.run_now(&c, 0, 0) }.unwrap();
}

fn threads(n: usize, f: impl Fn(Arc<Comm>) + Send + Sync + 'static) {
    let name = new_id_name().unwrap();
    let f = Arc::new(f);
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let (name, f) = (name.clone(), f.clone());
            std::thread::spawn(move || {
                let comm =
                    Comm::init_rank(&name, n, rank, rank as i32, SLOT_BYTES, TIMEOUT).unwrap();
                f(comm);
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a rank panicked");
    }
}

#[test]
fn every_collective_type_and_op_is_exact_on_2_3_and_4_thread_ranks() {
    for n in 2..=4 {
        threads(n, |comm| run_all_cases(&comm));
    }
}

#[test]
fn one_rank_is_a_copy() {
    threads(1, |comm| run_all_cases(&comm));
}

#[test]
fn ranks_that_disagree_all_get_invalid_usage() {
    threads(2, |comm| {
        let c = Collective {
            kind: Kind::AllReduce,
            count: 4 + comm.rank,
            dtype: DType::F32,
            op: RedOp::Sum,
            root: 0,
        };
        let (send, mut recv) = (vec![0f32; 8], vec![0f32; 8]);
        // SAFETY: both buffers hold 8 elements.
        let e = unsafe { comm.run_now(&c, send.as_ptr() as u64, recv.as_mut_ptr() as u64) };
        assert!(
            matches!(e, Err(CommError::InvalidUsage(ref m)) if m.contains("disagree")),
            "{e:?}"
        );
        // The communicator keeps its error.
        assert!(comm.async_error().is_some());
        assert!(comm.usable().is_err());
    });
}

#[test]
fn a_rank_that_never_arrives_is_a_timeout_error_within_the_timeout() {
    let name = new_id_name().unwrap();
    let start = Instant::now();
    let e = Comm::init_rank(&name, 2, 0, 0, SLOT_BYTES, Duration::from_millis(300)).err();
    assert!(
        matches!(e, Some(CommError::System(ref m)) if m.contains("timed out") && m.contains("[1]")),
        "{e:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    // The rendezvous file is gone.
    assert!(
        !super::clique::valid_id_name(&name)
            || !std::path::Path::new("/dev/shm").join(&name).exists()
    );
}

#[test]
fn a_peer_that_left_stops_the_wait_at_once() {
    let name = new_id_name().unwrap();
    let peer = {
        let name = name.clone();
        std::thread::spawn(move || {
            let comm = Comm::init_rank(&name, 2, 1, 1, SLOT_BYTES, TIMEOUT).unwrap();
            comm.abort();
        })
    };
    let comm = Comm::init_rank(&name, 2, 0, 0, SLOT_BYTES, TIMEOUT).unwrap();
    peer.join().unwrap();
    let c = Collective {
        kind: Kind::Broadcast,
        count: 3,
        dtype: DType::I32,
        op: RedOp::Sum,
        root: 0,
    };
    let mut buf = vec![0i32; 3];
    let start = Instant::now();
    let p = buf.as_mut_ptr() as u64;
    // SAFETY: `buf` holds 3 elements.
    let e = unsafe { comm.run_now(&c, p, p) };
    assert!(
        matches!(e, Err(CommError::Remote(ref m)) if m.contains("rank 1")),
        "{e:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
}

const PEER_ENV: &str = "KILN_EMU_NCCL_TEST_PEER";

/// The peer rank of the cross-process tests (does nothing unless started by one of them).
#[test]
fn peer_process() {
    let Ok(spec) = std::env::var(PEER_ENV) else {
        return;
    };
    let parts: Vec<&str> = spec.split(',').collect();
    let (name, mode) = (parts[0], parts[1]);
    let comm = Comm::init_rank(name, 2, 1, 0, SLOT_BYTES, TIMEOUT).unwrap();
    match mode {
        "run" => run_all_cases(&comm),
        // Dies without leaving: the parent must notice the dead process.
        _ => std::process::exit(0),
    }
}

fn spawn_peer(name: &str, mode: &str) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "nccl::tests::peer_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PEER_ENV, format!("{name},{mode}"))
        // Piped, so the peer's test-harness lines do not mix into this binary's output.
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for the peer; its output when it failed.
fn peer_result(child: std::process::Child) -> Result<(), String> {
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr))
    }
}

#[test]
fn ranks_in_two_processes_run_every_collective() {
    let name = new_id_name().unwrap();
    let child = spawn_peer(&name, "run");
    let comm = Comm::init_rank(&name, 2, 0, 0, SLOT_BYTES, TIMEOUT).unwrap();
    run_all_cases(&comm);
    if let Err(output) = peer_result(child) {
        panic!("the peer process failed:\n{output}");
    }
}

#[test]
fn a_peer_process_that_dies_is_reported() {
    let name = new_id_name().unwrap();
    let child = spawn_peer(&name, "die");
    let comm = Comm::init_rank(&name, 2, 0, 0, SLOT_BYTES, TIMEOUT).unwrap();
    let _ = peer_result(child);
    let c = Collective {
        kind: Kind::AllReduce,
        count: 3,
        dtype: DType::F64,
        op: RedOp::Sum,
        root: 0,
    };
    let mut buf = vec![0f64; 3];
    let p = buf.as_mut_ptr() as u64;
    let start = Instant::now();
    // SAFETY: `buf` holds 3 elements.
    let e = unsafe { comm.run_now(&c, p, p) };
    assert!(
        matches!(e, Err(CommError::Remote(ref m)) if m.contains("died")),
        "{e:?}"
    );
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn the_default_slot_size_moves_more_than_one_slot() {
    let name = new_id_name().unwrap();
    let count = super::clique::SLOT_BYTES / 4 + 5;
    let run = move |rank: usize, name: String| {
        let slot = super::clique::SLOT_BYTES;
        let comm = Comm::init_rank(&name, 2, rank, rank as i32, slot, TIMEOUT).unwrap();
        let c = Collective {
            kind: Kind::AllReduce,
            count,
            dtype: DType::F32,
            op: RedOp::Sum,
            root: 0,
        };
        let mut buf: Vec<f32> = (0..count)
            .map(|i| (i % 1000) as f32 + rank as f32)
            .collect();
        let p = buf.as_mut_ptr() as u64;
        // SAFETY: `buf` holds `count` elements.
        unsafe { comm.run_now(&c, p, p) }.unwrap();
        assert!(buf
            .iter()
            .enumerate()
            .all(|(i, &x)| x == 2.0 * (i % 1000) as f32 + 1.0));
    };
    let peer = {
        let name = name.clone();
        std::thread::spawn(move || run(1, name))
    };
    run(0, name);
    peer.join().unwrap();
}

/// A ring exchange (each rank sends to the next and receives from the previous, both in one
/// batch, messages many times the ring's size) and a send to itself.
fn run_p2p_cases(comm: &Comm) {
    let (rank, n) = (comm.rank, comm.nranks);
    for (dtype, count) in [(DType::F32, 1000), (DType::BF16, 3), (DType::U8, 0)] {
        let send = fill(dtype, rank, count);
        let mut recv = vec![0u8; send.len()];
        let mut own = vec![0u8; send.len()];
        let op = |send: bool, peer: usize, addr: u64| P2pOp {
            send,
            peer,
            addr,
            count,
            dtype,
        };
        // Two messages to itself on one channel: they must arrive whole and in order.
        let second = fill(dtype, rank + 7, count);
        let mut own2 = vec![0u8; send.len()];
        let ops = [
            op(true, (rank + 1) % n, send.as_ptr() as u64),
            op(false, (rank + n - 1) % n, recv.as_mut_ptr() as u64),
            op(true, rank, send.as_ptr() as u64),
            op(true, rank, second.as_ptr() as u64),
            op(false, rank, own.as_mut_ptr() as u64),
            op(false, rank, own2.as_mut_ptr() as u64),
        ];
        // SAFETY: every buffer holds `count` elements.
        unsafe { comm.execute_p2p(&ops, &unguarded) }
            .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        assert_eq!(
            recv,
            fill(dtype, (rank + n - 1) % n, count),
            "rank {rank} {dtype:?}"
        );
        assert_eq!(own, send, "rank {rank} {dtype:?} to itself");
        assert_eq!(
            own2, second,
            "rank {rank} {dtype:?} second message to itself"
        );
    }
}

#[test]
fn a_receive_that_expects_another_size_is_invalid_usage() {
    threads(2, |comm| {
        let mut buf = vec![0f32; 6];
        let p = buf.as_mut_ptr() as u64;
        let op = if comm.rank == 0 {
            P2pOp {
                send: true,
                peer: 1,
                addr: p,
                count: 5,
                dtype: DType::F32,
            }
        } else {
            P2pOp {
                send: false,
                peer: 0,
                addr: p,
                count: 6,
                dtype: DType::F32,
            }
        };
        // SAFETY: `buf` holds 6 elements.
        let r = unsafe { comm.execute_p2p(&[op], &unguarded) };
        if comm.rank == 1 {
            assert!(
                matches!(r, Err(CommError::InvalidUsage(ref m)) if m.contains("sent 20 bytes")),
                "{r:?}"
            );
        }
    });
}
