//! `one_hot`: class indices to one-hot vectors, built on the seam's `scatter` (a tensor op).
//!
//! CPU labels, and device labels without `num_classes`, are read to the host (like PyTorch, which
//! synchronises to find the largest label when `num_classes` is inferred), validated (first
//! negative or too-large label reported with its position), and a zeroed `[..labels, C]` int64
//! tensor on the host gets 1 scattered at each label along the last dim; the result goes back to
//! the labels' device. Device labels with `num_classes` given never leave the device: the same scatter runs
//! there as a tensor op (see `one_hot_on_device`). Both paths refuse an output whose size cannot
//! be addressed before allocating it; one larger than memory gets the allocator's OOM error.

use crate::error::{dtype_err, Error};
use crate::Result;
use kiln_autograd::{DType, Device, Tensor};

/// Coordinates of element `flat` of a row-major `shape`.
pub(crate) fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut coords = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        let size = shape[d].max(1);
        coords[d] = flat % size;
        flat /= size;
    }
    coords
}

/// `Ok` for integer class labels (`I64`/`U8`), else the dtype error for `op`; reads nothing.
pub(crate) fn check_label_dtype(op: &'static str, labels: &Tensor) -> Result<()> {
    match labels.dtype() {
        DType::I64 | DType::U8 => Ok(()),
        other => Err(dtype_err(
            op,
            format!(
                "labels must be integer class indices, got {other}; convert with \
                 to_dtype(DType::I64){}",
                if other.is_float() {
                    " (if these are already one-hot vectors or probabilities, they need no \
                     one_hot)"
                } else {
                    ""
                }
            ),
        )),
    }
}

/// Integer labels as `i64` on the host, or a dtype error for `op`.
pub(crate) fn labels_to_host(op: &'static str, labels: &Tensor) -> Result<Vec<i64>> {
    check_label_dtype(op, labels)?;
    Ok(labels.to_dtype(DType::I64)?.to_vec::<i64>()?)
}

/// PyTorch's `torch.nn.functional.one_hot`: an int64 tensor of shape `[..labels.shape, C]`
/// with 1 at each label's class and 0 elsewhere.
///
/// `num_classes = None` is PyTorch's `-1`: one more than the largest label (an error for empty
/// labels). Negative labels, and labels `>= num_classes`, are errors naming the first such label
/// and its position. `labels` may be `I64` or `U8`.
pub fn one_hot(labels: &Tensor, num_classes: Option<usize>) -> Result<Tensor> {
    if let (Some(classes), false) = (num_classes, labels.device().is_cpu()) {
        return one_hot_on_device(labels, classes);
    }
    let values = labels_to_host("one_hot", labels)?;
    let shape = labels.shape().to_vec();
    if let Some(flat) = values.iter().position(|&v| v < 0) {
        return Err(Error::InvalidLabel {
            value: values[flat],
            position: unravel(flat, &shape),
            why: "is negative; class labels must be non-negative indices 0, 1, ... (drop or remap \
                  ignored labels such as -100 before one_hot)"
                .into(),
        });
    }
    let classes = match num_classes {
        Some(c) => c,
        None => match values.iter().max() {
            Some(&m) => m as usize + 1,
            None => {
                return Err(crate::error::arg_err(
                    "one_hot",
                    "cannot infer the number of classes from empty labels; pass \
                     Some(num_classes)",
                ))
            }
        },
    };
    if let Some(flat) = values.iter().position(|&v| v as u64 >= classes as u64) {
        return Err(Error::InvalidLabel {
            value: values[flat],
            position: unravel(flat, &shape),
            why: format!(
                "is out of range for num_classes = {classes}; labels must lie in [0, \
                 {classes}): pass a larger num_classes (or None to infer it from the largest \
                 label)"
            ),
        });
    }
    // The validated labels scatter on the host through the seam, then move to their device.
    let host_labels = Tensor::from_vec(values, &shape, Device::Cpu)?;
    Ok(scatter_ones(&host_labels, classes)?.to_device(labels.device())?)
}

