//! The bugs `cargo xtask cpu-mutants` plants in paths taken only above a size or for a kind of
//! view: kiln-device's CPU kernels, the caching allocator's free-block index and the `.pth`
//! reader's zip64 records, each with the test meant to cover it. The rules only some settings
//! reach are in `rules.rs`.

/// One planted bug: `find` (exactly one occurrence in `file`) replaced by `replace`; `test`
/// (run as `cargo test -p <package> <target> -- <test> --exact`) must fail.
pub struct Mutant {
    /// What the bug is.
    pub bug: &'static str,
    /// The package the file belongs to.
    pub package: &'static str,
    /// The file, relative to the workspace root.
    pub file: &'static str,
    /// Text to replace.
    pub find: &'static str,
    /// Its replacement.
    pub replace: &'static str,
    /// The test target: `--lib`, or `--test NAME`.
    pub target: &'static [&'static str],
    /// The test's full name within its target.
    pub test: &'static str,
}

pub(super) const LIB: &[&str] = &["--lib"];
const DEVICE: &str = "kiln-device";
pub(super) const ALLOC: &str = "kiln-alloc-cache";
const PTH: &[&str] = &["--test", "pth"];
const PTH_VIEWS: &str = "views_dtypes_and_shared_storages_match_safetensors_bit_for_bit";
const STRIDED: &str =
    "ops::strided::tests::parallel_chunks_of_strided_views_read_what_a_serial_walk_reads";
const DIRECT_PRODUCT: &str = "ops::conv::cpu_direct::tests::product_equals_the_sums_of_its_taps";
const CHUNKED_STEPS: &str =
    "ops::multi_tensor::cpu::tests::long_tensors_cut_into_chunks_update_as_tensors_of_one_chunk";

