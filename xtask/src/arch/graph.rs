//! The file-level dependency graph of one crate's `src/`, and its cycles.
//!
//! Invariants: every `.rs` file under `src/` is a node whose module path follows the 2018 file
//! layout (`lib.rs`/`main.rs` = the crate root, `a/mod.rs` and `a.rs` = `a`, `a/b.rs` = `a::b`);
//! an edge `A -> B` means a path written in A resolves into B's module; self edges, `mod`
//! declarations and a module's `pub use` of its own descendants are not edges; paths into other
//! crates are ignored.

use super::scan::{blank_comments_and_strings, rust_files, tokenize, Token};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The files of one crate and which of them use which.
#[derive(Debug)]
pub struct FileGraph {
    files: Vec<PathBuf>,
    /// `(from, to, line)`: file indexes and the line of the first use.
    edges: Vec<(usize, usize, usize)>,
}

impl FileGraph {
    /// Reads every `.rs` file under `src`.
    pub fn read(src: &Path) -> Result<FileGraph, String> {
        let files = rust_files(src)?;
        let modules: BTreeMap<Vec<String>, usize> = files
            .iter()
            .enumerate()
            .filter_map(|(i, f)| module_path(src, f).map(|m| (m, i)))
            .collect();
        let mut scanned = Vec::new();
        let mut test_only: Vec<Vec<String>> = Vec::new();
        for f in &files {
            let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
            let tokens = tokenize(&blank_comments_and_strings(&text));
            let me = module_path(src, f);
            let scan = me.as_ref().map(|m| paths_of(&tokens, m, &modules));
            if let Some(s) = &scan {
                test_only.extend(s.test_modules.iter().cloned());
            }
            scanned.push(me.zip(scan));
        }
        let mut edges = BTreeMap::new();
        for (i, entry) in scanned.into_iter().enumerate() {
            let Some((me, scan)) = entry else {
                continue;
            };
            if test_only.iter().any(|t| me.starts_with(t)) {
                continue;
            }
            for (path, line, reexport) in scan.paths {
                let Some(to) = resolve(&path, &modules) else {
                    continue;
                };
                let to_module = module_path(src, &files[to]).unwrap_or_default();
                if to == i || (reexport && to_module.starts_with(&me)) {
                    continue;
                }
                edges.entry((i, to)).or_insert(line);
            }
        }
        Ok(FileGraph {
            files,
            edges: edges.into_iter().map(|((a, b), l)| (a, b, l)).collect(),
        })
    }

    /// Every strongly connected group of more than one file.
    pub fn cycles(&self) -> Vec<Vec<PathBuf>> {
        let n = self.files.len();
        let mut adj = vec![Vec::new(); n];
        for &(a, b, _) in &self.edges {
            adj[a].push(b);
        }
        strongly_connected(&adj)
            .into_iter()
            .filter(|g| g.len() > 1)
            .map(|g| g.into_iter().map(|i| self.files[i].clone()).collect())
            .collect()
    }

    /// The edges between files of `group`, with the line of each first use.
    pub fn edges_within(&self, group: &[PathBuf]) -> Vec<(PathBuf, PathBuf, usize)> {
        let inside: BTreeSet<usize> = group
            .iter()
            .filter_map(|g| self.files.iter().position(|f| f == g))
            .collect();
        self.edges
            .iter()
            .filter(|(a, b, _)| inside.contains(a) && inside.contains(b))
            .map(|&(a, b, l)| (self.files[a].clone(), self.files[b].clone(), l))
            .collect()
    }
}

/// The module path of `file` inside the crate rooted at `src`; `None` for `src/bin/*`.
fn module_path(src: &Path, file: &Path) -> Option<Vec<String>> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    let is_root = parts.is_empty() && (stem == "lib" || stem == "main");
    if !is_root && stem != "mod" {
        parts.push(stem.to_string());
    }
    Some(parts)
}

/// The deepest module with a file that `path` (absolute, from the crate root) lands in.
fn resolve(path: &[String], modules: &BTreeMap<Vec<String>, usize>) -> Option<usize> {
    (0..=path.len())
        .rev()
        .find_map(|k| modules.get(&path[..k]).copied())
}

/// What one file names: its crate-internal paths, and the child modules it declares only for
/// tests.
struct Scan {
    /// `(absolute module path, line, is a pub use)`, outside `#[cfg(test)]` modules.
    paths: Vec<(Vec<String>, usize, bool)>,
    /// Modules declared `#[cfg(test)] mod name;` (files that are tests, not layers).
    test_modules: Vec<Vec<String>>,
}

/// True when the tokens before `i` are `#[cfg(test)]`.
fn cfg_test_before(tokens: &[Token], i: usize) -> bool {
    let want = ["#", "[", "cfg", "(", "test", ")", "]"];
    i >= want.len()
        && tokens[i - want.len()..i]
            .iter()
            .zip(want)
            .all(|(t, w)| t.text == w)
}

