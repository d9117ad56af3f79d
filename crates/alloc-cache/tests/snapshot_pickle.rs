//! The memory_viz snapshot format against a fixture PyTorch's side made:
//! `fixtures/memory_viz/torch_snapshot.pickle` is `pickle.dump` of a snapshot dict in the layout
//! of `torch.cuda.memory._snapshot()`, built by `make_fixture.py` (which also runs PyTorch's
//! `_memory_viz` on it and on kiln's `kiln_snapshot.pickle`). The same scenario built from kiln's
//! types must give an equal dict, kiln's bytes must equal the committed `kiln_snapshot.pickle`
//! (refresh with `KILN_BLESS=1`), and reading either file back must give kiln's events.

use kiln_alloc_cache::pickle::{from_pickle, to_pickle, PickleError, PickleValue};
use kiln_alloc_cache::snapshot_pickle::{snapshot_pickle, snapshot_value, write_snapshot_pickle};
use kiln_alloc_cache::snapshot_read::{read_snapshot, read_snapshot_file, SnapshotFileError};
use kiln_alloc_cache::{
    Attribution, BlockSnapshot, BlockSnapshotState, MemoryCategory, MemoryEvent, MemoryEventKind,
    MemoryHistory, MemorySnapshot, MemoryStats, PoolKind, SegmentSnapshot, StreamId,
};
use std::path::PathBuf;
use std::sync::Arc;

const BASE: u64 = 0x7F3A_0000_0000;
const SEGMENT: usize = 2 << 20;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/memory_viz")
        .join(name)
}

fn who(category: MemoryCategory, module: Option<&str>, op: Option<&str>) -> Attribution {
    Attribution {
        category: Some(category),
        op: op.map(Arc::from),
        module: module.map(Arc::from),
    }
}

/// The scenario of `make_fixture.py`, as kiln's recorder reports it (a block stops counting as
/// allocated at its `free_requested`).
fn scenario() -> MemoryHistory {
    use MemoryCategory::*;
    use MemoryEventKind::*;
    let fc = who(Parameter, Some("fc"), Some("empty"));
    let conv = who(
        Activation,
        Some("layer1.0.conv1"),
        Some("ConvolutionBackward"),
    );
    let unknown = who(Unknown, None, None);
    let add = who(Temporary, None, Some("add"));
    let loader = who(Data, Some("loader"), Some("to_device"));
    #[rustfmt::skip]
    let rows = [
        (SegmentAlloc, BASE, SEGMENT, 10, fc.clone(), 0),
        (Alloc, BASE, 1024, 11, fc.clone(), 1024),
        (Alloc, BASE + 1024, 512, 20, conv.clone(), 1536),
        (Alloc, BASE + 1536, 2048, 30, add, 3584),
        (FreeRequested, BASE + 1536, 2048, 40, unknown.clone(), 1536),
        (FreeCompleted, BASE + 1536, 2048, 41, unknown.clone(), 1536),
        (FreeRequested, BASE + 1024, 512, 50, unknown.clone(), 1024),
        (Oom, 0, 1 << 40, 80, loader, 1024),
    ];
    let events = rows
        .into_iter()
        .map(
            |(kind, address, size, time_us, attribution, allocated_after)| MemoryEvent {
                kind,
                address,
                size,
                stream: StreamId::DEFAULT,
                time_us,
                attribution,
                allocated_after,
                reserved_after: SEGMENT,
            },
        )
        .collect();
    let block = |address, size, requested_size, state, attribution| BlockSnapshot {
        address,
        size,
        requested_size,
        state,
        fully_mapped: true,
        attribution,
    };
    let snapshot = MemorySnapshot {
        segments: vec![SegmentSnapshot {
            address: BASE,
            total_size: SEGMENT,
            allocated_size: 1024,
            active_size: 1536,
            requested_size: 1000,
            stream: StreamId::DEFAULT,
            segment_type: PoolKind::Small,
            is_expandable: false,
            address_space: 0,
            blocks: vec![
                block(
                    BASE,
                    1024,
                    1000,
                    BlockSnapshotState::ActiveAllocated,
                    Some(fc),
                ),
                block(
                    BASE + 1024,
                    512,
                    500,
                    BlockSnapshotState::ActivePendingFree,
                    Some(conv),
                ),
                block(
                    BASE + 1536,
                    SEGMENT - 1536,
                    0,
                    BlockSnapshotState::Inactive,
                    None,
                ),
            ],
        }],
        stats: MemoryStats::default(),
    };
    MemoryHistory {
        events,
        dropped: 0,
        max_entries: 100,
        recording: true,
        expandable_segments: false,
        live_before: Vec::new(),
        snapshot,
    }
}

