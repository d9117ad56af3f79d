//! Finds the kernels of a program in its preprocessed text (scan mode of kiln_emu_runtime.h keeps
//! `__global__`, `__launch_bounds__` and `__shared__` as marker tokens) and writes the entry
//! points appended to the program before it is compiled.
//!
//! Invariants: only `extern "C"` kernels are listed (cuModuleGetFunction looks kernels up by their
//! unmangled name; a C++-linkage kernel has no such name), each once, in source order; a kernel's
//! `__launch_bounds__` arguments are kept as the preprocessed expressions, for g++ to evaluate.

/// One `extern "C" __global__` function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelDecl {
    /// Its name.
    pub name: String,
    /// The `__launch_bounds__` arguments, empty when it has none.
    pub launch_bounds: Vec<String>,
}

/// One `extern __shared__ T name[];` (dynamic shared memory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamicShared {
    /// The array's name.
    pub name: String,
    /// Its element type, as written.
    pub element: String,
}

/// What a program declares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// The kernels, in source order.
    pub kernels: Vec<KernelDecl>,
    /// The dynamic shared arrays.
    pub dynamic_shared: Vec<DynamicShared>,
}

/// Dynamic shared memory bytes a module can give one block (the H200's opt-in maximum).
pub const DYNAMIC_SHARED_BYTES: u32 = 227 * 1024;

/// Splits preprocessed C++ into tokens (identifiers, numbers, literals, single punctuators),
/// dropping line markers.
fn tokens(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line_start = true;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'\n' {
            line_start = true;
            i += 1;
            continue;
        }
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if line_start && c == b'#' {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        line_start = false;
        let start = i;
        if c.is_ascii_alphabetic() || c == b'_' {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
        } else if c.is_ascii_digit() {
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || b"._'".contains(&bytes[i]))
            {
                i += 1;
            }
        } else if c == b'"' || c == b'\'' {
            i += 1;
            while i < bytes.len() && bytes[i] != c && bytes[i] != b'\n' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(bytes.len());
        } else {
            i += 1;
        }
        out.push(&text[start..i]);
    }
    out
}

fn is_identifier(token: &str) -> bool {
    token
        .bytes()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
}

