//! Launch plumbing shared by every CUDA op family of [`crate::CudaStorage`].
//!
//! **Strided operands.** Kernels read any view through a [`StridedArgs`] passed by value (the
//! `struct StridedArgs` each `.cu` file declares with the same fields): an element offset and up
//! to [`MAX_DIMS`] sizes and strides. Element `i` of the logical (row-major) order lives at
//! `offset + Σ_d idx_d(i) · strides[d]`, all in 64-bit arithmetic, so buffers past 2^31 elements
//! index correctly. Before launch, [`collapse`] drops size-1 dims and merges neighbouring dims
//! that are contiguous *in every operand at once*, so a contiguous tensor becomes one dim (one
//! divide per element) and a broadcast `[N, C] + [C]` becomes two.
//!
//! **Launch shape.** Elementwise kernels are grid-stride loops over `u64` indices: the grid is
//! capped ([`grid_for`]) and each thread walks `i += gridDim.x * blockDim.x`, so any element count
//! fits in a 1-D grid (no `gridDim.y/z`, whose 65535 limit never comes into play).
//!
//! **Errors.** A failed launch is [`Error::KernelLaunch`] naming the kernel; a sticky error from an
//! earlier asynchronous failure surfaces at the next launch the same way. Nothing here waits on
//! the stream: only copies to the host and explicit synchronisation do.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, DeviceRepr, DriverError, LaunchConfig};

use crate::error::{Error, Result};
use crate::{DType, Layout};

/// Most dims a kernel operand may keep after [`collapse`].
pub const MAX_DIMS: usize = 8;

/// Threads per block of the elementwise kernels.
pub const BLOCK: u32 = 256;

/// A strided view as the kernels receive it (must match `struct StridedArgs` in every `.cu`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StridedArgs {
    /// Element offset of the view's first element.
    pub offset: u64,
    /// Sizes (only the first `ndim` are read).
    pub shape: [u64; MAX_DIMS],
    /// Strides in elements (only the first `ndim` are read).
    pub strides: [u64; MAX_DIMS],
    /// Number of dims.
    pub ndim: u32,
    /// Padding to a multiple of 8 bytes.
    pub pad: u32,
}

// SAFETY: plain `#[repr(C)]` integers with the same layout as the CUDA struct.
unsafe impl DeviceRepr for StridedArgs {}

// The layout every `.cu` file's `struct StridedArgs` must have (the kernels' own copies
// `static_assert` the same numbers, so a drift on either side fails to build).
const _: () = assert!(std::mem::size_of::<StridedArgs>() == 144);
const _: () = assert!(std::mem::align_of::<StridedArgs>() == 8);
const _: () = assert!(std::mem::offset_of!(StridedArgs, ndim) == 136);

impl StridedArgs {
    /// The args of one view with `shape`/`strides` (at most [`MAX_DIMS`] dims).
    pub fn new(offset: usize, shape: &[usize], strides: &[usize]) -> Self {
        let mut args = StridedArgs {
            offset: offset as u64,
            shape: [1; MAX_DIMS],
            strides: [0; MAX_DIMS],
            ndim: shape.len() as u32,
            pad: 0,
        };
        for d in 0..shape.len() {
            args.shape[d] = shape[d] as u64;
            args.strides[d] = strides[d] as u64;
        }
        args
    }
}

/// The kernel args of `layouts` (all of the same shape) after merging the dims that are
/// contiguous in every one of them; [`Error::Unsupported`] when more than [`MAX_DIMS`] remain.
pub fn collapse<const N: usize>(layouts: [&Layout; N]) -> Result<[StridedArgs; N]> {
    let shape = layouts[0].shape();
    // Dims kept (size > 1), outermost first.
    let mut dims: Vec<(usize, [usize; N])> = Vec::new();
    for (d, &len) in shape.iter().enumerate() {
        if len == 1 {
            continue;
        }
        let strides: [usize; N] = std::array::from_fn(|k| layouts[k].strides()[d]);
        if let Some((size, prev)) = dims.last_mut() {
            if (0..N).all(|k| prev[k] == strides[k] * len) {
                *size *= len;
                *prev = strides;
                continue;
            }
        }
        dims.push((len, strides));
    }
    if dims.len() > MAX_DIMS {
        return Err(Error::Unsupported {
            what: "a CUDA kernel operand keeps more than 8 non-mergeable dims; call contiguous() \
                   on the view first (or merge dims with reshape)",
        });
    }
    let sizes: Vec<usize> = dims.iter().map(|d| d.0).collect();
    Ok(std::array::from_fn(|k| {
        let strides: Vec<usize> = dims.iter().map(|d| d.1[k]).collect();
        StridedArgs::new(layouts[k].offset(), &sizes, &strides)
    }))
}

