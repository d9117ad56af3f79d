//! `cargo xtask arch`: the layout rules of the workspace, checked.
//!
//! Three rules, each a failure when broken:
//! 1. **File length**: no source file (`.rs`, `.cu`, `.cuh`, `.py`, `.sh`) under `crates/` or
//!    `xtask/` has more than [`MAX_LINES`] lines.
//! 2. **No import cycles between files**: inside each crate's `src/`, file A depends on file B
//!    when A names an item of B's module by a path (`use crate::x::y`, `super::z`, `self::`,
//!    `$crate::`, or a child module's name). A parent's `pub use` of its own descendants is a
//!    re-export, not a dependency, and `mod` declarations are not edges. Strongly connected
//!    groups of more than one file are cycles; only the intrinsic ones listed in
//!    [`INTRINSIC_CYCLES`] (with the reason) are allowed.
//! 3. **One seam signature**: each method of the backend seam listed in [`SEAM_METHODS`] is
//!    defined (`fn name(&self, ...`) at most [`MAX_SEAM_DEFINITIONS`] times in
//!    `crates/device/src`: its trait, the CPU implementation and the CUDA implementation.
//!
//! 4. **One module-file convention**: a module with children is `name/mod.rs`; a `name.rs` beside
//!    a folder `name/` is reported.
//!
//! Code under `#[cfg(test)]` (inline test modules and test-only module files) is not part of
//! the layering and is left out of the graph.
//!
//! The scanner reads text, not a syntax tree: comments and string literals are blanked first,
//! then paths are read token by token, with inline `mod x { ... }` blocks tracked so `super`
//! inside them resolves the way the compiler resolves it. A path resolves to the deepest module
//! that has a file of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a source file may be.
pub const MAX_LINES: usize = 600;

/// How often one seam method may be defined: trait, CPU, CUDA.
pub const MAX_SEAM_DEFINITIONS: usize = 3;

/// Seam methods whose definitions are counted.
pub const SEAM_METHODS: &[&str] = &[
    "conv2d",
    "conv2d_backward",
    "batch_norm_train",
    "batch_norm_backward",
    "softmax_cross_entropy",
    "pool2d",
];

/// Groups of files whose mutual dependency is part of the design, each with its reason
/// (paths relative to the workspace root).
pub const INTRINSIC_CYCLES: &[(&[&str], &str)] = &[
    (
        &[
            "crates/autograd/src/autograd/graph.rs",
            "crates/autograd/src/tensor.rs",
        ],
        "a tensor holds its graph node and a node holds the tensors it saved for backward",
    ),
    (
        &[
            "crates/alloc-cache/src/allocator.rs",
            "crates/alloc-cache/src/handle.rs",
        ],
        "an allocation handle gives its block back to the allocator that handed it out",
    ),
    (
        &["crates/models/src/layer.rs", "crates/models/src/trace.rs"],
        "layers accept the shape tracer as a visitor and the tracer walks layers",
    ),
];

const SOURCE_EXTENSIONS: &[&str] = &["rs", "cu", "cuh", "py", "sh"];

