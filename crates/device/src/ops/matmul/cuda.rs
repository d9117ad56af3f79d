//! CUDA batched matmul: one `cublasGemmStridedBatchedEx` call per product.
//!
//! **Layouts without copies.** cuBLAS is column-major; a row-major `C[m, n] = A[m, k] · B[k, n]`
//! is the column-major `Cᵀ (n×m) = Bᵀ · Aᵀ`, so B is passed as cuBLAS's first operand and A as
//! its second. Each operand is used in place when its matrix is row-major (unit column stride:
//! no transpose) or column-major (unit row stride, e.g. a `.t()` view: cuBLAS transposes it),
//! and its batch dims flatten to one batch stride (stride 0 for a broadcast operand, which is
//! how `[b, m, k] @ [k, n]` runs as one batched call). Any other view is first copied
//! contiguous on the device.
//!
//! **Types.** f32 and f64 compute in their own precision (no TF32, as PyTorch's default); f16 and
//! bf16 read and write 16-bit values with f32 accumulation (`CUBLAS_COMPUTE_32F`), PyTorch's
//! choice for autocast matmuls.
//!
//! **Handles.** One cuBLAS handle per device, created on first use and bound to kiln's stream,
//! so GEMMs order with every other kernel without synchronisation.

use super::MatmulOps;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublas::{result as blas, sys, CudaBlas};

use crate::error::{Error, Result};
use crate::ops::copy::CopyOps;
use crate::storage::CudaStorage;
use crate::{DType, Layout};

/// How cuBLAS reads one operand in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GemmOperand {
    /// Row-major matrix (unit stride along the columns); otherwise column-major.
    pub row_major: bool,
    /// Leading dimension in elements.
    pub ld: usize,
    /// Elements between consecutive batch matrices (0 when broadcast).
    pub batch_stride: usize,
}

/// `layout` (`[..batch, rows, cols]`) as a cuBLAS operand, or `None` when it needs a copy.
pub(crate) fn gemm_operand(layout: &Layout) -> Option<GemmOperand> {
    let (shape, strides) = (layout.shape(), layout.strides());
    let r = shape.len();
    if r < 2 {
        return None;
    }
    let (rows, cols) = (shape[r - 2], shape[r - 1]);
    let (rs, cs) = (strides[r - 2], strides[r - 1]);
    // Batch dims must flatten to one stride.
    let mut batch_stride = None::<usize>;
    let mut expect = 0;
    for d in (0..r - 2).rev() {
        if shape[d] == 1 {
            continue;
        }
        match batch_stride {
            None => batch_stride = Some(strides[d]),
            Some(_) if strides[d] != expect => return None,
            Some(_) => {}
        }
        expect = strides[d] * shape[d];
    }
    let batch_stride = batch_stride.unwrap_or(0);
    if cols == 1 || cs == 1 {
        let ld = if rows == 1 { cols.max(1) } else { rs };
        if ld >= cols.max(1) {
            return Some(GemmOperand {
                row_major: true,
                ld,
                batch_stride,
            });
        }
    }
    if rows == 1 || rs == 1 {
        let ld = if cols == 1 { rows.max(1) } else { cs };
        if ld >= rows.max(1) {
            return Some(GemmOperand {
                row_major: false,
                ld,
                batch_stride,
            });
        }
    }
    None
}

fn blas_err(call: &'static str) -> impl Fn(blas::CublasError) -> Error {
    move |e| Error::KernelLaunch {
        kernel: call.to_string(),
        code: format!("{:?}", e.0),
    }
}

static HANDLES: Mutex<Option<HashMap<usize, CudaBlas>>> = Mutex::new(None);

fn as_int(what: &'static str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Unsupported {
        what: match what {
            "batch" => "matmul on CUDA: more than 2^31 - 1 batch matrices; split the batch",
            _ => "matmul on CUDA: a matrix dimension or leading dimension is 2^31 or more",
        },
    })
}

