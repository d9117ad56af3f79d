//! Each header of `include/` compiles alone without warnings, and every kiln kernel file
//! (`crates/device/src/ops/*/*.cu`, `crates/device/src/cuda/*.cu`) compiles with g++ against
//! those headers, with a declaration-only stand-in for the execution model
//! (`tests/builtins_cpp/exec_stub.h`), so a built-in a kernel uses and the headers lack is found
//! here, not at a kernel's first launch. The probe's `api` check (overload resolution of min /
//! max and __ldg, the small helpers, vector types, the 16-bit pair types and operators) runs
//! here too.
//!
//! Invariants: the kernel files are found by listing their folders (a new one is checked
//! without editing this test); kiln's shared headers come from `crates/device/src/cuda`, and
//! the generated `kiln_op_codes.cuh` is rebuilt from the op tables in
//! `crates/device/src/ops/elementwise/mod.rs` (one `#define <PREFIX><NAME> <code>` per row).

#[path = "builtins_cpp/support.rs"]
mod support;

use std::path::{Path, PathBuf};

/// `kiln_op_codes.cuh` from the op tables: `pub enum X as "PREFIX_" {` opens a table, and
/// each `Variant = code, C_NAME, ...;` row is one define.
fn op_codes(table_source: &str) -> String {
    let mut out = String::from("#pragma once\n");
    let mut prefix: Option<&str> = None;
    for line in table_source.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("pub enum ") {
            prefix = rest.split('"').nth(1);
            continue;
        }
        let Some(p) = prefix else { continue };
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if let [head, name, ..] = fields.as_slice() {
            if let Some((_, code)) = head.split_once(" = ") {
                if code.chars().all(|c| c.is_ascii_digit()) && !name.is_empty() {
                    out.push_str(&format!("#define {p}{name} {code}\n"));
                }
            }
        }
    }
    out
}

fn kernel_files(device: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![device.join("src/cuda")];
    let ops = std::fs::read_dir(device.join("src/ops")).expect("ops folder");
    dirs.extend(ops.map(|e| e.expect("entry").path()).filter(|p| p.is_dir()));
    for dir in dirs {
        for entry in std::fs::read_dir(&dir).expect("kernel folder") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "cu") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn every_kiln_kernel_file_compiles_against_the_headers() {
    let device = support::crate_dir().join("../device");
    let tables = std::fs::read_to_string(device.join("src/ops/elementwise/mod.rs"))
        .expect("elementwise op tables");
    let codes = op_codes(&tables);
    assert!(
        codes.contains("#define UNARY_NEG 0\n"),
        "op tables not understood:\n{codes}"
    );
    let gen = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("kiln-op-codes-{}", std::process::id()));
    std::fs::create_dir_all(&gen).expect("temp dir");
    std::fs::write(gen.join("kiln_op_codes.cuh"), codes).expect("op codes header");
    let files = kernel_files(&device);
    assert!(
        files.len() >= 10,
        "kernel files not found under {}",
        device.display()
    );
    let stub = support::crate_dir().join("tests/builtins_cpp/exec_stub.h");
    let incs = [
        format!("-I{}", support::include_dir().display()),
        format!("-I{}", device.join("src/cuda").display()),
        format!("-I{}", gen.display()),
    ];
    for file in &files {
        let mut args: Vec<&std::ffi::OsStr> = support::FLAGS.iter().map(|f| f.as_ref()).collect();
        args.extend([
            "-fsyntax-only".as_ref(),
            "-Wall".as_ref(),
            "-include".as_ref(),
            stub.as_os_str(),
        ]);
        args.extend(incs.iter().map(|i| -> &std::ffi::OsStr { i.as_ref() }));
        args.extend(["-x".as_ref(), "c++".as_ref(), file.as_os_str()]);
        support::compile(&args, &file.display().to_string());
    }
    let _ = std::fs::remove_dir_all(&gen);
}

#[test]
fn every_header_compiles_alone_without_warnings() {
    let mut headers: Vec<PathBuf> = std::fs::read_dir(support::include_dir())
        .expect("include dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "h"))
        .collect();
    headers.sort();
    assert!(headers.len() >= 3, "headers not found");
    for header in &headers {
        let mut args: Vec<&std::ffi::OsStr> = support::FLAGS.iter().map(|f| f.as_ref()).collect();
        args.extend(
            ["-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-x", "c++"].map(std::ffi::OsStr::new),
        );
        args.push(header.as_os_str());
        support::compile(&args, &header.display().to_string());
    }
}

#[test]
fn overloads_helpers_and_vector_types_behave_as_cuda_documents() {
    let (ok, out) = support::run_program(support::probe(), "api", &[]);
    let out = String::from_utf8_lossy(&out);
    assert!(ok && out.trim() == "ok", "{out}");
}
