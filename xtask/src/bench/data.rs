//! The `data` group: an epoch of a folder of images through kiln's `DataLoader`, the way a
//! fine-tune on one's own photos reads them. The folder (96 PNGs of 256x320, four classes,
//! smooth colour fields with fine noise so that they compress like photos) is written to
//! `$TMPDIR/kiln-bench-image-folder/` on every run; each epoch resizes every image to 224x224
//! (Pillow's bilinear), crops with padding 4, flips, converts and normalises with ImageNet's
//! constants, in batches of 16.
//!
//! Rows: the folder read from disk as it is used (`image_folder_on_disk`, each batch decoded in
//! parallel on rayon's pool) and held in memory (`image_folder`, decoded once). With
//! `--vs-torch` the disk row gets a pair against torchvision's `ImageFolder` with the same
//! transforms in a `DataLoader` of two worker processes (`torch_bench.py`'s
//! `image_folder_epoch`), which reads the same files: both sides use the machine's two cores.

use super::harness::{err, median_of, Options, Row};
use super::torch::{Figure, Pairs};
use kiln::data::{
    image_folder, image_folder_on_disk, save_png, Augment, DataLoader, DataLoaderConfig,
    ImageDataset, ImageOptions, Normalize,
};
use kiln_autograd::Device;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const GROUP: &str = "data";
const CLASSES: usize = 4;
const PER_CLASS: usize = 24;
const IMAGE: [usize; 3] = [3, 256, 320];
const BATCH: usize = 16;

/// The folder both sides read (`torch_bench.py` names the same path).
fn folder() -> PathBuf {
    std::env::temp_dir().join("kiln-bench-image-folder")
}

/// A deterministic photo-like image: bilinear colour fields over a coarse grid plus noise.
fn photo(seed: usize) -> Vec<u8> {
    let [c, h, w] = IMAGE;
    let hash = |k: usize| {
        let mut z = (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xbf58_476d_1ce4_e5b9;
        z = (z ^ (z >> 31)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 29)) as usize
    };
    let cell = 32;
    let coarse = |ch: usize, gy: usize, gx: usize| {
        (hash(seed * 1_000_003 + ch * 7919 + gy * 131 + gx) % 256) as f64
    };
    let mut out = Vec::with_capacity(c * h * w);
    for ch in 0..c {
        for y in 0..h {
            for x in 0..w {
                let (gy, gx) = (y / cell, x / cell);
                let (fy, fx) = (
                    (y % cell) as f64 / cell as f64,
                    (x % cell) as f64 / cell as f64,
                );
                let top = coarse(ch, gy, gx) * (1.0 - fx) + coarse(ch, gy, gx + 1) * fx;
                let bottom = coarse(ch, gy + 1, gx) * (1.0 - fx) + coarse(ch, gy + 1, gx + 1) * fx;
                let noise = (hash(((seed * c + ch) * h + y) * w + x) % 17) as f64 - 8.0;
                out.push((top * (1.0 - fy) + bottom * fy + noise).clamp(0.0, 255.0) as u8);
            }
        }
    }
    out
}

fn write_folder(root: &Path) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(root);
    for class in 0..CLASSES {
        let dir = root.join(format!("class{class}"));
        std::fs::create_dir_all(&dir).map_err(err)?;
        for i in 0..PER_CLASS {
            save_png(
                dir.join(format!("{i}.png")),
                &photo(class * PER_CLASS + i),
                IMAGE,
            )
            .map_err(err)?;
        }
    }
    Ok(())
}

/// Milliseconds of one epoch of `dataset` (median of `runs` after a warm-up).
fn epoch_ms(dataset: ImageDataset, runs: usize) -> Result<f64, String> {
    let config = DataLoaderConfig {
        batch_size: BATCH,
        shuffle: true,
        drop_last: false,
        seed: 0,
        prefetch_batches: 0,
        augment: Augment::cifar(),
        normalize: Some(Normalize::imagenet()),
    };
    let mut loader = DataLoader::new(Arc::new(dataset), config, Device::Cpu).map_err(err)?;
    let mut epoch = || {
        let mut seen = 0;
        for batch in loader.iter() {
            seen += batch.map_err(err)?.indices.len();
        }
        match seen {
            n if n == CLASSES * PER_CLASS => Ok(()),
            n => Err(format!("an epoch gave {n} images")),
        }
    };
    Ok(median_of(runs, &mut epoch)? * 1e3)
}

/// The group's rows (none with `--gpu-only`).
pub(super) fn run(options: &Options) -> Result<Vec<Row>, String> {
    if options.gpu_only {
        return Ok(Vec::new());
    }
    let root = folder();
    write_folder(&root)?;
    let runs = if options.quick { 1 } else { 5 };
    let size = [3, 224, 224];
    let resize = ImageOptions {
        resize: true,
        convert_channels: true,
    };
    let images = CLASSES * PER_CLASS;
    let name =
        format!("{images} PNGs of 256x320 to 224x224, crop + flip + normalise, batch {BATCH}");
    let mut rows = Vec::new();
    let mut pairs = Pairs::new(GROUP, options);
    let on_disk = || {
        epoch_ms(
            image_folder_on_disk(&root, size, resize).map_err(err)?,
            runs,
        )
    };
    let disk_ms = on_disk()?;
    let in_memory = image_folder(&root, size, resize).map_err(err)?;
    let memory_ms = epoch_ms(in_memory, runs)?;
    for (how, ms) in [
        ("read from disk (image_folder_on_disk)", disk_ms),
        ("held in memory (image_folder)", memory_ms),
    ] {
        eprintln!("bench data: {how}: {ms:.1} ms an epoch");
        rows.push(Row::new(
            GROUP,
            format!("image folder, {name}, {how}: epoch"),
            "ms",
            ms,
            "images per second (ratio = images/s)",
            images as f64 * 1e3 / ms,
        ));
    }
    pairs.add(
        &format!("image folder read from disk, {name}: epoch vs torchvision ImageFolder, 2 workers (image_folder_epoch)"),
        "image_folder_epoch/2",
        Figure::Millis,
        disk_ms,
        on_disk,
    )?;
    rows.extend(pairs.into_rows());
    let _ = std::fs::remove_dir_all(&root);
    Ok(rows)
}