#[test]
fn kiln_writes_the_dict_pytorch_writes() {
    let history = scenario();
    let torch = from_pickle(&std::fs::read(fixture("torch_snapshot.pickle")).unwrap()).unwrap();
    let kiln = snapshot_value(1, &history);
    assert_eq!(kiln, torch, "kiln:\n{kiln}\nPyTorch:\n{torch}");
    // The parts memory_viz keys on, spelled out.
    let seg = &kiln.get("segments").unwrap().as_list().unwrap()[0];
    assert_eq!(seg.get("device").unwrap().as_int(), Some(1));
    let states: Vec<_> = seg
        .get("blocks")
        .unwrap()
        .as_list()
        .unwrap()
        .iter()
        .map(|b| b.get("state").unwrap().as_str().unwrap())
        .collect();
    assert_eq!(
        states,
        ["active_allocated", "active_pending_free", "inactive"]
    );
    let traces = kiln.get("device_traces").unwrap().as_list().unwrap();
    assert_eq!(
        traces.len(),
        2,
        "one trace list per device index up to this one"
    );
    assert!(traces[0].as_list().unwrap().is_empty());
    let actions: Vec<_> = traces[1]
        .as_list()
        .unwrap()
        .iter()
        .map(|e| e.get("action").unwrap().as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "segment_alloc",
            "alloc",
            "alloc",
            "alloc",
            "free_requested",
            "free_completed",
            "free_requested",
            "oom",
            "snapshot"
        ]
    );
}

#[test]
fn kiln_bytes_match_the_golden_file_pytorch_checked() {
    let history = scenario();
    let bytes = snapshot_pickle(1, &history).unwrap();
    let golden = fixture("kiln_snapshot.pickle");
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&golden, &bytes).unwrap();
    }
    let want = std::fs::read(&golden).expect("run with KILN_BLESS=1 to write the golden file");
    assert_eq!(
        bytes, want,
        "kiln's pickle changed: check it with make_fixture.py, then bless"
    );
    // Protocol 4 header, STOP at the end, and no opcode that could run code.
    assert_eq!(&bytes[..2], &[0x80, 4]);
    assert_eq!(bytes.last(), Some(&b'.'));
}

#[test]
fn reading_back_gives_the_events_with_their_totals() {
    let history = scenario();
    for file in ["torch_snapshot.pickle", "kiln_snapshot.pickle"] {
        let loaded = read_snapshot_file(&fixture(file)).unwrap();
        assert_eq!(loaded.device_traces.len(), 2, "{file}");
        assert_eq!(loaded.busiest_device(), 1);
        // The `snapshot` entry is not an event; the rest are kiln's, totals rebuilt.
        assert_eq!(loaded.device_traces[1], history.events, "{file}");
        let seg = &loaded.segments[0];
        assert_eq!(
            (seg.device, seg.address, seg.total_size),
            (1, BASE, SEGMENT)
        );
        assert_eq!(
            seg.blocks[1].attribution.module.as_deref(),
            Some("layer1.0.conv1")
        );
        assert_eq!(seg.blocks[1].state, "active_pending_free");
        assert_eq!(
            seg.blocks.iter().map(|b| b.size).sum::<usize>(),
            history.snapshot.segments[0].total_size
        );
    }
}

