//! [`image_folder`] and [`image_folder_on_disk`]: torchvision's `ImageFolder` layout
//! (`root/<class>/**/<image>`) as an [`ImageDataset`] held in memory or read from disk as it is
//! used, so a model trained on the same folder in PyTorch sees the same class indices and
//! sample order here.
//!
//! Invariants (torchvision's `find_classes` and `make_dataset`, written from their documented
//! behaviour):
//! - the classes are the names of `root`'s sub-folders (links to folders included), sorted by
//!   code point as Python's `sorted` does; label `i` is the `i`-th name;
//! - a class's samples are the files anywhere under its folder (links followed), folder by
//!   folder in the order of their whole path strings (Python's `sorted(os.walk(...))`: `a b/`
//!   comes before `a/x/`), and by name within a folder;
//! - a file is an image when its name ends, in any case, with one of torchvision's image
//!   extensions; other files are skipped as torchvision skips them. kiln decodes PNG and JPEG
//!   only, so an image of another format (`.bmp`, `.webp`, ...) is an error naming the file
//!   instead of a silently smaller dataset;
//! - a class with no image is an error naming it (torchvision's "Found no valid file");
//! - every image becomes `[C, H, W]` bytes as [`crate::load_image`] makes them, under the same
//!   [`ImageOptions`], or is an error naming its file.
//!
//! Beyond torchvision: a folder reached through several links is walked once, under its first
//! path in the order above (`os.walk` with `followlinks=True` lists it under each path, and
//! loops forever on a link to a parent), and the images are decoded in parallel on rayon's pool.
//! [`image_folder`] holds the dataset in memory, one byte a value (10,000 images of 3x224x224
//! take 1.5 GB), in one buffer whose size is checked against memory before any image is read;
//! [`image_folder_on_disk`] keeps only the file list and decodes each image when it is used, as
//! torchvision does.

use crate::dataset::{ImageDataset, ImageFiles};
use crate::error::{arg_err, Error, Result};
use crate::files::io_err;
use crate::image_io::{check_target, ImageOptions};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::path::{Path, PathBuf};

/// torchvision's `IMG_EXTENSIONS`: the file names `ImageFolder` counts as images.
const IMAGE_EXTENSIONS: [&str; 9] = [
    ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
];
/// The ones kiln decodes.
const DECODED_EXTENSIONS: [&str; 3] = [".jpg", ".jpeg", ".png"];

/// One folder's entries as `(name, path, is a folder)`.
type Listing = Vec<(String, PathBuf, bool)>;

/// The entries of `dir`, links followed.
fn entries(dir: &Path) -> Result<Listing> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let path = entry.path();
        // a broken link is a file here, as in `os.walk`: with an image's name it is a sample
        // whose reading fails, naming it
        let is_dir = std::fs::metadata(&path).is_ok_and(|m| m.is_dir());
        out.push((
            entry.file_name().to_string_lossy().into_owned(),
            path,
            is_dir,
        ));
    }
    Ok(out)
}

/// The listing of every folder under `top` (itself included), in the order of the folder's path
/// string, each folder once: one reached through several links keeps its first path in that
/// order. Each folder is read once; the caller takes its files from the same listing.
fn folders_under(top: &Path) -> Result<Vec<Listing>> {
    // A child's path string extends its parent's, so popping the smallest known path visits
    // every reachable path in sorted order, whatever order the folders list their entries in.
    let key = |p: PathBuf| Reverse((p.to_string_lossy().into_owned(), p));
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    let mut next = BinaryHeap::from([key(top.to_path_buf())]);
    while let Some(Reverse((_, dir))) = next.pop() {
        let real = std::fs::canonicalize(&dir).map_err(io_err(&dir))?;
        if !seen.insert(real) {
            continue;
        }
        let listing = entries(&dir)?;
        for (_, path, is_dir) in &listing {
            if *is_dir {
                next.push(key(path.clone()));
            }
        }
        found.push(listing);
    }
    Ok(found)
}

fn ends_with_any(name: &str, extensions: &[&str]) -> bool {
    let lower = name.to_lowercase();
    extensions.iter().any(|e| lower.ends_with(e))
}

