//! A minimal pickle codec for plain data (dict, list, tuple, str, int, float, bool, None): the
//! writer behind [`dump_snapshot`](crate::snapshot_pickle) and the reader that reads a snapshot
//! back (kiln's own, or one `pickle.dump` wrote in Python).
//!
//! Invariants:
//! - The writer emits protocol-4 opcodes that both Python's `pickle` and the unpickler of
//!   PyTorch's `MemoryViz.js` understand (`PROTO 4`, `EMPTY_DICT` / `MARK` / `SETITEMS`,
//!   `EMPTY_LIST` / `APPENDS`, tuples, `BININT1/2`, `BININT`, `LONG1`, `BINFLOAT`,
//!   `SHORT_BINUNICODE` / `BINUNICODE`, `NEWTRUE` / `NEWFALSE`, `NONE`); no memo, no framing
//!   (both optional), no globals: the result can never run code when loaded.
//! - The reader accepts only data opcodes (any `GLOBAL`, `REDUCE`, `BUILD` is an error naming
//!   it). Containers live in an arena and the stack refers to them by index, so the memo shares
//!   them the way Python does (a dict memoized before its items were set still gets them).
//!   Every length is checked against the bytes left before anything is allocated; building
//!   the result is limited in depth and in total nodes, so shared references cannot blow up
//!   memory.

use std::fmt;

/// A pickled value of the plain-data subset.
#[derive(Debug, Clone, PartialEq)]
pub enum PickleValue {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An int (Python ints are unbounded; this subset keeps 128 bits).
    Int(i128),
    /// A float.
    Float(f64),
    /// A str.
    Str(String),
    /// A list.
    List(Vec<PickleValue>),
    /// A tuple.
    Tuple(Vec<PickleValue>),
    /// A dict, in insertion order.
    Dict(Vec<(PickleValue, PickleValue)>),
}

/// What is wrong with a pickle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PickleError {
    /// The bytes are not a pickle of the plain-data subset.
    #[error("pickle byte {offset}: {message}")]
    Malformed {
        /// Where in the input.
        offset: usize,
        /// What is wrong and what was expected.
        message: String,
    },
    /// A value cannot be written (a str over 4 GiB).
    #[error("cannot pickle: {0}")]
    Unwritable(String),
}

impl PickleValue {
    /// A str value.
    pub fn str(s: impl Into<String>) -> Self {
        PickleValue::Str(s.into())
    }

    /// An int value.
    pub fn int(v: impl Into<i128>) -> Self {
        PickleValue::Int(v.into())
    }

