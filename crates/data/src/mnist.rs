//! MNIST in its IDX files (`train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-...`),
//! plain or gzip (as downloaded), also the format of Fashion-MNIST and KMNIST.
//!
//! IDX: a 4-byte magic `00 00 08 NN` (`08` = unsigned bytes, `NN` = number of dimensions), then
//! `NN` big-endian `u32` sizes, then the data row-major. Images are `[N, rows, cols]`, labels
//! `[N]`. Every check reports the file and the byte offset where the file stops matching this.

use crate::dataset::{ImageDataset, Split};
use crate::error::{Error, Result};
use crate::files::{find, FileBytes};
use std::path::Path;

/// MNIST's class names (the digits).
pub const CLASSES: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];

/// Magic number of an IDX file of unsigned bytes with `ndim` dimensions.
fn magic(ndim: u8) -> u32 {
    0x0000_0800 | ndim as u32
}

/// Checks the magic number and reads the `ndim` sizes; returns them and the data offset.
fn header(file: &FileBytes, ndim: u8, what: &str) -> Result<(Vec<usize>, usize)> {
    let found = file.be_u32(0, &format!("magic number 0x{:08x}", magic(ndim)))?;
    if found != magic(ndim) {
        return Err(file.error(
            0,
            format!(
                "magic number 0x{:08x} (IDX {what}: unsigned bytes, {ndim} dimension{})",
                magic(ndim),
                if ndim == 1 { "" } else { "s" }
            ),
            format!("0x{found:08x}"),
        ));
    }
    let mut dims = Vec::with_capacity(ndim as usize);
    for k in 0..ndim as usize {
        let offset = 4 + 4 * k;
        let d = file.be_u32(offset, &format!("size of dimension {k}"))?;
        if d == 0 && k > 0 {
            return Err(file.error(
                offset,
                format!("a nonzero size of dimension {k}"),
                "0".to_string(),
            ));
        }
        dims.push(d as usize);
    }
    Ok((dims, 4 + 4 * ndim as usize))
}

/// Checks that the data after the header is exactly `len` bytes.
fn check_len(file: &FileBytes, start: usize, len: usize, what: &str) -> Result<()> {
    let have = file.bytes.len();
    let Some(end) = start.checked_add(len) else {
        return Err(file.error(
            have,
            format!("{what}: {len} bytes from offset {start}"),
            format!("end of data ({have} bytes in all)"),
        ));
    };
    if have < end {
        return Err(file.error(
            have,
            format!("{what}: {len} bytes from offset {start} to {end}"),
            format!("end of data ({have} bytes in all)"),
        ));
    }
    if have > end {
        return Err(file.error(
            end,
            format!("end of data after {what}"),
            format!("{} extra bytes", have - end),
        ));
    }
    Ok(())
}

/// Parses an IDX3 image file: `(count, rows, cols, pixels)`.
fn parse_images(file: &FileBytes) -> Result<(usize, usize, usize, Vec<u8>)> {
    let (dims, start) = header(file, 3, "images")?;
    let (n, rows, cols) = (dims[0], dims[1], dims[2]);
    let what = format!("{n} images of {rows}x{cols}");
    let Some(len) = n.checked_mul(rows).and_then(|v| v.checked_mul(cols)) else {
        return Err(file.error(
            4,
            format!("sizes whose product fits in memory ({what})"),
            "an overflowing product",
        ));
    };
    check_len(file, start, len, &what)?;
    Ok((n, rows, cols, file.bytes[start..].to_vec()))
}

/// Parses an IDX1 label file; every label must be a digit.
fn parse_labels(file: &FileBytes) -> Result<Vec<i64>> {
    let (dims, start) = header(file, 1, "labels")?;
    let n = dims[0];
    check_len(file, start, n, &format!("{n} labels"))?;
    let data = &file.bytes[start..];
    if let Some(i) = data.iter().position(|&l| l as usize >= CLASSES.len()) {
        return Err(file.error(
            start + i,
            format!("a label in 0..{} (label {i})", CLASSES.len()),
            data[i].to_string(),
        ));
    }
    Ok(data.iter().map(|&l| l as i64).collect())
}

/// Loads `split` of MNIST from `dir`, which holds the four IDX files (each plain or `.gz`).
pub fn load(dir: impl AsRef<Path>, split: Split) -> Result<ImageDataset> {
    let dir = dir.as_ref();
    let (prefix, name) = match split {
        Split::Train => ("train", "mnist/train"),
        Split::Test => ("t10k", "mnist/test"),
    };
    let fix = "download MNIST's four IDX files (gz or extracted) into that folder";
    let images_path = find(
        dir,
        &[
            &format!("{prefix}-images-idx3-ubyte"),
            &format!("{prefix}-images.idx3-ubyte"),
        ],
        &format!("MNIST {prefix} images"),
        fix,
    )?;
    let labels_path = find(
        dir,
        &[
            &format!("{prefix}-labels-idx1-ubyte"),
            &format!("{prefix}-labels.idx1-ubyte"),
        ],
        &format!("MNIST {prefix} labels"),
        fix,
    )?;
    let images = FileBytes::read(&images_path)?;
    let (n, rows, cols, pixels) = parse_images(&images)?;
    drop(images);
    let labels_file = FileBytes::read(&labels_path)?;
    let labels = parse_labels(&labels_file)?;
    if labels.len() != n {
        return Err(Error::Mismatch {
            msg: format!(
                "{} holds {n} images but {} holds {} labels; the two files must come from the \
                 same split (re-download both)",
                images_path.display(),
                labels_path.display(),
                labels.len()
            ),
        });
    }
    ImageDataset::new(
        name,
        [1, rows, cols],
        pixels,
        labels,
        CLASSES.iter().map(|c| c.to_string()).collect(),
    )
}
