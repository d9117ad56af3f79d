//! From pickled records to kiln tensors: the state dict's `(name, record)` pairs, and each
//! record's view copied out of its storage.
//!
//! Invariants: a record's offset, sizes and strides are checked with checked arithmetic against
//! its storage's element count (itself checked against the storage's bytes) before any element
//! is read; a view holds at most as many elements as its storage, and all the tensors of one
//! file at most [`OUTPUT_FACTOR`] times the file's bytes, so a load's memory is bounded by its
//! input; dimensions of size 1 ignore their stride.

use super::error::PthError;
use super::value::{Object, TensorRecord, Value};
use crate::checkpoint::tensor_from_le_bytes;
use kiln_autograd::{DType, Tensor};
use std::collections::HashMap;

/// The most dimensions a tensor in a `.pth` file may have.
pub(crate) const MAX_DIMS: usize = 64;

/// How many times its own size the tensors of one file may add up to: views sharing a storage
/// (tied weights, slices) are copied once per name, and a hostile file could name one large
/// storage many times over.
const OUTPUT_FACTOR: u64 = 8;

/// The bytes of tensors a load may still produce.
pub(crate) struct OutputBudget {
    left: u64,
}

impl OutputBudget {
    /// The budget of a file of `len` bytes.
    pub(crate) fn for_input(len: usize) -> Self {
        OutputBudget {
            left: (len as u64)
                .saturating_mul(OUTPUT_FACTOR)
                .saturating_add(1 << 20),
        }
    }

    fn spend(&mut self, name: &str, bytes: u64) -> Result<(), PthError> {
        self.left = self.left.checked_sub(bytes).ok_or_else(|| {
            bounds(
                name,
                format!(
                    "the file's tensors add up to more than {OUTPUT_FACTOR} times its size: the \
                     same storage is named over and over; save tensors that own their data \
                     (t.clone()) instead"
                ),
            )
        })?;
        Ok(())
    }
}

/// A tensor's record with the storage bytes it views and their byte order.
pub(crate) struct Located<'b> {
    pub record: TensorRecord,
    pub storage: &'b [u8],
    pub big_endian: bool,
}

/// The `(key, tensor record)` pairs of a pickled `state_dict`.
pub(crate) fn state_dict_records(
    top: &Value,
    objects: &[Object],
) -> std::result::Result<Vec<(String, TensorRecord)>, PthError> {
    let items = match top {
        Value::Obj(i) => match &objects[*i] {
            Object::Dict { items, .. } => items,
            other => return Err(not_state_dict(other)),
        },
        other => {
            return Err(PthError::NotStateDict(format!(
                "the file holds {other:?}, not a state_dict; save model.state_dict() with \
                 torch.save"
            )))
        }
    };
    let mut out: Vec<(String, TensorRecord)> = Vec::with_capacity(items.len());
    let mut index: HashMap<String, usize> = HashMap::new();
    for (k, v) in items {
        let Value::Str(name) = k else {
            return Err(PthError::NotStateDict(format!(
                "a key of the dict is {k:?}, not a string; a state_dict maps names to tensors"
            )));
        };
        let record = match v {
            Value::Obj(i) => match &objects[*i] {
                Object::Tensor(t) => t.clone(),
                Object::Dict { .. } => {
                    return Err(PthError::NotStateDict(format!(
                        "{name:?} holds a dict, not a tensor: this is a training checkpoint; \
                         save checkpoint[{name:?}] (the state_dict itself) with torch.save"
                    )))
                }
                _ => return Err(not_tensor(name)),
            },
            _ => return Err(not_tensor(name)),
        };
        match index.get(name.as_ref()) {
            Some(&at) => out[at].1 = record,
            None => {
                index.insert(name.to_string(), out.len());
                out.push((name.to_string(), record));
            }
        }
    }
    Ok(out)
}

fn not_state_dict(o: &Object) -> PthError {
    let kind = match o {
        Object::List(_) => "a list",
        Object::Tuple(_) => "a tuple",
        Object::Tensor(_) => "a single tensor",
        _ => "something else",
    };
    PthError::NotStateDict(format!(
        "the file holds {kind}, not a state_dict; save model.state_dict() with torch.save"
    ))
}

fn not_tensor(name: &str) -> PthError {
    PthError::NotStateDict(format!(
        "{name:?} is not a tensor; a state_dict holds only tensors (save model.state_dict())"
    ))
}

