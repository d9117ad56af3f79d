//! PNG and JPEG files to 8-bit pixels and back, on the `png` and `zune-jpeg` decoders (the ones
//! the `image` crate wraps, without its colour management and dozen other formats).
//!
//! Invariants: a decoded image is HWC bytes with 1 (gray), 2 (gray + alpha), 3 (RGB) or 4 (RGBA)
//! channels and holds exactly `H * W * C` bytes.
//! - PNG is expanded as libpng's `expand` does: palette to RGB or RGBA, gray under 8 bits to 8
//!   bits, a `tRNS` colour to alpha. 16-bit samples are rounded to 8 bits, `(v + 128) / 257`,
//!   as the `image` crate does (Pillow's `convert("L")` of a 16-bit image clips at 255 instead).
//! - JPEG gray stays gray; every other JPEG colour space (YCbCr, CMYK, YCCK) becomes RGB. A JPEG
//!   side above libjpeg's 65500 is refused, as Pillow refuses it, and so is a JPEG that ends
//!   before its end-of-image marker (a truncated file, which zune-jpeg would fill out with gray).
//! - The format is chosen by the file's signature, never by its name.
//! - No file decodes to more than [`MAX_DECODED_BYTES`]: the limit is checked from the header,
//!   before the pixels are read.

use crate::error::{Error, Result};
use std::path::Path;

/// The most bytes one decoded image may take (the `image` crate's default allocation limit),
/// so a small file that claims a huge image is refused instead of exhausting memory.
pub(crate) const MAX_DECODED_BYTES: usize = 512 << 20;

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
const JPEG_SIGNATURE: &[u8] = &[0xff, 0xd8, 0xff];
/// libjpeg's `JPEG_MAX_DIMENSION`: the longest JPEG side Pillow (and so torchvision) opens.
const JPEG_MAX_SIDE: usize = 65500;

/// A decoded image: HWC bytes with `channels` (1..=4) per pixel.
pub(crate) struct Decoded {
    pub(crate) hwc: Vec<u8>,
    pub(crate) height: usize,
    pub(crate) width: usize,
    pub(crate) channels: usize,
}

fn image_err(path: &Path, msg: String) -> Error {
    Error::Image {
        path: path.to_path_buf(),
        msg,
    }
}

fn undecodable(path: &Path, why: impl std::fmt::Display) -> Error {
    image_err(
        path,
        format!("cannot decode the image ({why}); kiln reads PNG and JPEG files"),
    )
}

/// `height * width * channels` bytes, refused above [`MAX_DECODED_BYTES`].
fn decoded_len(path: &Path, height: usize, width: usize, channels: usize) -> Result<usize> {
    let len = height
        .checked_mul(width)
        .and_then(|p| p.checked_mul(channels))
        .filter(|&n| n <= MAX_DECODED_BYTES);
    len.ok_or_else(|| {
        image_err(
            path,
            format!(
                "the file says the image is {width}x{height} with {channels} channel(s), more than \
                 the {} MiB kiln decodes at once; shrink the image (or check that the file is \
                 not damaged)",
                MAX_DECODED_BYTES >> 20
            ),
        )
    })
}

/// Reads and decodes the PNG or JPEG at `path`.
pub(crate) fn decode(path: &Path) -> Result<Decoded> {
    let bytes = crate::files::read_file(path)?;
    if bytes.starts_with(PNG_SIGNATURE) {
        decode_png(path, &bytes)
    } else if bytes.starts_with(JPEG_SIGNATURE) {
        decode_jpeg(path, &bytes)
    } else {
        Err(undecodable(path, "neither a PNG nor a JPEG signature"))
    }
}

fn decode_png(path: &Path, bytes: &[u8]) -> Result<Decoded> {
    let limits = png::Limits {
        bytes: MAX_DECODED_BYTES,
    };
    let mut decoder = png::Decoder::new_with_limits(std::io::Cursor::new(bytes), limits);
    decoder.set_transformations(png::Transformations::EXPAND);
    let mut reader = decoder.read_info().map_err(|e| undecodable(path, e))?;
    let (color, depth) = reader.output_color_type();
    let channels = color.samples();
    let (width, height) = reader.info().size();
    let len = decoded_len(path, height as usize, width as usize, channels)?;
    let wide = depth == png::BitDepth::Sixteen;
    let mut buf = vec![0u8; if wide { len * 2 } else { len }];
    let frame = reader
        .next_frame(&mut buf)
        .map_err(|e| undecodable(path, e))?;
    buf.truncate(frame.buffer_size());
    let hwc = if wide {
        buf.chunks_exact(2)
            .map(|be| ((u32::from(u16::from_be_bytes([be[0], be[1]])) + 128) / 257) as u8)
            .collect()
    } else {
        buf
    };
    if hwc.len() != len {
        return Err(undecodable(path, "the pixel data ends early"));
    }
    Ok(Decoded {
        hwc,
        height: height as usize,
        width: width as usize,
        channels,
    })
}

