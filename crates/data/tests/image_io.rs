//! Image input for `predict` and PNG output: decoding, layout, conversions, errors.

use kiln_autograd::Device;
use kiln_data::{
    image_grid, load_image, read_image, resize_bilinear, save_png, synthetic, ImageOptions,
    Normalize, Split,
};
use std::path::PathBuf;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-data-img-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn png_round_trip_keeps_chw_bytes() {
    let dir = temp_dir("roundtrip");
    let (img, _) = synthetic::render(0, Split::Train, 3);
    let path = dir.join("s.png");
    save_png(&path, &img, [3, 32, 32]).unwrap();
    let (back, shape) = read_image(&path).unwrap();
    assert_eq!(shape, [3, 32, 32]);
    assert_eq!(back, img);
}

#[test]
fn load_image_gives_normalised_chw() {
    let dir = temp_dir("load");
    // 2x3 RGB: channel c of pixel (y, x) is 10 * c + 3 * y + x.
    let chw: Vec<u8> = (0..3)
        .flat_map(|c| (0..6).map(move |i| (10 * c + 3 * (i / 3) + i % 3) as u8))
        .collect();
    let path = dir.join("rgb.png");
    save_png(&path, &chw, [3, 2, 3]).unwrap();
    let n = Normalize::new(&[0.0, 0.1, 0.2], &[1.0, 0.5, 0.25]).unwrap();
    let t = load_image(
        &path,
        [3, 2, 3],
        ImageOptions::default(),
        Some(&n),
        Device::Cpu,
    )
    .unwrap();
    assert_eq!(t.shape(), &[3, 2, 3]);
    let v = t.to_vec::<f32>().unwrap();
    for c in 0..3 {
        for i in 0..6 {
            let want = (chw[c * 6 + i] as f32 / 255.0 - n.mean()[c]) / n.std()[c];
            assert!((v[c * 6 + i] - want).abs() < 1e-6);
        }
    }
}

#[test]
fn wrong_size_and_channels_name_both_shapes_and_the_fix() {
    let dir = temp_dir("wrong");
    let path = dir.join("digit.png");
    save_png(&path, &[128; 28 * 28], [1, 28, 28]).unwrap();
    let msg = load_image(
        &path,
        [3, 32, 32],
        ImageOptions::default(),
        None,
        Device::Cpu,
    )
    .unwrap_err()
    .to_string();
    assert!(msg.contains("digit.png"), "{msg}");
    assert!(
        msg.contains("image is 28x28 with 1 channel; the model expects 3x32x32: "),
        "{msg}"
    );
    assert!(msg.contains("resize it to 32x32"), "{msg}");
    assert!(msg.contains("convert it to 3 channels"), "{msg}");
    // Size right, channels wrong: only the channel fix is offered.
    let msg = load_image(
        &path,
        [3, 28, 28],
        ImageOptions::default(),
        None,
        Device::Cpu,
    )
    .unwrap_err()
    .to_string();
    assert!(!msg.contains("resize"), "{msg}");
    // Asked for: gray is repeated into three equal planes, then resized.
    let opts = ImageOptions {
        convert_channels: true,
        resize: true,
    };
    let t = load_image(&path, [3, 32, 32], opts, None, Device::Cpu).unwrap();
    assert_eq!(t.shape(), &[3, 32, 32]);
    let v = t.to_vec::<f32>().unwrap();
    assert!(v.iter().all(|&x| (x - 128.0 / 255.0).abs() < 1e-6));
}