    /// A dict with str keys.
    pub fn dict<'a>(items: impl IntoIterator<Item = (&'a str, PickleValue)>) -> Self {
        PickleValue::Dict(
            items
                .into_iter()
                .map(|(k, v)| (PickleValue::str(k), v))
                .collect(),
        )
    }

    /// The value under str key `key` of a dict.
    pub fn get(&self, key: &str) -> Option<&PickleValue> {
        match self {
            PickleValue::Dict(items) => items
                .iter()
                .find(|(k, _)| matches!(k, PickleValue::Str(s) if s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The int, if this is one (`True` / `False` count as 1 / 0, as in Python).
    pub fn as_int(&self) -> Option<i128> {
        match *self {
            PickleValue::Int(v) => Some(v),
            PickleValue::Bool(b) => Some(b as i128),
            _ => None,
        }
    }

    /// The str, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            PickleValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The items, if this is a list or a tuple.
    pub fn as_list(&self) -> Option<&[PickleValue]> {
        match self {
            PickleValue::List(v) | PickleValue::Tuple(v) => Some(v),
            _ => None,
        }
    }

    /// The name of this value's Python type, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            PickleValue::None => "None",
            PickleValue::Bool(_) => "bool",
            PickleValue::Int(_) => "int",
            PickleValue::Float(_) => "float",
            PickleValue::Str(_) => "str",
            PickleValue::List(_) => "list",
            PickleValue::Tuple(_) => "tuple",
            PickleValue::Dict(_) => "dict",
        }
    }
}

impl fmt::Display for PickleValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PickleValue::None => f.write_str("None"),
            PickleValue::Bool(b) => f.write_str(if *b { "True" } else { "False" }),
            PickleValue::Int(v) => write!(f, "{v}"),
            PickleValue::Float(v) => write!(f, "{v:?}"),
            PickleValue::Str(s) => write!(f, "{s:?}"),
            PickleValue::List(v) | PickleValue::Tuple(v) => {
                let (open, close) = if matches!(self, PickleValue::List(_)) {
                    ("[", "]")
                } else {
                    ("(", ")")
                };
                f.write_str(open)?;
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{x}")?;
                }
                f.write_str(close)
            }
            PickleValue::Dict(items) => {
                f.write_str("{")?;
                for (i, (k, v)) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{k}: {v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

mod read;

pub use read::{from_pickle, MAX_DEPTH};
pub(crate) const PROTO: u8 = 0x80;
pub(crate) const FRAME: u8 = 0x95;
pub(crate) const STOP: u8 = b'.';
pub(crate) const MARK: u8 = b'(';
pub(crate) const POP: u8 = b'0';
pub(crate) const POP_MARK: u8 = b'1';
pub(crate) const EMPTY_DICT: u8 = b'}';
pub(crate) const DICT: u8 = b'd';
pub(crate) const SETITEM: u8 = b's';
pub(crate) const SETITEMS: u8 = b'u';
pub(crate) const EMPTY_LIST: u8 = b']';
pub(crate) const LIST: u8 = b'l';
pub(crate) const APPEND: u8 = b'a';
pub(crate) const APPENDS: u8 = b'e';
pub(crate) const EMPTY_TUPLE: u8 = b')';
pub(crate) const TUPLE: u8 = b't';
pub(crate) const TUPLE1: u8 = 0x85;
pub(crate) const TUPLE2: u8 = 0x86;
pub(crate) const TUPLE3: u8 = 0x87;
pub(crate) const BININT: u8 = b'J';
pub(crate) const BININT1: u8 = b'K';
pub(crate) const BININT2: u8 = b'M';
pub(crate) const LONG1: u8 = 0x8a;
pub(crate) const BINFLOAT: u8 = b'G';
pub(crate) const SHORT_BINUNICODE: u8 = 0x8c;
pub(crate) const BINUNICODE: u8 = b'X';
pub(crate) const BINUNICODE8: u8 = 0x8d;
pub(crate) const NONE: u8 = b'N';
pub(crate) const NEWTRUE: u8 = 0x88;
pub(crate) const NEWFALSE: u8 = 0x89;
pub(crate) const MEMOIZE: u8 = 0x94;
pub(crate) const BINPUT: u8 = b'q';
pub(crate) const LONG_BINPUT: u8 = b'r';
pub(crate) const BINGET: u8 = b'h';
pub(crate) const LONG_BINGET: u8 = b'j';

/// `value` as a protocol-4 pickle.
pub fn to_pickle(value: &PickleValue) -> Result<Vec<u8>, PickleError> {
    let mut out = vec![PROTO, 4];
    write_value(&mut out, value)?;
    out.push(STOP);
    Ok(out)
}

fn write_value(out: &mut Vec<u8>, value: &PickleValue) -> Result<(), PickleError> {
    match value {
        PickleValue::None => out.push(NONE),
        PickleValue::Bool(b) => out.push(if *b { NEWTRUE } else { NEWFALSE }),
        PickleValue::Int(v) => write_int(out, *v),
        PickleValue::Float(v) => {
            out.push(BINFLOAT);
            out.extend_from_slice(&v.to_be_bytes());
        }
        PickleValue::Str(s) => {
            if s.len() < 256 {
                out.extend_from_slice(&[SHORT_BINUNICODE, s.len() as u8]);
            } else {
                let len = u32::try_from(s.len()).map_err(|_| {
                    PickleError::Unwritable(format!(
                        "a str of {} bytes is over BINUNICODE's 4 GiB",
                        s.len()
                    ))
                })?;
                out.push(BINUNICODE);
                out.extend_from_slice(&len.to_le_bytes());
            }
            out.extend_from_slice(s.as_bytes());
        }
        PickleValue::List(items) => {
            out.push(EMPTY_LIST);
            if !items.is_empty() {
                out.push(MARK);
                for x in items {
                    write_value(out, x)?;
                }
                out.push(APPENDS);
            }
        }
        PickleValue::Tuple(items) => {
            match items.len() {
                0 => out.push(EMPTY_TUPLE),
                1..=3 => {
                    for x in items {
                        write_value(out, x)?;
                    }
                    out.push([TUPLE1, TUPLE2, TUPLE3][items.len() - 1]);
                }
                _ => {
                    out.push(MARK);
                    for x in items {
                        write_value(out, x)?;
                    }
                    out.push(TUPLE);
                }
            };
        }
        PickleValue::Dict(items) => {
            out.push(EMPTY_DICT);
            if !items.is_empty() {
                out.push(MARK);
                for (k, v) in items {
                    write_value(out, k)?;
                    write_value(out, v)?;
                }
                out.push(SETITEMS);
            }
        }
    }
    Ok(())
}

fn write_int(out: &mut Vec<u8>, v: i128) {
    if (0..256).contains(&v) {
        out.extend_from_slice(&[BININT1, v as u8]);
    } else if (0..65536).contains(&v) {
        out.push(BININT2);
        out.extend_from_slice(&(v as u16).to_le_bytes());
    } else if let Ok(small) = i32::try_from(v) {
        out.push(BININT);
        out.extend_from_slice(&small.to_le_bytes());
    } else {
        // Shortest little-endian two's complement whose top bit carries the sign.
        let bytes = v.to_le_bytes();
        let mut n = bytes.len();
        while n > 1 {
            let (top, below) = (bytes[n - 1], bytes[n - 2]);
            let redundant = (top == 0 && below < 0x80) || (top == 0xff && below >= 0x80);
            if !redundant {
                break;
            }
            n -= 1;
        }
        out.extend_from_slice(&[LONG1, n as u8]);
        out.extend_from_slice(&bytes[..n]);
    }
}