/// Runs every check and prints a report; an error lists what broke.
pub fn run(args: &[String]) -> Result<(), String> {
    if let Some(a) = args.first() {
        return Err(format!("`arch` takes no arguments, got `{a}`"));
    }
    let root = crate::paths::workspace_root();
    let mut failures = Vec::new();

    let files = source_files(&root)?;
    let long: Vec<_> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).ok()?.lines().count();
            (n > MAX_LINES).then(|| format!("{} has {n} lines", rel(&root, f)))
        })
        .collect();
    println!(
        "file length: {} files read, {} over {MAX_LINES} lines",
        files.len(),
        long.len()
    );
    for l in &long {
        println!("  {l}");
    }
    failures.extend(long.into_iter().map(|l| format!("too long: {l}")));

    let pairs: Vec<_> = files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
        .filter(|f| f.file_name().is_some_and(|n| n != "mod.rs"))
        .filter(|f| f.with_extension("").is_dir())
        .map(|f| rel(&root, f))
        .collect();
    println!(
        "module files: {} `name.rs` beside a folder `name/`",
        pairs.len()
    );
    for p in &pairs {
        println!("  {p} (move it to {}/mod.rs)", p.trim_end_matches(".rs"));
        failures.push(format!("module file beside its folder: {p}"));
    }

    let mut crates_read = 0;
    let mut cycles_found = 0;
    for src in crate_src_dirs(&root)? {
        crates_read += 1;
        let graph = FileGraph::read(&src)?;
        for group in graph.cycles() {
            let names: BTreeSet<String> = group.iter().map(|f| rel(&root, f)).collect();
            let allowed = INTRINSIC_CYCLES
                .iter()
                .any(|(set, _)| names.iter().all(|n| set.contains(&n.as_str())));
            cycles_found += 1;
            println!(
                "import cycle{}: {}",
                if allowed { " (intrinsic, allowed)" } else { "" },
                names.iter().cloned().collect::<Vec<_>>().join(" <-> ")
            );
            for (from, to, line) in graph.edges_within(&group) {
                println!("    {}:{line} uses {}", rel(&root, &from), rel(&root, &to));
            }
            if !allowed {
                failures.push(format!(
                    "import cycle: {}",
                    names.into_iter().collect::<Vec<_>>().join(" <-> ")
                ));
            }
        }
    }
    println!("import cycles: {crates_read} crates read, {cycles_found} cycles");

    let mut seam = seam_definitions(&root.join("crates/device/src"), SEAM_METHODS)?;
    for name in SEAM_METHODS {
        let defs = seam.remove(name).unwrap_or_default();
        println!("seam method `{name}`: {} definitions", defs.len());
        for d in &defs {
            println!("  {}", rel(&root, Path::new(d)));
        }
        if defs.len() > MAX_SEAM_DEFINITIONS {
            failures.push(format!(
                "`fn {name}` is defined {} times in crates/device/src (at most \
                 {MAX_SEAM_DEFINITIONS}: trait, CPU, CUDA)",
                defs.len()
            ));
        }
    }

    if failures.is_empty() {
        println!("arch: every rule holds");
        Ok(())
    } else {
        Err(format!(
            "{} layout rule(s) broken:\n  {}",
            failures.len(),
            failures.join("\n  ")
        ))
    }
}

fn rel(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

/// Every source file under `crates/` and `xtask/`, skipping build output and fixtures' data.
fn source_files(root: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for top in ["crates", "xtask"] {
        walk(&root.join(top), &mut |p| {
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
            if SOURCE_EXTENSIONS.contains(&ext) {
                out.push(p.to_path_buf());
            }
        })?;
    }
    out.sort();
    Ok(out)
}

/// The `src/` folder of every workspace crate (each `crates/*` and `xtask`).
fn crate_src_dirs(root: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = vec![root.join("xtask/src")];
    let crates = root.join("crates");
    let entries =
        std::fs::read_dir(&crates).map_err(|e| format!("reading {}: {e}", crates.display()))?;
    for entry in entries.flatten() {
        let src = entry.path().join("src");
        if src.is_dir() {
            out.push(src);
        }
    }
    out.sort();
    Ok(out)
}

/// Where each of `names` is defined as a method (`fn name(&self`, `fn name<..>(self`, ...) in
/// the `.rs` files under `dir`, as `file:line`; every file is read once for all names.
fn seam_definitions(
    dir: &Path,
    names: &[&'static str],
) -> Result<BTreeMap<&'static str, Vec<String>>, String> {
    let mut out = BTreeMap::new();
    for file in rust_files(dir)? {
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let tokens = tokenize(&blank_comments_and_strings(&text));
        for (k, w) in tokens.windows(3).enumerate() {
            let Some(&name) = names.iter().find(|n| w[1].text == **n) else {
                continue;
            };
            if w[0].text != "fn" || (w[2].text != "(" && w[2].text != "<") {
                continue;
            }
            // Only methods (`&self` / `&mut self` / `self` first): free kernel functions of the
            // same name are typed helpers, not the seam's signature.
            let open = (k + 2..tokens.len()).find(|&j| tokens[j].text == "(");
            let first: Vec<&str> = open
                .map(|o| {
                    tokens[o + 1..(o + 4).min(tokens.len())]
                        .iter()
                        .map(|t| t.text.as_str())
                        .collect()
                })
                .unwrap_or_default();
            let is_method = matches!(
                first.as_slice(),
                ["&", "self", ..] | ["&", "mut", "self"] | ["self", ..]
            );
            if is_method {
                let at = format!("{}:{}", file.display(), w[1].line);
                out.entry(name).or_insert_with(Vec::new).push(at);
            }
        }
    }
    Ok(out)
}

mod graph;
mod scan;
use graph::FileGraph;
use scan::{blank_comments_and_strings, rust_files, tokenize, walk};

#[cfg(test)]
mod tests;
