//! The typed errors of the `.pth` reader.
//!
//! Invariants: every variant names what is wrong and what to do about it; none carries more
//! than a bounded excerpt of the file (names and counts, never its bytes).

/// What is wrong with a `.pth` file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PthError {
    /// The bytes are neither a zip archive nor a legacy `torch.save` stream.
    #[error(
        "not a PyTorch checkpoint: it starts with neither a zip header nor a pickle; pass a file \
         written by torch.save"
    )]
    NotPth,
    /// The zip container is malformed or truncated.
    #[error("bad zip container: {0}")]
    Zip(String),
    /// The pickle stream is malformed or truncated.
    #[error("bad pickle: {0}")]
    Pickle(String),
    /// An opcode this reader does not run (it reads the subset `torch.save` writes for a
    /// `state_dict`).
    #[error(
        "pickle opcode {opcode:#04x} ({name}) at offset {offset} is not part of a state_dict; \
         save only model.state_dict() with torch.save"
    )]
    UnknownOpcode {
        /// The opcode byte.
        opcode: u8,
        /// Its name in Python's `pickletools`, where it has one.
        name: &'static str,
        /// Its offset in the pickle.
        offset: usize,
    },
    /// A global outside the allow-list: the file would run or build something other than
    /// tensors and dicts.
    #[error(
        "the pickle names the global {module}.{name}, which is not part of a state_dict and is \
         never run; save only model.state_dict() (a dict of tensors) with torch.save"
    )]
    UnknownGlobal {
        /// The module part (`builtins`, `torch.nn.modules.linear`, ...).
        module: String,
        /// The name part.
        name: String,
    },
    /// A tensor whose offset, sizes or strides reach outside its storage, or a storage record
    /// that is missing or shorter than the pickle says.
    #[error("tensor {name:?}: {msg}")]
    Bounds {
        /// The state-dict key.
        name: String,
        /// What does not fit.
        msg: String,
    },
    /// A tensor of a dtype kiln does not store (int32, int16, int8, complex, ...).
    #[error(
        "tensor {name:?} is stored as {storage}, which kiln does not hold; convert it in \
         PyTorch (for example t.float() or t.long()) before saving"
    )]
    UnsupportedDtype {
        /// The state-dict key.
        name: String,
        /// The storage type (`IntStorage`, ...).
        storage: String,
    },
    /// The pickle is valid but is not a flat dict of tensors.
    #[error("{0}")]
    NotStateDict(String),
}
