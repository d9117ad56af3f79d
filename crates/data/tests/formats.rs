//! MNIST IDX and CIFAR-10 binary loading on small files written here, plain and gzip, and the
//! errors for corrupt and truncated files (file, byte offset, what was expected).

use flate2::{write::GzEncoder, Compression};
use kiln_data::{cifar10, mnist, Split};
use std::io::Write;
use std::path::{Path, PathBuf};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-data-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn idx_images(n: u32, rows: u32, cols: u32) -> Vec<u8> {
    let mut v = vec![0, 0, 8, 3];
    for d in [n, rows, cols] {
        v.extend_from_slice(&d.to_be_bytes());
    }
    v.extend((0..n * rows * cols).map(|i| (i * 7 % 256) as u8));
    v
}

fn idx_labels(labels: &[u8]) -> Vec<u8> {
    let mut v = vec![0, 0, 8, 1];
    v.extend_from_slice(&(labels.len() as u32).to_be_bytes());
    v.extend_from_slice(labels);
    v
}

fn write_mnist(dir: &Path, prefix: &str, images: &[u8], labels: &[u8], gzip: bool) {
    let (ext, imgs, labs) = if gzip {
        (".gz", gz(images), gz(labels))
    } else {
        ("", images.to_vec(), labels.to_vec())
    };
    std::fs::write(dir.join(format!("{prefix}-images-idx3-ubyte{ext}")), imgs).unwrap();
    std::fs::write(dir.join(format!("{prefix}-labels-idx1-ubyte{ext}")), labs).unwrap();
}

#[test]
fn mnist_plain_and_gzip_load_the_same_samples() {
    for gzip in [false, true] {
        let dir = temp_dir(&format!("mnist-ok-{gzip}"));
        write_mnist(
            &dir,
            "train",
            &idx_images(3, 4, 5),
            &idx_labels(&[7, 0, 9]),
            gzip,
        );
        write_mnist(
            &dir,
            "t10k",
            &idx_images(2, 4, 5),
            &idx_labels(&[1, 2]),
            gzip,
        );
        let train = mnist::load(&dir, Split::Train).unwrap();
        assert_eq!(train.len(), 3);
        assert_eq!(train.sample_shape(), [1, 4, 5]);
        assert_eq!(train.labels(), &[7, 0, 9]);
        // Sample 1 starts at pixel 20: bytes (20 * 7) % 256, ...
        let want: Vec<u8> = (20..40u32).map(|i| (i * 7 % 256) as u8).collect();
        assert_eq!(&*train.image(1).unwrap(), want.as_slice());
        assert_eq!(train.num_classes(), 10);
        let test = mnist::load(&dir, Split::Test).unwrap();
        assert_eq!(test.labels(), &[1, 2]);
        assert_eq!(test.name(), "mnist/test");
    }
}

fn mnist_error(name: &str, images: Vec<u8>, labels: Vec<u8>, gzip: bool) -> String {
    let dir = temp_dir(name);
    write_mnist(&dir, "train", &images, &labels, gzip);
    mnist::load(&dir, Split::Train).unwrap_err().to_string()
}

#[test]
fn mnist_bad_magic_names_file_offset_and_expected_magic() {
    let mut images = idx_images(2, 3, 3);
    images[3] = 1; // a label file's magic in the image file
    let msg = mnist_error("mnist-magic", images, idx_labels(&[1, 2]), false);
    assert!(msg.contains("train-images-idx3-ubyte"), "{msg}");
    assert!(msg.contains("at byte offset 0:"), "{msg}");
    assert!(msg.contains("expected magic number 0x00000803"), "{msg}");
    assert!(msg.contains("found 0x00000801"), "{msg}");
}

#[test]
fn mnist_truncated_pixels_name_the_offset_where_data_ends() {
    let mut images = idx_images(2, 3, 3); // 16 + 18 bytes
    images.truncate(30);
    let msg = mnist_error("mnist-trunc", images.clone(), idx_labels(&[1, 2]), false);
    assert!(msg.contains("train-images-idx3-ubyte:"), "{msg}");
    assert!(msg.contains("at byte offset 30:"), "{msg}");
    assert!(
        msg.contains("2 images of 3x3: 18 bytes from offset 16 to 34"),
        "{msg}"
    );
    assert!(msg.contains("found end of data (30 bytes in all)"), "{msg}");
    // The same truncation inside a valid gzip stream: offsets count decompressed bytes.
    let msg = mnist_error("mnist-trunc-gz", images, idx_labels(&[1, 2]), true);
    assert!(msg.contains("train-images-idx3-ubyte.gz"), "{msg}");
    assert!(
        msg.contains("at byte offset 30 (of the decompressed data)"),
        "{msg}"
    );
}

#[test]
fn mnist_truncated_header_and_extra_bytes() {
    let images = idx_images(2, 3, 3)[..10].to_vec(); // cut inside dimension 1
    let msg = mnist_error("mnist-header", images, idx_labels(&[1, 2]), false);
    assert!(msg.contains("at byte offset 8:"), "{msg}");
    assert!(
        msg.contains("4-byte big-endian size of dimension 1"),
        "{msg}"
    );
    let mut images = idx_images(2, 3, 3);
    images.extend_from_slice(&[1, 2, 3]);
    let msg = mnist_error("mnist-extra", images, idx_labels(&[1, 2]), false);
    assert!(msg.contains("at byte offset 34:"), "{msg}");
    assert!(msg.contains("found 3 extra bytes"), "{msg}");
}

#[test]
fn mnist_absurd_dimensions_are_an_error_not_an_overflow() {
    let mut images = vec![0, 0, 8, 3];
    images.extend([0xff; 12]);
    let msg = mnist_error("mnist-huge", images, idx_labels(&[1]), false);
    assert!(msg.contains("at byte offset 4:"), "{msg}");
    assert!(
        msg.contains("4294967295 images of 4294967295x4294967295"),
        "{msg}"
    );
}

