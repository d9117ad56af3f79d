//! `kiln_data::image_folder` against torchvision's `ImageFolder`: the classes, labels and sample
//! order torchvision finds in a tree (`fixtures/image_folder_order.json`, made by
//! `fixtures/image_folder_order.py`), each sample's bytes, links, and the refusals; and the same
//! folder read from disk as it is used (`image_folder_on_disk`), batch for batch.

mod common;

use common::epoch;
use kiln_autograd::Device;
use kiln_data::{
    image_folder, image_folder_on_disk, read_image, resize_bilinear, save_png, Augment, DataLoader,
    DataLoaderConfig, Error, ImageOptions, LoaderState, Normalize,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const SHAPE: [usize; 3] = [3, 12, 20];

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-image-folder-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A `SHAPE` image whose bytes depend on `seed`.
fn pixels(seed: usize) -> Vec<u8> {
    (0..SHAPE.iter().product::<usize>())
        .map(|i| ((i * 13 + seed * 71) % 251) as u8)
        .collect()
}

/// Writes `files` (paths relative to `root`): PNGs of distinct `SHAPE` images, JPEGs a copy of
/// the 20x12 pattern fixture, anything else text. Returns each image's expected CHW bytes.
fn write_tree(root: &Path, files: &[&str]) -> HashMap<String, Vec<u8>> {
    let (jpeg, _) = read_image(fixture("pattern.jpg")).unwrap();
    let mut expected = HashMap::new();
    for (k, rel) in files.iter().enumerate() {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let lower = rel.to_lowercase();
        if lower.ends_with(".png") {
            save_png(&path, &pixels(k), SHAPE).unwrap();
            expected.insert(rel.to_string(), pixels(k));
        } else if lower.ends_with(".jpg") || lower.ends_with(".jpeg") {
            std::fs::copy(fixture("pattern.jpg"), &path).unwrap();
            expected.insert(rel.to_string(), jpeg.clone());
        } else {
            std::fs::write(&path, "not an image").unwrap();
        }
    }
    expected
}

#[test]
fn classes_labels_and_order_equal_torchvision() {
    let spec: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/image_folder_order.json")).unwrap();
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    let files = strings(&spec["files"]);
    let root = temp_dir("tree");
    let expected = write_tree(&root, &files.iter().map(String::as_str).collect::<Vec<_>>());
    let ds = image_folder(&root, SHAPE, ImageOptions::default()).unwrap();
    assert_eq!(ds.classes(), strings(&spec["classes"]));
    assert_eq!(ds.sample_shape(), SHAPE);
    let samples = spec["samples"].as_array().unwrap();
    assert_eq!(ds.len(), samples.len());
    for (i, sample) in samples.iter().enumerate() {
        let rel = sample[0].as_str().unwrap();
        assert_eq!(
            ds.label(i),
            sample[1].as_i64().unwrap(),
            "sample {i} ({rel})"
        );
        assert!(
            *ds.image(i).unwrap() == expected[rel][..],
            "sample {i} is not {rel}'s image"
        );
    }
    assert!(ds.name().starts_with("kiln-image-folder-"), "{}", ds.name());
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn refusals_name_the_folder_or_file() {
    let root = temp_dir("refusals");
    let message = |r: Result<kiln_data::ImageDataset, Error>| r.unwrap_err().to_string();
    let missing = root.join("missing");
    let msg = message(image_folder(&missing, SHAPE, ImageOptions::default()));
    assert!(msg.contains("missing"), "{msg}");
    // no class folders
    write_tree(&root, &["a.png"]);
    let msg = message(image_folder(&root, SHAPE, ImageOptions::default()));
    assert!(
        msg.contains("has no class folders") && msg.contains("root/<class>/"),
        "{msg}"
    );
    // a stray folder becomes a class with no image
    write_tree(&root, &["cat/x.png", ".ipynb_checkpoints/notes.txt"]);
    let msg = message(image_folder(&root, SHAPE, ImageOptions::default()));
    assert!(
        msg.contains("(\".ipynb_checkpoints\") holds no PNG or JPEG image"),
        "{msg}"
    );
    std::fs::remove_dir_all(root.join(".ipynb_checkpoints")).unwrap();
    // an image format torchvision reads and kiln does not
    write_tree(&root, &["dog/y.bmp"]);
    let msg = message(image_folder(&root, SHAPE, ImageOptions::default()));
    assert!(
        msg.contains("y.bmp") && msg.contains("kiln reads PNG and JPEG"),
        "{msg}"
    );
    std::fs::remove_file(root.join("dog/y.bmp")).unwrap();
    // an image of another size is refused unless resizing is asked for
    let small: Vec<u8> = (0..3 * 6 * 10).map(|i| (i * 3) as u8).collect();
    save_png(root.join("dog/small.png"), &small, [3, 6, 10]).unwrap();
    let msg = message(image_folder(&root, SHAPE, ImageOptions::default()));
    assert!(msg.contains("small.png") && msg.contains("6x10"), "{msg}");
    let resize = ImageOptions {
        resize: true,
        convert_channels: false,
    };
    let ds = image_folder(&root, SHAPE, resize).unwrap();
    assert_eq!(ds.classes(), ["cat", "dog"]);
    assert_eq!(ds.labels(), [0, 1]);
    assert_eq!(
        &*ds.image(1).unwrap(),
        resize_bilinear(&small, [3, 6, 10], [12, 20]).unwrap()
    );
    // not an image shape
    let msg = message(image_folder(&root, [5, 12, 20], ImageOptions::default()));
    assert!(msg.contains("not an image shape"), "{msg}");
    let _ = std::fs::remove_dir_all(&root);
}

/// Links are followed, as torchvision follows them, but a folder is walked once per class: a
/// link back to a parent (where `os.walk(followlinks=True)` never ends) adds nothing, and a
/// class folder that is a link to another class's holds the same images.
#[cfg(unix)]
#[test]
fn links_are_followed_and_each_folder_walked_once() {
    let root = temp_dir("links");
    let expected = write_tree(&root, &["cat/x.png", "cat/sub/y.png"]);
    std::os::unix::fs::symlink(root.join("cat"), root.join("cat/sub/loop")).unwrap();
    std::os::unix::fs::symlink(root.join("cat"), root.join("dog")).unwrap();
    // a broken link with an image's name is a sample (as in torchvision) that cannot be read
    std::os::unix::fs::symlink(root.join("nowhere"), root.join("cat/broken.png")).unwrap();
    let msg = image_folder(&root, SHAPE, ImageOptions::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("cat/broken.png"), "{msg}");
    std::fs::remove_file(root.join("cat/broken.png")).unwrap();
    let ds = image_folder(&root, SHAPE, ImageOptions::default()).unwrap();
    assert_eq!(ds.classes(), ["cat", "dog"]);
    assert_eq!(ds.labels(), [0, 0, 1, 1]);
    for (i, rel) in ["cat/x.png", "cat/sub/y.png", "cat/x.png", "cat/sub/y.png"]
        .iter()
        .enumerate()
    {
        assert!(
            *ds.image(i).unwrap() == expected[*rel][..],
            "sample {i} is not {rel}'s image"
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}

fn loader_config(prefetch_batches: usize, normalize: Normalize) -> DataLoaderConfig {
    DataLoaderConfig {
        batch_size: 4,
        shuffle: true,
        drop_last: false,
        seed: 7,
        prefetch_batches,
        augment: Augment::cifar(),
        normalize: Some(normalize),
    }
}

/// Eleven images in two classes: ten distinct PNGs and the pattern JPEG.
fn eleven_images(root: &Path) {
    let mut files: Vec<String> = (0..10)
        .map(|k| format!("{}/{k}.png", ["cat", "dog"][k % 2]))
        .collect();
    files.push("dog/pattern.jpg".into());
    let refs: Vec<&str> = files.iter().map(String::as_str).collect();
    write_tree(root, &refs);
}

#[test]
fn on_disk_dataset_gives_the_in_memory_samples_statistics_and_batches() {
    let root = temp_dir("on-disk");
    eleven_images(&root);
    let options = ImageOptions::default();
    let memory = image_folder(&root, SHAPE, options).unwrap();
    let disk = image_folder_on_disk(&root, SHAPE, options).unwrap();
    assert!(disk.is_on_disk() && !memory.is_on_disk());
    assert_eq!(disk.len(), 11);
    assert_eq!(disk.classes(), memory.classes());
    assert_eq!(disk.labels(), memory.labels());
    for i in 0..disk.len() {
        assert_eq!(
            disk.image(i).unwrap(),
            memory.image(i).unwrap(),
            "sample {i}"
        );
    }
    let msg = disk.image(11).unwrap_err().to_string();
    assert!(
        msg.contains("sample 11 of a dataset of 11 samples"),
        "{msg}"
    );
    assert_eq!(
        disk.channel_stats().unwrap(),
        memory.channel_stats().unwrap()
    );
    assert_eq!(disk.clone().into_memory().unwrap(), memory);

    let normalize = Normalize::from_dataset(&memory).unwrap();
    let (memory, disk) = (Arc::new(memory), Arc::new(disk));
    for prefetch in [0, 2] {
        let config = loader_config(prefetch, normalize.clone());
        let mut from_memory = DataLoader::new(memory.clone(), config.clone(), Device::Cpu).unwrap();
        let mut from_disk = DataLoader::new(disk.clone(), config, Device::Cpu).unwrap();
        for round in 0..2 {
            let want = epoch(&mut from_memory);
            assert_eq!(want.len(), 3);
            assert_eq!(
                epoch(&mut from_disk),
                want,
                "prefetch {prefetch}, epoch {round}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// A file that breaks after listing is an error naming it when its batch is built; the epoch's
/// iterator ends there, the loader stays after the last good batch, and once the file is back
/// the next `iter` builds that batch as it would have been.
#[test]
fn an_unreadable_file_ends_the_epoch_and_the_next_iter_retries_its_batch() {
    let root = temp_dir("on-disk-broken");
    eleven_images(&root);
    let disk = Arc::new(image_folder_on_disk(&root, SHAPE, ImageOptions::default()).unwrap());
    let normalize = Normalize::from_dataset(&disk).unwrap();
    for prefetch in [0, 2] {
        let config = loader_config(prefetch, normalize.clone());
        let mut reference = DataLoader::new(disk.clone(), config.clone(), Device::Cpu).unwrap();
        let want = epoch(&mut reference);
        let mut loader = DataLoader::new(disk.clone(), config, Device::Cpu).unwrap();
        // the second batch's first sample: cat holds 0.png, 2.png, .. 8.png (samples 0-4), dog
        // holds 1.png, 3.png, .. 9.png and then pattern.jpg (samples 5-10)
        let victim = want[1].0[0];
        let path = match victim {
            0..=4 => root.join(format!("cat/{}.png", 2 * victim)),
            5..=9 => root.join(format!("dog/{}.png", 2 * (victim - 5) + 1)),
            _ => root.join("dog/pattern.jpg"),
        };
        let saved = std::fs::read(&path).unwrap();
        for broken in [&b"not a png"[..], &saved[..saved.len() / 2]] {
            std::fs::write(&path, broken).unwrap();
            let mut it = loader.iter();
            let first = it.next().unwrap().unwrap();
            assert_eq!(first.indices, want[0].0);
            let msg = it.next().unwrap().unwrap_err().to_string();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            assert!(msg.contains(&name), "prefetch {prefetch}: {msg}");
            assert!(it.next().is_none(), "the iterator ends at its error");
            drop(it);
            assert_eq!(
                loader.state(),
                LoaderState {
                    epoch: 0,
                    batches_done: 1
                }
            );
            // back where it was: the first batch again, this time from a rewound loader
            loader.set_state(LoaderState::default()).unwrap();
        }
        std::fs::write(&path, &saved).unwrap();
        loader
            .set_state(LoaderState {
                epoch: 0,
                batches_done: 1,
            })
            .unwrap();
        assert_eq!(epoch(&mut loader), want[1..].to_vec());
    }
    let _ = std::fs::remove_dir_all(&root);
}
