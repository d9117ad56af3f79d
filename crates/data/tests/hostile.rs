//! Hostile sizes and states: each used to abort (allocation failed), wrap or store a wrong
//! value silently; each is now an error that names the problem and the fix.

use kiln_autograd::Device;
use kiln_data::{
    hwc_to_chw, image_grid, load_image, save_png, synthetic, Augment, DataLoader, DataLoaderConfig,
    DataSource, Error, ImageDataset, ImageOptions, LoaderState, Normalize, Split,
};
use std::sync::Arc;

/// `--data synthetic:99999999999999` aborted allocating 307 TB; now an error before allocating.
#[test]
fn synthetic_sets_larger_than_memory_are_errors() {
    let e = synthetic::generate(0, Split::Train, 99_999_999_999_999).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("99999999999999 synthetic samples") && msg.contains("fewer samples"),
        "{msg}"
    );
    let src: DataSource = "synthetic:99999999999999".parse().unwrap();
    assert!(matches!(src.load(0), Err(Error::OutOfMemory { .. })));
    // Sizes that overflow usize say so.
    let msg = synthetic::train_val(0, usize::MAX, 1)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("usize::MAX"), "{msg}");
    // Small sets still render.
    assert_eq!(synthetic::generate(0, Split::Train, 3).unwrap().len(), 3);
}

/// `load_image` / `predict --resize` to a huge model input aborted in the resize.
#[test]
fn huge_image_inputs_are_errors_before_decoding() {
    let huge = [3, 1 << 20, 1 << 20];
    let opts = ImageOptions {
        resize: true,
        convert_channels: true,
    };
    let e = load_image("/nonexistent.png", huge, opts, None, Device::Cpu).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    assert!(e.to_string().contains("real input size"), "{e}");
    let e = load_image("/nonexistent.png", [3, 8, 1 << 33], opts, None, Device::Cpu).unwrap_err();
    assert!(e.to_string().contains("beyond 4294967295 pixels"), "{e}");
    let e = load_image("/x.png", [3, usize::MAX, 2], opts, None, Device::Cpu).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("has a side beyond 4294967295 pixels") && msg.contains("real input size"),
        "{msg}"
    );
    kiln_testkit::assert_readable(&msg);
    let img = [0u8; 12];
    let e = image_grid(&[&img], [3, 2, 2], 1, usize::MAX / 2, 0).unwrap_err();
    assert!(e.to_string().contains("smaller gap"), "{e}");
}

/// `Normalize` with std 1e-50 stored 0 (f32) and divided by it.
#[test]
fn normalize_refuses_stds_that_vanish_in_f32() {
    let msg = Normalize::new(&[0.5], &[1e-50]).unwrap_err().to_string();
    assert!(
        msg.contains("too small for f32") && msg.contains("std 1"),
        "{msg}"
    );
    assert!(Normalize::new(&[0.5], &[1e-30]).is_ok());
}

/// `set_state` with epoch u64::MAX wrapped to epoch 0 (release) or panicked (debug).
#[test]
fn loader_states_at_the_last_epoch_are_errors() {
    let ds = ImageDataset::new(
        "t",
        [1, 2, 2],
        vec![0; 16],
        vec![0, 1, 0, 1],
        vec!["a".into(), "b".into()],
    )
    .unwrap();
    let config = DataLoaderConfig {
        batch_size: 2,
        ..Default::default()
    };
    let mut loader = DataLoader::new(Arc::new(ds), config, Device::Cpu).unwrap();
    for batches_done in [0, 1, 2] {
        let state = LoaderState {
            epoch: u64::MAX,
            batches_done,
        };
        let msg = loader.set_state(state).unwrap_err().to_string();
        assert!(msg.contains("epoch 18446744073709551615"), "{msg}");
    }
    let last_ok = LoaderState {
        epoch: u64::MAX - 1,
        batches_done: 2,
    };
    loader.set_state(last_ok).unwrap();
    assert_eq!(loader.state().epoch, u64::MAX);
    let mut it = loader.iter();
    assert!(it.next().unwrap().is_ok());
    assert!(it.next().unwrap().is_err(), "no epoch after u64::MAX");
}

