//! Image folders: random trees of class folders (odd names, nesting, links to a parent and to
//! nothing, non-images, corrupt, cut and odd-sized images, named pipes) read by `image_folder`
//! (in memory) and `image_folder_on_disk`, and the disk one through a `DataLoader`.
//!
//! Besides "no panic, abort or hang", the two readings must agree: they list the same classes
//! and labels; when the in-memory one is read, the disk one gives the same bytes, statistics and
//! an epoch without error; when only the in-memory one is refused (an image that cannot be
//! decoded), the disk one fails both its statistics and its epoch.

use crate::harness::{refused, run, Outcome, Rng};
use kiln::autograd::Device;
use kiln::data::{
    image_folder, image_folder_on_disk, save_png, Augment, DataLoader, DataLoaderConfig,
    ImageOptions,
};
use std::path::Path;
use std::sync::Arc;

const JPEG: &[u8] = include_bytes!("../../../data/tests/fixtures/pattern.jpg");

/// One entry of a class folder.
#[derive(Debug, Clone)]
enum Entry {
    /// A PNG of `channels` x `side` x `side`, its name's extension in `ext`'s case.
    Png {
        channels: usize,
        side: usize,
        ext: &'static str,
    },
    /// A valid PNG cut to `keep` of its bytes.
    CutPng { keep: usize },
    /// The 20x12 JPEG fixture.
    Jpeg,
    /// Text under a name that is no image (`notes.txt`) or is one (`fake.png`).
    Text { as_image: bool },
    /// An image format kiln refuses (`.bmp`).
    Bmp,
    /// A folder of these entries.
    Folder(Vec<Entry>),
    /// A link to the tree's root (a loop) or to a missing file named like an image.
    Link { to_root: bool },
    /// A named pipe named like an image.
    Pipe,
}

#[derive(Debug)]
pub struct Tree {
    classes: Vec<(String, Vec<Entry>)>,
    expected: [usize; 3],
    options: ImageOptions,
    prefetch: usize,
}

fn entry(rng: &mut Rng, depth: usize) -> Entry {
    // mostly valid images, so that many trees read through; each hostile entry refuses its tree
    match rng.below(28) {
        0..=5 => Entry::Png {
            channels: rng.pick(&[3, 3, 1, 4]),
            side: rng.pick(&[4, 4, 4, 5]),
            ext: rng.pick(&[".png", ".png", ".PNG"]),
        },
        6 => Entry::CutPng {
            keep: rng.below(80),
        },
        7 => Entry::Jpeg,
        8 => Entry::Text {
            as_image: rng.chance(0.3),
        },
        9 => Entry::Bmp,
        10 | 11 if depth < 2 => {
            let n = rng.below(3);
            Entry::Folder((0..n).map(|_| entry(rng, depth + 1)).collect())
        }
        12 => Entry::Link {
            to_root: rng.chance(0.5),
        },
        13 if rng.chance(0.3) => Entry::Pipe,
        _ => Entry::Png {
            channels: 3,
            side: 4,
            ext: ".png",
        },
    }
}

fn generate(rng: &mut Rng) -> Tree {
    let names = ["cat", "Dog", "a b", ".hidden", "é", "x.png", "dog"];
    let mut classes: Vec<(String, Vec<Entry>)> = Vec::new();
    for _ in 0..rng.pick(&[0, 1, 2, 3, 2, 3]) {
        let name = rng.pick(&names).to_string();
        if classes.iter().any(|(n, _)| *n == name) {
            continue;
        }
        let entries = (0..rng.pick(&[0, 1, 2, 3, 4, 2, 3]))
            .map(|_| entry(rng, 0))
            .collect();
        classes.push((name, entries));
    }
    Tree {
        classes,
        expected: [rng.pick(&[3, 3, 1]), rng.pick(&[4, 4, 5]), 4],
        options: ImageOptions {
            resize: rng.chance(0.8),
            convert_channels: rng.chance(0.8),
        },
        prefetch: rng.pick(&[0, 2]),
    }
}

