//! What the examples share: the shipped trace files.

use std::path::PathBuf;

/// The `.trace` files of `crates/alloc-cache/traces/` (kiln's recordings, PyTorch's, the
/// synthetic steps), sorted by name; the recording script beside them is not one.
pub fn shipped_traces() -> std::io::Result<Vec<PathBuf>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/traces");
    let mut paths = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        if path.extension().is_some_and(|x| x == "trace") {
            paths.push(path);
        }
    }
    paths.sort();
    Ok(paths)
}