/// `prefetch_batches: usize::MAX` sized the prefetch channel's buffer from it and aborted; a
/// huge `crop_padding` overflowed the crop offsets.
#[test]
fn huge_prefetch_and_crop_padding_do_not_abort() {
    let ds = Arc::new(
        ImageDataset::new(
            "t",
            [1, 2, 2],
            vec![0; 16],
            vec![0, 1, 0, 1],
            vec!["a".into(), "b".into()],
        )
        .unwrap(),
    );
    let config = DataLoaderConfig {
        batch_size: 2,
        prefetch_batches: usize::MAX,
        ..Default::default()
    };
    let mut loader = DataLoader::new(ds.clone(), config, Device::Cpu).unwrap();
    assert_eq!(loader.iter().filter(|b| b.is_ok()).count(), 2);
    let config = DataLoaderConfig {
        batch_size: 2,
        augment: Augment {
            crop_padding: usize::MAX,
            flip_prob: 0.0,
        },
        ..Default::default()
    };
    let msg = DataLoader::new(ds.clone(), config, Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("crop_padding") && msg.contains("uses 4"),
        "{msg}"
    );
    // A hostile flip_prob is echoed as -1e300, not as 301 digits.
    let config = DataLoaderConfig {
        batch_size: 2,
        augment: Augment {
            crop_padding: 0,
            flip_prob: -1e300,
        },
        ..Default::default()
    };
    let msg = DataLoader::new(ds, config, Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("flip_prob -1e300 is not"), "{msg}");
}

/// Image shapes whose byte count overflows `usize` panicked (debug) or wrapped (release) in
/// the CHW helpers; each is now an error naming the shape, and `hwc_to_chw` checks its input.
#[test]
fn image_shapes_that_overflow_are_errors() {
    let huge = [usize::MAX / 2, 3, 1];
    let e = Augment::cifar()
        .apply(&[0; 3], huge, 0, 0, 0, &mut [0; 3])
        .unwrap_err();
    assert!(
        e.to_string().contains("more bytes than can be addressed"),
        "{e}"
    );
    let e = image_grid(&[&[0u8; 3][..]], huge, 1, 0, 0).unwrap_err();
    assert!(
        e.to_string().contains("more bytes than can be addressed"),
        "{e}"
    );
    let path = std::env::temp_dir().join(format!("kiln-huge-{}.png", std::process::id()));
    let e = save_png(&path, &[0; 3], [3, usize::MAX / 2, 2]).unwrap_err();
    assert!(
        e.to_string().contains("more bytes than can be addressed"),
        "{e}"
    );
    assert!(!path.exists());

    assert_eq!(
        hwc_to_chw(&[1, 2, 3, 4, 5, 6], [1, 2, 3]).unwrap(),
        [1, 4, 2, 5, 3, 6]
    );
    for (bytes, shape) in [(&[0u8; 5][..], [1, 2, 3]), (&[][..], [2, 2, 0])] {
        let e = hwc_to_chw(bytes, shape).unwrap_err().to_string();
        assert!(e.contains("pass HWC bytes of that shape"), "{e}");
    }
    let e = hwc_to_chw(&[0; 4], [usize::MAX, 2, 2]).unwrap_err();
    assert!(
        e.to_string().contains("more bytes than can be addressed"),
        "{e}"
    );
    let classes = vec!["a".to_string()];
    let e = ImageDataset::new("d", huge, vec![0; 3], vec![0], classes.clone()).unwrap_err();
    assert!(
        e.to_string().contains("more bytes than can be addressed"),
        "{e}"
    );
    let labels = vec![0; 1 << 20];
    let e = ImageDataset::new("d", [1 << 20, 1 << 20, 1 << 20], vec![], labels, classes);
    let e = e.unwrap_err().to_string();
    assert!(e.contains("(needs more than can be addressed)"), "{e}");
}

