//! [`KernelError`]: bad parameters or buffers handed to a kernel.
//!
//! Every kernel validates its shapes, parameters, buffer lengths and index values before it
//! writes anything, and reports the first problem as one of these variants. Each message names
//! the op, the problem and the fix. [`crate::Error::Kernel`] wraps it for callers that use the
//! crate-wide error.

/// What is wrong with the arguments of a kernel call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// A slice does not hold exactly the number of elements its shape needs.
    #[error(
        "{op}: `{buffer}` holds {actual} elements but its shape {shape:?} needs {expected}; \
         pass a contiguous buffer with exactly {expected} elements"
    )]
    BufferLength {
        /// The op (`"conv2d"`, `"max_pool2d_backward"`, ...).
        op: &'static str,
        /// Which argument.
        buffer: &'static str,
        /// The shape the buffer must have.
        shape: Vec<usize>,
        /// Elements that shape needs.
        expected: usize,
        /// Elements the slice holds.
        actual: usize,
    },
    /// A size-like parameter (stride, dilation, kernel size, groups, ...) is zero.
    #[error("{op}: `{param}` is 0; it must be at least 1")]
    ZeroParameter {
        /// The op.
        op: &'static str,
        /// The parameter.
        param: &'static str,
    },
    /// A channel count is not a multiple of `groups`.
    #[error(
        "{op}: {channels_name} = {channels} is not divisible by groups = {groups}; \
         choose groups that divide both in_channels and out_channels"
    )]
    NotDivisibleByGroups {
        /// The op.
        op: &'static str,
        /// `"in_channels"` or `"out_channels"`.
        channels_name: &'static str,
        /// The channel count.
        channels: usize,
        /// The group count.
        groups: usize,
    },
    /// The convolution weight's second dimension is not `in_channels / groups`.
    #[error(
        "{op}: weight shape {weight_shape:?} needs dim 1 = in_channels / groups = \
         {in_channels} / {groups} = {expected}; use a weight of shape \
         [out_channels, {expected}, kernel_h, kernel_w] or change groups"
    )]
    WeightChannelMismatch {
        /// The op.
        op: &'static str,
        /// The weight's shape.
        weight_shape: [usize; 4],
        /// The input's channel count.
        in_channels: usize,
        /// The group count.
        groups: usize,
        /// `in_channels / groups`.
        expected: usize,
    },
    /// The (dilated) kernel does not fit into the padded input, so the output would be empty.
    #[error(
        "{op}: the {axis} of the dilated kernel ({window}) exceeds the padded input {axis} \
         ({padded_input}), so the output would be empty; use a smaller kernel or dilation, more \
         padding, or a larger input"
    )]
    WindowLargerThanInput {
        /// The op.
        op: &'static str,
        /// `"height"` or `"width"`.
        axis: &'static str,
        /// `dilation * (kernel - 1) + 1`.
        window: usize,
        /// `input + 2 * padding`.
        padded_input: usize,
    },
    /// Pooling padding larger than half the kernel (PyTorch's rule).
    #[error(
        "{op}: padding {padding} along {axis} is more than half the kernel size {kernel}; \
         use padding <= kernel_size / 2"
    )]
    PaddingTooLarge {
        /// The op.
        op: &'static str,
        /// `"height"` or `"width"`.
        axis: &'static str,
        /// The padding.
        padding: usize,
        /// The kernel size.
        kernel: usize,
    },
    /// A max-pooling window that covers only padding (possible with dilation and `ceil_mode`).
    #[error(
        "{op}: output position {output_index} along {axis} covers no input element (only \
         padding); reduce dilation or padding, or turn off ceil_mode"
    )]
    EmptyPoolingWindow {
        /// The op.
        op: &'static str,
        /// `"height"` or `"width"`.
        axis: &'static str,
        /// The output position whose window is empty.
        output_index: usize,
    },
    /// A shape breaks a rule of the op; `rule` says which and how to fix it.
    #[error("{op}: shape {shape:?} is invalid: {rule}")]
    InvalidShape {
        /// The op.
        op: &'static str,
        /// The offending shape.
        shape: Vec<usize>,
        /// The rule broken and the fix.
        rule: String,
    },
    /// A dimension argument is not smaller than the number of dimensions.
    #[error("{op}: dim {dim} is out of range for a tensor with {ndim} dimensions; use 0 <= dim < {ndim}")]
    DimOutOfRange {
        /// The op.
        op: &'static str,
        /// The dimension asked for.
        dim: usize,
        /// The tensor's number of dimensions.
        ndim: usize,
    },
    /// An index value lies outside `[0, size)` of the dimension it indexes.
    #[error(
        "{op}: index {index} at position {position:?} of the index tensor is out of range for \
         dimension {dim} of size {size}; every index must lie in [0, {size})"
    )]
    IndexOutOfRange {
        /// The op.
        op: &'static str,
        /// The bad index value.
        index: i64,
        /// Its coordinates in the index tensor (the first bad one in row-major order).
        position: Vec<usize>,
        /// The indexed dimension.
        dim: usize,
        /// That dimension's size.
        size: usize,
    },
    /// An embedding's `padding_idx` lies outside `[-num_embeddings, num_embeddings)`.
    #[error(
        "{op}: padding_idx {padding_idx} is out of range for {num_embeddings} embeddings; use \
         -{num_embeddings} <= padding_idx < {num_embeddings} or no padding_idx"
    )]
    PaddingIdxOutOfRange {
        /// The op.
        op: &'static str,
        /// The given `padding_idx`.
        padding_idx: i64,
        /// Rows of the embedding table.
        num_embeddings: usize,
    },
    /// Batch norm in training mode over a single value per channel (variance undefined).
    #[error(
        "{op}: training needs more than 1 value per channel to estimate a variance, got \
         {count} (batch x spatial); use a larger batch or input, or evaluation mode"
    )]
    TooFewValuesPerChannel {
        /// The op.
        op: &'static str,
        /// Values per channel.
        count: usize,
    },
}

/// Checks that `buffer` has the element count of `shape`.
pub(crate) fn check_len<T>(
    op: &'static str,
    buffer: &'static str,
    slice: &[T],
    shape: &[usize],
) -> Result<(), KernelError> {
    let expected: usize = shape.iter().product();
    if slice.len() == expected {
        Ok(())
    } else {
        Err(KernelError::BufferLength {
            op,
            buffer,
            shape: shape.to_vec(),
            expected,
            actual: slice.len(),
        })
    }
}

/// Returns an error when `value` is zero.
pub(crate) fn check_nonzero(
    op: &'static str,
    param: &'static str,
    value: usize,
) -> Result<(), KernelError> {
    if value == 0 {
        Err(KernelError::ZeroParameter { op, param })
    } else {
        Ok(())
    }
}
