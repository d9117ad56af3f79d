//! Data: loader states and configurations, and mutated IDX (MNIST), CIFAR-10, PNG and JPEG bytes,
//! through the public loaders. Every case must end in `Ok` or a typed error.

use crate::harness::{refused, run, Outcome, Rng};
use kiln::autograd::Device;
use kiln::data::{
    cifar10, load_image, mnist, read_image, save_png, Augment, DataLoader, DataLoaderConfig,
    ImageDataset, ImageOptions, LoaderState, Normalize, Split,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A scratch folder for this process and target.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-fuzz-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Byte mutations: flip bytes, overwrite a big-endian u32 with a hostile size, cut or grow.
fn mutate_bytes(bytes: &mut Vec<u8>, rng: &mut Rng, header_words: usize) {
    for _ in 0..1 + rng.below(3) {
        match rng.below(5) {
            0 if !bytes.is_empty() => {
                let i = rng.below(bytes.len());
                bytes[i] ^= 1 << rng.below(8);
            }
            1 if header_words > 0 => {
                let w = rng.below(header_words) * 4;
                let v: u32 = rng.pick(&[0, 1, 0x7fff_ffff, 0xffff_ffff, 0x0001_0000, 3073]);
                if bytes.len() >= w + 4 {
                    bytes[w..w + 4].copy_from_slice(&v.to_be_bytes());
                }
            }
            2 => {
                let keep = rng.below(bytes.len() + 1);
                bytes.truncate(keep);
            }
            3 => {
                let extra = rng.below(64);
                bytes.extend((0..extra).map(|_| rng.next_u64() as u8));
            }
            _ => {
                if !bytes.is_empty() {
                    let i = rng.below(bytes.len());
                    bytes[i] = rng.pick(&[0, 0xff, 0x7f, 0x80]);
                }
            }
        }
    }
}

fn idx(magic: u32, dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = magic.to_be_bytes().to_vec();
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

#[derive(Debug)]
pub struct Files {
    images: Vec<u8>,
    labels: Vec<u8>,
}

pub fn mnist_files(seed: u64, cases: usize) {
    let dir = scratch("mnist");
    let generate = |rng: &mut Rng| {
        let mut images = idx(0x0803, &[3, 2, 2], &[7; 12]);
        let mut labels = idx(0x0801, &[3], &[1, 2, 3]);
        if rng.chance(0.7) {
            mutate_bytes(&mut images, rng, 4);
        }
        if rng.chance(0.5) {
            mutate_bytes(&mut labels, rng, 2);
        }
        Files { images, labels }
    };
    let check = |f: &Files| {
        std::fs::write(dir.join("t10k-images-idx3-ubyte"), &f.images).unwrap();
        std::fs::write(dir.join("t10k-labels-idx1-ubyte"), &f.labels).unwrap();
        Outcome::from(mnist::load(&dir, Split::Test))
    };
    run("MNIST IDX bytes", seed, cases, generate, check);
    let _ = std::fs::remove_dir_all(&dir);
}

pub fn cifar_files(seed: u64, cases: usize) {
    let dir = scratch("cifar");
    let generate = |rng: &mut Rng| {
        let mut batch = Vec::new();
        for r in 0..2u8 {
            batch.push(r);
            batch.extend(std::iter::repeat_n(r * 50, 3072));
        }
        mutate_bytes(&mut batch, rng, 0);
        batch
    };
    let check = |batch: &Vec<u8>| {
        std::fs::write(dir.join("test_batch.bin"), batch).unwrap();
        Outcome::from(cifar10::load(&dir, Split::Test))
    };
    run("CIFAR-10 batch bytes", seed, cases, generate, check);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A valid 4x4 RGB PNG's bytes.
fn png_bytes(dir: &Path) -> Vec<u8> {
    let path = dir.join("valid.png");
    let pixels: Vec<u8> = (0..48).map(|i| (i * 5) as u8).collect();
    save_png(&path, &pixels, [3, 4, 4]).unwrap();
    std::fs::read(&path).unwrap()
}

/// Image bytes and the model input they are loaded for (PNG and JPEG targets).
#[derive(Debug)]
pub struct ImageCase {
    bytes: Vec<u8>,
    expected: [usize; 3],
    options: ImageOptions,
}

impl ImageCase {
    /// `bytes` for a model input drawn from `channels` and `sides`, resizing and converting
    /// each allowed half of the time.
    fn drawn(rng: &mut Rng, bytes: Vec<u8>, channels: &[usize], sides: &[usize]) -> Self {
        ImageCase {
            bytes,
            expected: [rng.pick(channels), rng.pick(sides), rng.pick(sides)],
            options: ImageOptions {
                resize: rng.chance(0.5),
                convert_channels: rng.chance(0.5),
            },
        }
    }

    /// Writes the bytes to `path`, reads them as they are, then loads them as the model input.
    fn load(&self, path: &Path, normalize: Option<&Normalize>) -> Outcome {
        std::fs::write(path, &self.bytes).unwrap();
        let _ = read_image(path);
        Outcome::from(load_image(
            path,
            self.expected,
            self.options,
            normalize,
            Device::Cpu,
        ))
    }
}

pub fn png_files(seed: u64, cases: usize) {
    let dir = scratch("png");
    let valid = png_bytes(&dir);
    let generate = |rng: &mut Rng| {
        let mut bytes = valid.clone();
        // IHDR width and height are the big-endian u32s at bytes 16..24.
        if rng.chance(0.3) {
            let v: u32 = rng.pick(&[0, 1, 0x7fff_ffff, 0xffff_ffff, 1 << 20]);
            let at = 16 + 4 * rng.below(2);
            bytes[at..at + 4].copy_from_slice(&v.to_be_bytes());
        }
        mutate_bytes(&mut bytes, rng, 0);
        let sides = [4, 4, 4, 1, 32, 1 << 16, 1 << 31, usize::MAX];
        ImageCase::drawn(rng, bytes, &[3, 3, 0, 1, 4, 5], &sides)
    };
    let path = dir.join("case.png");
    let norm = Normalize::new(&[0.5; 3], &[0.25; 3]).unwrap();
    let check = |p: &ImageCase| p.load(&path, (p.expected[0] == 3).then_some(&norm));
    run("PNG bytes and model inputs", seed, cases, generate, check);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The JPEG fixtures kiln-data's tests check against Pillow: RGB 4:2:0 baseline, the same image
/// progressive, and a gray baseline, so the mutations reach each of zune-jpeg's decode paths.
const JPEGS: [&[u8]; 3] = [
    include_bytes!("../../../data/tests/fixtures/pattern.jpg"),
    include_bytes!("../../../data/tests/fixtures/pattern_progressive.jpg"),
    include_bytes!("../../../data/tests/fixtures/flat_gray.jpg"),
];

/// Where each marker segment (`FF xx` followed by a big-endian length) starts, before the
/// entropy-coded data of the first scan.
fn jpeg_segments(bytes: &[u8]) -> Vec<usize> {
    let mut at = 2; // past SOI
    let mut found = Vec::new();
    while at + 4 <= bytes.len() && bytes[at] == 0xff {
        found.push(at);
        if bytes[at + 1] == 0xda {
            break; // start of scan: entropy-coded data follows
        }
        at += 2 + usize::from(u16::from_be_bytes([bytes[at + 2], bytes[at + 3]]));
    }
    found
}

pub fn jpeg_files(seed: u64, cases: usize) {
    let dir = scratch("jpeg");
    let generate = |rng: &mut Rng| {
        let mut bytes = JPEGS[rng.below(JPEGS.len())].to_vec();
        let segments = jpeg_segments(&bytes);
        let hostile = |rng: &mut Rng| rng.pick(&[0u16, 1, 2, 7, 0x8000, 0xfffe, 0xffff]);
        // A frame header (SOF0 / SOF2) with hostile sides, component count or sampling.
        if let Some(&sof) = segments
            .iter()
            .find(|&&at| matches!(bytes[at + 1], 0xc0 | 0xc2))
        {
            if rng.chance(0.3) && sof + 9 <= bytes.len() {
                let at = sof + 5 + 2 * rng.below(2); // height, then width
                bytes[at..at + 2].copy_from_slice(&hostile(rng).to_be_bytes());
            }
            if rng.chance(0.15) && sof + 12 <= bytes.len() {
                // the component count, or the first component's sampling factors
                let at = sof + 9 + 2 * rng.below(2);
                bytes[at] = rng.pick(&[0, 1, 2, 4, 0x11, 0x44, 0x41, 0xff]);
            }
        }
        // A segment's length field.
        if rng.chance(0.2) && !segments.is_empty() {
            let at = segments[rng.below(segments.len())] + 2;
            bytes[at..at + 2].copy_from_slice(&hostile(rng).to_be_bytes());
        }
        mutate_bytes(&mut bytes, rng, 0);
        // Hostile requested sizes are the PNG target's. A large real size here would only time
        // a large resize in a debug build: a mutated header's size is what gets decoded, and a
        // 16x32768 decode resized to 1000 wide is 0.3 G multiply-adds of legitimate work (a
        // second in release, as in Pillow), to 65536 wide 20 G.
        ImageCase::drawn(
            rng,
            bytes,
            &[3, 3, 1, 0, 4],
            &[12, 20, 16, 1, 100, usize::MAX],
        )
    };
    let path = dir.join("case.jpg");
    let check = |p: &ImageCase| p.load(&path, None);
    run("JPEG bytes and model inputs", seed, cases, generate, check);
    let _ = std::fs::remove_dir_all(&dir);
}

#[derive(Debug)]
pub struct Loader {
    batch_size: usize,
    drop_last: bool,
    prefetch: usize,
    crop_padding: usize,
    state: LoaderState,
}

pub fn loader_states(seed: u64, cases: usize) {
    let ds = {
        let pixels = (0..10 * 12).map(|i| i as u8).collect();
        let labels = (0..10).map(|i| i % 3).collect();
        let classes = ["a", "b", "c"].map(String::from).to_vec();
        Arc::new(ImageDataset::new("fuzz", [3, 2, 2], pixels, labels, classes).unwrap())
    };
    let generate = |rng: &mut Rng| {
        let (any_epoch, any_size) = (rng.next_u64(), rng.size());
        Loader {
            batch_size: rng.pick(&[0, 1, 3, 10, 11, usize::MAX]),
            drop_last: rng.chance(0.5),
            prefetch: rng.pick(&[0, 1, 2, 1 << 40, usize::MAX]),
            crop_padding: rng.pick(&[0, 1, 4, 1 << 40, usize::MAX]),
            state: LoaderState {
                epoch: rng.pick(&[0, 1, u64::MAX - 1, u64::MAX, any_epoch]),
                batches_done: rng.pick(&[0, 1, 2, 3, 4, usize::MAX, any_size]),
            },
        }
    };
    let check = |l: &Loader| {
        let config = DataLoaderConfig {
            batch_size: l.batch_size,
            drop_last: l.drop_last,
            shuffle: true,
            prefetch_batches: l.prefetch,
            augment: Augment {
                crop_padding: l.crop_padding,
                flip_prob: 0.5,
            },
            ..Default::default()
        };
        let mut loader = match DataLoader::new(ds.clone(), config, Device::Cpu) {
            Ok(loader) => loader,
            Err(e) => return refused(e),
        };
        if let Err(e) = loader.set_state(l.state) {
            return refused(e);
        }
        for batch in loader.iter().take(5) {
            if batch.is_err() {
                return Outcome::Refused;
            }
        }
        Outcome::Accepted
    };
    run(
        "data loader states and configs",
        seed,
        cases,
        generate,
        check,
    );
}
