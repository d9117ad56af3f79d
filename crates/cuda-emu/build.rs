//! Generates, into OUT_DIR:
//! - `stubs.rs`: one exported "not supported" stub for every symbol cudarc can load from the
//!   driver, NVRTC, cuBLAS or NCCL (the lists in `names/`) that no file under `src/` implements
//!   (a listed name used as an identifier in the code there: `extern "C" fn NAME`, or a macro
//!   invocation that defines it), so the library never lacks a symbol and never defines one
//!   twice;
//! - `cuda_errors.rs`: the value and name of every `CUresult` of the CUDA version kiln builds for.

use std::collections::BTreeSet;
use std::env;
use std::fs;
use std::path::{Path, PathBuf};

/// Functions that return a C string rather than a status.
const RETURNS_TEXT: &[&str] = &[
    "nvrtcGetErrorString",
    "cublasGetStatusName",
    "cublasGetStatusString",
    "ncclGetErrorString",
    "ncclGetLastError",
];
/// Functions that return nothing.
const RETURNS_NOTHING: &[&str] = &["cublasXerbla", "ncclParamDumpAll", "ncclResetDebugInit"];
/// Functions that return a number rather than a status.
const RETURNS_NUMBER: &[&str] = &["cublasGetCudartVersion"];

/// The identifiers of Rust source, without comments, string and character literals.
fn code_identifiers(text: &str, out: &mut BTreeSet<String>) {
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut ident = String::new();
    while i < bytes.len() {
        let c = bytes[i];
        let Some(rest) = text.get(i..) else {
            i += 1;
            continue;
        };
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            i += rest.find("*/").map_or(rest.len(), |e| e + 2);
        } else if c == b'r'
            && ident.is_empty()
            && (rest.starts_with("r\"") || rest.starts_with("r#"))
        {
            let hashes = rest[1..].bytes().take_while(|&b| b == b'#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 1 + hashes + 1;
            i += rest
                .get(body..)
                .and_then(|r| r.find(&close))
                .map_or(rest.len(), |e| body + e + close.len());
        } else if c == b'"' {
            let mut j = i + 1;
            while j < bytes.len() && bytes[j] != b'"' {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
            i = j + 1;
        } else if c == b'\'' && (rest.get(2..3) == Some("'") || rest.get(1..2) == Some("\\")) {
            i += rest[1..].find('\'').map_or(rest.len(), |e| e + 2);
        } else {
            if c.is_ascii_alphanumeric() || c == b'_' {
                ident.push(c as char);
            } else if !ident.is_empty() {
                out.insert(std::mem::take(&mut ident));
            }
            i += 1;
            continue;
        }
        if !ident.is_empty() {
            out.insert(std::mem::take(&mut ident));
        }
    }
    if !ident.is_empty() {
        out.insert(ident);
    }
}

/// Every identifier used in the code under `dir`, except in this crate's stubs module: a listed
/// symbol named in code (an `extern "C" fn NAME`, or a macro invocation that defines it) counts
/// as implemented. The `exports` test checks the library still exports every listed symbol.
fn implemented(dir: &Path, names: &mut BTreeSet<String>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            implemented(&path, names);
        } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with("stubs.rs") {
            code_identifiers(&fs::read_to_string(&path).unwrap_or_default(), names);
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=names");
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let mut done = BTreeSet::new();
    implemented(&manifest.join("src"), &mut done);

    let mut stubs = String::new();
    for (file, library) in [
        ("driver", "Driver"),
        ("nvrtc", "Nvrtc"),
        ("cublas", "Cublas"),
        ("nccl", "Nccl"),
    ] {
        let list = fs::read_to_string(manifest.join("names").join(format!("{file}.txt")))
            .expect("name list");
        for name in list.lines().map(str::trim).filter(|n| !n.is_empty()) {
            if !done.insert(name.to_string()) {
                continue;
            }
            stubs.push_str(
                "/// Not emulated: logs its name once and returns the library's \"not supported\".\n\
                 #[no_mangle]\n",
            );
            if RETURNS_TEXT.contains(&name) {
                stubs.push_str(&format!(
                    "pub unsafe extern \"C\" fn {name}() -> *const std::ffi::c_char {{ unsupported_text(\"{name}\") }}\n"
                ));
            } else if RETURNS_NOTHING.contains(&name) {
                stubs.push_str(&format!(
                    "pub unsafe extern \"C\" fn {name}() {{ unsupported_silently(\"{name}\") }}\n"
                ));
            } else if RETURNS_NUMBER.contains(&name) {
                stubs.push_str(&format!(
                    "pub unsafe extern \"C\" fn {name}() -> usize {{ unsupported_silently(\"{name}\"); 0 }}\n"
                ));
            } else {
                stubs.push_str(&format!(
                    "pub unsafe extern \"C\" fn {name}() -> u32 {{ unsupported(\"{name}\", Library::{library}) }}\n"
                ));
            }
        }
    }
    fs::write(out.join("stubs.rs"), stubs).expect("write stubs.rs");

    let codes = fs::read_to_string(manifest.join("names").join("cuda_errors.txt")).expect("codes");
    let mut table = String::from("/// Value and name of every `CUresult`.\npub(crate) const CUDA_ERROR_CODES: &[(u32, &str)] = &[\n");
    for line in codes.lines() {
        if let Some((value, name)) = line.split_once(' ') {
            table.push_str(&format!("    ({value}, \"{name}\"),\n"));
        }
    }
    table.push_str("];\n");
    fs::write(out.join("cuda_errors.rs"), table).expect("write cuda_errors.rs");
}
