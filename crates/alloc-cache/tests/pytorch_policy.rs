//! The model of PyTorch's allocator (`kiln_alloc_cache::pytorch_policy`) on hand-made traces
//! whose segment sizes, splits, best-fit choices and out-of-memory retries are worked out by
//! hand from PyTorch's documented rules.

use kiln_alloc_cache::pytorch_policy::PyTorchPolicy;
use kiln_alloc_cache::{replay_with, ReplayMode, ReplayPolicy, Trace};

const MIB: usize = 1 << 20;

fn run(text: &str, mode: ReplayMode, capacity: usize) -> PyTorchPolicy {
    let trace = Trace::parse(text).unwrap();
    let mut p = PyTorchPolicy::new(mode, capacity);
    p.run(&trace).unwrap();
    p
}

#[test]
fn segment_sizes_and_large_pool_split_threshold() {
    let mut text = String::new();
    // 1000 B: a 2 MiB small segment.
    text += "a 1 1000\n";
    // 5 MiB: a 20 MiB segment, the 15 MiB rest split off.
    text += &format!("a 2 {}\n", 5 * MIB);
    // 14.5 MiB takes the 15 MiB rest whole: 0.5 MiB is not worth a split in the large pool.
    text += &format!("a 3 {}\n", 29 * MIB / 2);
    // Just over 10 MiB: its own segment, rounded up to 12 MiB.
    text += &format!("a 4 {}\n", 10 * MIB + 1);
    let p = run(&text, ReplayMode::Default, 80 << 30);
    assert_eq!(p.reserved_bytes(), 34 * MIB);
    let r = p.report();
    assert_eq!((r.device_allocs, r.device_frees), (3, 0));
    assert_eq!(
        r.peak_live_bytes,
        1000 + 5 * MIB + 29 * MIB / 2 + 10 * MIB + 1
    );

    // Freeing 2 and 3 merges the 20 MiB segment; 18 MiB best-fits it (the 12 MiB segment's
    // 2 MiB - 512 B rest is too small) and splits off 2 MiB.
    text += "f 2\nf 3\n";
    text += &format!("a 5 {}\n", 18 * MIB);
    // 1.5 MiB then best-fits the 12 MiB segment's 2 MiB - 512 B rest (smaller than the 2 MiB
    // rest of the 20 MiB one): no new segment.
    text += &format!("a 6 {}\n", 3 * MIB / 2);
    let r = run(&text, ReplayMode::Default, 80 << 30).report();
    assert_eq!((r.device_allocs, r.peak_reserved_bytes), (3, 34 * MIB));
    // 1 MiB is still small-pool: it shares the first 2 MiB segment.
    text += &format!("a 7 {MIB}\n");
    assert_eq!(
        run(&text, ReplayMode::Default, 80 << 30).reserved_bytes(),
        34 * MIB
    );
    // A second one no longer fits there (1024 B + 2 MiB > 2 MiB): a new small segment.
    text += &format!("a 8 {MIB}\n");
    assert_eq!(
        run(&text, ReplayMode::Default, 80 << 30).reserved_bytes(),
        36 * MIB
    );
}

#[test]
fn out_of_memory_releases_free_segments_and_retries_once() {
    let text = format!("a 1 1000\nf 1\na 2 {}\na 3 1000\n", 21 * MIB);
    let r = run(&text, ReplayMode::Default, 22 * MIB).report();
    // The 22 MiB segment does not fit beside the cached 2 MiB one: that is released and the
    // retry succeeds; the last request finds nothing to release and fails.
    assert_eq!(r.alloc_retries, 2);
    assert_eq!((r.device_allocs, r.device_frees, r.ooms), (2, 1, 1));
    assert_eq!(r.peak_reserved_bytes, 22 * MIB);
}

#[test]
fn expandable_segments_map_20_mib_chunks_and_prefer_inner_blocks() {
    let mut text = String::new();
    // 5 MiB maps one 20 MiB chunk; the 15 MiB rest stays free at the mapped end.
    text += &format!("a 1 {}\n", 5 * MIB);
    // 30 MiB: the free 15 MiB tail grows by one more chunk.
    text += &format!("a 2 {}\n", 30 * MIB);
    // Small requests map 2 MiB chunks of their own segment.
    text += "a 3 1000\n";
    let p = run(&text, ReplayMode::Expandable, 80 << 30);
    assert_eq!(p.reserved_bytes(), 42 * MIB);
    assert_eq!(p.report().device_allocs, 3);
    assert_eq!(p.report().peak_reserved_bytes, 42 * MIB);
}

#[test]
fn expandable_best_fit_prefers_a_block_inside_over_the_growable_tail() {
    // [0, 6) 6 MiB, [6, 15) 9 MiB allocated; [15, 20) the free 5 MiB tail; then [0, 6) freed.
    let mut text = format!("a 1 {}\na 2 {}\na 3 1000\nf 1\n", 6 * MIB, 9 * MIB);
    // 4 MiB: the best fit by size is the 5 MiB tail, but it counts as 5 MiB plus the unmapped
    // space after it, so the inner 6 MiB block is taken; 6 MiB then fits neither the 2 MiB left
    // there nor the tail, and maps a second chunk. (Kiln's best fit would take the tail and
    // serve 6 MiB from [0, 6) without mapping.)
    text += &format!("a 4 {}\na 5 {}\n", 4 * MIB, 6 * MIB);
    let r = run(&text, ReplayMode::Expandable, 80 << 30).report();
    assert_eq!((r.device_allocs, r.peak_reserved_bytes), (3, 42 * MIB));
}