/// Scans one file's tokens; `file_module` is its module path.
fn paths_of(
    tokens: &[Token],
    file_module: &[String],
    modules: &BTreeMap<Vec<String>, usize>,
) -> Scan {
    let mut out = Vec::new();
    let mut test_modules = Vec::new();
    // Inline `mod name { ... }` blocks: the module path inside, the depth they close at, and
    // whether they are test code (inside `#[cfg(test)]`).
    let mut inline: Vec<(Vec<String>, usize, bool)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    let is_ident = |t: &Token| {
        t.text
            .chars()
            .next()
            .is_some_and(|c| c.is_alphabetic() || c == '_')
    };
    while i < tokens.len() {
        let here = inline
            .last()
            .map(|(m, _, _)| m.clone())
            .unwrap_or_else(|| file_module.to_vec());
        let in_test = inline.last().is_some_and(|(_, _, t)| *t);
        let t = &tokens[i];
        match t.text.as_str() {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d, _)| *d == depth) {
                    inline.pop();
                }
            }
            "mod" if tokens.get(i + 2).is_some_and(|t| t.text == "{") => {
                let mut m = here.clone();
                m.push(tokens[i + 1].text.clone());
                inline.push((m, depth, in_test || cfg_test_before(tokens, i)));
                i += 2;
                continue;
            }
            "mod" if tokens.get(i + 2).is_some_and(|t| t.text == ";") => {
                if in_test || cfg_test_before(tokens, i) {
                    let mut m = here.clone();
                    m.push(tokens[i + 1].text.clone());
                    test_modules.push(m);
                }
                i += 3;
                continue;
            }
            "use" => {
                let reexport = is_pub_before(tokens, i);
                let mut trees = Vec::new();
                let end = use_tree(tokens, i + 1, Vec::new(), &mut trees);
                for p in trees.into_iter().filter(|_| !in_test) {
                    if let Some(abs) = absolute(&p, &here, modules) {
                        out.push((abs, t.line, reexport));
                    }
                }
                i = end;
                continue;
            }
            _ if is_ident(t)
                && tokens.get(i + 1).is_some_and(|n| n.text == "::")
                && (i == 0 || (tokens[i - 1].text != "::" && tokens[i - 1].text != ".")) =>
            {
                let mut p = vec![t.text.clone()];
                let mut j = i + 1;
                while tokens.get(j).is_some_and(|x| x.text == "::")
                    && tokens.get(j + 1).is_some_and(is_ident)
                {
                    p.push(tokens[j + 1].text.clone());
                    j += 2;
                }
                if let Some(abs) = absolute(&p, &here, modules).filter(|_| !in_test) {
                    out.push((abs, t.line, false));
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Scan {
        paths: out,
        test_modules,
    }
}

/// True when the `use` at `i` is preceded by `pub` or `pub(...)`.
fn is_pub_before(tokens: &[Token], i: usize) -> bool {
    match i.checked_sub(1).map(|k| tokens[k].text.as_str()) {
        Some("pub") => true,
        Some(")") => (0..i)
            .rev()
            .find(|&k| tokens[k].text == "(")
            .is_some_and(|k| k > 0 && tokens[k - 1].text == "pub"),
        _ => false,
    }
}

/// Reads a use tree starting at `i` with `prefix`; pushes each full path (a glob is its
/// prefix); returns the index after the tree (after the `;` at the top level).
fn use_tree(
    tokens: &[Token],
    mut i: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let top = prefix.is_empty();
    loop {
        let Some(t) = tokens.get(i) else {
            return i;
        };
        match t.text.as_str() {
            "::" => i += 1,
            "{" => {
                i += 1;
                while tokens.get(i).is_some_and(|t| t.text != "}") {
                    i = use_tree(tokens, i, prefix.clone(), out);
                    if tokens.get(i).is_some_and(|t| t.text == ",") {
                        i += 1;
                    }
                }
                i += 1; // the `}`
                return finish(tokens, i, top);
            }
            "*" => {
                out.push(prefix);
                return finish(tokens, i + 1, top);
            }
            "as" => i += 2,
            ";" | "," | "}" => {
                if !prefix.is_empty() {
                    out.push(prefix);
                }
                return finish(tokens, i, top);
            }
            "$" => i += 1,
            _ => {
                prefix.push(t.text.clone());
                i += 1;
            }
        }
    }
}

/// After a tree: at the top level skips through the `;`.
fn finish(tokens: &[Token], i: usize, top: bool) -> usize {
    if top {
        (i..tokens.len())
            .find(|&k| tokens[k].text == ";")
            .map_or(tokens.len(), |k| k + 1)
    } else {
        i
    }
}

/// `path` as written in module `here`, made absolute; `None` for paths into other crates.
fn absolute(
    path: &[String],
    here: &[String],
    modules: &BTreeMap<Vec<String>, usize>,
) -> Option<Vec<String>> {
    let first = path.first()?;
    let (mut base, rest): (Vec<String>, &[String]) = match first.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (here.to_vec(), &path[1..]),
        "super" => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            let keep = here.len().checked_sub(ups)?;
            (here[..keep].to_vec(), &path[ups..])
        }
        _ => {
            let mut child = here.to_vec();
            child.push(first.clone());
            if !modules.contains_key(&child) {
                return None;
            }
            (here.to_vec(), path)
        }
    };
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Tarjan's strongly connected components of a graph given as adjacency lists.
fn strongly_connected(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        adj: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for k in 0..s.adj[v].len() {
            let w = s.adj[v][k];
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut group = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                group.push(w);
                if w == v {
                    break;
                }
            }
            group.sort_unstable();
            s.out.push(group);
        }
    }
    let n = adj.len();
    let mut s = State {
        adj,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
pub(super) fn test_paths(src: &str, here: &[&str], known: &[&[&str]]) -> Vec<(Vec<String>, bool)> {
    let modules: BTreeMap<Vec<String>, usize> = known
        .iter()
        .enumerate()
        .map(|(i, m)| (m.iter().map(|s| s.to_string()).collect(), i))
        .collect();
    let here: Vec<String> = here.iter().map(|s| s.to_string()).collect();
    let tokens = tokenize(&blank_comments_and_strings(src));
    paths_of(&tokens, &here, &modules)
        .paths
        .into_iter()
        .map(|(p, _, r)| (p, r))
        .collect()
}

#[cfg(test)]
pub(super) fn test_sccs(adj: &[Vec<usize>]) -> Vec<Vec<usize>> {
    strongly_connected(adj)
}