/// `one_hot` of device labels with a known class count, without reading them back: the scatter
/// runs on the labels' device, which checks every label against `[0, C)` there; a bad one is
/// reported by kiln-device (value and position) at the next synchronisation rather than here.
fn one_hot_on_device(labels: &Tensor, classes: usize) -> Result<Tensor> {
    scatter_ones(labels, classes)
}

/// A zero `[..labels, C]` int64 tensor with 1 scattered at each label along the last dim (the
/// seam's `scatter`, on the labels' device).
fn scatter_ones(labels: &Tensor, classes: usize) -> Result<Tensor> {
    check_label_dtype("one_hot", labels)?;
    let index = labels.to_dtype(DType::I64)?.unsqueeze(-1)?;
    let mut out_shape = labels.shape().to_vec();
    out_shape.push(classes);
    // The output's size comes from user input: refuse one that cannot be addressed before asking
    // the allocator (which then refuses, with its out-of-memory report, one larger than memory).
    let addressable = kiln_device::checked_numel(&out_shape)
        .and_then(|n| n.checked_mul(DType::I64.size_in_bytes()))
        .is_some_and(|bytes| bytes <= isize::MAX as usize);
    if !addressable {
        return Err(crate::error::arg_err(
            "one_hot",
            format!(
                "num_classes = {classes} makes an output of shape {out_shape:?}, too many int64 \
                 elements to address; pass the real number of classes"
            ),
        ));
    }
    let zeros = Tensor::zeros(&out_shape, DType::I64, labels.device())?;
    let ones = Tensor::ones(index.shape(), DType::I64, labels.device())?;
    Ok(zeros.scatter(-1, &index, &ones)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The device path is plain tensor ops, so it runs on the CPU too: it must give exactly
    /// what the host path gives, for I64 and U8 labels of any rank.
    #[test]
    fn the_device_composition_equals_the_host_path() {
        let cases: [(&[usize], Vec<i64>); 3] = [
            (&[5], vec![0, 3, 1, 3, 2]),
            (&[2, 3], vec![4, 0, 0, 1, 2, 3]),
            (&[], vec![2]),
        ];
        for (shape, values) in cases {
            let labels = Tensor::from_vec(values.clone(), shape, Device::Cpu).unwrap();
            let want = one_hot(&labels, Some(5)).unwrap();
            let got = one_hot_on_device(&labels, 5).unwrap();
            assert_eq!(got.shape(), want.shape());
            assert_eq!(got.to_vec::<i64>().unwrap(), want.to_vec::<i64>().unwrap());
            let bytes: Vec<u8> = values.iter().map(|&v| v as u8).collect();
            let u8_labels = Tensor::from_vec(bytes, shape, Device::Cpu).unwrap();
            let got = one_hot_on_device(&u8_labels, 5).unwrap();
            assert_eq!(got.to_vec::<i64>().unwrap(), want.to_vec::<i64>().unwrap());
        }
        let floats = Tensor::from_vec(vec![1f32], &[1], Device::Cpu).unwrap();
        let err = one_hot_on_device(&floats, 5).unwrap_err().to_string();
        assert!(err.contains("to_dtype(DType::I64)"), "{err}");
    }

    #[test]
    fn empty_labels_with_a_class_count_give_an_empty_one_hot() {
        let labels = Tensor::from_vec(Vec::<i64>::new(), &[0], Device::Cpu).unwrap();
        let out = one_hot(&labels, Some(3)).unwrap();
        assert_eq!(out.shape(), &[0, 3]);
        let labels = Tensor::from_vec(Vec::<i64>::new(), &[2, 0], Device::Cpu).unwrap();
        assert_eq!(one_hot(&labels, Some(4)).unwrap().shape(), &[2, 0, 4]);
    }
}