/// Where [`CudaStorage::gemm_into`] writes `C [..batch, m, n]`: `buf` from element `offset`,
/// rows `ld` elements apart, batch matrices `batch_stride` apart (the elements are the buffer's
/// dtype: the operands' own, or f32 for 16-bit operands).
pub(crate) struct GemmOut<'a> {
    /// The buffer written.
    pub buf: &'a CudaStorage,
    /// First element of the first matrix.
    pub offset: usize,
    /// Elements between consecutive rows (at least `n`).
    pub ld: usize,
    /// Elements between consecutive batch matrices.
    pub batch_stride: usize,
    /// `C += A·B` instead of `C = A·B`.
    pub accumulate: bool,
}

/// cuBLAS's data type for `dtype`, with `op` named in the error for other dtypes.
fn data_type(op: &'static str, dtype: DType) -> Result<sys::cudaDataType> {
    match dtype {
        DType::F32 => Ok(sys::cudaDataType::CUDA_R_32F),
        DType::F64 => Ok(sys::cudaDataType::CUDA_R_64F),
        DType::F16 => Ok(sys::cudaDataType::CUDA_R_16F),
        DType::BF16 => Ok(sys::cudaDataType::CUDA_R_16BF),
        other => Err(Error::UnsupportedDType {
            op,
            dtype: other,
            hint: "convert with to_dtype(DType::F32) first",
        }),
    }
}

impl CudaStorage {
    /// The checks every product makes of its operands (`[..batch, m, k]` of `self` through
    /// `layout` and `[..batch, k, n]` of `rhs`: one device, one float dtype cuBLAS takes, shapes
    /// that multiply, views inside their buffers) and its sizes `[batch, m, k, n]`, the output's
    /// element count checked to fit.
    fn product_dims(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout) -> Result<[usize; 4]> {
        self.same_device("matmul", rhs)?;
        let dtype = self.dtype();
        if rhs.dtype() != dtype {
            return Err(Error::DTypeMismatch {
                op: "matmul",
                lhs: dtype,
                rhs: rhs.dtype(),
            });
        }
        data_type("matmul", dtype)?;
        let (sa, sb) = (layout.shape(), rhs_layout.shape());
        let r = sa.len();
        if r < 2 || sb.len() != r || sa[..r - 2] != sb[..r - 2] || sa[r - 1] != sb[r - 2] {
            return Err(Error::LengthMismatch {
                op: "matmul",
                what: format!("shapes {sa:?} and {sb:?} are not [..b, m, k] and [..b, k, n]"),
            });
        }
        self.check_view("matmul", layout)?;
        rhs.check_view("matmul", rhs_layout)?;
        let (m, k, n) = (sa[r - 2], sa[r - 1], sb[r - 1]);
        let batch = crate::checked_size("matmul", "the batch count", &sa[..r - 2])?;
        // `[2^32, 0] @ [0, 2^32]` is two empty operands but a 2^64-element output.
        crate::checked_size("matmul", "the output's element count", &[batch, m, n])?;
        Ok([batch, m, k, n])
    }

