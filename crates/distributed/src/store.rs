//! The start-up rendezvous over TCP: rank 0 listens at `MASTER_ADDR:MASTER_PORT` and hands a
//! few bytes (NCCL's unique id) to every other rank, as PyTorch's TCPStore does for its
//! bootstrap. Only the bootstrap goes through here; tensors never do.
//!
//! Invariants: every wait (accepting, connecting, reading) ends by the deadline with an
//! [`Error::Timeout`] or an [`Error::Collective`] naming the rank; a peer announcing another
//! world size, or a rank seen twice, is refused; the payload has the same length everywhere.

use crate::env::LaunchEnv;
use crate::{Error, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"KLN1";
const OP: &str = "rendezvous";

fn collective(env: &LaunchEnv, msg: String) -> Error {
    Error::Collective {
        rank: env.rank,
        world_size: env.world_size,
        op: OP,
        msg,
    }
}

fn timeout(env: &LaunchEnv, limit: Duration) -> Error {
    Error::Timeout {
        rank: env.rank,
        world_size: env.world_size,
        op: OP,
        seconds: limit.as_secs_f64(),
    }
}

/// Rank 0's address from `MASTER_ADDR` / `MASTER_PORT`.
fn master(env: &LaunchEnv) -> Result<SocketAddr> {
    let (Some(host), Some(port)) = (env.master_addr.as_deref(), env.master_port) else {
        return Err(Error::Environment(format!(
            "rank {} of {}: the NCCL bootstrap needs rank 0's address: set MASTER_ADDR (its \
             host) and MASTER_PORT (a free TCP port, such as 29500) on every rank, as torchrun \
             does, or launch with mpirun and a build with the `mpi` feature",
            env.rank, env.world_size
        )));
    };
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            Error::Environment(format!(
                "MASTER_ADDR={host:?} does not resolve to an address; set it to rank 0's host"
            ))
        })
}

/// Shares `payload` (given on rank 0, `len` bytes) with every rank of `env`; returns it on
/// every rank. Gives up after `limit`.
pub fn share_from_rank0(
    env: &LaunchEnv,
    payload: Option<&[u8]>,
    len: usize,
    limit: Duration,
) -> Result<Vec<u8>> {
    if env.world_size == 1 {
        return payload
            .map(<[u8]>::to_vec)
            .ok_or_else(|| collective(env, "rank 0 has no payload to share".into()));
    }
    let addr = master(env)?;
    let deadline = Instant::now() + limit;
    if env.rank == 0 {
        let payload = payload.ok_or_else(|| collective(env, "rank 0 has no payload".into()))?;
        serve(env, addr, payload, deadline, limit)?;
        Ok(payload.to_vec())
    } else {
        fetch(env, addr, len, deadline, limit)
    }
}

fn serve(
    env: &LaunchEnv,
    addr: SocketAddr,
    payload: &[u8],
    deadline: Instant,
    limit: Duration,
) -> Result<()> {
    let listener = TcpListener::bind(addr).map_err(|e| {
        collective(
            env,
            format!("cannot listen on MASTER_ADDR:MASTER_PORT = {addr}: {e}; choose a free port"),
        )
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|e| collective(env, format!("listener: {e}")))?;
    let mut seen = vec![false; env.world_size];
    seen[0] = true;
    while seen.iter().any(|s| !s) {
        match listener.accept() {
            Ok((mut stream, _)) => {
                stream
                    .set_nonblocking(false)
                    .and_then(|_| stream.set_read_timeout(Some(remaining(deadline))))
                    .map_err(|e| collective(env, format!("socket: {e}")))?;
                let mut hello = [0u8; 12];
                if stream.read_exact(&mut hello).is_err() || &hello[..4] != MAGIC {
                    continue; // Not a kiln rank (a port scanner, a stale client): ignore it.
                }
                let rank = u32::from_le_bytes([hello[4], hello[5], hello[6], hello[7]]) as usize;
                let world = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]) as usize;
                if world != env.world_size || rank == 0 || rank >= world || seen[rank] {
                    return Err(collective(
                        env,
                        format!(
                            "a process announced rank {rank} of {world} at {addr} while this job \
                             has {} ranks (or that rank joined twice): two jobs share \
                             MASTER_PORT, or the ranks' WORLD_SIZE differ",
                            env.world_size
                        ),
                    ));
                }
                stream
                    .write_all(payload)
                    .map_err(|e| collective(env, format!("sending to rank {rank}: {e}")))?;
                seen[rank] = true;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<String> = (0..env.world_size)
                        .filter(|r| !seen[*r])
                        .map(|r| r.to_string())
                        .collect();
                    eprintln!(
                        "kiln-distributed: rank 0: ranks {} never reached {addr}",
                        missing.join(", ")
                    );
                    return Err(timeout(env, limit));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(collective(env, format!("accept on {addr}: {e}"))),
        }
    }
    Ok(())
}

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

fn fetch(
    env: &LaunchEnv,
    addr: SocketAddr,
    len: usize,
    deadline: Instant,
    limit: Duration,
) -> Result<Vec<u8>> {
    // Rank 0 may start later: retry until the deadline.
    let mut stream = loop {
        match TcpStream::connect_timeout(&addr, remaining(deadline)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => {
                eprintln!(
                    "kiln-distributed: rank {}: cannot reach rank 0 at {addr}: {e}",
                    env.rank
                );
                return Err(timeout(env, limit));
            }
        }
    };
    let mut hello = Vec::with_capacity(12);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&(env.rank as u32).to_le_bytes());
    hello.extend_from_slice(&(env.world_size as u32).to_le_bytes());
    let mut out = vec![0u8; len];
    stream
        .set_read_timeout(Some(remaining(deadline)))
        .and_then(|_| stream.write_all(&hello))
        .and_then(|_| stream.read_exact(&mut out))
        .map_err(|e| {
            collective(
                env,
                format!(
                    "rank 0 at {addr} did not send the bootstrap bytes ({e}); see rank 0's log"
                ),
            )
        })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Launcher;

    fn env(rank: usize, world: usize, port: u16) -> LaunchEnv {
        LaunchEnv {
            rank,
            world_size: world,
            local_rank: rank,
            master_addr: Some("127.0.0.1".into()),
            master_port: Some(port),
            launcher: Launcher::Torchrun,
        }
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[test]
    fn rank0_hands_its_bytes_to_every_rank() {
        let port = free_port();
        let limit = Duration::from_secs(20);
        let clients: Vec<_> = (1..3)
            .map(|r| std::thread::spawn(move || share_from_rank0(&env(r, 3, port), None, 5, limit)))
            .collect();
        let mine = share_from_rank0(&env(0, 3, port), Some(b"hello"), 5, limit).unwrap();
        assert_eq!(mine, b"hello");
        for c in clients {
            assert_eq!(c.join().unwrap().unwrap(), b"hello");
        }
    }

    #[test]
    fn a_missing_rank_times_out_and_no_address_says_what_to_set() {
        let port = free_port();
        let err = share_from_rank0(&env(0, 2, port), Some(b"x"), 1, Duration::from_millis(300))
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Timeout {
                    rank: 0,
                    op: OP,
                    ..
                }
            ),
            "{err}"
        );
        let err =
            share_from_rank0(&env(1, 2, port), None, 1, Duration::from_millis(300)).unwrap_err();
        assert!(matches!(err, Error::Timeout { rank: 1, .. }), "{err}");
        let mut no_addr = env(1, 2, port);
        no_addr.master_addr = None;
        let msg = share_from_rank0(&no_addr, None, 1, Duration::from_millis(300))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("set MASTER_ADDR"), "{msg}");
    }
}
