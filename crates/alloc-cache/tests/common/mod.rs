//! What the trace tests share.

use kiln_alloc_cache::{replay, replay_stitched, ReplayMode, Trace};

/// Replays `trace` in default mode, expandable mode and expandable mode with page stitching;
/// each must keep reserved/live at most its bound (same order) with no failed allocation and
/// no retry.
pub fn assert_within_bounds(name: &str, trace: &Trace, bounds: [f64; 3]) {
    let cap = kiln_alloc_cache::replay::DEFAULT_REPLAY_CAPACITY;
    let reports = [
        replay(trace, ReplayMode::Default, cap).unwrap(),
        replay(trace, ReplayMode::Expandable, cap).unwrap(),
        replay_stitched(trace, cap).unwrap(),
    ];
    for ((r, bound), mode) in reports
        .iter()
        .zip(bounds)
        .zip(["default", "expandable", "stitching"])
    {
        assert!(
            r.reserved_over_live <= bound,
            "{name} {mode}: reserved/live {:.4} above {bound}",
            r.reserved_over_live
        );
        assert_eq!((r.ooms, r.alloc_retries), (0, 0), "{name} {mode}");
    }
}
