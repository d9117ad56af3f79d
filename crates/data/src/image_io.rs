//! Single images in and out: PNG/JPEG files to a normalised `[C, H, W]` tensor for inference
//! (`predict`), and dataset samples to PNG (`save_png`, `image_grid`) for docs and debugging.
//!
//! Decoding is `image_codec` (PNG and JPEG only). A file's pixels become 8-bit HWC, are
//! converted to the model's channel count, resized with Pillow's bilinear filter
//! ([`crate::resize_bilinear`]), then become CHW `f32` in `[0, 1]` and are normalised: what
//! torchvision's `Image.open(p).convert(mode)`, `Resize`, `ToTensor` and `Normalize` do. Nothing
//! is changed silently: a size or channel count the model does not take is an error naming
//! both, unless the caller asks for the fix ([`ImageOptions`]). The channel conversions are
//! fixed and documented: gray to RGB repeats the gray plane; alpha is dropped, not composited
//! (PIL's `convert("RGB")`); RGB to gray is PIL's `L` exactly (ITU-R 601-2 luma in 16-bit fixed
//! point: `(19595 r + 38470 g + 7471 b + 2^15) >> 16`).

use crate::error::{Error, Result};
use crate::image_codec::{self, Decoded};
use crate::memory;
use crate::resize::resize_bilinear;
use crate::transforms::{push_f32, Normalize};
use kiln_autograd::{Device, Tensor};
use std::path::Path;

/// What [`load_image`] may change to make an image fit the model. Both off by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ImageOptions {
    /// Convert gray/gray+alpha/RGB/RGBA to the model's channel count (see the module docs).
    pub convert_channels: bool,
    /// Resize to the model's height and width (Pillow's bilinear, aspect ratio not kept).
    pub resize: bool,
}

fn channels_word(c: usize) -> &'static str {
    if c == 1 {
        "channel"
    } else {
        "channels"
    }
}

/// Reads a PNG or JPEG as 8-bit CHW bytes with its own channel count (1 gray, 2 gray+alpha,
/// 3 RGB, 4 RGBA): `(pixels, [C, H, W])`.
pub fn read_image(path: impl AsRef<Path>) -> Result<(Vec<u8>, [usize; 3])> {
    let img = image_codec::decode(path.as_ref())?;
    let shape = [img.height, img.width, img.channels];
    Ok((
        hwc_to_chw(&img.hwc, shape)?,
        [img.channels, img.height, img.width],
    ))
}

/// `img`'s HWC bytes with `c` channels (1..=4), converting as the module docs say.
fn with_channels(img: Decoded, c: usize, what: &str, fix: &str) -> Result<Vec<u8>> {
    let src = img.channels;
    if src == c {
        return Ok(img.hwc);
    }
    let pixels = img.hwc.len() / src;
    let len = memory::checked_size("load_image", what, &[pixels, c], fix)?;
    let mut out = memory::filled("load_image", what, len, 0u8, fix)?;
    for (px, dst) in img.hwc.chunks_exact(src).zip(out.chunks_exact_mut(c)) {
        let (rgb, alpha) = match src {
            1 => ([px[0]; 3], 255),
            2 => ([px[0]; 3], px[1]),
            3 => ([px[0], px[1], px[2]], 255),
            _ => ([px[0], px[1], px[2]], px[3]),
        };
        let gray = if src <= 2 {
            px[0]
        } else {
            let [r, g, b] = rgb.map(u32::from);
            ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16) as u8
        };
        match c {
            1 => dst[0] = gray,
            2 => dst.copy_from_slice(&[gray, alpha]),
            3 => dst.copy_from_slice(&rgb),
            _ => dst.copy_from_slice(&[rgb[0], rgb[1], rgb[2], alpha]),
        }
    }
    Ok(out)
}

