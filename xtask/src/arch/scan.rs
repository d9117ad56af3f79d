//! The text scanner behind `cargo xtask arch`: comments and literals blanked, tokens with line
//! numbers, and a directory walk.
//!
//! Invariants: blanking keeps every newline, so token lines are source lines; lifetimes (`'a`)
//! are kept, char literals (`'x'`, `'\\n'`) are blanked; a token is an identifier, `::`, or one
//! punctuation character (numbers and white space are dropped).

use std::path::{Path, PathBuf};

/// Calls `f` for every file under `dir`, skipping `target` and hidden folders.
pub(super) fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("reading {}: {e}", dir.display()))?;
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            walk(&path, f)?;
        } else {
            f(&path);
        }
    }
    Ok(())
}

/// Every `.rs` file under `dir`, sorted.
pub(super) fn rust_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    walk(dir, &mut |p| {
        if p.extension().is_some_and(|e| e == "rs") {
            files.push(p.to_path_buf());
        }
    })?;
    files.sort();
    Ok(files)
}

/// A token of Rust source: an identifier, `::`, or one punctuation character.
#[derive(Debug, Clone)]
pub(super) struct Token {
    /// The text.
    pub(super) text: String,
    /// The 1-based source line.
    pub(super) line: usize,
}

/// `text` with comments, string literals and char literals replaced by spaces (newlines kept).
pub(super) fn blank_comments_and_strings(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if c[i] == 'r' && matches!(c.get(i + 1), Some('"') | Some('#')) && raw_start(&c, i) {
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            j += 1; // the opening quote
            while j < c.len() {
                if c[j] == '"' && (0..hashes).all(|h| c.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.extend(c[i..j.min(c.len())].iter().map(|&ch| blank(ch)));
            i = j;
        } else if c[i] == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                let skip = if c[i] == '\\' { 2 } else { 1 };
                for k in 0..skip {
                    if let Some(&ch) = c.get(i + k) {
                        out.push(blank(ch));
                    }
                }
                i += skip;
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): only literals are blanked.
            let end = if c.get(i + 1) == Some(&'\\') {
                (i + 2..c.len()).find(|&j| c[j] == '\'')
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    out.extend(std::iter::repeat_n(' ', e + 1 - i));
                    i = e + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// True when the `r` at `i` starts a raw string (`r"`, `r#"`), not an identifier's last letter.
fn raw_start(c: &[char], i: usize) -> bool {
    let ident_before = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
    let mut j = i + 1;
    while c.get(j) == Some(&'#') {
        j += 1;
    }
    !ident_before && c.get(j) == Some(&'"')
}

/// The tokens of blanked `code`.
pub(super) fn tokenize(code: &str) -> Vec<Token> {
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let c: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < c.len() {
            let ch = c[i];
            if ch.is_alphabetic() || ch == '_' {
                let start = i;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
                out.push(Token {
                    text: c[start..i].iter().collect(),
                    line: n + 1,
                });
            } else if ch == ':' && c.get(i + 1) == Some(&':') {
                out.push(Token {
                    text: "::".into(),
                    line: n + 1,
                });
                i += 2;
            } else if ch.is_whitespace() || ch.is_ascii_digit() {
                i += 1;
            } else {
                out.push(Token {
                    text: ch.to_string(),
                    line: n + 1,
                });
                i += 1;
            }
        }
    }
    out
}
