//! Bucket assignment: which parameters' gradients are flattened and all-reduced together.
//!
//! Invariants (PyTorch's `compute_bucket_assignment_by_size`): only parameters that require grad
//! are bucketed; they are taken in reverse registration order (the order backward usually makes
//! their gradients ready, last layer first); a bucket holds one dtype on one device; a bucket is
//! closed as soon as its byte size reaches the cap (so it may exceed the cap by its last
//! parameter, and a parameter larger than the cap is a bucket alone); buckets are numbered in the
//! order their first parameter was taken, which is the order they are all-reduced in on every
//! rank.

use kiln_autograd::{DType, Device, Parameter};

/// One bucket: its parameters (indices into the bucketed list) and their places in the flat
/// buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct Bucket {
    /// Indices of its parameters in the bucketed list (registration order), in bucket order.
    pub params: Vec<usize>,
    /// Element offset of each parameter in the flat buffer.
    pub offsets: Vec<usize>,
    /// Total elements.
    pub numel: usize,
    /// The gradients' dtype.
    pub dtype: DType,
    /// The gradients' device.
    pub device: Device,
}

impl Bucket {
    /// The flat buffer's size in bytes.
    pub fn bytes(&self) -> usize {
        self.numel.saturating_mul(self.dtype.size_in_bytes())
    }
}

/// Splits `params` (registration order, all requiring grad) into buckets of about `cap_bytes`.
pub fn assign_buckets(params: &[Parameter], cap_bytes: usize) -> Vec<Bucket> {
    // Open buckets per (dtype, device), each with its number once closed or at the end.
    let mut open: Vec<(usize, Bucket)> = Vec::new();
    let mut done: Vec<(usize, Bucket)> = Vec::new();
    let mut next_number = 0usize;
    for index in (0..params.len()).rev() {
        let p = &params[index];
        let (dtype, device) = (p.dtype(), p.device());
        let slot = match open
            .iter()
            .position(|(_, b)| b.dtype == dtype && b.device == device)
        {
            Some(slot) => slot,
            None => {
                open.push((
                    next_number,
                    Bucket {
                        params: Vec::new(),
                        offsets: Vec::new(),
                        numel: 0,
                        dtype,
                        device,
                    },
                ));
                next_number += 1;
                open.len() - 1
            }
        };
        let bucket = &mut open[slot].1;
        bucket.params.push(index);
        bucket.offsets.push(bucket.numel);
        bucket.numel = bucket.numel.saturating_add(p.numel());
        if bucket.bytes() >= cap_bytes {
            done.push(open.swap_remove(slot));
        }
    }
    done.extend(open);
    done.sort_by_key(|(number, _)| *number);
    done.into_iter().map(|(_, b)| b).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_autograd::Tensor;

    fn param(numel: usize, dtype: DType) -> Parameter {
        Parameter::new(Tensor::zeros(&[numel], dtype, Device::Cpu).unwrap()).unwrap()
    }

    #[test]
    fn buckets_take_parameters_in_reverse_order_per_dtype_and_close_at_the_cap() {
        // 4-byte elements, cap 40 bytes = 10 f32 elements.
        let params = vec![
            param(3, DType::F32),
            param(4, DType::F64),
            param(6, DType::F32),
            param(12, DType::F32),
            param(2, DType::F32),
        ];
        let buckets = assign_buckets(&params, 40);
        let summary: Vec<(Vec<usize>, Vec<usize>, usize, DType)> = buckets
            .iter()
            .map(|b| (b.params.clone(), b.offsets.clone(), b.numel, b.dtype))
            .collect();
        assert_eq!(
            summary,
            vec![
                (vec![4, 3], vec![0, 2], 14, DType::F32),
                (vec![2, 0], vec![0, 6], 9, DType::F32),
                (vec![1], vec![0], 4, DType::F64),
            ]
        );
        // A bucket closes when it reaches the cap exactly (PyTorch's `>=`): 6 + 4 elements.
        let params = vec![
            param(5, DType::F32),
            param(4, DType::F32),
            param(6, DType::F32),
        ];
        let numels: Vec<usize> = assign_buckets(&params, 40)
            .iter()
            .map(|b| b.numel)
            .collect();
        assert_eq!(numels, [10, 5]);
    }
}
