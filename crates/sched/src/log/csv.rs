//! CSV scalar log: one row per logged value, `wall_time,step,tag,value`, full f64 precision.
//!
//! Long format (one row per value rather than one column per tag) so the file can be appended
//! to forever without knowing the tags in advance, and re-opened by a resumed run: the header
//! is written only when the file is empty. Values are written with Rust's shortest round-trip
//! formatting, so reading them back gives the exact f64.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Result, SchedError};

/// The header line.
pub const HEADER: &str = "wall_time,step,tag,value";

/// Appends scalar rows to a CSV file.
#[derive(Debug)]
pub struct CsvWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

/// Quote a field when it holds a comma, quote or line break (RFC 4180).
pub fn quote(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_string()
    }
}

impl CsvWriter {
    /// Open `path` for appending (creating it and its folder if needed).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let io = |source| SchedError::Io {
            path: path.clone(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .map_err(io)?;
        let empty = file.metadata().map_err(io)?.len() == 0;
        let mut w = Self {
            out: BufWriter::new(file),
            path,
        };
        if empty {
            w.write_line(HEADER)?;
        }
        Ok(w)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_line(&mut self, line: &str) -> Result<()> {
        writeln!(self.out, "{line}").map_err(|source| SchedError::Io {
            path: self.path.clone(),
            source,
        })
    }

    /// Append one row.
    pub fn write_row(&mut self, wall_time: f64, step: i64, tag: &str, value: f64) -> Result<()> {
        let line = format!("{wall_time:.6},{step},{},{value:?}", quote(tag));
        self.write_line(&line)
    }

    /// Hand everything written so far to the OS.
    pub fn flush(&mut self) -> Result<()> {
        self.out.flush().map_err(|source| SchedError::Io {
            path: self.path.clone(),
            source,
        })
    }
}

impl Drop for CsvWriter {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}
