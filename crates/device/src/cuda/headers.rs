//! The headers kiln's `.cu` files share (`kiln_common.cuh`: integer types, `StridedArgs` and its
//! index math, the grid-stride loop; `kiln_float.cuh`: the f32 accumulator and rounding helpers
//! of the 16-bit kernels; `kiln_op_codes.cuh`: the elementwise op codes, generated from the
//! Rust op tables), and the splice that hands them to NVRTC.
//!
//! NVRTC compiles one source string; a `#include "name"` of a file it cannot open is an error,
//! and kiln ships its kernels inside the binary (`include_str!`), with no source tree at run time.
//! So a kernel file writes `#include "kiln_common.cuh"` like any C header, and
//! [`expand_includes`] replaces that line with the header's text before compiling, framed by
//! `#line` directives so NVRTC's errors name the header's lines, then the file's own again. The
//! runtime loader ([`super::kernels`]), `cargo xtask kernels` and the kernel cache key all use the
//! expanded text; the host emulation in `tests/kernel_emulation` includes the headers as files.

/// The shared headers: include name and text.
pub const HEADERS: [(&str, &str); 3] = [
    ("kiln_common.cuh", include_str!("kiln_common.cuh")),
    ("kiln_float.cuh", include_str!("kiln_float.cuh")),
    ("kiln_op_codes.cuh", crate::ops::elementwise::OP_CODES_CUH),
];

/// The header a line includes, when it is `#include "<one of HEADERS>"`.
fn included(line: &str) -> Option<&'static (&'static str, &'static str)> {
    let name = line
        .trim()
        .strip_prefix("#include")?
        .trim()
        .strip_prefix('"')?
        .strip_suffix('"')?;
    HEADERS.iter().find(|(n, _)| *n == name)
}

/// `source` (the file `file`) as NVRTC compiles it: every `#include "<kiln header>"` line becomes
/// the header's text between `#line` directives; every other line (system headers such as
/// `<cuda_fp16.h>` included) is kept as it is.
pub fn expand_includes(source: &str, file: &str) -> String {
    let extra: usize = HEADERS.iter().map(|(_, t)| t.len() + 64).sum();
    let mut out = String::with_capacity(source.len() + extra);
    for (i, line) in source.lines().enumerate() {
        match included(line) {
            Some((name, text)) => {
                out.push_str(&format!("#line 1 \"{name}\"\n"));
                out.push_str(text);
                if !text.ends_with('\n') {
                    out.push('\n');
                }
                // The file's next line is line i + 2 (lines count from 1).
                out.push_str(&format!("#line {} \"{file}\"\n", i + 2));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kiln_headers_are_spliced_with_line_markers_and_others_kept() {
        let src = "#include <cuda_fp16.h>\n\n  #include \"kiln_common.cuh\"\nint x;\n";
        let out = expand_includes(src, "ops/a/a.cu");
        let common = HEADERS[0].1;
        let want = format!(
            "#include <cuda_fp16.h>\n\n#line 1 \"kiln_common.cuh\"\n{common}#line 4 \"ops/a/a.cu\"\nint x;\n"
        );
        assert_eq!(out, want);
        // An unknown quoted include is left for NVRTC to report.
        let other = "#include \"missing.cuh\"\n";
        assert_eq!(expand_includes(other, "b.cu"), other);
    }

    #[test]
    fn the_op_codes_header_has_one_define_per_op_with_its_code() {
        use crate::ops::elementwise::{BinaryOp, CmpOp, UnaryOp, OP_CODES_CUH};
        let defines = OP_CODES_CUH
            .lines()
            .filter(|l| l.starts_with("#define "))
            .count();
        assert_eq!(defines, 16 + 13 + 6);
        for (line, code) in [
            (
                "#define BINARY_GELU_TANH_BACKWARD ",
                BinaryOp::GeluTanhBackward.code(),
            ),
            ("#define UNARY_SQUARE ", UnaryOp::Square.code()),
            ("#define UNARY_NEG ", UnaryOp::Neg.code()),
            ("#define BINARY_MINIMUM ", BinaryOp::Minimum.code()),
            ("#define CMP_GE ", CmpOp::Ge.code()),
        ] {
            assert!(OP_CODES_CUH.contains(&format!("{line}{code}\n")), "{line}");
        }
    }

    #[test]
    fn every_kernel_file_gets_its_headers_and_defines_nothing_twice() {
        use crate::ops::*;
        let all = [
            copy::cuda::COPY_KERNELS,
            elementwise::cuda::ELEMENTWISE_KERNELS,
            reduce::cuda::REDUCE_KERNELS,
            random::cuda::RANDOM_KERNELS,
            softmax::cuda::SOFTMAX_KERNELS,
            topk::cuda::TOPK_KERNELS,
            index::cuda::INDEX_KERNELS,
            conv::cuda::CONV_KERNELS,
            norm::cuda::NORM_KERNELS,
            pool::cuda::POOL_KERNELS,
            loss::cuda::LOSS_KERNELS,
            fill::cuda::FILL_KERNELS,
            multi_tensor::cuda::MULTI_TENSOR_KERNELS,
            crate::cuda::deferred::DEFERRED_KERNELS,
        ];
        for k in all {
            let out = expand_includes(k.source, k.file);
            assert!(
                !out.lines().any(|l| included(l).is_some()),
                "{}: unexpanded",
                k.file
            );
            if k.source.contains("#include \"kiln_common.cuh\"") {
                assert_eq!(out.matches("struct StridedArgs {").count(), 1, "{}", k.file);
                assert_eq!(out.matches("#define GRID_STRIDE").count(), 1, "{}", k.file);
            }
            if k.source.contains("#include \"kiln_op_codes.cuh\"") {
                assert_eq!(
                    out.matches("#define UNARY_NEG 0\n").count(),
                    1,
                    "{}",
                    k.file
                );
            }
        }
    }
}