fn bounds(name: &str, msg: impl Into<String>) -> PthError {
    PthError::Bounds {
        name: name.to_string(),
        msg: msg.into(),
    }
}

/// Copies a (possibly strided, offset) view out of its storage into a contiguous kiln tensor.
pub(crate) fn materialise(
    name: &str,
    at: &Located<'_>,
    budget: &mut OutputBudget,
) -> std::result::Result<Tensor, PthError> {
    let rec = &at.record;
    let dtype = rec
        .storage
        .dtype
        .kiln_dtype()
        .ok_or_else(|| PthError::UnsupportedDtype {
            name: name.to_string(),
            storage: format!("{:?}Storage", rec.storage.dtype),
        })?;
    let es = rec.storage.dtype.element_size();
    let storage_numel = (at.storage.len() / es) as u64;
    if rec.storage.numel > storage_numel {
        return Err(bounds(
            name,
            format!(
                "its storage should hold {} elements but has bytes for {storage_numel}",
                rec.storage.numel
            ),
        ));
    }
    let storage_numel = rec.storage.numel;
    if rec.size.len() > MAX_DIMS {
        return Err(bounds(name, format!("{} dimensions", rec.size.len())));
    }
    let too_big = || bounds(name, format!("its size {:?} overflows", rec.size));
    let numel = rec
        .size
        .iter()
        .try_fold(1u64, |n, &s| n.checked_mul(s))
        .ok_or_else(too_big)?;
    let shape: Vec<usize> = rec
        .size
        .iter()
        .map(|&s| usize::try_from(s).map_err(|_| too_big()))
        .collect::<std::result::Result<_, _>>()?;
    if numel == 0 {
        return to_tensor(name, dtype, &shape, &[]);
    }
    if numel > storage_numel {
        return Err(bounds(
            name,
            format!(
                "the view has {numel} elements, more than its storage's {storage_numel} (a \
                 stride-0 expand?); save t.contiguous() instead"
            ),
        ));
    }
    budget.spend(name, numel * es as u64)?;
    // Dimensions of size 1 never move, whatever their stride says.
    let stride: Vec<u64> = rec
        .size
        .iter()
        .zip(&rec.stride)
        .map(|(&s, &st)| if s == 1 { 0 } else { st })
        .collect();
    let reach = rec
        .size
        .iter()
        .zip(&stride)
        .try_fold(rec.offset, |acc, (&s, &st)| {
            (s - 1).checked_mul(st).and_then(|d| acc.checked_add(d))
        })
        .filter(|&last| last < storage_numel);
    if reach.is_none() {
        return Err(bounds(
            name,
            format!(
                "offset {} with size {:?} and stride {:?} reaches past its storage of \
                 {storage_numel} elements",
                rec.offset, rec.size, rec.stride
            ),
        ));
    }
    // Every position below is at most `last`, so it and `* es` fit in the storage's length.
    let es64 = es as u64;
    let mut out = Vec::with_capacity(numel as usize * es);
    let contiguous = {
        let mut expect = 1u64;
        let mut ok = true;
        for (&s, &st) in rec.size.iter().zip(&stride).rev() {
            if s != 1 && st != expect {
                ok = false;
            }
            expect = expect.saturating_mul(s);
        }
        ok
    };
    if contiguous {
        let start = (rec.offset * es64) as usize;
        out.extend_from_slice(&at.storage[start..start + numel as usize * es]);
    } else {
        let nd = shape.len();
        let mut idx = vec![0u64; nd];
        let mut pos = rec.offset;
        for _ in 0..numel {
            let b = (pos * es64) as usize;
            out.extend_from_slice(&at.storage[b..b + es]);
            for d in (0..nd).rev() {
                idx[d] += 1;
                pos = pos.wrapping_add(stride[d]);
                if idx[d] < rec.size[d] {
                    break;
                }
                pos = pos.wrapping_sub(stride[d].wrapping_mul(rec.size[d]));
                idx[d] = 0;
            }
        }
    }
    if at.big_endian && es > 1 {
        out.chunks_exact_mut(es).for_each(|c| c.reverse());
    }
    to_tensor(name, dtype, &shape, &out)
}

fn to_tensor(
    name: &str,
    dtype: DType,
    shape: &[usize],
    bytes: &[u8],
) -> std::result::Result<Tensor, PthError> {
    tensor_from_le_bytes(dtype, shape, bytes).map_err(|e| bounds(name, e.to_string()))
}
