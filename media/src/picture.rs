//! An I420 (YUV 4:2:0, 8-bit, planar) picture in one buffer, sized once.

use openh264::formats::YUVSource;

/// An I420 picture: a full-size luma plane, then quarter-size U and V planes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Picture {
    width: usize,
    height: usize,
    data: Vec<u8>,
}

impl Picture {
    /// A black picture of `width` × `height` pixels (both even).
    ///
    /// # Panics
    /// If a dimension is odd or zero (callers validate sizes from flags and files first).
    pub fn new(width: usize, height: usize) -> Picture {
        assert!(
            width > 0 && height > 0 && width.is_multiple_of(2) && height.is_multiple_of(2),
            "picture size {width}x{height}"
        );
        let luma = width * height;
        let mut data = vec![16u8; luma + luma / 2];
        data[luma..].fill(128);
        Picture {
            width,
            height,
            data,
        }
    }

    /// Width in pixels.
    pub fn width(&self) -> usize {
        self.width
    }

    /// Height in pixels.
    pub fn height(&self) -> usize {
        self.height
    }

    /// The three planes, writable: (Y, U, V).
    pub fn planes_mut(&mut self) -> (&mut [u8], &mut [u8], &mut [u8]) {
        let luma = self.width * self.height;
        let (y, uv) = self.data.split_at_mut(luma);
        let (u, v) = uv.split_at_mut(luma / 4);
        (y, u, v)
    }

    /// The whole buffer (Y, then U, then V), as a Y4M frame holds it.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.data
    }

    /// The luma plane.
    pub fn luma(&self) -> &[u8] {
        &self.data[..self.width * self.height]
    }
}

impl YUVSource for Picture {
    fn dimensions(&self) -> (usize, usize) {
        (self.width, self.height)
    }

    fn strides(&self) -> (usize, usize, usize) {
        (self.width, self.width / 2, self.width / 2)
    }

    fn y(&self) -> &[u8] {
        self.luma()
    }

    fn u(&self) -> &[u8] {
        let luma = self.width * self.height;
        &self.data[luma..luma + luma / 4]
    }

    fn v(&self) -> &[u8] {
        let luma = self.width * self.height;
        &self.data[luma + luma / 4..]
    }
}