/// The grid of a grid-stride loop over `n` elements with `block` threads per block.
pub fn grid_for(n: u64, block: u32) -> u32 {
    // 2^16 blocks of 256 threads keep every SM of a large GPU busy; the loop covers the rest.
    n.div_ceil(u64::from(block)).clamp(1, 1 << 16) as u32
}

/// A 1-D launch over `n` elements.
pub fn elementwise_config(n: u64) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid_for(n, BLOCK), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// How a kernel reads an operand, picked on the host ([`flat_access`]) and passed to the kernel
/// as `unsigned access` (the `ACCESS_*` codes of the `.cu` files).
///
/// - `Strided`: element `i` through [`StridedArgs`] (a divide and modulo per dim);
/// - `Contiguous`: every operand is unit-stride after [`collapse`], element `i` is
///   `x[offset + i]`: a straight coalesced read with no index math;
/// - `Vector`: contiguous, and every operand's first element (pointer + offset) sits on a
///   [`VECTOR_BYTES`] boundary, so the kernel moves 16 bytes per load and store (a tail shorter
///   than one vector is done element by element).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Through the strides.
    Strided,
    /// Unit stride from the offset.
    Contiguous,
    /// Unit stride, 16-byte aligned: vector loads.
    Vector,
}

impl Access {
    /// The `ACCESS_*` code the kernels switch on.
    pub fn code(self) -> u32 {
        match self {
            Access::Strided => 0,
            Access::Contiguous => 1,
            Access::Vector => 2,
        }
    }
}

/// Bytes moved by one vector load (`uint4`).
pub const VECTOR_BYTES: u64 = 16;

/// True when collapsed `args` walk memory with unit stride from their offset (a single element,
/// with no dims left, counts).
pub fn is_unit_stride(args: &StridedArgs) -> bool {
    args.ndim == 0 || (args.ndim == 1 && args.strides[0] == 1)
}

/// True when element `offset` of a buffer at device address `base` (elements of `elem_bytes`)
/// starts a 16-byte vector.
pub fn vector_aligned(base: u64, offset: u64, elem_bytes: usize) -> bool {
    (base + offset * elem_bytes as u64).is_multiple_of(VECTOR_BYTES)
}

/// The access of an elementwise kernel over `operands` (collapsed args and buffer address, all
/// of one `elem_bytes`) writing a fresh contiguous output at `out`.
pub fn flat_access(operands: &[(StridedArgs, u64)], out: u64, elem_bytes: usize) -> Access {
    if !operands.iter().all(|(a, _)| is_unit_stride(a)) {
        return Access::Strided;
    }
    let aligned = vector_aligned(out, 0, elem_bytes)
        && operands
            .iter()
            .all(|(a, base)| vector_aligned(*base, a.offset, elem_bytes));
    if aligned {
        Access::Vector
    } else {
        Access::Contiguous
    }
}

/// [`Error::KernelLaunch`] for `kernel`.
pub fn launch_error(kernel: &str, err: DriverError) -> Error {
    let detail = err
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Error::KernelLaunch {
        kernel: kernel.to_string(),
        code: format!("{} ({detail})", super::probe::code_name(&err)),
    }
}

/// The function `name` of `source` in `stream`'s context (compiled on first use).
pub fn function(
    stream: &Arc<CudaStream>,
    source: &super::kernels::KernelSource,
    name: &str,
) -> Result<CudaFunction> {
    super::kernels::load_function(stream.context(), source, name)
}

