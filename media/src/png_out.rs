//! Decoded pictures written as PNG files (8-bit RGB, through the `png` crate).

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use openh264::decoder::DecodedYUV;
use openh264::formats::YUVSource;

/// Writes `yuv` as an RGB PNG at `path`, converting through `rgb` (a reused buffer).
///
/// # Errors
/// The file cannot be created or written.
pub fn write_png(path: &Path, yuv: &DecodedYUV<'_>, rgb: &mut Vec<u8>) -> std::io::Result<()> {
    let (w, h) = yuv.dimensions();
    rgb.resize(w * h * 3, 0);
    yuv.write_rgb8(rgb);
    let file = BufWriter::new(File::create(path)?);
    let mut enc = png::Encoder::new(file, w as u32, h as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().map_err(std::io::Error::other)?;
    writer
        .write_image_data(rgb)
        .map_err(std::io::Error::other)?;
    writer.finish().map_err(std::io::Error::other)
}