#[test]
fn rgba_drops_alpha_and_rgb_to_gray_is_luma() {
    let dir = temp_dir("rgba");
    let path = dir.join("rgba.png");
    // One pixel: r 200, g 100, b 50, alpha 10.
    save_png(&path, &[200, 100, 50, 10], [4, 1, 1]).unwrap();
    let convert = ImageOptions {
        convert_channels: true,
        resize: false,
    };
    let rgb = load_image(&path, [3, 1, 1], convert, None, Device::Cpu).unwrap();
    let want = [200.0 / 255.0, 100.0 / 255.0, 50.0 / 255.0];
    for (a, b) in rgb.to_vec::<f32>().unwrap().iter().zip(want) {
        assert!((a - b).abs() < 1e-6);
    }
    let gray = load_image(&path, [1, 1, 1], convert, None, Device::Cpu).unwrap();
    // (200 * 19595 + 100 * 38470 + 50 * 7471 + 32768) >> 16 = 124
    assert!((gray.to_vec::<f32>().unwrap()[0] - 124.0 / 255.0).abs() < 1e-6);
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A `[C, H, W]` nested list of a fixture file, flattened.
fn flat(v: &serde_json::Value) -> Vec<u8> {
    fn walk(v: &serde_json::Value, out: &mut Vec<u8>) {
        match v {
            serde_json::Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            n => out.push(u8::try_from(n.as_u64().unwrap()).unwrap()),
        }
    }
    let mut out = Vec::new();
    walk(v, &mut out);
    out
}

fn dims<const N: usize>(v: &serde_json::Value) -> [usize; N] {
    let d: Vec<usize> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    d.try_into().unwrap()
}

#[test]
fn jpeg_decodes_and_garbage_is_a_clear_error() {
    // A flat 16x16 gray JPEG (Pillow, quality 90) decodes back to (nearly) its value.
    let (px, shape) = read_image(fixture("flat_gray.jpg")).unwrap();
    assert_eq!(shape, [1, 16, 16]);
    assert!(px.iter().all(|&v| v.abs_diff(90) <= 1), "{px:?}");
    let dir = temp_dir("jpeg");
    let bad = dir.join("bad.png");
    std::fs::write(&bad, b"not an image at all").unwrap();
    let msg = read_image(&bad).unwrap_err().to_string();
    assert!(msg.contains("bad.png: cannot decode the image"), "{msg}");
    assert!(msg.contains("PNG and JPEG"), "{msg}");
    // A PNG signature followed by garbage is a decoder error, not a panic.
    std::fs::write(&bad, b"\x89PNG\r\n\x1a\nnot really").unwrap();
    let msg = read_image(&bad).unwrap_err().to_string();
    assert!(msg.contains("cannot decode the image"), "{msg}");
}

#[test]
fn rgb_jpeg_decodes_close_to_pillow() {
    let want: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/pattern_jpg.json")).unwrap();
    let (px, shape) = read_image(fixture("pattern.jpg")).unwrap();
    assert_eq!(shape, dims::<3>(&want["shape"]));
    let want = flat(&want["pixels"]);
    assert_eq!(px.len(), want.len());
    // libjpeg (Pillow's) and zune-jpeg round their IDCT and chroma upsampling differently, the
    // most in the last column, where the 4:2:0 chroma is upsampled at the image's edge: two
    // thirds of the samples are equal here and the rest a few steps off.
    let diff: Vec<u8> = px.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).collect();
    let worst = diff.iter().max().copied().unwrap_or(0);
    let mean = diff.iter().map(|&d| f64::from(d)).sum::<f64>() / diff.len() as f64;
    assert!(worst <= 8 && mean < 0.75, "worst {worst}, mean {mean}");
}

#[test]
fn progressive_jpeg_decodes_to_the_baseline_pixels() {
    // The same coefficients in progressive scans (Pillow decodes both files to the same pixels;
    // the fixture script asserts it), so zune-jpeg's progressive path must give the baseline
    // path's bytes.
    let baseline = read_image(fixture("pattern.jpg")).unwrap();
    let progressive = read_image(fixture("pattern_progressive.jpg")).unwrap();
    assert_eq!(progressive.1, [3, 12, 20]);
    assert_eq!(progressive, baseline);
}

#[test]
fn truncated_jpeg_is_refused_as_pillow_refuses_it() {
    let dir = temp_dir("truncated-jpeg");
    let decode = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        read_image(&path)
    };
    let baseline = read_image(fixture("pattern.jpg")).unwrap();
    for name in ["pattern.jpg", "pattern_progressive.jpg"] {
        let bytes = std::fs::read(fixture(name)).unwrap();
        // Pillow 13 raises "image file is truncated" on each of these cuts (zune-jpeg alone
        // decodes the first three, filling the missing blocks with gray).
        for cut in [bytes.len() - 2, bytes.len() - 20, bytes.len() * 3 / 4, 40] {
            let msg = decode("cut.jpg", &bytes[..cut]).unwrap_err().to_string();
            assert!(
                msg.contains("cut.jpg: cannot decode the image")
                    && msg.contains("ends before its end-of-image marker: it is truncated"),
                "{name} cut to {cut} bytes: {msg}"
            );
        }
        // Bytes after the end marker are ignored, as Pillow ignores them.
        let mut padded = bytes.clone();
        padded.extend_from_slice(b"trailing bytes \xff\xd8");
        assert_eq!(decode("padded.jpg", &padded).unwrap(), baseline, "{name}");
    }
    // An end marker inside a segment (an EXIF thumbnail's) does not end the image: an APP1
    // segment holding `FF D9` after SOI, then the image cut short, is still truncated.
    let bytes = std::fs::read(fixture("pattern.jpg")).unwrap();
    let mut app1 = vec![
        0xff, 0xd8, 0xff, 0xe1, 0x00, 0x08, b'E', b'x', 0xff, 0xd9, 0xff, 0xd9,
    ];
    app1.extend_from_slice(&bytes[2..]);
    assert_eq!(decode("exif.jpg", &app1).unwrap(), baseline);
    let msg = decode("exif_cut.jpg", &app1[..app1.len() - 30])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("it is truncated"), "{msg}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn png_palette_transparency_and_sixteen_bit_samples_expand_to_bytes() {
    // index 0 opaque red, index 1 green made transparent by tRNS
    let (px, shape) = read_image(fixture("palette_trns.png")).unwrap();
    assert_eq!(shape, [4, 1, 2]);
    assert_eq!(px, [255, 0, 0, 255, 0, 0, 255, 0]);
    // 16-bit samples round to the nearest byte: (v + 128) / 257
    let (px, shape) = read_image(fixture("gray16.png")).unwrap();
    assert_eq!(shape, [1, 1, 6]);
    assert_eq!(px, [0, 0, 1, 2, 128, 255]);
}