/// The image files of one class folder, in torchvision's order (see the module docs).
fn class_files(class: &str, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for listing in folders_under(dir)? {
        let mut names: Vec<(String, PathBuf)> = listing
            .into_iter()
            .filter(|(name, _, is_dir)| !is_dir && ends_with_any(name, &IMAGE_EXTENSIONS))
            .map(|(name, path, _)| (name, path))
            .collect();
        names.sort();
        for (name, path) in names {
            if !ends_with_any(&name, &DECODED_EXTENSIONS) {
                return Err(Error::Image {
                    path,
                    msg: "an image format kiln does not decode; kiln reads PNG and JPEG, so \
                          convert it (e.g. with Pillow: Image.open(p).save(q.png)) or remove it"
                        .to_string(),
                });
            }
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(arg_err(
            "image_folder",
            format!(
                "class folder {} ({class:?}) holds no PNG or JPEG image; remove the folder \
                 (a stray folder such as .ipynb_checkpoints becomes a class) or add its images",
                dir.display()
            ),
        ));
    }
    Ok(files)
}

/// `root`'s class folders as `(name, path)`, sorted by name; none is an error.
fn class_folders(root: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut classes: Vec<(String, PathBuf)> = entries(root)?
        .into_iter()
        .filter(|(_, _, is_dir)| *is_dir)
        .map(|(name, path, _)| (name, path))
        .collect();
    classes.sort();
    if classes.is_empty() {
        return Err(arg_err(
            "image_folder",
            format!(
                "{} has no class folders; put each class's images in a folder of its own \
                 (root/<class>/<image>.png), as torchvision's ImageFolder expects",
                root.display()
            ),
        ));
    }
    Ok(classes)
}

/// Reads a folder of class folders (`root/<class>/**/<image>.png|jpg`), torchvision's
/// `ImageFolder` layout, into an in-memory [`ImageDataset`] of `shape` (`[C, H, W]`) samples
/// named after `root`: classes, labels and sample order as torchvision gives them (see the
/// module docs), each image converted and resized only as `options` allow, as
/// [`crate::load_image`] does. Every image is decoded here, once; for a folder larger than
/// memory use [`image_folder_on_disk`].
///
/// Errors name the problem and its file or folder: a missing root, a root with no class
/// folder, a class with no image, an image in a format kiln does not decode, an image that
/// does not fit `shape` under `options`, or a dataset too large for memory.
pub fn image_folder(
    root: impl AsRef<Path>,
    shape: [usize; 3],
    options: ImageOptions,
) -> Result<ImageDataset> {
    let target = check_target("image_folder", shape)?;
    FolderFiles::list(root.as_ref())?
        .on_disk(shape, options, target, None)?
        .into_memory()
}

/// [`image_folder`]'s dataset (the same classes, labels, order and bytes) with its images left
/// on disk: each is decoded, converted and resized when a sample is read, as torchvision's
/// `ImageFolder` does, so memory holds only the file list whatever the folder's size. A
/// [`crate::DataLoader`] decodes each batch's images in parallel;
/// [`ImageDataset::into_memory`] decodes them all once.
///
/// Only the folders are read here, so an image that cannot be read as `shape` under `options`
/// is an error naming it when it is first used (by [`ImageDataset::image`],
/// [`ImageDataset::channel_stats`] or a loader's batch), not here.
pub fn image_folder_on_disk(
    root: impl AsRef<Path>,
    shape: [usize; 3],
    options: ImageOptions,
) -> Result<ImageDataset> {
    let target = check_target("image_folder_on_disk", shape)?;
    FolderFiles::list(root.as_ref())?.on_disk(shape, options, target, None)
}

/// A folder's samples in torchvision's order (see the module docs), each folder walked once.
pub(crate) struct FolderFiles {
    /// The dataset's name: the folder's.
    name: String,
    /// Sample `i`'s file.
    pub(crate) paths: Vec<PathBuf>,
    /// Sample `i`'s class index.
    labels: Vec<i64>,
    /// The class names, sorted: label `i` is the `i`-th.
    pub(crate) classes: Vec<String>,
}

impl FolderFiles {
    /// Lists `root`'s class folders and their images; reads no image.
    pub(crate) fn list(root: &Path) -> Result<Self> {
        let classes = class_folders(root)?;
        let mut paths = Vec::new();
        let mut labels = Vec::new();
        for (label, (name, dir)) in classes.iter().enumerate() {
            let found = class_files(name, dir)?;
            labels.extend(std::iter::repeat_n(label as i64, found.len()));
            paths.extend(found);
        }
        let name = root.file_name().map_or_else(
            || "image_folder".to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let classes = classes.into_iter().map(|(name, _)| name).collect();
        Ok(FolderFiles {
            name,
            paths,
            labels,
            classes,
        })
    }

    /// The dataset of `shape` samples on disk. `(what, fix)` is [`check_target`]'s for
    /// `shape`, and `shape_fix` (if any) the fix an image of the wrong size names.
    pub(crate) fn on_disk(
        self,
        shape: [usize; 3],
        options: ImageOptions,
        (what, fix): (String, String),
        shape_fix: Option<String>,
    ) -> Result<ImageDataset> {
        let files = ImageFiles {
            paths: self.paths,
            options,
            what,
            fix,
            shape_fix,
        };
        ImageDataset::on_disk(self.name, shape, files, self.labels, self.classes)
    }
}
