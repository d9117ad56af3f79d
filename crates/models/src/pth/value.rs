//! The values a pickle of a `state_dict` builds, and the allow-list of globals it may name.
//!
//! Invariants: a [`Global`] exists only for the names [`resolve_global`] accepts, so holding one
//! proves the stream named an allowed callable; records ([`StorageRef`], [`TensorRecord`]) are
//! plain data, checked against the storage bytes only when a tensor is materialised.

use super::error::PthError;
use kiln_autograd::DType;
use std::rc::Rc;

/// A pickled value; containers are indices into [`Unpickled::objects`].
#[derive(Debug, Clone)]
pub(crate) enum Value {
    None,
    Bool(bool),
    Int(i128),
    // Read only through `Debug`, in error messages that show a value.
    Float(#[allow(dead_code)] f64),
    Str(Rc<str>),
    Bytes(#[allow(dead_code)] Rc<[u8]>),
    Obj(usize),
}

/// An allowed global.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Global {
    OrderedDict,
    RebuildTensorV2,
    RebuildParameter,
    RebuildParameterWithState,
    RebuildFromTypeV2,
    TensorType,
    ParameterType,
    Storage(StorageDtype),
}

/// A storage named by a persistent id: `('storage', type, key, location, numel, ...)`.
#[derive(Debug, Clone)]
pub(crate) struct StorageRef {
    pub dtype: StorageDtype,
    pub key: String,
    pub numel: u64,
}

/// What `_rebuild_tensor_v2` was called with: a view of a storage.
#[derive(Debug, Clone)]
pub(crate) struct TensorRecord {
    pub storage: StorageRef,
    pub offset: u64,
    pub size: Vec<u64>,
    pub stride: Vec<u64>,
}

/// A container or record built by the stream.
#[derive(Debug, Clone)]
pub(crate) enum Object {
    List(Vec<Value>),
    Tuple(Vec<Value>),
    /// A dict or `OrderedDict`, in insertion order, with what `BUILD` set on it (`_metadata`).
    Dict {
        items: Vec<(Value, Value)>,
        state: Option<Value>,
    },
    Global(Global),
    Storage(StorageRef),
    Tensor(TensorRecord),
}

/// Resolves a `GLOBAL module name` against the allow-list.
pub(crate) fn resolve_global(module: &str, name: &str) -> Result<Global, PthError> {
    Ok(match (module, name) {
        ("collections", "OrderedDict") => Global::OrderedDict,
        ("torch._utils", "_rebuild_tensor_v2") => Global::RebuildTensorV2,
        ("torch._utils", "_rebuild_parameter") => Global::RebuildParameter,
        ("torch._utils", "_rebuild_parameter_with_state") => Global::RebuildParameterWithState,
        ("torch._tensor", "_rebuild_from_type_v2") => Global::RebuildFromTypeV2,
        ("torch", "Tensor") => Global::TensorType,
        ("torch.nn.parameter", "Parameter") => Global::ParameterType,
        ("torch", storage) => match StorageDtype::from_storage_name(storage) {
            Some(d) => Global::Storage(d),
            None => return Err(unknown_global(module, name)),
        },
        _ => return Err(unknown_global(module, name)),
    })
}

fn unknown_global(module: &str, name: &str) -> PthError {
    PthError::UnknownGlobal {
        module: module.to_string(),
        name: name.to_string(),
    }
}

/// The opcode names of the pickle protocol that this reader does not accept, for errors.
pub(crate) fn opcode_name(op: u8) -> &'static str {
    match op {
        b'I' => "INT",
        b'L' => "LONG",
        b'S' => "STRING",
        b'V' => "UNICODE",
        b'F' => "FLOAT",
        b'p' => "PUT",
        b'g' => "GET",
        b'd' => "DICT",
        b'l' => "LIST",
        b'i' => "INST",
        b'o' => "OBJ",
        b'P' => "PERSID",
        0x81 => "NEWOBJ",
        0x92 => "NEWOBJ_EX",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => "not a pickle opcode",
    }
}

/// The element type of a `torch.*Storage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StorageDtype {
    Float,
    Double,
    Half,
    BFloat16,
    Long,
    Int,
    Short,
    Char,
    Byte,
    Bool,
}

impl StorageDtype {
    pub(crate) fn from_storage_name(name: &str) -> Option<Self> {
        Some(match name {
            "FloatStorage" => Self::Float,
            "DoubleStorage" => Self::Double,
            "HalfStorage" => Self::Half,
            "BFloat16Storage" => Self::BFloat16,
            "LongStorage" => Self::Long,
            "IntStorage" => Self::Int,
            "ShortStorage" => Self::Short,
            "CharStorage" => Self::Char,
            "ByteStorage" => Self::Byte,
            "BoolStorage" => Self::Bool,
            _ => return None,
        })
    }

    pub(crate) fn element_size(self) -> usize {
        match self {
            Self::Float | Self::Int => 4,
            Self::Double | Self::Long => 8,
            Self::Half | Self::BFloat16 | Self::Short => 2,
            Self::Char | Self::Byte | Self::Bool => 1,
        }
    }

    pub(crate) fn kiln_dtype(self) -> Option<DType> {
        Some(match self {
            Self::Float => DType::F32,
            Self::Double => DType::F64,
            Self::Half => DType::F16,
            Self::BFloat16 => DType::BF16,
            Self::Long => DType::I64,
            Self::Byte => DType::U8,
            Self::Bool => DType::Bool,
            Self::Int | Self::Short | Self::Char => return None,
        })
    }
}

/// The storage a persistent id `('storage', type, key, location, numel, ...)` names; `len` is
/// the number of fields the format writes (5 in zip archives, 6 in the legacy stream).
pub(crate) fn storage_ref(
    fields: &[Value],
    objects: &[Object],
    len: usize,
) -> Result<StorageRef, PthError> {
    if fields.len() != len {
        return Err(pickle_err(format!(
            "a persistent id with {} fields where a storage has {len}",
            fields.len()
        )));
    }
    match &fields[0] {
        Value::Str(s) if &**s == "storage" => {}
        other => {
            return Err(pickle_err(format!(
                "a persistent id of kind {other:?}; only storages belong in a state_dict"
            )))
        }
    }
    let dtype = match &fields[1] {
        Value::Obj(i) => match objects[*i] {
            Object::Global(Global::Storage(d)) => d,
            _ => {
                return Err(pickle_err(
                    "a persistent id whose type is not a torch storage type",
                ))
            }
        },
        _ => {
            return Err(pickle_err(
                "a persistent id whose type is not a torch storage type",
            ))
        }
    };
    let key = match &fields[2] {
        Value::Str(s) => s.to_string(),
        _ => return Err(pickle_err("a persistent id whose key is not a string")),
    };
    let numel = match fields[4] {
        Value::Int(n) => {
            u64::try_from(n).map_err(|_| pickle_err(format!("a storage of {n} elements")))?
        }
        _ => {
            return Err(pickle_err(
                "a persistent id whose element count is not an integer",
            ))
        }
    };
    Ok(StorageRef { dtype, key, numel })
}

fn pickle_err(msg: impl Into<String>) -> PthError {
    PthError::Pickle(msg.into())
}
