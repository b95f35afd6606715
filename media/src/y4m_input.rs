//! Raw pictures from a YUV4MPEG2 stream (`ffmpeg … -f yuv4mpegpipe -`), through the `y4m` crate.

use std::io::{BufReader, Read};

use crate::picture::Picture;

/// Why a Y4M stream was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The stream header is not a valid YUV4MPEG2 header.
    #[error("y4m: bad stream header: {0}")]
    Header(String),
    /// The stream's colour space is not 8-bit 4:2:0.
    #[error("y4m: colour space {0} is not 8-bit 4:2:0 (convert with ffmpeg -pix_fmt yuv420p)")]
    Colorspace(String),
    /// Odd or out-of-range picture dimensions.
    #[error("y4m: picture size {0}x{1} is not even or exceeds 3840x2160")]
    Size(usize, usize),
    /// A frame header is malformed, or reading failed.
    #[error("y4m: frame {0}: {1}")]
    Frame(u64, String),
}

/// A Y4M stream read frame by frame into a [`Picture`].
pub struct Y4mSource<R: Read> {
    decoder: y4m::Decoder<BufReader<R>>,
    frames: u64,
}

impl<R: Read> std::fmt::Debug for Y4mSource<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Y4mSource")
            .field("width", &self.width())
            .field("height", &self.height())
            .field("frames", &self.frames)
            .finish()
    }
}

impl<R: Read> Y4mSource<R> {
    /// Reads and checks the stream header.
    ///
    /// # Errors
    /// [`Error::Header`], [`Error::Colorspace`] or [`Error::Size`].
    pub fn new(reader: R) -> Result<Y4mSource<R>, Error> {
        let limits = y4m::Limits {
            bytes: 3840 * 2160 * 3 / 2,
        };
        let decoder = y4m::Decoder::new_with_limits(BufReader::new(reader), limits)
            .map_err(|e| Error::Header(describe(&e)))?;
        let cs = decoder.get_colorspace();
        use y4m::Colorspace::*;
        if !matches!(cs, C420 | C420jpeg | C420paldv | C420mpeg2) {
            return Err(Error::Colorspace(format!("{cs:?}")));
        }
        let (w, h) = (decoder.get_width(), decoder.get_height());
        if w == 0
            || h == 0
            || !w.is_multiple_of(2)
            || !h.is_multiple_of(2)
            || w.max(h) > 3840
            || w.min(h) > 2160
        {
            return Err(Error::Size(w, h));
        }
        Ok(Y4mSource { decoder, frames: 0 })
    }

    /// Picture width.
    pub fn width(&self) -> usize {
        self.decoder.get_width()
    }

    /// Picture height.
    pub fn height(&self) -> usize {
        self.decoder.get_height()
    }

    /// The frame rate the header states, if it states one.
    pub fn fps(&self) -> Option<f64> {
        let r = self.decoder.get_framerate();
        (r.num > 0 && r.den > 0).then(|| r.num as f64 / r.den as f64)
    }

    /// Reads the next frame into `pic` (of this stream's size); false at the end of the stream.
    ///
    /// A frame cut short by the end of the stream counts as the end.
    ///
    /// # Errors
    /// [`Error::Frame`] for a malformed frame header or a read error.
    ///
    /// # Panics
    /// If `pic` is not this stream's size.
    pub fn read_into(&mut self, pic: &mut Picture) -> Result<bool, Error> {
        assert_eq!((pic.width(), pic.height()), (self.width(), self.height()));
        match self.decoder.read_frame() {
            Ok(frame) => {
                let (y, u, v) = pic.planes_mut();
                y.copy_from_slice(frame.get_y_plane());
                u.copy_from_slice(frame.get_u_plane());
                v.copy_from_slice(frame.get_v_plane());
                self.frames += 1;
                Ok(true)
            }
            Err(y4m::Error::EOF) => Ok(false),
            Err(e) => Err(Error::Frame(self.frames, describe(&e))),
        }
    }
}

/// A y4m error in words.
fn describe(e: &y4m::Error) -> String {
    match e {
        y4m::Error::EOF => "the stream ends inside its header".into(),
        y4m::Error::ParseError(p) => format!("not YUV4MPEG2 ({p})"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(w: usize, h: usize, frames: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut enc = y4m::encode(w, h, y4m::Ratio::new(25, 1))
            .with_colorspace(y4m::Colorspace::C420jpeg)
            .write_header(&mut out)
            .unwrap();
        let (y, c) = (vec![100u8; w * h], vec![128u8; w * h / 4]);
        for _ in 0..frames {
            enc.write_frame(&y4m::Frame::new([&y, &c, &c], None))
                .unwrap();
        }
        out
    }

    #[test]
    fn reads_frames_then_ends() {
        let data = stream(64, 48, 3);
        let mut src = Y4mSource::new(&data[..]).unwrap();
        assert_eq!((src.width(), src.height(), src.fps()), (64, 48, Some(25.0)));
        let mut pic = Picture::new(64, 48);
        for _ in 0..3 {
            assert!(src.read_into(&mut pic).unwrap());
            assert!(pic.luma().iter().all(|&p| p == 100));
        }
        assert!(!src.read_into(&mut pic).unwrap());
        // Cut inside the last frame: the end.
        let mut src = Y4mSource::new(&data[..data.len() - 10]).unwrap();
        assert!(src.read_into(&mut pic).unwrap() && src.read_into(&mut pic).unwrap());
        assert!(!src.read_into(&mut pic).unwrap());
    }

    #[test]
    fn bad_headers_are_named() {
        for bad in [
            &b""[..],
            b"YUV4MPEG2 ",
            b"P6 64 48 255\n",
            b"YUV4MPEG2 W64 H48 Fx\n",
        ] {
            let e = Y4mSource::new(bad).unwrap_err();
            assert!(matches!(e, Error::Header(_)), "{e}");
        }
        let e = Y4mSource::new(&b"YUV4MPEG2 W64 H48 F25:1 C444\n"[..]).unwrap_err();
        assert!(matches!(e, Error::Colorspace(_)), "{e}");
        let e = Y4mSource::new(&b"YUV4MPEG2 W63 H48 F25:1 C420jpeg\n"[..]).unwrap_err();
        assert!(matches!(e, Error::Size(63, 48)), "{e}");
        let mut data = stream(64, 48, 2);
        let second = data.len() - (64 * 48 * 3 / 2 + 6);
        data[second] = b'X';
        let mut src = Y4mSource::new(&data[..]).unwrap();
        let mut pic = Picture::new(64, 48);
        assert!(src.read_into(&mut pic).unwrap());
        assert!(matches!(src.read_into(&mut pic), Err(Error::Frame(1, _))));
    }
}