/// Reorders HWC bytes (`shape` = `[H, W, C]`) to CHW. Errors when `hwc` does not hold exactly
/// `H * W * C` bytes or `C` is 0.
pub fn hwc_to_chw(hwc: &[u8], shape: [usize; 3]) -> Result<Vec<u8>> {
    let [h, w, c] = shape;
    let n = memory::image_len("hwc_to_chw", [c, h, w])?;
    if c == 0 || hwc.len() != n {
        return Err(crate::error::arg_err(
            "hwc_to_chw",
            format!(
                "{} bytes for an HWC image of shape [{h}, {w}, {c}] (needs {n}, with at least one \
                 channel); pass HWC bytes of that shape",
                hwc.len()
            ),
        ));
    }
    let mut out = vec![0u8; n];
    for (i, px) in hwc.chunks_exact(c).enumerate() {
        for (ch, &v) in px.iter().enumerate() {
            out[ch * h * w + i] = v;
        }
    }
    Ok(out)
}

/// Reads a PNG or JPEG as the model's input: a `[C, H, W]` `F32` tensor on `device`, scaled to
/// `[0, 1]` and normalised when `normalize` is given. `expected` is the model's `[C, H, W]`;
/// add the batch dimension with `unsqueeze(0)`.
pub fn load_image(
    path: impl AsRef<Path>,
    expected: [usize; 3],
    options: ImageOptions,
    normalize: Option<&Normalize>,
    device: Device,
) -> Result<Tensor> {
    let path = path.as_ref();
    let (what, fix) = check_target("load_image", expected)?;
    let [ec, eh, ew] = expected;
    // the resized bytes (1 a value), then the tensor (4)
    let bytes = memory::checked_size("load_image", &what, &[eh, ew, 5 * ec], &fix)?;
    memory::check_fits("load_image", &what, bytes, &fix)?;
    if let Some(n) = normalize {
        if n.channels() != ec {
            return Err(crate::error::arg_err(
                "load_image",
                format!(
                    "normalize has {} channel(s) but the model expects {ec}; pass the \
                     statistics the model was trained with",
                    n.channels()
                ),
            ));
        }
    }
    // The tensor's buffer first: a size this process cannot hold is refused before the file is
    // decoded and resized to it.
    let mut data = memory::reserved("load_image", &what, ec * eh * ew, &fix)?;
    let chw = fit_image(path, expected, options, &what, &fix)?;
    push_f32(&chw, ec, normalize, &mut data);
    Ok(Tensor::from_vec(data, &[ec, eh, ew], device)?)
}

/// Checks that `expected` (`[C, H, W]`) is an image shape an image file can have (PNG's sides
/// are u32, JPEG's u16): `(what, fix)` for the messages about it.
pub(crate) fn check_target(op: &'static str, expected: [usize; 3]) -> Result<(String, String)> {
    let [ec, eh, ew] = expected;
    if !(1..=4).contains(&ec) || eh == 0 || ew == 0 {
        return Err(crate::error::arg_err(
            op,
            format!("expected input {ec}x{eh}x{ew} is not an image shape; pass [C, H, W] with C in 1..=4"),
        ));
    }
    let fix = format!(
        "a {ec}x{eh}x{ew} input is larger than this machine can hold; pass the model's real \
         input size"
    );
    if u32::try_from(eh).is_err() || u32::try_from(ew).is_err() {
        return Err(crate::error::arg_err(
            op,
            format!(
                "expected size {eh}x{ew} has a side beyond {} pixels; {fix}",
                u32::MAX
            ),
        ));
    }
    Ok((format!("a {ec}x{eh}x{ew} image"), fix))
}

/// The image at `path` as CHW bytes of `expected` (checked by [`check_target`]): decoded, its
/// channels converted and resized when `options` allow, else an error naming both shapes.
pub(crate) fn fit_image(
    path: &Path,
    expected: [usize; 3],
    options: ImageOptions,
    what: &str,
    fix: &str,
) -> Result<Vec<u8>> {
    let [ec, eh, ew] = expected;
    let img = image_codec::decode(path)?;
    let (h, w, c) = (img.height, img.width, img.channels);
    let wrong_size = (h, w) != (eh, ew) && !options.resize;
    let wrong_channels = c != ec && !options.convert_channels;
    if wrong_size || wrong_channels {
        let mut fixes = Vec::new();
        if wrong_size {
            fixes.push(format!(
                "resize it to {eh}x{ew} (ImageOptions::resize, --resize in predict)"
            ));
        }
        if wrong_channels {
            fixes.push(format!(
                "convert it to {ec} {} (ImageOptions::convert_channels, --convert-channels in \
                 predict: gray is repeated, alpha dropped, RGB to gray by luma)",
                channels_word(ec)
            ));
        }
        return Err(Error::ImageShape {
            path: path.to_path_buf(),
            found: format!("{h}x{w} with {c} {}", channels_word(c)),
            expected: format!("{ec}x{eh}x{ew}"),
            fix: fixes.join(", and "),
        });
    }
    let hwc = with_channels(img, ec, what, fix)?;
    let chw = hwc_to_chw(&hwc, [h, w, ec])?;
    drop(hwc);
    if (h, w) == (eh, ew) {
        return Ok(chw);
    }
    resize_bilinear(&chw, [ec, h, w], [eh, ew])
}