/// A small file whose header claims a huge image is refused from its header, before any pixel
/// buffer is allocated (the `image` crate's 512 MiB limit, kept when kiln began decoding with
/// `png` and `zune-jpeg` directly).
#[test]
fn files_claiming_huge_images_are_refused_from_the_header() {
    fn chunk(kind: &[u8], data: &[u8]) -> Vec<u8> {
        let mut c = (data.len() as u32).to_be_bytes().to_vec();
        c.extend_from_slice(kind);
        c.extend_from_slice(data);
        c.extend_from_slice(&crc32fast::hash(&c[4..]).to_be_bytes());
        c
    }
    let dir = std::env::temp_dir().join(format!("kiln-huge-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let refusal = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        kiln_data::read_image(&path).unwrap_err().to_string()
    };
    // 60000 x 60000 RGBA: 13.4 GiB decoded, from a 65-byte file whose pixel data is an empty
    // zlib stream
    let mut ihdr = 60_000u32.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&60_000u32.to_be_bytes());
    ihdr.extend_from_slice(&[8, 6, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(chunk(b"IHDR", &ihdr));
    png.extend(chunk(b"IDAT", &[0x78, 0x9c, 0x03, 0, 0, 0, 0, 1]));
    png.extend(chunk(b"IEND", &[]));
    let msg = refusal("huge.png", &png);
    assert!(
        msg.contains("60000x60000 with 4 channel(s), more than the 512 MiB"),
        "{msg}"
    );
    kiln_testkit::assert_readable(&msg);
    // The gray JPEG fixture with its frame header's sides set to 65500 (4 GiB decoded), then
    // to 65535, beyond libjpeg's limit (and where zune-jpeg's MCU count overflows).
    let mut jpeg = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/flat_gray.jpg"
    ))
    .unwrap();
    let sof = jpeg.windows(2).position(|m| m == [0xff, 0xc0]).unwrap();
    for side in [sof + 5, sof + 7] {
        jpeg[side..side + 2].copy_from_slice(&65500u16.to_be_bytes());
    }
    let msg = refusal("huge.jpg", &jpeg);
    assert!(
        msg.contains("65500x65500 with 1 channel(s), more than the 512 MiB"),
        "{msg}"
    );
    // a one-row image 65535 wide is small (64 KiB) but still refused by its side
    jpeg[sof + 5..sof + 9].copy_from_slice(&[0, 1, 0xff, 0xff]);
    let msg = refusal("wide.jpg", &jpeg);
    assert!(
        msg.contains("claims 1x65535 pixels, beyond JPEG's practical limit of 65500"),
        "{msg}"
    );
    kiln_testkit::assert_readable(&msg);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A named pipe (or a folder) where a data file is expected is refused before it is opened:
/// reading a pipe would wait for a writer forever. Each read runs on its own thread and must
/// answer within a few seconds.
#[cfg(unix)]
#[test]
fn a_pipe_or_a_folder_is_refused_not_waited_on() {
    use std::sync::mpsc;
    use std::time::Duration;
    let dir = std::env::temp_dir().join(format!("kiln-pipes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("folder.png")).unwrap();
    kiln_testkit::make_fifo(&dir.join("pipe.png"));
    kiln_testkit::make_fifo(&dir.join("t10k-images-idx3-ubyte"));
    let answer = |read: Box<dyn FnOnce() -> String + Send>| {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(read()));
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the read waited on the pipe")
    };
    for name in ["pipe.png", "folder.png"] {
        let path = dir.join(name);
        let msg = answer(Box::new(move || {
            kiln_data::read_image(&path).unwrap_err().to_string()
        }));
        assert!(
            msg.contains(name) && msg.contains("not a regular file"),
            "{msg}"
        );
    }
    let root = dir.clone();
    let msg = answer(Box::new(move || {
        kiln_data::mnist::load(&root, kiln_data::Split::Test)
            .unwrap_err()
            .to_string()
    }));
    // MNIST looks only for regular files under its names, so the pipe is not one of them
    assert!(msg.contains("t10k-images-idx3-ubyte"), "{msg}");
    let _ = std::fs::remove_dir_all(&dir);
}