#[test]
fn resize_bilinear_equals_pillow_byte_for_byte() {
    let cases: Vec<serde_json::Value> =
        serde_json::from_str(include_str!("fixtures/pil_resize.json")).unwrap();
    let mut checked = 0;
    for case in &cases {
        let shape = dims::<3>(&case["shape"]);
        let input = flat(&case["input"]);
        for r in case["resized"].as_array().unwrap() {
            let size = dims::<2>(&r["size"]);
            let got = resize_bilinear(&input, shape, size).unwrap();
            assert_eq!(got, flat(&r["output"]), "{shape:?} -> {size:?}");
            checked += 1;
        }
    }
    assert_eq!(checked, 11);
}

#[test]
fn rgb_to_gray_equals_pillow_convert_l() {
    // Every RGB triple of the fixture, as one row of an RGB PNG, loaded as one channel.
    let want: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/pil_luma.json")).unwrap();
    let (rgb, gray) = (flat(&want["rgb"]), flat(&want["gray"]));
    let n = gray.len();
    assert_eq!(rgb.len(), 3 * n);
    let dir = temp_dir("luma");
    let path = dir.join("row.png");
    let chw: Vec<u8> = (0..3)
        .flat_map(|c| (0..n).map(move |i| (c, i)))
        .map(|(c, i)| rgb[3 * i + c])
        .collect();
    save_png(&path, &chw, [3, 1, n]).unwrap();
    let opts = ImageOptions {
        convert_channels: true,
        resize: false,
    };
    let t = load_image(&path, [1, 1, n], opts, None, Device::Cpu).unwrap();
    let got: Vec<u8> = t
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| (v * 255.0).round() as u8)
        .collect();
    assert_eq!(got, gray);
}

#[test]
fn resize_bilinear_refuses_wrong_lengths_and_empty_sides() {
    let msg = resize_bilinear(&[0; 5], [1, 2, 3], [4, 4])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("5 bytes of a 1x2x3 image") && msg.contains("needs 6"),
        "{msg}"
    );
    let msg = resize_bilinear(&[0; 6], [1, 2, 3], [0, 4])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("at least one pixel"), "{msg}");
    kiln_testkit::assert_readable(&msg);
}

#[test]
fn load_image_resizes_as_pillow_after_converting_channels() {
    // An RGB file loaded as gray and resized: Pillow's `convert("L")` (the luma above) then
    // its bilinear resize of the gray plane.
    let dir = temp_dir("resize");
    let path = dir.join("rgb.png");
    let (rgb, _) = synthetic::render(1, Split::Train, 0);
    save_png(&path, &rgb, [3, 32, 32]).unwrap();
    let opts = ImageOptions {
        convert_channels: true,
        resize: true,
    };
    let t = load_image(&path, [1, 20, 45], opts, None, Device::Cpu).unwrap();
    let gray: Vec<u8> = (0..32 * 32)
        .map(|i| {
            let [r, g, b] = [0, 1, 2].map(|c| u32::from(rgb[c * 1024 + i]));
            ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16) as u8
        })
        .collect();
    let want = resize_bilinear(&gray, [1, 32, 32], [20, 45]).unwrap();
    let got = t.to_vec::<f32>().unwrap();
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(&want) {
        assert!((a - f32::from(*b) / 255.0).abs() < 1e-6);
    }
}

#[test]
fn grid_places_each_image_at_its_cell() {
    let a = [1u8; 4];
    let b = [2u8; 4];
    let c = [3u8; 4];
    let (g, shape) = image_grid(&[&a, &b, &c], [1, 2, 2], 2, 1, 0).unwrap();
    assert_eq!(shape, [1, 7, 7]);
    assert_eq!(g[7 + 1], 1); // (1, 1)
    assert_eq!(g[7 + 4], 2); // (1, 4)
    assert_eq!(g[4 * 7 + 1], 3); // (4, 1)
    assert_eq!(g[4 * 7 + 4], 0); // the empty fourth cell
    assert_eq!(g[0], 0);
}