    /// `C = A·B` (or `C += A·B`) for `A` = `layout` of `self` and `B` = `rhs_layout` of `rhs`
    /// (`[..batch, m, k]` and `[..batch, k, n]`, identical batch dims, stride 0 allowed), into
    /// `out`, which must hold every element it addresses. f32 and f64 write their own dtype;
    /// f16 and bf16 write their own or f32 (the f32 sums unrounded). `k = 0` is refused unless
    /// accumulating (then `C` is left as it is).
    pub(crate) fn gemm_into(
        &self,
        layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
        out: GemmOut<'_>,
    ) -> Result<()> {
        let [batch, m, k, n] = self.product_dims(layout, rhs, rhs_layout)?;
        self.same_device("matmul", out.buf)?;
        let dtype = self.dtype();
        let data = data_type("matmul", dtype)?;
        let out_dtype = out.buf.dtype();
        let widened = matches!(dtype, DType::F16 | DType::BF16) && out_dtype == DType::F32;
        if out_dtype != dtype && !widened {
            return Err(Error::DTypeMismatch {
                op: "matmul",
                lhs: dtype,
                rhs: out_dtype,
            });
        }
        let compute = if dtype == DType::F64 {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_64F
        } else {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        if batch * m * n == 0 {
            return Ok(());
        }
        let (sa, sb) = (layout.shape(), rhs_layout.shape());
        let out_shape = [batch, m, n];
        let out_layout = Layout::new(
            out_shape.to_vec(),
            vec![out.batch_stride, out.ld, 1],
            out.offset,
        );
        if out.ld < n || (batch > 1 && out.batch_stride == 0) {
            return Err(Error::LengthMismatch {
                op: "matmul",
                what: format!("output rows {} apart cannot hold {n} columns", out.ld),
            });
        }
        out.buf.check_view("matmul", &out_layout)?;
        if k == 0 {
            // An empty sum adds nothing; cuBLAS is not asked to handle k = 0 (`matmul` returns
            // zeros itself).
            if out.accumulate {
                return Ok(());
            }
            return Err(Error::Unsupported {
                what: "a GEMM into an existing buffer with k = 0 (use matmul, which returns zeros)",
            });
        }
        // Operands cuBLAS cannot read in place are copied contiguous first.
        let (a_copy, b_copy);
        let (a, la, a_offset) = match gemm_operand(layout) {
            Some(op) => (self, op, layout.offset()),
            None => {
                a_copy = self.to_dtype(layout, dtype)?;
                let op = gemm_operand(&Layout::contiguous(sa)).expect("contiguous is row-major");
                (&a_copy, op, 0)
            }
        };
        let (b, lb, b_offset) = match gemm_operand(rhs_layout) {
            Some(op) => (rhs, op, rhs_layout.offset()),
            None => {
                b_copy = rhs.to_dtype(rhs_layout, dtype)?;
                let op = gemm_operand(&Layout::contiguous(sb)).expect("contiguous is row-major");
                (&b_copy, op, 0)
            }
        };
        let stream = crate::storage::cuda_stream(self.ordinal())?;
        let size = dtype.size_in_bytes() as u64;
        let a_ptr = a.device_ptr() + a_offset as u64 * size;
        let b_ptr = b.device_ptr() + b_offset as u64 * size;
        let c_ptr = out.buf.device_ptr() + (out.offset * out_dtype.size_in_bytes()) as u64;
        // cuBLAS sees Cᵀ (n×m) = Bᵀ (n×k) · Aᵀ (k×m).
        let op = |row_major: bool| {
            if row_major {
                sys::cublasOperation_t::CUBLAS_OP_N
            } else {
                sys::cublasOperation_t::CUBLAS_OP_T
            }
        };
        let (mi, ni, ki) = (as_int("m", n)?, as_int("n", m)?, as_int("k", k)?);
        let (lda, ldb, ldc) = (
            as_int("ld", lb.ld)?,
            as_int("ld", la.ld)?,
            as_int("ld", out.ld)?,
        );
        let batch_count = as_int("batch", batch)?;
        let beta = if out.accumulate { 1.0 } else { 0.0 };
        let (one32, beta32, one64, beta64) = (1f32, beta as f32, 1f64, beta);
        let (alpha, beta): (*const c_void, *const c_void) = if dtype == DType::F64 {
            (
                (&one64 as *const f64).cast(),
                (&beta64 as *const f64).cast(),
            )
        } else {
            (
                (&one32 as *const f32).cast(),
                (&beta32 as *const f32).cast(),
            )
        };
        // SAFETY: only probes whether the dynamic library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::CudaUnavailable(
                "libcublas was not found; install the CUDA toolkit's cuBLAS (or `pip install \
                 nvidia-cublas`) and add its lib folder to LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        let mut handles = HANDLES.lock().unwrap_or_else(|p| p.into_inner());
        let handles = handles.get_or_insert_with(HashMap::new);
        let blas = match handles.entry(self.ordinal()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(CudaBlas::new(stream.clone()).map_err(blas_err("cublasCreate"))?)
            }
        };
        let handle = *blas.handle();
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| crate::cuda::launch::launch_error("cublasGemmStridedBatchedEx", e))?;
        // SAFETY: the pointers address blocks holding every element the strides reach (views
        // checked above, the output's through `out_layout`; copies are contiguous); alpha/beta
        // are host scalars of the compute type; the handle is bound to `stream`, on which all
        // three buffers are used.
        unsafe {
            blas::gemm_strided_batched_ex(
                handle,
                op(lb.row_major),
                op(la.row_major),
                mi,
                ni,
                ki,
                alpha,
                b_ptr as *const c_void,
                data,
                lda,
                lb.batch_stride as i64,
                a_ptr as *const c_void,
                data,
                ldb,
                la.batch_stride as i64,
                beta,
                c_ptr as *mut c_void,
                data_type("matmul", out_dtype)?,
                ldc,
                out.batch_stride as i64,
                batch_count,
                compute,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
            )
        }
        .map_err(blas_err("cublasGemmStridedBatchedEx"))?;
        Ok(())
    }
}