/// The suffix naming a dtype's instantiation in the `.cu` files.
pub fn suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::I64 => "i64",
        DType::U8 => "u8",
        DType::Bool => "bool",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_views_collapse_to_one_dim() {
        let l = Layout::contiguous(&[2, 3, 4]);
        let [a] = collapse([&l]).unwrap();
        assert_eq!((a.ndim, a.shape[0], a.strides[0]), (1, 24, 1));
    }

    #[test]
    fn broadcast_and_transposed_views_keep_their_dims() {
        let full = Layout::contiguous(&[4, 3]);
        let row = Layout::contiguous(&[3]).broadcast_to(&[4, 3]);
        let [a, b] = collapse([&full, &row]).unwrap();
        assert_eq!(a.ndim, 2);
        assert_eq!((&a.shape[..2], &a.strides[..2]), (&[4, 3][..], &[3, 1][..]));
        assert_eq!((&b.shape[..2], &b.strides[..2]), (&[4, 3][..], &[0, 1][..]));
        let t = Layout::contiguous(&[3, 4]).transpose(0, 1).narrow(0, 1, 2);
        let [c] = collapse([&t]).unwrap();
        assert_eq!(c.offset, 1);
        assert_eq!((&c.shape[..2], &c.strides[..2]), (&[2, 3][..], &[1, 4][..]));
        // size-1 dims vanish; a scalar has no dims
        let [s] = collapse([&Layout::contiguous(&[1, 1])]).unwrap();
        assert_eq!(s.ndim, 0);
    }

    #[test]
    fn too_many_dims_is_a_typed_error() {
        let shape = [2usize; 9];
        let strides: Vec<usize> = (0..9).map(|d| 1 << (2 * (9 - d))).collect();
        let l = Layout::new(shape.to_vec(), strides, 0);
        assert!(matches!(collapse([&l]), Err(Error::Unsupported { .. })));
    }

    #[test]
    fn every_kernel_the_launchers_name_is_in_its_ptx() {
        use crate::ops::{copy, elementwise, random, reduce, softmax};
        const ALL: [DType; 7] = [
            DType::F32,
            DType::F64,
            DType::F16,
            DType::BF16,
            DType::I64,
            DType::U8,
            DType::Bool,
        ];
        const FLOATS_AND_I64: [DType; 5] =
            [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64];
        let mut wanted: Vec<(super::super::kernels::KernelSource, String)> = Vec::new();
        for a in ALL {
            for b in ALL {
                let name = format!("kiln_cast_{}_{}", suffix(a), suffix(b));
                wanted.push((copy::cuda::COPY_KERNELS, name));
            }
            let sfx = suffix(a);
            wanted.push((
                copy::cuda::COPY_KERNELS,
                format!("kiln_copy_into_b{}", a.size_in_bytes()),
            ));
            let e = elementwise::cuda::ELEMENTWISE_KERNELS;
            wanted.push((e, format!("kiln_compare_{sfx}")));
            wanted.push((e, format!("kiln_where_b{}", a.size_in_bytes())));
            let r = reduce::cuda::REDUCE_KERNELS;
            wanted.push((r, format!("kiln_reduce_sum_{sfx}")));
            wanted.push((r, format!("kiln_reduce_extreme_{sfx}")));
            wanted.push((r, format!("kiln_reduce_extreme_combine_{sfx}")));
            for kind in ["arange", "rand_uniform", "rand_normal"] {
                wanted.push((random::cuda::RANDOM_KERNELS, format!("kiln_{kind}_{sfx}")));
            }
        }
        for d in FLOATS_AND_I64 {
            let e = elementwise::cuda::ELEMENTWISE_KERNELS;
            wanted.push((e, format!("kiln_unary_{}", suffix(d))));
            wanted.push((e, format!("kiln_binary_{}", suffix(d))));
            let r = reduce::cuda::REDUCE_KERNELS;
            wanted.push((r, format!("kiln_reduce_sum_combine_{}", suffix(d))));
            wanted.push((
                crate::ops::topk::cuda::TOPK_KERNELS,
                format!("kiln_topk_{}", suffix(d)),
            ));
            if d != DType::I64 {
                let s = softmax::cuda::SOFTMAX_KERNELS;
                wanted.push((s, format!("kiln_softmax_{}", suffix(d))));
            }
        }
        let ix = crate::ops::index::cuda::INDEX_KERNELS;
        let dc = crate::cuda::deferred::DEFERRED_KERNELS;
        wanted.push((dc, "kiln_deferred_check_range".into()));
        for name in ["add_f32", "add_f64", "b1", "b2", "b4", "b8"] {
            wanted.push((ix, format!("kiln_put_{name}")));
        }
        for bytes in [1, 2, 4, 8] {
            wanted.push((ix, format!("kiln_take_b{bytes}")));
        }
        use crate::ops::{conv, pool};
        for d in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            for kind in ["im2col", "col2im"] {
                let name = conv::cuda::kernel_name(kind, d).unwrap();
                wanted.push((conv::cuda::CONV_KERNELS, name));
            }
            for kind in crate::ops::norm::cuda::KERNEL_KINDS {
                let name = crate::ops::norm::cuda::kernel_name(kind, d).unwrap();
                wanted.push((crate::ops::norm::cuda::NORM_KERNELS, name));
            }
            for p in pool::cuda::every_kind_for_tests() {
                for backward in [false, true] {
                    let name = pool::cuda::kernel_name(&p, backward, d).unwrap();
                    wanted.push((pool::cuda::POOL_KERNELS, name));
                }
            }
        }
        for (source, name) in &wanted {
            let ptx = match super::super::kernels::compile_ptx(source, (8, 0)) {
                Err(Error::NvrtcNotFound) if !crate::testing::cuda_required() => {
                    eprintln!("skipping: libnvrtc.so not found (cargo xtask kernels covers this)");
                    return;
                }
                other => other.unwrap(),
            };
            assert!(
                ptx.contains(&format!(".entry {name}(")),
                "{name} missing from {}",
                source.file
            );
        }
    }

    #[test]
    fn flat_access_needs_unit_strides_and_alignment_for_vectors() {
        let [flat] = collapse([&Layout::contiguous(&[4, 8])]).unwrap();
        let [offset1] = collapse([&Layout::contiguous(&[33]).narrow(0, 1, 32)]).unwrap();
        let [offset4] = collapse([&Layout::contiguous(&[36]).narrow(0, 4, 32)]).unwrap();
        let [transposed] = collapse([&Layout::contiguous(&[4, 8]).transpose(0, 1)]).unwrap();
        let [bcast] = collapse([&Layout::contiguous(&[8]).broadcast_to(&[4, 8])]).unwrap();
        let [scalar] = collapse([&Layout::new(vec![], vec![], 3)]).unwrap();
        let (base, out) = (0x7f00_0000_0000u64, 0x7f00_0010_0000u64);
        assert_eq!(flat_access(&[(flat, base)], out, 4), Access::Vector);
        assert_eq!(
            flat_access(&[(flat, base), (flat, base + 512)], out, 4),
            Access::Vector
        );
        // one element of f32 off: contiguous, not vector; four elements (16 bytes) off: vector
        assert_eq!(flat_access(&[(offset1, base)], out, 4), Access::Contiguous);
        assert_eq!(flat_access(&[(offset4, base)], out, 4), Access::Vector);
        assert_eq!(flat_access(&[(offset4, base)], out, 2), Access::Contiguous);
        assert_eq!(flat_access(&[(flat, base + 8)], out, 4), Access::Contiguous);
        assert_eq!(flat_access(&[(flat, base)], out + 4, 4), Access::Contiguous);
        assert_eq!(
            flat_access(&[(flat, base), (offset1, base)], out, 4),
            Access::Contiguous
        );
        assert_eq!(flat_access(&[(transposed, base)], out, 4), Access::Strided);
        assert_eq!(
            flat_access(&[(flat, base), (bcast, base)], out, 4),
            Access::Strided
        );
        assert_eq!(flat_access(&[(scalar, base)], out, 8), Access::Contiguous);
        assert_eq!(
            [Access::Strided, Access::Contiguous, Access::Vector].map(Access::code),
            [0, 1, 2]
        );
    }

    #[test]
    fn grids_are_capped_and_never_empty() {
        assert_eq!(grid_for(0, 256), 1);
        assert_eq!(grid_for(257, 256), 2);
        assert_eq!(grid_for(u64::MAX / 2, 256), 1 << 16);
    }
}