#[test]
fn write_snapshot_pickle_creates_the_folder_and_the_file_reads_back() {
    let history = scenario();
    let dir = std::env::temp_dir().join(format!("kiln-snapshot-pickle-{}", std::process::id()));
    let path = dir.join("nested/memory_snapshot.pickle");
    write_snapshot_pickle(&path, 0, &history).unwrap();
    let loaded = read_snapshot_file(&path).unwrap();
    assert_eq!(loaded.device_traces.len(), 1);
    assert_eq!(loaded.device_traces[0], history.events);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn expandable_segments_are_written_as_their_mapped_runs() {
    let mut history = scenario();
    history.expandable_segments = true;
    let seg = &mut history.snapshot.segments[0];
    seg.is_expandable = true;
    seg.address_space = 8 * SEGMENT;
    seg.blocks[2].fully_mapped = false;
    seg.total_size = 1536;
    history.events.truncate(1);
    let v = snapshot_value(0, &history);
    let segs = v.get("segments").unwrap().as_list().unwrap();
    assert_eq!(segs.len(), 1);
    assert_eq!(segs[0].get("total_size").unwrap().as_int(), Some(1536));
    assert_eq!(segs[0].get("blocks").unwrap().as_list().unwrap().len(), 2);
    let trace = v.get("device_traces").unwrap().as_list().unwrap()[0]
        .as_list()
        .unwrap();
    assert_eq!(
        trace[0].get("action").unwrap().as_str(),
        Some("segment_map")
    );
}

#[test]
fn pickle_round_trips_every_kind_of_value() {
    let v = PickleValue::dict([
        (
            "ints",
            PickleValue::List(
                [
                    0i128,
                    255,
                    256,
                    65535,
                    65536,
                    -1,
                    i32::MIN as i128,
                    i32::MAX as i128 + 1,
                    -(1 << 40),
                    u64::MAX as i128,
                    i64::MIN as i128,
                ]
                .into_iter()
                .map(PickleValue::Int)
                .collect(),
            ),
        ),
        ("float", PickleValue::Float(-2.5e-300)),
        ("long str", PickleValue::str("x".repeat(300))),
        ("unicode", PickleValue::str("layer1.0.conv1 · ü")),
        (
            "flags",
            PickleValue::Tuple(vec![
                PickleValue::Bool(true),
                PickleValue::Bool(false),
                PickleValue::None,
            ]),
        ),
        (
            "four",
            PickleValue::Tuple((0..4).map(PickleValue::int).collect()),
        ),
        ("empty", PickleValue::Tuple(vec![])),
        ("nested", PickleValue::List(vec![PickleValue::Dict(vec![])])),
    ]);
    assert_eq!(from_pickle(&to_pickle(&v).unwrap()).unwrap(), v);
}

#[test]
fn bad_pickles_are_errors_naming_the_problem() {
    let err = |bytes: &[u8]| from_pickle(bytes).unwrap_err().to_string();
    assert!(
        err(b"\x80\x04}").contains("truncated"),
        "{}",
        err(b"\x80\x04}")
    );
    // A pickle of an object: GLOBAL 'os\nsystem\n' is refused, not run.
    assert!(err(b"\x80\x02cos\nsystem\n.").contains("outside the plain-data subset"));
    assert!(err(b"\x80\x09N.").contains("protocol 9"));
    // A list that contains itself cannot be built.
    let cyclic = b"\x80\x04]\x94h\x00a.";
    assert!(err(cyclic).contains("nested deeper"), "{}", err(cyclic));
    // Sharing that doubles at each level is bounded.
    let mut bomb = b"\x80\x04]".to_vec();
    for i in 0..40u8 {
        bomb.extend_from_slice(&[b'q', i, b'h', i, b'h', i, 0x86]);
    }
    bomb.push(b'.');
    assert!(err(&bomb).contains("node budget"), "{}", err(&bomb));
    assert!(matches!(
        from_pickle(b"\x80\x04M\x01"),
        Err(PickleError::Malformed { .. })
    ));
    // A pickle, but not a snapshot: the message names the field.
    let not_snapshot = to_pickle(&PickleValue::dict([("segments", PickleValue::int(3))])).unwrap();
    match read_snapshot(&not_snapshot) {
        Err(e @ SnapshotFileError::Layout { .. }) => {
            assert!(e.to_string().contains("segments"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}
