//! The legacy `torch.save` stream (PyTorch before 1.6, or `_use_new_zipfile_serialization=False`):
//! a magic-number pickle, a protocol-version pickle, a system-info pickle (byte order), the
//! state-dict pickle, a pickle listing the storage keys, then each storage as an 8-byte element
//! count followed by its raw elements.
//!
//! Invariants: each pickle and each storage is read from the bytes left after the previous one,
//! every count is checked against those bytes before it is used, and a storage's element size
//! comes from the type its persistent id named, so no read leaves the input.

use super::error::PthError;
use super::pickle::unpickle;
use super::tensor::{materialise, state_dict_records, Located, OutputBudget};
use super::value::{storage_ref, Object, StorageDtype, Value};
use crate::checkpoint::NamedTensors;
use std::collections::HashMap;

/// `torch.serialization.MAGIC_NUMBER`.
const MAGIC_NUMBER: i128 = 0x1950a86a20f9469cfc6c;
/// `torch.serialization.PROTOCOL_VERSION`.
const PROTOCOL_VERSION: i128 = 1001;

fn bad(msg: impl Into<String>) -> PthError {
    PthError::Pickle(msg.into())
}

fn no_persistent_ids(_: &[Value], _: &[Object]) -> Result<Object, PthError> {
    Err(bad("a persistent id in a header pickle"))
}

fn take<'b>(bytes: &'b [u8], at: &mut usize, n: u64, what: &str) -> Result<&'b [u8], PthError> {
    let end = usize::try_from(n)
        .ok()
        .and_then(|n| at.checked_add(n))
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| {
            bad(format!(
                "{what} wants {n} bytes at offset {at} of a {}-byte file: it is cut short",
                bytes.len()
            ))
        })?;
    let s = &bytes[*at..end];
    *at = end;
    Ok(s)
}

/// Reads a legacy `torch.save` stream of a `state_dict`.
pub(crate) fn read(bytes: &[u8]) -> Result<NamedTensors, PthError> {
    let mut at = 0usize;
    let magic = unpickle(bytes, no_persistent_ids)?;
    at += magic.consumed;
    if !matches!(magic.top, Value::Int(MAGIC_NUMBER)) {
        return Err(PthError::NotPth);
    }
    let proto = unpickle(&bytes[at..], no_persistent_ids)?;
    at += proto.consumed;
    if !matches!(proto.top, Value::Int(PROTOCOL_VERSION)) {
        return Err(bad(format!(
            "legacy protocol {:?}; only {PROTOCOL_VERSION} is read",
            proto.top
        )));
    }
    let sys = unpickle(&bytes[at..], no_persistent_ids)?;
    at += sys.consumed;
    let big_endian = match &sys.top {
        Value::Obj(i) => match &sys.objects[*i] {
            Object::Dict { items, .. } => items.iter().any(|(k, v)| {
                matches!(k, Value::Str(s) if &**s == "little_endian")
                    && matches!(v, Value::Bool(false))
            }),
            _ => false,
        },
        _ => false,
    };
    let mut dtypes: HashMap<String, StorageDtype> = HashMap::new();
    let main = unpickle(&bytes[at..], |fields: &[Value], objects: &[Object]| {
        let s = storage_ref(fields, objects, 6)?;
        if !matches!(fields[5], Value::None) {
            return Err(bad(format!(
                "storage {:?} is a view of another storage, which this reader does not \
                 support; re-save the file with a current PyTorch",
                s.key
            )));
        }
        dtypes.insert(s.key.clone(), s.dtype);
        Ok(Object::Storage(s))
    })?;
    at += main.consumed;
    let keys = unpickle(&bytes[at..], no_persistent_ids)?;
    at += keys.consumed;
    let key_list: Vec<String> = match &keys.top {
        Value::Obj(i) => match &keys.objects[*i] {
            Object::List(l) => l
                .iter()
                .map(|v| match v {
                    Value::Str(s) => Ok(s.to_string()),
                    _ => Err(bad("a storage key that is not a string")),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(bad("the storage keys are not a list")),
        },
        _ => return Err(bad("the storage keys are not a list")),
    };
    let mut storages: HashMap<String, &[u8]> = HashMap::new();
    for key in key_list {
        let dtype = *dtypes
            .get(&key)
            .ok_or_else(|| bad(format!("storage {key:?} is listed but never used")))?;
        let count: [u8; 8] = take(bytes, &mut at, 8, "a storage's element count")?
            .try_into()
            .map_err(|_| bad("a storage's element count"))?;
        let count = if big_endian {
            u64::from_be_bytes(count)
        } else {
            u64::from_le_bytes(count)
        };
        let len = count
            .checked_mul(dtype.element_size() as u64)
            .ok_or_else(|| bad(format!("storage {key:?} of {count} elements")))?;
        let data = take(bytes, &mut at, len, &format!("storage {key:?}"))?;
        storages.insert(key, data);
    }
    let mut budget = OutputBudget::for_input(bytes.len());
    let records = state_dict_records(&main.top, &main.objects)?;
    let mut out = Vec::with_capacity(records.len());
    for (name, record) in records {
        let storage = *storages
            .get(&record.storage.key)
            .ok_or_else(|| PthError::Bounds {
                name: name.clone(),
                msg: format!("its storage {:?} is not in the file", record.storage.key),
            })?;
        let located = Located {
            record,
            storage,
            big_endian,
        };
        let t = materialise(&name, &located, &mut budget)?;
        out.push((name, t));
    }
    Ok(out)
}
