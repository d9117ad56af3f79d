//! Reading dataset files: whole-file reads, transparent gzip (detected by its magic bytes
//! `1f 8b`, not by the file name), and the typed format errors every parser reports through.

use crate::error::{Error, Result};
use flate2::read::GzDecoder;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The bytes of the regular file at `path` (links followed). Anything else is an error before
/// it is opened: reading a named pipe would wait for a writer forever, and a folder or a device
/// is never a data file.
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>> {
    if !std::fs::metadata(path).map_err(io_err(path))?.is_file() {
        return Err(io_err(path)(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a folder, pipe, socket or device)",
        )));
    }
    std::fs::read(path).map_err(io_err(path))
}

/// An operating-system error on `path` as kiln-data's [`Error::Io`], for `map_err`.
pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A dataset file's bytes (decompressed when it was gzip) and where they came from.
pub(crate) struct FileBytes {
    pub(crate) path: PathBuf,
    pub(crate) bytes: Vec<u8>,
    pub(crate) decompressed: bool,
}

impl FileBytes {
    /// Reads `path`, gunzipping it when it starts with the gzip magic bytes.
    pub(crate) fn read(path: &Path) -> Result<Self> {
        let raw = read_file(path)?;
        if raw.len() >= 2 && raw[0] == 0x1f && raw[1] == 0x8b {
            let mut bytes = Vec::new();
            if let Err(source) = GzDecoder::new(raw.as_slice()).read_to_end(&mut bytes) {
                return Err(Error::Gzip {
                    path: path.to_path_buf(),
                    decompressed_bytes: bytes.len() as u64,
                    source,
                });
            }
            return Ok(FileBytes {
                path: path.to_path_buf(),
                bytes,
                decompressed: true,
            });
        }
        Ok(FileBytes {
            path: path.to_path_buf(),
            bytes: raw,
            decompressed: false,
        })
    }

    /// A format error at `offset`.
    pub(crate) fn error(
        &self,
        offset: usize,
        expected: impl Into<String>,
        found: impl Into<String>,
    ) -> Error {
        Error::Format {
            path: self.path.clone(),
            offset: offset as u64,
            decompressed: self.decompressed,
            expected: expected.into(),
            found: found.into(),
        }
    }

    /// The big-endian `u32` at `offset`, or a truncation error saying what it should have been.
    pub(crate) fn be_u32(&self, offset: usize, what: &str) -> Result<u32> {
        match self.bytes.get(offset..offset + 4) {
            Some(b) => Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            None => Err(self.error(
                offset,
                format!("a 4-byte big-endian {what}"),
                format!("end of data ({} bytes in all)", self.bytes.len()),
            )),
        }
    }
}

/// The first of `names` (each tried plain and with `.gz`) that exists in `dir`.
pub(crate) fn find(dir: &Path, names: &[&str], what: &str, fix: &str) -> Result<PathBuf> {
    let mut tried = Vec::new();
    for name in names {
        for candidate in [dir.join(name), dir.join(format!("{name}.gz"))] {
            if candidate.is_file() {
                return Ok(candidate);
            }
            tried.push(candidate);
        }
    }
    Err(Error::MissingFile {
        what: what.to_string(),
        looked_for: tried,
        fix: fix.to_string(),
    })
}