/// The index just past the parenthesised group opening at `open` (which must be `(`).
fn group_end(toks: &[&str], open: usize) -> usize {
    let mut depth = 0usize;
    let mut i = open;
    while i < toks.len() {
        match toks[i] {
            "(" => depth += 1,
            ")" => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    toks.len()
}

/// The group's top-level comma-separated parts, each joined with spaces.
fn group_args(toks: &[&str], open: usize, end: usize) -> Vec<String> {
    let mut args = vec![String::new()];
    let mut depth = 0usize;
    for &t in &toks[open + 1..end.saturating_sub(1)] {
        match t {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => depth = depth.saturating_sub(1),
            "," if depth == 0 => {
                args.push(String::new());
                continue;
            }
            _ => {}
        }
        let last = args.last_mut().expect("args is never empty");
        if !last.is_empty() {
            last.push(' ');
        }
        last.push_str(t);
    }
    args.retain(|a| !a.is_empty());
    args
}

/// The first token of the declaration holding `at` (just after the previous `;`, `{` or `}`).
fn declaration_start(toks: &[&str], at: usize) -> usize {
    let mut i = at;
    while i > 0 && !matches!(toks[i - 1], ";" | "{" | "}") {
        i -= 1;
    }
    i
}

fn has_extern_c(decl: &[&str]) -> bool {
    decl.windows(2).any(|w| w == ["extern", "\"C\""])
}

/// Scans a program preprocessed in scan mode.
pub fn scan(preprocessed: &str) -> Scan {
    let toks = tokens(preprocessed);
    let mut out = Scan::default();
    // For each open brace: whether it opens an `extern "C" {` block.
    let mut braces: Vec<bool> = Vec::new();
    for i in 0..toks.len() {
        match toks[i] {
            "{" => braces.push(i >= 2 && toks[i - 2] == "extern" && toks[i - 1] == "\"C\""),
            "}" => {
                braces.pop();
            }
            "__kiln_emu_global__" => {
                let start = declaration_start(&toks, i);
                let extern_c = braces.iter().any(|&b| b) || has_extern_c(&toks[start..i]);
                if let Some(kernel) = kernel_after(&toks, i).filter(|_| extern_c) {
                    match out.kernels.iter_mut().find(|k| k.name == kernel.name) {
                        Some(seen) if seen.launch_bounds.is_empty() => {
                            seen.launch_bounds = kernel.launch_bounds
                        }
                        Some(_) => {}
                        None => out.kernels.push(kernel),
                    }
                }
            }
            "__kiln_emu_shared__" => {
                let start = declaration_start(&toks, i);
                if toks[start..i].contains(&"extern") {
                    if let Some(d) = dynamic_shared(&toks, start) {
                        if !out.dynamic_shared.iter().any(|s| s.name == d.name) {
                            out.dynamic_shared.push(d);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    out
}

/// The kernel declared after the `__global__` marker at `at`: the identifier before the first
/// parenthesis that is not an attribute's.
fn kernel_after(toks: &[&str], at: usize) -> Option<KernelDecl> {
    let mut bounds = Vec::new();
    let mut j = at + 1;
    while j < toks.len() {
        match toks[j] {
            "__kiln_emu_launch_bounds__" | "__attribute__" | "__declspec" | "alignas"
                if toks.get(j + 1) == Some(&"(") =>
            {
                let end = group_end(toks, j + 1);
                if toks[j] == "__kiln_emu_launch_bounds__" {
                    bounds = group_args(toks, j + 1, end);
                }
                j = end;
                continue;
            }
            "(" => {
                let name = toks[j - 1];
                return is_identifier(name).then(|| KernelDecl {
                    name: name.to_string(),
                    launch_bounds: bounds,
                });
            }
            ";" | "{" | "=" => return None,
            _ => {}
        }
        j += 1;
    }
    None
}

/// `extern ... __shared__ T name[]` starting at `start`, when the declaration has that shape.
fn dynamic_shared(toks: &[&str], start: usize) -> Option<DynamicShared> {
    let end = start + toks[start..].iter().position(|&t| t == ";")?;
    let decl = &toks[start..end];
    let at = decl
        .windows(3)
        .position(|w| is_identifier(w[0]) && w[1] == "[" && w[2] == "]")?;
    let mut element = Vec::new();
    let mut k = 0;
    while k < at {
        match decl[k] {
            "__attribute__" | "alignas" | "__declspec" if decl.get(k + 1) == Some(&"(") => {
                k = group_end(decl, k + 1);
                continue;
            }
            "extern" | "\"C\"" | "__kiln_emu_shared__" => {}
            t => element.push(t),
        }
        k += 1;
    }
    (!element.is_empty()).then(|| DynamicShared {
        name: decl[at].to_string(),
        element: element.join(" "),
    })
}

/// The text appended to a program: one entry point and descriptor per kernel, and the storage
/// of its dynamic shared arrays.
pub fn entry_points(scan: &Scan) -> String {
    let mut out = String::new();
    for d in &scan.dynamic_shared {
        out.push_str(&format!(
            "alignas(16) thread_local {ty} {name}[{bytes} / sizeof({ty})];\n",
            ty = d.element,
            name = d.name,
            bytes = DYNAMIC_SHARED_BYTES
        ));
    }
    if !scan.dynamic_shared.is_empty() {
        out.push_str(&format!(
            "extern \"C\" __attribute__((visibility(\"default\"))) const unsigned \
             kiln_emu_dynamic_shared_bytes = {DYNAMIC_SHARED_BYTES};\n"
        ));
    }
    for k in &scan.kernels {
        let bound = |i: usize| {
            k.launch_bounds
                .get(i)
                .map(|b| format!("({b})"))
                .unwrap_or_else(|| "0".into())
        };
        out.push_str(&format!(
            "KILN_EMU_KERNEL({}, {}, {})\n",
            k.name,
            bound(0),
            bound(1)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extern_c_kernels_are_found_with_their_launch_bounds() {
        let text = "# 1 \"x.cu\"\nextern \"C\" __kiln_emu_global__ void __kiln_emu_launch_bounds__(256, 2) a(int* p) {}\n\
            __kiln_emu_global__ void cxx(int) {}\n\
            extern \"C\" { __kiln_emu_global__ void b(const char* s = \"(\") { } }\n\
            extern \"C\" __kiln_emu_global__ void a(int* p);\n";
        let s = scan(text);
        let names: Vec<_> = s.kernels.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(s.kernels[0].launch_bounds, ["256", "2"]);
        assert!(entry_points(&s).contains("KILN_EMU_KERNEL(a, (256), (2))"));
        assert!(entry_points(&s).contains("KILN_EMU_KERNEL(b, 0, 0)"));
    }

    #[test]
    fn dynamic_shared_arrays_are_found() {
        let text =
            "extern \"C\" __kiln_emu_global__ void k() { extern __kiln_emu_shared__ float smem[]; \
            __kiln_emu_shared__ int fixed[4]; }";
        let s = scan(text);
        assert_eq!(
            s.dynamic_shared,
            [DynamicShared {
                name: "smem".into(),
                element: "float".into()
            }]
        );
    }
}
