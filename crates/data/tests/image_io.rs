//! Image input for `predict` and PNG output: decoding, layout, conversions, errors.

use kiln_autograd::Device;
use kiln_data::{
    image_grid, load_image, read_image, save_png, synthetic, ImageOptions, Normalize, Split,
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
    // (200 * 299 + 100 * 587 + 50 * 114 + 500) / 1000 = 124
    assert!((gray.to_vec::<f32>().unwrap()[0] - 124.0 / 255.0).abs() < 1e-6);
}

#[test]
fn jpeg_decodes_and_garbage_is_a_clear_error() {
    let dir = temp_dir("jpeg");
    // A flat 16x16 gray JPEG decodes back to (nearly) the same value.
    let path = dir.join("flat.jpg");
    let img = image::GrayImage::from_pixel(16, 16, image::Luma([90u8]));
    img.save(&path).unwrap();
    let (px, shape) = read_image(&path).unwrap();
    assert_eq!(shape, [1, 16, 16]);
    assert!(px.iter().all(|&v| v.abs_diff(90) <= 2), "{px:?}");
    let bad = dir.join("bad.png");
    std::fs::write(&bad, b"not an image at all").unwrap();
    let msg = read_image(&bad).unwrap_err().to_string();
    assert!(msg.contains("bad.png: cannot decode the image"), "{msg}");
    assert!(msg.contains("PNG and JPEG"), "{msg}");
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