/// The planted bugs.
pub const MUTANTS: &[Mutant] = &[
    Mutant {
        bug: "a parallel chunk of a strided unary op starts its walk at the wrong element",
        package: DEVICE,
        file: "crates/device/src/ops/strided.rs",
        find: "for (o, i) in chunk.iter_mut().zip(StridedIndex::new(layout, start)) {",
        replace: "for (o, i) in chunk.iter_mut().zip(StridedIndex::new(layout, start / 2)) {",
        target: LIB,
        test: STRIDED,
    },
    Mutant {
        bug: "a parallel chunk of a binary op with one strided operand starts its walk at the wrong element",
        package: DEVICE,
        file: "crates/device/src/ops/strided.rs",
        find: ".zip(sa).zip(StridedIndex::new(lb, start)) {",
        replace: ".zip(sa).zip(StridedIndex::new(lb, start / 2)) {",
        target: LIB,
        test: STRIDED,
    },
    Mutant {
        bug: "a parallel chunk of a binary op with two strided operands starts its walk at the wrong element",
        package: DEVICE,
        file: "crates/device/src/ops/strided.rs",
        find: "let ib = StridedIndex::new(lb, start);\n                for ((o, i), j)",
        replace: "let ib = StridedIndex::new(lb, start / 2);\n                for ((o, i), j)",
        target: LIB,
        test: STRIDED,
    },
    Mutant {
        bug: "a parallel chunk of an in-place binary op starts its walk at the wrong element",
        package: DEVICE,
        file: "crates/device/src/ops/strided.rs",
        find: "for (o, j) in chunk.iter_mut().zip(StridedIndex::new(lb, start)) {",
        replace: "for (o, j) in chunk.iter_mut().zip(StridedIndex::new(lb, start / 2)) {",
        target: LIB,
        test: STRIDED,
    },
    Mutant {
        bug: "a parallel chunk of a ternary op starts its walk at the wrong element",
        package: DEVICE,
        file: "crates/device/src/ops/strided.rs",
        find: "let ic = StridedIndex::new(lc, start);",
        replace: "let ic = StridedIndex::new(lc, start / 2);",
        target: LIB,
        test: STRIDED,
    },
    Mutant {
        bug: "a parallel block of reduction outputs is numbered from the wrong output",
        package: DEVICE,
        file: "crates/device/src/ops/reduce/cpu.rs",
        find: "for (o, slot) in (first..).zip(slots) {",
        replace: "for (o, slot) in ((first / 2)..).zip(slots) {",
        target: LIB,
        test: "ops::reduce::cpu::tests::parallel_blocks_of_outputs_write_every_output",
    },
    Mutant {
        bug: "a parallel softmax skips its first row",
        package: DEVICE,
        file: "crates/device/src/ops/softmax/cpu.rs",
        find: "out.par_chunks_mut(d).for_each(row)",
        replace: "out.par_chunks_mut(d).skip(1).for_each(row)",
        target: LIB,
        test: "ops::softmax::cpu::tests::every_row_of_a_parallel_softmax_is_normalised_against_an_f64_reference",
    },
    Mutant {
        bug: "a parallel top-k pairs each row with the next row's outputs",
        package: DEVICE,
        file: "crates/device/src/ops/topk/cpu.rs",
        find: ".par_chunks(d)",
        replace: ".par_chunks(d).skip(1)",
        target: LIB,
        test: "ops::topk::cpu::tests::every_row_of_a_parallel_top_k_matches_a_sorted_row",
    },
    Mutant {
        bug: "a parallel random fill numbers its parts backwards",
        package: DEVICE,
        file: "crates/device/src/ops/random/cpu.rs",
        find: "out.par_chunks_mut(CHUNK).enumerate()",
        replace: "out.par_chunks_mut(CHUNK).rev().enumerate()",
        target: LIB,
        test: "ops::random::cpu::tests::a_parallel_fill_gives_element_i_draw_offset_plus_i",
    },
    Mutant {
        bug: "a bad max-pool index past the first piece is reported at the wrong position",
        package: DEVICE,
        file: "crates/device/src/ops/pool/cpu.rs",
        find: ".map(|k| n * PIECE + k)",
        replace: ".map(|k| n + k)",
        target: &["--test", "pool"],
        test: "max_pool2d_backward_rejects_indices_outside_the_plane",
    },
    Mutant {
        bug: "max pooling by frame: the third block of a plane reads the second's rows",
        package: DEVICE,
        file: "crates/device/src/ops/pool/cpu_max.rs",
        find: "let first_row = b * (block / out_w);",
        replace: "let first_row = b.min(1) * (block / out_w);",
        target: LIB,
        test: "ops::pool::cpu_max::tests::forward_matches_visiting_each_windows_taps",
    },
    Mutant {
        bug: "a block of eight random draws starts at the wrong counter",
        package: DEVICE,
        file: "crates/device/src/ops/random/cpu.rs",
        find: "let start = first.wrapping_add((c * LANES) as u64);",
        replace: "let start = first.wrapping_add((c * (LANES - 1)) as u64);",
        target: LIB,
        test: "ops::random::cpu::tests::a_parallel_fill_gives_element_i_draw_offset_plus_i",
    },
    Mutant {
        bug: "the cosine of a turn takes the wrong sign in its third quarter",
        package: DEVICE,
        file: "crates/device/src/ops/random/normal_math.rs",
        find: "let negative = k == 1.0 || k == 2.0;",
        replace: "let negative = k == 1.0 || k == 3.0;",
        target: LIB,
        test: "ops::random::normal_math::tests::cos_of_turns_matches_libm_and_is_exact_at_the_quarters",
    },
    Mutant {
        bug: "max pooling window by window skips each plane's first output",
        package: DEVICE,
        file: "crates/device/src/ops/pool/cpu_max.rs",
        find: "for (o, out) in out.iter_mut().enumerate() {",
        replace: "for (o, out) in out.iter_mut().enumerate().skip(1) {",
        target: LIB,
        test: "ops::pool::cpu_max::tests::forward_matches_visiting_each_windows_taps",
    },
    Mutant {
        bug: "a parallel chunk of `add_` with alpha reads the wrong operand slice",
        package: DEVICE,
        file: "crates/device/src/ops/elementwise/cpu_assign.rs",
        find: "chunk(out, &b[start..start + out.len()])",
        replace: "chunk(out, &b[start / 2..start / 2 + out.len()])",
        target: LIB,
        test: "ops::elementwise::cpu_assign::tests::a_parallel_fused_update_pairs_every_element_with_its_own_operand",
    },
    Mutant {
        bug: "batched products large enough for gemm to split: odd batches read the even one's B",
        package: DEVICE,
        file: "crates/device/src/ops/matmul/cpu.rs",
        find: "one_matrix(dst, offs_a[i], offs_b[i], par)",
        replace: "one_matrix(dst, offs_a[i], offs_b[i / 2 * 2], par)",
        target: LIB,
        test: "ops::matmul::cpu::tests::every_batch_of_a_batched_product_reads_its_own_operands",
    },
    Mutant {
        bug: "small batched products, one per task: odd batches read the even one's B",
        package: DEVICE,
        file: "crates/device/src/ops/matmul/cpu.rs",
        find: "one_matrix(dst, offs_a[i], offs_b[i], Parallelism::None)",
        replace: "one_matrix(dst, offs_a[i], offs_b[i / 2 * 2], Parallelism::None)",
        target: LIB,
        test: "ops::matmul::cpu::tests::every_batch_of_a_batched_product_reads_its_own_operands",
    },
    Mutant {
        bug: "Adam over a tensor longer than a chunk: gradient chunks out of step",
        package: DEVICE,
        file: "crates/device/src/ops/multi_tensor/cpu/adam.rs",
        find: ".zip(g.chunks(CHUNK_ELEMS))",
        replace: ".zip(g.chunks(CHUNK_ELEMS - 8))",
        target: LIB,
        test: CHUNKED_STEPS,
    },
    Mutant {
        bug: "Adam over a tensor longer than a chunk: amsgrad's running-maximum chunks out of step",
        package: DEVICE,
        file: "crates/device/src/ops/multi_tensor/cpu/adam.rs",
        find: "Some(x.chunks_mut(CHUNK_ELEMS))",
        replace: "Some(x.chunks_mut(CHUNK_ELEMS - 8))",
        target: LIB,
        test: CHUNKED_STEPS,
    },
    Mutant {
        bug: "SGD over a tensor longer than a chunk: gradient chunks out of step",
        package: DEVICE,
        file: "crates/device/src/ops/multi_tensor/cpu/sgd.rs",
        find: ".zip(g.chunks(CHUNK_ELEMS))",
        replace: ".zip(g.chunks(CHUNK_ELEMS - 8))",
        target: LIB,
        test: CHUNKED_STEPS,
    },
    Mutant {
        bug: "SGD over a tensor longer than a chunk: momentum-buffer chunks out of step",
        package: DEVICE,
        file: "crates/device/src/ops/multi_tensor/cpu/sgd.rs",
        find: "Some(b.chunks_mut(CHUNK_ELEMS))",
        replace: "Some(b.chunks_mut(CHUNK_ELEMS - 8))",
        target: LIB,
        test: CHUNKED_STEPS,
    },
    Mutant {
        bug: "a norm over more than four sub-blocks drops the rest",
        package: DEVICE,
        file: "crates/device/src/ops/multi_tensor/cpu/mod.rs",
        find: "for block in s.chunks(SUB_BLOCK) {",
        replace: "for block in s.chunks(SUB_BLOCK).take(4) {",
        target: LIB,
        test: "ops::multi_tensor::cpu::tests::norms_match_a_naive_sum_for_every_kind_and_odd_lengths",
    },
    Mutant {
        bug: "layer norm's weight gradient skips the first row of every row block after the first",
        package: DEVICE,
        file: "crates/device/src/ops/norm/cpu/mod.rs",
        find: "for row in block * ROW_BLOCK..",
        replace: "for row in block * ROW_BLOCK + (block > 0) as usize..",
        target: &["--test", "norm"],
        test: "layer_norm_gradients_match_finite_differences",
    },
    Mutant {
        bug: "the largest free block of a shared size class is the last one listed, not the largest",
        package: ALLOC,
        file: "crates/alloc-cache/src/free_index.rs",
        find: "largest = largest.max(blocks[id as usize].size);",
        replace: "largest = blocks[id as usize].size;",
        target: LIB,
        test: "free_index::tests::a_shared_class_is_searched_by_size_and_address",
    },
    Mutant {
        bug: "a best fit in a shared size class ignores the lowest-address tie rule",
        package: ALLOC,
        file: "crates/alloc-cache/src/free_index.rs",
        find: "best.is_none_or(|(s, a, _)| (b.size, b.addr) < (s, a))",
        replace: "best.is_none_or(|(s, _a, _)| b.size < s)",
        target: LIB,
        test: "free_index::tests::a_shared_class_is_searched_by_size_and_address",
    },
    Mutant {
        bug: "a zip64 entry's saturated sizes read in swapped order (archives over 4 GiB)",
        package: "kiln-models",
        file: "crates/models/src/pth/zip.rs",
        find: "take(&mut entry.uncompressed_size)?;\n            take(&mut entry.compressed_size)?;",
        replace: "take(&mut entry.compressed_size)?;\n            take(&mut entry.uncompressed_size)?;",
        target: PTH,
        test: PTH_VIEWS,
    },
    Mutant {
        bug: "the zip64 end record read from the wrong offset (archives of 65,535 entries or more)",
        package: "kiln-models",
        file: "crates/models/src/pth/zip.rs",
        find: "slice(b, u64_at(loc, 8), 56, \"the zip64 end record\")",
        replace: "slice(b, u64_at(loc, 4), 56, \"the zip64 end record\")",
        target: PTH,
        test: PTH_VIEWS,
    },
    Mutant {
        bug: "a channel of a padded image filled on the pool reads another channel",
        package: DEVICE,
        file: "crates/device/src/ops/conv/padded.rs",
        find: "let pieces = planes.par_chunks_mut(self.plane.max(1));",
        replace: "let pieces = planes.par_chunks_mut(self.plane.max(1)).rev();",
        target: LIB,
        test: "ops::conv::padded::tests::fill_writes_every_padded_pixel_where_taps_read_it",
    },
    Mutant {
        bug: "the direct convolution's product on the pool skips its first block of channels",
        package: DEVICE,
        file: "crates/device/src/ops/conv/cpu_direct.rs",
        find: "blocks.into_par_iter().with_min_len(min_len).for_each(tiles);",
        replace: "blocks.into_par_iter().with_min_len(min_len).skip(1).for_each(tiles);",
        target: LIB,
        test: DIRECT_PRODUCT,
    },
    Mutant {
        bug: "a strip of the direct convolution ending in three vectors computes two",
        package: DEVICE,
        file: "crates/device/src/ops/conv/cpu_direct.rs",
        find: "3 => tile::<{ 3 * NARROW }>(isa, dst, rows, w, src, starts),",
        replace: "3 => tile::<{ 2 * NARROW }>(isa, dst, rows, w, src, starts),",
        target: LIB,
        test: DIRECT_PRODUCT,
    },
];