/// Writes CHW bytes of `shape` (`C` = 1 gray, 3 RGB or 4 RGBA) as a PNG file.
pub fn save_png(path: impl AsRef<Path>, chw: &[u8], shape: [usize; 3]) -> Result<()> {
    let path = path.as_ref();
    let [c, h, w] = shape;
    if !(1..=4).contains(&c) {
        return Err(crate::error::arg_err(
            "save_png",
            format!("{c} channels; PNG holds 1 (gray), 2, 3 (RGB) or 4 (RGBA)"),
        ));
    }
    let n = memory::image_len("save_png", shape)?;
    if chw.len() != n {
        return Err(crate::error::arg_err(
            "save_png",
            format!(
                "{} bytes for a {c}x{h}x{w} image (needs {n}); pass CHW bytes of that shape",
                chw.len()
            ),
        ));
    }
    let mut hwc = vec![0u8; chw.len()];
    for ch in 0..c {
        for i in 0..h * w {
            hwc[i * c + ch] = chw[ch * h * w + i];
        }
    }
    let side = |n: usize| {
        u32::try_from(n).map_err(|_| {
            crate::error::arg_err(
                "save_png",
                format!(
                    "a {c}x{h}x{w} image has a side beyond PNG's {} pixels",
                    u32::MAX
                ),
            )
        })
    };
    image_codec::write_png(path, &hwc, side(h)?, side(w)?, c)
}

/// Tiles same-shape CHW `images` into one CHW image, `cols` per row, `gap` pixels of `fill`
/// between and around them: `(pixels, [C, H, W])`, ready for [`save_png`].
pub fn image_grid(
    images: &[&[u8]],
    shape: [usize; 3],
    cols: usize,
    gap: usize,
    fill: u8,
) -> Result<(Vec<u8>, [usize; 3])> {
    let [c, h, w] = shape;
    if cols == 0 || images.is_empty() {
        return Err(crate::error::arg_err(
            "image_grid",
            "needs at least one image and one column",
        ));
    }
    let n = memory::image_len("image_grid", shape)?;
    if let Some(i) = images.iter().position(|im| im.len() != n) {
        return Err(crate::error::arg_err(
            "image_grid",
            format!("image {i} is not {c}x{h}x{w}; pass images of one shape"),
        ));
    }
    let rows = images.len().div_ceil(cols);
    let what = format!(
        "a grid of {} {c}x{h}x{w} images, {cols} per row",
        images.len()
    );
    let fix = "use fewer images, fewer columns or a smaller gap";
    let side = |n: usize, len: usize| {
        len.checked_add(gap)
            .and_then(|cell| cell.checked_mul(n))
            .and_then(|s| s.checked_add(gap))
            .ok_or_else(|| memory::overflow("image_grid", &what, fix))
    };
    let (gh, gw) = (side(rows, h)?, side(cols, w)?);
    let len = memory::checked_size("image_grid", &what, &[c, gh, gw], fix)?;
    let mut out = memory::filled("image_grid", &what, len, fill, fix)?;
    for (k, im) in images.iter().enumerate() {
        let (oy, ox) = (gap + (k / cols) * (h + gap), gap + (k % cols) * (w + gap));
        for ch in 0..c {
            for y in 0..h {
                let dst = (ch * gh + oy + y) * gw + ox;
                out[dst..dst + w].copy_from_slice(&im[(ch * h + y) * w..(ch * h + y + 1) * w]);
            }
        }
    }
    Ok((out, [c, gh, gw]))
}
