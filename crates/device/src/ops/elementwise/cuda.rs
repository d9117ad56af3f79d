//! CUDA elementwise ops: the kernels of `elementwise.cu`, launched on the buffers' stream.
//!
//! Each op is one grid-stride kernel per dtype reading every operand through its own strides
//! (broadcast operands have stride 0), so nothing is materialised before the kernel runs.
//! Unary and binary ops on operands that are unit-stride after collapsing (the hot case) take a
//! flat path with no index math, with 16-byte vector loads and stores when every operand and the
//! output are 16-byte aligned at their first element ([`flat_access`] picks it); comparisons and
//! `where` take the flat path without vectors. The
//! dtype rules are the CPU backend's: unary and binary arithmetic on the four float types and
//! `I64` (the subset of ops that make sense on integers), comparisons on every dtype, `where`
//! on every dtype with a `Bool`/`U8` condition.

use super::ElementwiseOps;
use super::{BinaryOp, CmpOp, UnaryOp};
use crate::cuda::kernels::KernelSource;
use crate::cuda::launch::{
    collapse, elementwise_config, flat_access, function, is_unit_stride, launch_error, suffix,
    Access, StridedArgs,
};
use crate::error::{Error, Result};
use crate::storage::CudaStorage;
use crate::{DType, Layout};
use cudarc::driver::PushKernelArg;

/// The kernels of this op family.
pub const ELEMENTWISE_KERNELS: KernelSource = KernelSource {
    file: "ops/elementwise/elementwise.cu",
    source: include_str!("elementwise.cu"),
};

const FLOAT_HINT: &str = "convert with to_dtype(DType::F32) first";

fn check_same_dtype(op: &'static str, a: &CudaStorage, b: &CudaStorage) -> Result<()> {
    a.same_device(op, b)?;
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch {
            op,
            lhs: a.dtype(),
            rhs: b.dtype(),
        });
    }
    Ok(())
}

fn check_same_shape(op: &'static str, a: &Layout, b: &Layout) -> Result<()> {
    if a.shape() != b.shape() {
        return Err(Error::LengthMismatch {
            op,
            what: format!(
                "operand shapes {:?} and {:?} differ (broadcast them first)",
                a.shape(),
                b.shape()
            ),
        });
    }
    Ok(())
}

impl CudaStorage {
    /// The checks of an in-place update of `dst` through `dst_layout` by `self` through
    /// `layout` (one device, one dtype that `takes` accepts, one shape, both views inside their
    /// buffers), then its element count and collapsed views, or `None` when it has no element.
    fn in_place_views(
        &self,
        op: &'static str,
        layout: &Layout,
        dst: &Self,
        dst_layout: &Layout,
        takes: impl FnOnce(DType) -> Result<()>,
    ) -> Result<Option<(u64, [StridedArgs; 2])>> {
        self.same_device(op, dst)?;
        check_same_dtype(op, dst, self)?;
        takes(dst.dtype())?;
        check_same_shape(op, dst_layout, layout)?;
        self.check_view(op, layout)?;
        dst.check_view(op, dst_layout)?;
        let n = layout.numel() as u64;
        if n == 0 {
            return Ok(None);
        }
        Ok(Some((n, collapse([dst_layout, layout])?)))
    }
}

/// The launch of a grid-stride loop over `n` elements, or over its 16-byte vectors when `access`
/// is [`Access::Vector`] (`elem` bytes per element).
fn config_for(access: Access, n: u64, elem: usize) -> cudarc::driver::LaunchConfig {
    match access {
        Access::Vector => elementwise_config(n.div_ceil(16 / elem as u64)),
        Access::Strided | Access::Contiguous => elementwise_config(n),
    }
}

fn unsupported(op: &'static str, dtype: DType, hint: &'static str) -> Error {
    Error::UnsupportedDType { op, dtype, hint }
}

impl CudaStorage {
    /// The launch shared by binary ops and comparisons: (a, la, b, lb, out, n, op, access);
    /// vector access only when `vectors` (binary ops: output and inputs of one size).
    fn launch_binary(
        &self,
        (layout, rhs, rhs_layout): (&Layout, &Self, &Layout),
        op: &'static str,
        name: &str,
        out_dtype: DType,
        (code, vectors): (u32, bool),
    ) -> Result<Self> {
        check_same_shape(op, layout, rhs_layout)?;
        self.check_view(op, layout)?;
        rhs.check_view(op, rhs_layout)?;
        let n = layout.numel();
        let (stream, out) = CudaStorage::output(self.ordinal(), n, out_dtype)?;
        if n == 0 {
            return Ok(out);
        }
        let f = function(&stream, &ELEMENTWISE_KERNELS, name)?;
        let [va, vb] = collapse([layout, rhs_layout])?;
        let (a, b, dst, n) = (
            self.device_ptr(),
            rhs.device_ptr(),
            out.device_ptr(),
            n as u64,
        );
        let mut launch = stream.launch_builder(&f);
        launch
            .arg(&a)
            .arg(&va)
            .arg(&b)
            .arg(&vb)
            .arg(&dst)
            .arg(&n)
            .arg(&code);
        let elem = self.dtype().size_in_bytes();
        let access = match flat_access(&[(va, a), (vb, b)], dst, elem) {
            Access::Vector if !vectors => Access::Contiguous,
            access => access,
        };
        let access_code = access.code();
        launch.arg(&access_code);
        // SAFETY: signature (const T*, StridedArgs, const T*, StridedArgs, O*, u64, unsigned,
        // unsigned) as in elementwise.cu; both views were checked; `out` holds n elements of
        // `out_dtype`; a vector access was only picked for 16-byte aligned unit-stride operands
        // of the output's dtype (binary ops).
        unsafe { launch.launch(config_for(access, n, elem)) }.map_err(|e| launch_error(name, e))?;
        Ok(out)
    }
}

