//! `kiln_data::image_folder` against torchvision's `ImageFolder`: the classes, labels and sample
//! order torchvision finds in a tree (`fixtures/image_folder_order.json`, made by
//! `fixtures/image_folder_order.py`), each sample's bytes, links, and the refusals.

use kiln_data::{image_folder, read_image, resize_bilinear, save_png, Error, ImageOptions};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

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
            ds.image(i) == &expected[rel][..],
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
        ds.image(1),
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
            ds.image(i) == &expected[*rel][..],
            "sample {i} is not {rel}'s image"
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}
