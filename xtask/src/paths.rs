//! Where things are: the workspace root and Cargo's target folder, for every task.
//!
//! Invariants: both are absolute paths derived only from where xtask was built and from
//! `$CARGO_TARGET_DIR` (relative values are taken from the workspace root, as Cargo does).

use std::path::{Path, PathBuf};

/// The workspace root (the folder holding `xtask/`), as known when xtask was built.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// Cargo's target folder: `$CARGO_TARGET_DIR` when set, else `<root>/target`.
pub fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    }
}