/// Whether the JPEG's segments and scans run to its end-of-image marker before the bytes end.
/// Segments are skipped by their lengths (so an EXIF thumbnail's own end marker is not taken for
/// the image's), entropy-coded data up to the next marker (in it `FF 00` is a stuffed byte and
/// `FF D0`..`FF D7` a restart marker), and bytes that are not a marker are passed over, as
/// libjpeg passes over them.
fn reaches_end_of_image(bytes: &[u8]) -> bool {
    let mut at = 2; // past SOI (FF D8)
    while at + 1 < bytes.len() {
        let code = bytes[at + 1];
        if bytes[at] != 0xff || code == 0 || code == 0xff {
            at += 1;
            continue;
        }
        at += 2;
        match code {
            0xd9 => return true,
            // SOI, restart markers and TEM have no length
            0xd8 | 0xd0..=0xd7 | 0x01 => {}
            _ => match bytes.get(at..at + 2) {
                Some(len) => at += usize::from(u16::from_be_bytes([len[0], len[1]])),
                None => return false,
            },
        }
    }
    false
}

fn decode_jpeg(path: &Path, bytes: &[u8]) -> Result<Decoded> {
    use zune_core::colorspace::ColorSpace;
    // zune-jpeg fills a truncated file out with gray; Pillow refuses it (unless told to load
    // truncated images), and so does kiln rather than train on made-up pixels.
    if !reaches_end_of_image(bytes) {
        return Err(undecodable(
            path,
            "the file ends before its end-of-image marker: it is truncated (a partial download \
             or copy?), as Pillow reports it; fetch the file again or re-encode it",
        ));
    }
    // JPEG sides are 16-bit: zune's smaller default limit is lifted and the sides and the
    // decoded size are checked below.
    let options = zune_core::options::DecoderOptions::default()
        .set_strict_mode(false)
        .set_max_width(usize::from(u16::MAX))
        .set_max_height(usize::from(u16::MAX));
    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(
        zune_core::bytestream::ZCursor::new(bytes),
        options,
    );
    decoder.decode_headers().map_err(|e| undecodable(path, e))?;
    let (Some((width, height)), Some(input)) = (decoder.dimensions(), decoder.input_colorspace())
    else {
        return Err(undecodable(path, "no frame header"));
    };
    // Above this zune-jpeg's MCU count overflows the 16-bit side (a panic in a debug build).
    if width.max(height) > JPEG_MAX_SIDE {
        return Err(undecodable(
            path,
            format!(
                "its frame header claims {height}x{width} pixels, beyond JPEG's practical \
                 limit of {JPEG_MAX_SIDE} a side (libjpeg's, so Pillow refuses it too)"
            ),
        ));
    }
    let out = match input {
        ColorSpace::Luma | ColorSpace::LumaA => ColorSpace::Luma,
        _ => ColorSpace::RGB,
    };
    decoder.set_options(decoder.options().jpeg_set_out_colorspace(out));
    let channels = out.num_components();
    let len = decoded_len(path, height, width, channels)?;
    let hwc = decoder.decode().map_err(|e| undecodable(path, e))?;
    if hwc.len() != len {
        return Err(undecodable(path, "the pixel data ends early"));
    }
    Ok(Decoded {
        hwc,
        height,
        width,
        channels,
    })
}

/// Writes HWC bytes (`channels` 1..=4 per pixel, checked by the caller) as an 8-bit PNG.
pub(crate) fn write_png(
    path: &Path,
    hwc: &[u8],
    height: u32,
    width: u32,
    channels: usize,
) -> Result<()> {
    let color = match channels {
        1 => png::ColorType::Grayscale,
        2 => png::ColorType::GrayscaleAlpha,
        3 => png::ColorType::Rgb,
        _ => png::ColorType::Rgba,
    };
    let write_err = |e: png::EncodingError| Error::Write {
        path: path.to_path_buf(),
        msg: e.to_string(),
        source: match e {
            png::EncodingError::IoError(io) => Some(io),
            _ => None,
        },
    };
    let file = std::fs::File::create(path).map_err(|e| write_err(e.into()))?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), width, height);
    encoder.set_color(color);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(write_err)?;
    writer.write_image_data(hwc).map_err(write_err)?;
    writer.finish().map_err(write_err)
}