#[test]
fn expandable_out_of_memory_unmaps_whole_free_chunks() {
    let mut text = String::new();
    text += &format!("a 1 {}\na 2 {}\na 3 1000\n", 5 * MIB, 30 * MIB);
    // Free [0, 5) and [5, 35) MiB: with the tail, [0, 40) is one free mapped block.
    text += "f 1\nf 2\n";
    // 45 MiB needs a third chunk (60 MiB mapped > 42 MiB capacity): the retry unmaps the free
    // large chunks (one unmap of 40 MiB; the small segment's only chunk is in use), then needs
    // three again: 62 MiB > 42 MiB, out of memory.
    text += &format!("a 4 {}\n", 45 * MIB);
    // 38 MiB after that: two chunks fit again (2 + 40 MiB).
    text += &format!("a 5 {}\n", 38 * MIB);
    let r = run(&text, ReplayMode::Expandable, 42 * MIB).report();
    assert_eq!(r.ooms, 1);
    assert_eq!(r.alloc_retries, 1);
    assert_eq!((r.device_allocs, r.device_frees), (4, 1));
    assert_eq!(r.peak_reserved_bytes, 42 * MIB);
}

#[test]
fn replay_with_picks_the_policy() {
    let text = format!("a 1 {}\nf 1\n", 5 * MIB);
    let trace = Trace::parse(&text).unwrap();
    let p = replay_with(&trace, ReplayPolicy::PyTorch, ReplayMode::Default, 80 << 30).unwrap();
    assert_eq!(p.peak_reserved_bytes, 20 * MIB);
    let k = replay_with(&trace, ReplayPolicy::Kiln, ReplayMode::Default, 80 << 30).unwrap();
    assert_eq!(k.peak_live_bytes, 5 * MIB);
    assert!("tensorflow".parse::<ReplayPolicy>().is_err());
}

/// Each of PyTorch's size rules at its exact boundary (the cases on either side that tell `<`
/// from `<=`), worked out by hand from `CUDACachingAllocator.cpp`'s documented rules.
#[test]
fn every_size_rule_holds_at_its_exact_boundary() {
    let reserved = |text: &str, mode| run(text, mode, 80 << 30).reserved_bytes();
    let default = ReplayMode::Default;
    // Exactly 1 MiB is a small request: it shares a 2 MiB small segment with 0.5 MiB.
    assert_eq!(
        reserved(&format!("a 1 {MIB}\na 2 {}\n", MIB / 2), default),
        2 * MIB
    );
    // Exactly 10 MiB gets a segment of its own size (rounded to 2 MiB), not 20 MiB.
    assert_eq!(reserved(&format!("a 1 {}\n", 10 * MIB), default), 10 * MIB);
    // A small block is split when exactly 512 B would remain, in both modes: the last 512 B
    // request fits that rest.
    let rest = format!("a 1 {MIB}\na 2 {}\na 3 512\n", MIB - 512);
    for mode in [default, ReplayMode::Expandable] {
        assert_eq!(reserved(&rest, mode), 2 * MIB, "{mode:?}");
    }
    // A zero-byte request takes no block and no segment.
    let r = run("a 1 0\nf 1\n", default, 80 << 30).report();
    assert_eq!((r.device_allocs, r.peak_reserved_bytes), (0, 0));
}

/// `max_split_size` at its boundaries (20 MiB here): a free block of exactly that size is not
/// handed to a smaller request, and a request of at least that size takes no block 20 MiB or
/// more larger than itself.
#[test]
fn the_max_split_size_rules_of_pytorchs_policy_hold_at_their_boundaries() {
    let reserved = |text: &str| {
        let trace = Trace::parse(text).unwrap();
        let mut p = PyTorchPolicy::with_max_split(ReplayMode::Default, 80 << 30, Some(20 * MIB));
        p.run(&trace).unwrap();
        p.report().peak_reserved_bytes
    };
    // The freed 20 MiB block is oversize: 2 MiB needs a new 20 MiB segment.
    let text = format!("a 1 {}\nf 1\na 2 {}\n", 20 * MIB, 2 * MIB);
    assert_eq!(reserved(&text), 40 * MIB);
    // 20 MiB may not take the freed 40 MiB block (exactly 20 MiB larger): its own segment.
    let text = format!("a 1 {}\nf 1\na 2 {}\n", 40 * MIB, 20 * MIB);
    assert_eq!(reserved(&text), 60 * MIB);
    // Just under 20 MiB larger is taken.
    let text = format!("a 1 {}\nf 1\na 2 {}\n", 40 * MIB, 20 * MIB + 512);
    assert_eq!(reserved(&text), 40 * MIB);
}
