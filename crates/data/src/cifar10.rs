//! CIFAR-10 in its binary batches (`data_batch_1.bin` .. `data_batch_5.bin`, `test_batch.bin`,
//! in the folder given or its `cifar-10-batches-bin/` subfolder), plain or gzip.
//!
//! Each record is 3073 bytes: one label byte (0..9), then 1024 red, 1024 green and 1024 blue
//! bytes of a 32x32 image, row-major: already the CHW layout kiln uses, so records copy straight
//! in. A file that is not a whole number of records, or a label byte above 9, is reported with
//! the file and the offset of the record at fault.

use crate::dataset::{ImageDataset, Split};
use crate::error::Result;
use crate::files::{find, FileBytes};
use std::path::Path;

/// CIFAR-10's class names, indexed by label.
pub const CLASSES: [&str; 10] = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
];

/// Bytes per image (3 x 32 x 32).
pub const IMAGE_BYTES: usize = 3 * 32 * 32;

/// Bytes per record: the label byte and the image.
pub const RECORD_BYTES: usize = 1 + IMAGE_BYTES;

/// Parses one batch file, appending to `pixels` and `labels`.
fn parse_batch(file: &FileBytes, pixels: &mut Vec<u8>, labels: &mut Vec<i64>) -> Result<()> {
    let len = file.bytes.len();
    if len == 0 {
        return Err(file.error(
            0,
            format!("at least one {RECORD_BYTES}-byte record (1 label byte + {IMAGE_BYTES} pixel bytes)"),
            "an empty file",
        ));
    }
    let whole = len / RECORD_BYTES * RECORD_BYTES;
    if whole != len {
        return Err(file.error(
            whole,
            format!(
                "a whole {RECORD_BYTES}-byte record (1 label byte + {IMAGE_BYTES} pixel bytes) \
                 starting here (record {})",
                whole / RECORD_BYTES
            ),
            format!("only {} bytes before the end of data", len - whole),
        ));
    }
    for (r, rec) in file.bytes.chunks_exact(RECORD_BYTES).enumerate() {
        if rec[0] as usize >= CLASSES.len() {
            return Err(file.error(
                r * RECORD_BYTES,
                format!("a label byte in 0..{} (record {r})", CLASSES.len()),
                rec[0].to_string(),
            ));
        }
        labels.push(rec[0] as i64);
        pixels.extend_from_slice(&rec[1..]);
    }
    Ok(())
}

/// Loads `split` of CIFAR-10 from `dir` (five training batches or the test batch).
pub fn load(dir: impl AsRef<Path>, split: Split) -> Result<ImageDataset> {
    let mut dir = dir.as_ref().to_path_buf();
    let nested = dir.join("cifar-10-batches-bin");
    if nested.is_dir() {
        dir = nested;
    }
    let (names, name): (Vec<String>, _) = match split {
        Split::Train => (
            (1..=5).map(|k| format!("data_batch_{k}.bin")).collect(),
            "cifar10/train",
        ),
        Split::Test => (vec!["test_batch.bin".to_string()], "cifar10/test"),
    };
    let fix = "download and extract cifar-10-binary.tar.gz (the binary version) into that folder";
    let mut pixels = Vec::new();
    let mut labels = Vec::new();
    for file_name in &names {
        let path = find(&dir, &[file_name], &format!("CIFAR-10 {file_name}"), fix)?;
        parse_batch(&FileBytes::read(&path)?, &mut pixels, &mut labels)?;
    }
    ImageDataset::new(
        name,
        [3, 32, 32],
        pixels,
        labels,
        CLASSES.iter().map(|c| c.to_string()).collect(),
    )
}
