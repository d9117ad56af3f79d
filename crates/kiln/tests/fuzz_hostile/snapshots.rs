//! Memory snapshot pickles (what `cargo xtask memviz` draws: kiln's `memory_snapshot.pickle`
//! or one PyTorch's `_dump_snapshot` wrote), mutated value by value and byte by byte, read back
//! and drawn as kiln's memory picture. Every case must end in `Ok` or a typed error.

use crate::harness::{run, Outcome, Rng};
use kiln::alloc::pickle::{from_pickle, to_pickle, PickleValue};
use kiln::alloc::snapshot_read::read_snapshot;
use kiln::alloc::timeline::MemoryTimeline;
use kiln::memory_picture::memory_svg;

fn fixture(name: &str) -> Vec<u8> {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../alloc-cache/tests/fixtures/memory_viz"
    );
    std::fs::read(format!("{dir}/{name}")).unwrap()
}

/// Every node's path under `v`: list, tuple and dict-value positions.
fn paths(v: &PickleValue, at: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    out.push(at.clone());
    let children: Vec<&PickleValue> = match v {
        PickleValue::List(items) | PickleValue::Tuple(items) => items.iter().collect(),
        PickleValue::Dict(pairs) => pairs.iter().map(|(_, v)| v).collect(),
        _ => return,
    };
    for (i, c) in children.into_iter().enumerate() {
        at.push(i);
        paths(c, at, out);
        at.pop();
    }
}

fn node_mut<'a>(v: &'a mut PickleValue, path: &[usize]) -> Option<&'a mut PickleValue> {
    path.iter().try_fold(v, |v, &i| match v {
        PickleValue::List(items) | PickleValue::Tuple(items) => items.get_mut(i),
        PickleValue::Dict(pairs) => pairs.get_mut(i).map(|(_, v)| v),
        _ => None,
    })
}

fn hostile(rng: &mut Rng) -> PickleValue {
    let any = rng.next_u64() as i128;
    rng.pick(&[
        PickleValue::None,
        PickleValue::Bool(true),
        PickleValue::Int(0),
        PickleValue::Int(-1),
        PickleValue::Int(1),
        PickleValue::Int(1 << 40),
        PickleValue::Int(u64::MAX as i128),
        PickleValue::Int(i128::MAX),
        PickleValue::Int(i128::MIN),
        PickleValue::Int(any),
        PickleValue::Float(f64::NAN),
        PickleValue::Float(f64::INFINITY),
        PickleValue::Float(-1e300),
        PickleValue::Str(String::new()),
        PickleValue::Str("free_completed".into()),
        PickleValue::Str("segment_alloc".into()),
        PickleValue::List(vec![]),
        PickleValue::Dict(vec![]),
    ])
}

/// One change to a fixture.
#[derive(Debug)]
enum Change {
    /// The node at `path` replaced (`path` chosen among the fixture's nodes, as a fraction of
    /// their count, since earlier changes move them).
    Node {
        pick: usize,
        value: PickleValue,
    },
    /// A list or tuple at `pick` cut to `len` items, or grown by repeating its last.
    Resize {
        pick: usize,
        len: usize,
    },
    /// Bytes of the written pickle: a bit flipped, or the file cut.
    Flip {
        at: usize,
        bit: u8,
    },
    Cut {
        keep: usize,
    },
}

pub fn snapshot_pickles(seed: u64, cases: usize) {
    let fixtures = [
        fixture("kiln_snapshot.pickle"),
        fixture("torch_snapshot.pickle"),
    ];
    let generate = |rng: &mut Rng| {
        let which = rng.below(fixtures.len());
        let changes: Vec<Change> = (0..1 + rng.below(3))
            .map(|_| match rng.below(6) {
                0..=2 => Change::Node {
                    pick: rng.next_u64() as usize,
                    value: hostile(rng),
                },
                3 => Change::Resize {
                    pick: rng.next_u64() as usize,
                    len: rng.pick(&[0, 1, 2, 50]),
                },
                4 => Change::Flip {
                    at: rng.next_u64() as usize,
                    bit: rng.below(8) as u8,
                },
                _ => Change::Cut {
                    keep: rng.below(fixtures[which].len() + 1),
                },
            })
            .collect();
        (which, changes)
    };
    let check = |(which, changes): &(usize, Vec<Change>)| {
        let mut value = from_pickle(&fixtures[*which]).unwrap();
        for c in changes {
            let mut all = Vec::new();
            paths(&value, &mut Vec::new(), &mut all);
            match c {
                Change::Node { pick, value: new } => {
                    if let Some(node) = node_mut(&mut value, &all[pick % all.len()]) {
                        *node = new.clone();
                    }
                }
                Change::Resize { pick, len } => {
                    if let Some(PickleValue::List(items) | PickleValue::Tuple(items)) =
                        node_mut(&mut value, &all[pick % all.len()])
                    {
                        match items.last().cloned() {
                            Some(last) if *len > items.len() => items.resize(*len, last),
                            _ => items.truncate(*len),
                        }
                    }
                }
                _ => {}
            }
        }
        let mut bytes = to_pickle(&value).unwrap();
        for c in changes {
            match *c {
                Change::Flip { at, bit } if !bytes.is_empty() => {
                    let i = at % bytes.len();
                    bytes[i] ^= 1 << bit;
                }
                Change::Cut { keep } => bytes.truncate(keep),
                _ => {}
            }
        }
        let snapshot = match read_snapshot(&bytes) {
            Ok(s) => s,
            Err(e) => return Outcome::from(Err::<(), _>(e)),
        };
        let busiest = snapshot.busiest_device();
        for (device, events) in snapshot.device_traces.iter().enumerate() {
            let timeline = MemoryTimeline::from_events(events, 0);
            let _ = timeline.peak_bytes();
            if device == busiest {
                let svg = memory_svg(Some((&timeline, "fuzz")), &[]);
                assert!(
                    svg.starts_with("<svg") || svg.starts_with("<?xml"),
                    "{svg:.80}"
                );
            }
        }
        Outcome::Accepted
    };
    run("memory snapshot pickles", seed, cases, generate, check);
}
