//! Errors of `kiln-data`. Every message names the file or argument, what was wrong (for a file:
//! the byte offset and what was expected there), and how to fix it.

use std::path::PathBuf;

/// Everything that can go wrong in `kiln-data`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be opened or read.
    #[error("cannot read {}: {source}; check the path and its permissions", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating-system error.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("cannot write {}: {msg}; check that the folder exists and is writable", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The underlying error, as text.
        msg: String,
        /// The operating-system error, when there is one.
        #[source]
        source: Option<std::io::Error>,
    },
    /// A dataset file that is not what its name says: a bad magic number, a bad dimension, a
    /// truncated record, an out-of-range label.
    #[error(
        "{}: corrupt or truncated at byte offset {offset}{}: expected {expected}, found {found}; \
         re-download or re-extract the file",
        path.display(),
        if *decompressed { " (of the decompressed data)" } else { "" }
    )]
    Format {
        /// The file.
        path: PathBuf,
        /// Byte offset of the problem (in the decompressed data when `decompressed`).
        offset: u64,
        /// Whether `offset` counts bytes after gzip decompression.
        decompressed: bool,
        /// What the format requires at `offset`.
        expected: String,
        /// What the file holds there.
        found: String,
    },
    /// A gzip file whose compressed stream is corrupt or cut short.
    #[error(
        "{}: corrupt or truncated gzip stream after {decompressed_bytes} decompressed bytes \
         ({source}); re-download the file, or gunzip it to check it",
        path.display()
    )]
    Gzip {
        /// The file.
        path: PathBuf,
        /// How many bytes decompressed before the error.
        decompressed_bytes: u64,
        /// The decoder's error.
        #[source]
        source: std::io::Error,
    },
    /// Two files of one dataset that disagree (image and label counts).
    #[error("{msg}")]
    Mismatch {
        /// Both files, both numbers, and the fix.
        msg: String,
    },
    /// A dataset file that is not in the folder given.
    #[error("{what}: none of {} exists; {fix}", looked_for.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    MissingFile {
        /// Which file of the dataset this is.
        what: String,
        /// The paths tried.
        looked_for: Vec<PathBuf>,
        /// How to get the file.
        fix: String,
    },
    /// An image file that cannot be decoded or encoded.
    #[error("{}: {msg}", path.display())]
    Image {
        /// The file.
        path: PathBuf,
        /// The decoder's message and the fix.
        msg: String,
    },
    /// An image whose size or channel count does not fit the model, e.g.
    /// `image is 28x28 with 1 channel; the model expects 3x32x32: ...`.
    #[error("{}: image is {found}; the model expects {expected}: {fix}", path.display())]
    ImageShape {
        /// The file.
        path: PathBuf,
        /// The image's size and channels, `HxW with C channel(s)`.
        found: String,
        /// The model's input, `CxHxW`.
        expected: String,
        /// What to pass to make it fit.
        fix: String,
    },
    /// An argument out of range or inconsistent with the dataset.
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// The function or type.
        op: &'static str,
        /// What was wrong and what to pass instead.
        msg: String,
    },
    /// A buffer sized from input that this machine cannot hold (or whose size overflows).
    #[error(
        "{op}: {what} needs {}{}: {fix}",
        requested.map_or("more than usize::MAX bytes".to_string(), |b| format!("{b} bytes")),
        available.map_or(String::new(), |a| format!(", but this machine has {a} bytes of memory"))
    )]
    OutOfMemory {
        /// The function.
        op: &'static str,
        /// What the buffer holds, e.g. `99999999999999 synthetic samples`.
        what: String,
        /// The bytes needed; `None` when that overflows `usize`.
        requested: Option<usize>,
        /// The machine's physical memory, when known.
        available: Option<usize>,
        /// What to ask for instead.
        fix: String,
    },
    /// The prefetch worker thread died (a panic while building a batch).
    #[error("data loader worker thread failed: {0}")]
    Worker(String),
    /// An error from the tensor layer while wrapping a batch.
    #[error(transparent)]
    Tensor(#[from] kiln_autograd::Error),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn arg_err(op: &'static str, msg: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op,
        msg: msg.into(),
    }
}