impl ElementwiseOps for CudaStorage {
    /// Elementwise `op` (floats; `I64` for neg/abs/relu/sign/square).
    fn unary(&self, layout: &Layout, op: UnaryOp) -> Result<Self> {
        let int_ok = matches!(
            op,
            UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu | UnaryOp::Sign | UnaryOp::Square
        );
        match self.dtype() {
            d if d.is_float() => {}
            DType::I64 if int_ok => {}
            d => return Err(unsupported(op.name(), d, FLOAT_HINT)),
        }
        self.check_view(op.name(), layout)?;
        let n = layout.numel();
        let (stream, out) = CudaStorage::output(self.ordinal(), n, self.dtype())?;
        if n == 0 {
            return Ok(out);
        }
        let name = format!("kiln_unary_{}", suffix(self.dtype()));
        let f = function(&stream, &ELEMENTWISE_KERNELS, &name)?;
        let [view] = collapse([layout])?;
        let (x, dst, n, code) = (self.device_ptr(), out.device_ptr(), n as u64, op.code());
        let elem = self.dtype().size_in_bytes();
        let access = flat_access(&[(view, x)], dst, elem);
        let access_code = access.code();
        let mut launch = stream.launch_builder(&f);
        launch
            .arg(&x)
            .arg(&view)
            .arg(&dst)
            .arg(&n)
            .arg(&code)
            .arg(&access_code);
        // SAFETY: signature (const T*, StridedArgs, T*, u64, unsigned, unsigned) as in
        // elementwise.cu; the view was checked against `self`; `out` holds n elements; a vector
        // access was only picked for 16-byte aligned unit-stride operands.
        unsafe { launch.launch(config_for(access, n, elem)) }
            .map_err(|e| launch_error(&name, e))?;
        Ok(out)
    }
    /// Elementwise `op` of two same-shaped views (floats, and `I64` where
    /// [`BinaryOp::takes_integers`]).
    fn binary(
        &self,
        layout: &Layout,
        rhs: &Self,
        rhs_layout: &Layout,
        op: BinaryOp,
    ) -> Result<Self> {
        check_same_dtype(op.name(), self, rhs)?;
        match self.dtype() {
            d if d.is_float() => {}
            DType::I64 if op.takes_integers() => {}
            d => {
                return Err(unsupported(
                    op.name(),
                    d,
                    "convert with to_dtype(DType::F32) or to_dtype(DType::I64) first",
                ))
            }
        }
        let name = format!("kiln_binary_{}", suffix(self.dtype()));
        self.launch_binary(
            (layout, rhs, rhs_layout),
            op.name(),
            &name,
            self.dtype(),
            (op.code(), true),
        )
    }
    /// In place: `dst = op(dst, self)` element by element through both views (one kernel,
    /// nothing allocated; halves compute in `f32` and round once, as `binary` does).
    fn binary_into(
        &self,
        layout: &Layout,
        dst: &mut Self,
        dst_layout: &Layout,
        op: BinaryOp,
    ) -> Result<()> {
        let name = op.name();
        let takes = |d: DType| match d {
            d if d.is_float() => Ok(()),
            DType::I64 if op.takes_integers() => Ok(()),
            d => Err(unsupported(
                name,
                d,
                "convert with to_dtype(DType::F32) or to_dtype(DType::I64) first",
            )),
        };
        let Some((n, [dst_view, view])) =
            self.in_place_views(name, layout, dst, dst_layout, takes)?
        else {
            return Ok(());
        };
        let kernel = format!("kiln_binary_into_{}", suffix(dst.dtype()));
        let stream = crate::storage::cuda_stream(self.ordinal())?;
        let f = function(&stream, &ELEMENTWISE_KERNELS, &kernel)?;
        let (d, b, code) = (dst.device_ptr(), self.device_ptr(), op.code());
        let mut launch = stream.launch_builder(&f);
        launch
            .arg(&d)
            .arg(&dst_view)
            .arg(&b)
            .arg(&view)
            .arg(&n)
            .arg(&code);
        // SAFETY: signature (T*, StridedArgs, const T*, StridedArgs, u64, unsigned) as in
        // elementwise.cu; both views were checked against their buffers, which are distinct
        // (`&self`, `&mut dst`), and the caller's destination view maps no two elements to one
        // place, so each thread reads and writes only its own element.
        unsafe { launch.launch(elementwise_config(n)) }.map_err(|e| launch_error(&kernel, e))?;
        Ok(())
    }
    /// `dst += alpha * self` in place, one rounding.
    fn add_scaled_into(
        &self,
        layout: &Layout,
        dst: &mut Self,
        dst_layout: &Layout,
        alpha: f64,
    ) -> Result<()> {
        const OP: &str = "add_";
        let takes = |d: DType| match d.is_float() {
            true => Ok(()),
            false => Err(unsupported(
                OP,
                d,
                "convert with to_dtype(DType::F32) first",
            )),
        };
        let Some((n, [dst_view, view])) =
            self.in_place_views(OP, layout, dst, dst_layout, takes)?
        else {
            return Ok(());
        };
        let kernel = format!("kiln_add_scaled_into_{}", suffix(dst.dtype()));
        let stream = crate::storage::cuda_stream(self.ordinal())?;
        let f = function(&stream, &ELEMENTWISE_KERNELS, &kernel)?;
        let (d, b) = (dst.device_ptr(), self.device_ptr());
        let (alpha64, alpha32) = (alpha, super::add_scaled_alpha_f32(dst.dtype(), alpha));
        let mut launch = stream.launch_builder(&f);
        launch.arg(&d).arg(&dst_view).arg(&b).arg(&view).arg(&n);
        if dst.dtype() == DType::F64 {
            launch.arg(&alpha64);
        } else {
            launch.arg(&alpha32);
        }
        // SAFETY: signature (T*, StridedArgs, const T*, StridedArgs, u64, C) as in
        // elementwise.cu, C double for f64 and float otherwise; the views were checked against
        // their buffers, which are distinct (`&self`, `&mut dst`), and the destination view maps
        // no two elements to one place (the caller's contract), so each thread reads and writes
        // only its own element.
        unsafe { launch.launch(elementwise_config(n)) }.map_err(|e| launch_error(&kernel, e))?;
        Ok(())
    }
    /// Elementwise comparison; a `Bool` result.
    fn compare(&self, layout: &Layout, rhs: &Self, rhs_layout: &Layout, op: CmpOp) -> Result<Self> {
        check_same_dtype("comparison", self, rhs)?;
        let name = format!("kiln_compare_{}", suffix(self.dtype()));
        self.launch_binary(
            (layout, rhs, rhs_layout),
            "comparison",
            &name,
            DType::Bool,
            (op.code(), false),
        )
    }
    /// `self` (a `Bool`/`U8` condition) picks `on_true` where nonzero, else `on_false`.
    fn where_cond(
        &self,
        layout: &Layout,
        on_true: &Self,
        tl: &Layout,
        on_false: &Self,
        fl: &Layout,
    ) -> Result<Self> {
        check_same_dtype("where", on_true, on_false)?;
        self.same_device("where", on_true)?;
        if !matches!(self.dtype(), DType::Bool | DType::U8) {
            return Err(unsupported(
                "where",
                self.dtype(),
                "the condition must be a bool tensor (e.g. from a comparison)",
            ));
        }
        check_same_shape("where", layout, tl)?;
        check_same_shape("where", layout, fl)?;
        self.check_view("where", layout)?;
        on_true.check_view("where", tl)?;
        on_false.check_view("where", fl)?;
        let n = layout.numel();
        let (stream, out) = CudaStorage::output(self.ordinal(), n, on_true.dtype())?;
        if n == 0 {
            return Ok(out);
        }
        let name = format!("kiln_where_b{}", on_true.dtype().size_in_bytes());
        let f = function(&stream, &ELEMENTWISE_KERNELS, &name)?;
        let [vc, vt, vf] = collapse([layout, tl, fl])?;
        let (c, t, e, dst, n) = (
            self.device_ptr(),
            on_true.device_ptr(),
            on_false.device_ptr(),
            out.device_ptr(),
            n as u64,
        );
        let flat = [vc, vt, vf].iter().all(is_unit_stride);
        let access = if flat {
            Access::Contiguous
        } else {
            Access::Strided
        }
        .code();
        let mut launch = stream.launch_builder(&f);
        launch
            .arg(&c)
            .arg(&vc)
            .arg(&t)
            .arg(&vt)
            .arg(&e)
            .arg(&vf)
            .arg(&dst)
            .arg(&n)
            .arg(&access);
        // SAFETY: signature as in elementwise.cu; all three views were checked; `out` holds n
        // elements of the branches' dtype.
        unsafe { launch.launch(elementwise_config(n)) }.map_err(|e| launch_error(&name, e))?;
        Ok(out)
    }
}