/// Writes `entries` into `dir` (which exists); `k` numbers the names.
fn write(dir: &Path, root: &Path, entries: &[Entry], png: &[u8]) {
    for (k, e) in entries.iter().enumerate() {
        match e {
            Entry::Png {
                channels,
                side,
                ext,
            } => {
                let pixels: Vec<u8> = (0..channels * side * side)
                    .map(|i| (i * 37 + k * 11) as u8)
                    .collect();
                let path = dir.join(format!("{k}{ext}"));
                save_png(path, &pixels, [*channels, *side, *side]).unwrap();
            }
            Entry::CutPng { keep } => {
                let cut = &png[..(*keep).min(png.len())];
                std::fs::write(dir.join(format!("{k}cut.png")), cut).unwrap();
            }
            Entry::Jpeg => std::fs::write(dir.join(format!("{k}.Jpg")), JPEG).unwrap(),
            Entry::Text { as_image } => {
                let name = if *as_image { "fake.png" } else { "notes.txt" };
                std::fs::write(dir.join(format!("{k}{name}")), "not an image").unwrap();
            }
            Entry::Bmp => std::fs::write(dir.join(format!("{k}.bmp")), "BM").unwrap(),
            Entry::Folder(inner) => {
                let sub = dir.join(format!("{k}sub"));
                std::fs::create_dir(&sub).unwrap();
                write(&sub, root, inner, png);
            }
            Entry::Link { to_root } => {
                let (target, name) = match to_root {
                    true => (root.to_path_buf(), format!("{k}up")),
                    false => (root.join("missing"), format!("{k}gone.png")),
                };
                std::os::unix::fs::symlink(target, dir.join(name)).unwrap();
            }
            Entry::Pipe => kiln_testkit::make_fifo(&dir.join(format!("{k}pipe.png"))),
        }
    }
}

pub fn image_folder_trees(seed: u64, cases: usize) {
    let scratch = std::env::temp_dir().join(format!("kiln-fuzz-{}-folders", std::process::id()));
    let root = scratch.join("root");
    let png = {
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch).unwrap();
        let path = scratch.join("valid.png");
        save_png(&path, &[9u8; 48], [3, 4, 4]).unwrap();
        std::fs::read(&path).unwrap()
    };
    let check = |tree: &Tree| {
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        for (name, entries) in &tree.classes {
            let dir = root.join(name);
            std::fs::create_dir(&dir).unwrap();
            write(&dir, &root, entries, &png);
        }
        let memory = image_folder(&root, tree.expected, tree.options);
        let disk = match image_folder_on_disk(&root, tree.expected, tree.options) {
            Ok(disk) => disk,
            Err(e) => {
                assert!(memory.is_err(), "read in memory but refused on disk: {e}");
                return refused(e);
            }
        };
        if let Ok(m) = &memory {
            assert_eq!((disk.classes(), disk.labels()), (m.classes(), m.labels()));
            for i in 0..disk.len() {
                assert_eq!(disk.image(i).unwrap(), m.image(i).unwrap(), "sample {i}");
            }
            assert_eq!(disk.channel_stats().unwrap(), m.channel_stats().unwrap());
        } else {
            assert!(
                disk.channel_stats().is_err(),
                "refused in memory but every image on disk was read"
            );
        }
        let config = DataLoaderConfig {
            batch_size: 3,
            prefetch_batches: tree.prefetch,
            augment: Augment::cifar(),
            ..Default::default()
        };
        let mut loader = DataLoader::new(Arc::new(disk), config, Device::Cpu).unwrap();
        let failed = loader.iter().find_map(|b| b.err());
        match (memory, failed) {
            (Ok(_), None) => Outcome::Accepted,
            (Ok(_), Some(e)) => panic!("read in memory but an epoch on disk failed: {e}"),
            (Err(_), None) => panic!("refused in memory but an epoch on disk read every image"),
            (Err(e), Some(_)) => refused(e),
        }
    };
    run("image folder trees", seed, cases, generate, check);
    let _ = std::fs::remove_dir_all(&scratch);
}