#[test]
fn mnist_bad_label_and_count_mismatch() {
    let msg = mnist_error(
        "mnist-label",
        idx_images(2, 3, 3),
        idx_labels(&[1, 12]),
        false,
    );
    assert!(msg.contains("train-labels-idx1-ubyte"), "{msg}");
    assert!(msg.contains("at byte offset 9:"), "{msg}");
    assert!(
        msg.contains("a label in 0..10 (label 1), found 12"),
        "{msg}"
    );
    let msg = mnist_error("mnist-count", idx_images(2, 3, 3), idx_labels(&[1]), false);
    assert!(msg.contains("holds 2 images but"), "{msg}");
    assert!(msg.contains("holds 1 labels"), "{msg}");
}

#[test]
fn corrupt_gzip_stream_is_reported_with_the_file() {
    let dir = temp_dir("mnist-gz-corrupt");
    let mut z = gz(&idx_images(50, 8, 8));
    z.truncate(z.len() / 2);
    std::fs::write(dir.join("train-images-idx3-ubyte.gz"), z).unwrap();
    std::fs::write(dir.join("train-labels-idx1-ubyte"), idx_labels(&[0; 50])).unwrap();
    let msg = mnist::load(&dir, Split::Train).unwrap_err().to_string();
    assert!(msg.contains("train-images-idx3-ubyte.gz"), "{msg}");
    assert!(
        msg.contains("corrupt or truncated gzip stream after"),
        "{msg}"
    );
}

#[test]
fn missing_files_list_the_paths_tried() {
    let dir = temp_dir("missing");
    let msg = mnist::load(&dir, Split::Test).unwrap_err().to_string();
    assert!(msg.contains("t10k-images-idx3-ubyte.gz"), "{msg}");
    assert!(msg.contains("download MNIST"), "{msg}");
    let msg = cifar10::load(&dir, Split::Train).unwrap_err().to_string();
    assert!(msg.contains("data_batch_1.bin"), "{msg}");
}

/// `n` CIFAR records with labels `first_label..` and pixel bytes `(record + channel + i) % 256`.
fn cifar_batch(n: usize, first_label: u8) -> Vec<u8> {
    let mut v = Vec::new();
    for r in 0..n {
        v.push((first_label as usize + r) as u8 % 10);
        v.extend((0..cifar10::IMAGE_BYTES).map(|i| ((r + i / 1024 + i) % 256) as u8));
    }
    v
}

fn write_cifar(dir: &Path, gzip: bool) {
    for k in 1..=5 {
        let b = cifar_batch(2, k as u8);
        let (name, bytes) = if gzip && k % 2 == 0 {
            (format!("data_batch_{k}.bin.gz"), gz(&b))
        } else {
            (format!("data_batch_{k}.bin"), b)
        };
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    std::fs::write(dir.join("test_batch.bin"), cifar_batch(3, 0)).unwrap();
}

#[test]
fn cifar10_loads_all_batches_in_order_plain_and_gzip() {
    for gzip in [false, true] {
        let root = temp_dir(&format!("cifar-ok-{gzip}"));
        let dir = root.join("cifar-10-batches-bin"); // found inside the folder given
        std::fs::create_dir_all(&dir).unwrap();
        write_cifar(&dir, gzip);
        let train = cifar10::load(&root, Split::Train).unwrap();
        assert_eq!(train.len(), 10);
        assert_eq!(train.sample_shape(), [3, 32, 32]);
        assert_eq!(train.labels(), &[1, 2, 2, 3, 3, 4, 4, 5, 5, 6]);
        // Record 1 of batch 1 is sample 1: byte i of its image is (1 + i / 1024 + i) % 256.
        let img = train.image(1).unwrap();
        assert_eq!((img[0], img[1], img[1024], img[3071]), (1, 2, 2, 2));
        assert_eq!(train.classes()[3], "cat");
        let test = cifar10::load(&root, Split::Test).unwrap();
        assert_eq!(test.labels(), &[0, 1, 2]);
    }
}

#[test]
fn cifar10_truncated_record_and_bad_label() {
    let dir = temp_dir("cifar-bad");
    write_cifar(&dir, false);
    let mut b = cifar_batch(3, 0);
    b.truncate(2 * 3073 + 100);
    std::fs::write(dir.join("data_batch_3.bin"), b).unwrap();
    let msg = cifar10::load(&dir, Split::Train).unwrap_err().to_string();
    assert!(msg.contains("data_batch_3.bin"), "{msg}");
    assert!(msg.contains("at byte offset 6146:"), "{msg}");
    assert!(
        msg.contains(
            "a whole 3073-byte record (1 label byte + 3072 pixel bytes) starting here (record 2)"
        ),
        "{msg}"
    );
    assert!(
        msg.contains("only 100 bytes before the end of data"),
        "{msg}"
    );

    let mut b = cifar_batch(3, 0);
    b[3073] = 200; // label of record 1
    std::fs::write(dir.join("test_batch.bin"), b).unwrap();
    let msg = cifar10::load(&dir, Split::Test).unwrap_err().to_string();
    assert!(msg.contains("test_batch.bin"), "{msg}");
    assert!(msg.contains("at byte offset 3073:"), "{msg}");
    assert!(
        msg.contains("a label byte in 0..10 (record 1), found 200"),
        "{msg}"
    );

    std::fs::write(dir.join("test_batch.bin"), []).unwrap();
    let msg = cifar10::load(&dir, Split::Test).unwrap_err().to_string();
    assert!(msg.contains("found an empty file"), "{msg}");
}