impl MatmulOps for CudaStorage {
    /// `[..batch, m, k] @ [..batch, k, n]` (identical batch dims, stride 0 allowed).
    fn matmul(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout) -> Result<Self> {
        let [batch, m, k, n] = self.product_dims(layout, rhs, rhs_layout)?;
        let (dtype, numel) = (self.dtype(), batch * m * n);
        if numel == 0 || k == 0 {
            // An empty sum is 0.
            return CudaStorage::full_cuda(self.ordinal(), numel, 0.0, dtype);
        }
        let (_, out) = CudaStorage::output(self.ordinal(), numel, dtype)?;
        self.gemm_into(
            layout,
            rhs,
            rhs_layout,
            GemmOut {
                buf: &out,
                offset: 0,
                ld: n.max(1),
                batch_stride: m * n,
                accumulate: false,
            },
        )?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(layout: &Layout) -> Option<(bool, usize, usize)> {
        gemm_operand(layout).map(|o| (o.row_major, o.ld, o.batch_stride))
    }

    #[test]
    fn row_major_transposed_and_broadcast_operands_need_no_copy() {
        let a = Layout::contiguous(&[3, 4, 5]);
        assert_eq!(op(&a), Some((true, 5, 20)));
        // `.t()` of the last two dims: column-major with ld 5.
        assert_eq!(op(&a.transpose(1, 2)), Some((false, 5, 20)));
        // A 2-D weight broadcast over a batch: stride 0.
        let w = Layout::contiguous(&[4, 5])
            .unsqueeze(0)
            .broadcast_to(&[3, 4, 5]);
        assert_eq!(op(&w), Some((true, 5, 0)));
        // Two batch dims that flatten; a column slice keeps its row stride as ld.
        let b = Layout::contiguous(&[2, 3, 4, 8]).narrow(3, 2, 5);
        assert_eq!(op(&b), Some((true, 8, 32)));
        // Vectors: any stride on the size-1 dim.
        assert_eq!(
            op(&Layout::new(vec![1, 7], vec![99, 1], 0)),
            Some((true, 7, 0))
        );
    }

    #[test]
    fn views_cublas_cannot_read_are_copied() {
        // Neither dim has unit stride.
        assert_eq!(op(&Layout::new(vec![4, 5], vec![10, 2], 0)), None);
        // Batch dims that do not flatten (a narrowed outer batch dim).
        let l = Layout::contiguous(&[4, 3, 2, 2]).narrow(1, 0, 2);
        assert_eq!(op(&l), None);
    }
}
