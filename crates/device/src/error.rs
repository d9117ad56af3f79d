//! Errors of `kiln-device`.

use crate::{DType, Device};

/// Everything that can go wrong in `kiln-device`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA device was asked for but CUDA cannot be used; the string says why.
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),
    /// A CUDA ordinal past the visible devices.
    #[error(
        "cuda:{ordinal} does not exist: {count} CUDA device(s) visible; use an ordinal below {count} \
         (check CUDA_VISIBLE_DEVICES / set_visible_devices)"
    )]
    NoSuchCudaDevice {
        /// The logical ordinal asked for.
        ordinal: usize,
        /// How many devices are visible.
        count: usize,
    },
    /// `set_visible_devices` was called after kiln initialised CUDA.
    #[error(
        "set_visible_devices called after CUDA was initialised in this process; call it first thing \
         in main, before any device query, or set CUDA_VISIBLE_DEVICES before starting the process"
    )]
    VisibilityFrozen,
    /// An entry given to `set_visible_devices` is not a device id.
    #[error("set_visible_devices: entry {index} ({entry:?}) is invalid: {why}")]
    InvalidVisibleDevice {
        /// Index of the entry in the list.
        index: usize,
        /// The entry as given.
        entry: String,
        /// What is wrong and how to write it.
        why: String,
    },
    /// A CUDA driver call failed.
    #[error(
        "CUDA driver call {call} failed with {code}; check `nvidia-smi` and the driver install"
    )]
    Driver {
        /// The driver call (`cuMemGetInfo`, `cuModuleLoadData`, …).
        call: &'static str,
        /// The driver's error name (`CUDA_ERROR_OUT_OF_MEMORY`, …) and description.
        code: String,
    },
    /// The NVRTC library could not be loaded, so kernels cannot be compiled.
    #[error(
        "libnvrtc.so not found, so CUDA kernels cannot be compiled; install the CUDA toolkit's NVRTC \
         (or `pip install nvidia-cuda-nvrtc`) and add its lib folder to LD_LIBRARY_PATH"
    )]
    NvrtcNotFound,
    /// NVRTC rejected a kernel source file.
    #[error("NVRTC failed to compile {file} for compute_{arch}: {code}\n{log}{hint}")]
    KernelCompile {
        /// The `.cu` file, relative to the crate's `src/`.
        file: &'static str,
        /// The virtual architecture compiled for (`90` for compute_90).
        arch: u32,
        /// NVRTC's result code.
        code: String,
        /// NVRTC's compile log (the compiler's error messages).
        log: String,
        /// kiln's advice (`\nhint: …`) for a failure it recognises (missing CUDA headers), else empty.
        hint: String,
    },
    /// The kernel-source test hook (`KILN_KERNEL_SOURCE_DIR`) names something unusable.
    #[error("cannot compile {file} from the kernel-source override: {why}")]
    KernelSourceOverride {
        /// The `.cu` file being loaded.
        file: &'static str,
        /// What is wrong with the folder or the file.
        why: String,
    },
    /// A kernel function is missing from its compiled module.
    #[error("kernel {function} not found in {file}; check its `extern \"C\"` instantiation")]
    KernelNotFound {
        /// The `.cu` file.
        file: &'static str,
        /// The function looked for.
        function: String,
    },
    /// Two buffers or a buffer and a shape disagree in length.
    #[error("{op}: {what}; pass buffers whose lengths match the shape")]
    LengthMismatch {
        /// The operation.
        op: &'static str,
        /// What disagrees, with the numbers.
        what: String,
    },
    /// A size computed from shapes (an element count, a byte count, a grid) does not fit in
    /// `isize`: no buffer can be that large.
    #[error(
        "{op}: {what} overflows (more than isize::MAX); no buffer can hold it: check the shapes"
    )]
    SizeOverflow {
        /// The operation.
        op: &'static str,
        /// What was computed, with the factors.
        what: String,
    },
    /// The operation is not supported on this platform.
    #[error("not supported here: {what}")]
    Unsupported {
        /// What is missing.
        what: &'static str,
    },
    /// An op was given a dtype its kernel does not support.
    #[error("{op}: dtype {dtype} is not supported; {hint}")]
    UnsupportedDType {
        /// The op.
        op: &'static str,
        /// The dtype it got.
        dtype: DType,
        /// What to do instead.
        hint: &'static str,
    },
    /// Two operands of one op have different dtypes.
    #[error("{op}: dtypes differ ({lhs} vs {rhs}); convert one with to_dtype first")]
    DTypeMismatch {
        /// The op.
        op: &'static str,
        /// First operand's dtype.
        lhs: DType,
        /// Second operand's dtype.
        rhs: DType,
    },
    /// Two operands of one op live on different devices.
    #[error(
        "{op}: operands are on different devices ({lhs} vs {rhs}); move one with to_device first"
    )]
    DeviceMismatch {
        /// The op.
        op: &'static str,
        /// First operand's device.
        lhs: Device,
        /// Second operand's device.
        rhs: Device,
    },
    /// The op has no kernel on this device yet.
    #[error("{op}: not implemented on {device} yet; move the tensors to the CPU with to_device(Device::Cpu)")]
    NotImplemented {
        /// The op.
        op: &'static str,
        /// The device.
        device: Device,
    },
    /// A CUDA driver call failed.
    #[error("CUDA error in {op}: {msg}")]
    Cuda {
        /// What was being done.
        op: &'static str,
        /// The driver's message.
        msg: String,
    },
    /// Launching a CUDA kernel (or a cuBLAS call) failed. A sticky error left by an earlier
    /// asynchronous failure also surfaces here, at the next launch on the context.
    #[error(
        "CUDA kernel {kernel} failed to launch: {code}; a sticky error (illegal address, device-side \
         assert) means an earlier kernel failed: rerun with CUDA_LAUNCH_BLOCKING=1 to find it"
    )]
    KernelLaunch {
        /// The kernel's `extern "C"` name (or the cuBLAS routine).
        kernel: String,
        /// The driver's (or cuBLAS's) error name and description.
        code: String,
    },
    /// A kernel was called with bad parameters, shapes, buffers or indices.
    #[error(transparent)]
    Kernel(#[from] crate::ops::KernelError),
    /// A bad index found by a CUDA op's deferred check (the check runs on the device without
    /// waiting, so the error surfaces at the next synchronisation: a copy to the host such as
    /// `to_vec`/`item`, or `synchronize`). `error` is what the CPU raises for the same input.
    #[error(
        "{error} (raised by {op} on {device}, whose index check runs on the device without \
         waiting, and reported at the next synchronisation, {reported_at}; outputs computed from \
         the bad index are not meaningful. Fix the index; to get this error at the op itself, \
         set KILN_CUDA_EAGER_CHECKS=1 or call kiln_device::set_eager_checks(true))"
    )]
    DeferredCheck {
        /// The op whose check failed (the first failing check since the last synchronisation).
        op: &'static str,
        /// The device it ran on.
        device: Device,
        /// Where it was reported (`"a copy to the host (to_vec, item, to_device)"`, `"synchronize"`, or
        /// the op that settled the checks).
        reported_at: &'static str,
        /// The error the CPU gives for the same index tensor (boxed to keep [`Error`] small).
        error: Box<crate::ops::KernelError>,
    },
    /// The device's caching allocator failed: out of memory (its report says what is
    /// allocated, cached and free, and what to do) or a bad `KILN_ALLOC_CONF`.
    #[error(transparent)]
    Alloc(#[from] kiln_alloc_cache::Error),
    /// A memory snapshot file ([`dump_snapshot`](crate::dump_snapshot)) could not be written.
    #[error(transparent)]
    Snapshot(#[from] kiln_alloc_cache::snapshot_read::SnapshotFileError),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The kernel error behind `self`: raised at the op ([`Error::Kernel`]) or reported at a
    /// later synchronisation by a deferred CUDA check ([`Error::DeferredCheck`]).
    pub fn kernel_error(&self) -> Option<&crate::ops::KernelError> {
        match self {
            Error::Kernel(error) => Some(error),
            Error::DeferredCheck { error, .. } => Some(error),
            _ => None,
        }
    }
}
