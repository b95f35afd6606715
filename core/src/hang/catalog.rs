//! A writer of hang catalogs (docs/protocol.md §10.2) for video renditions,
//! into a caller's buffer, without allocating.
//!
//! The catalog is one JSON object; its `video.renditions` map is keyed by
//! track name and holds a WebCodecs decoder configuration per rendition:
//!
//! ```text
//! {"video":{"renditions":{"video":{"codec":"avc1.42c01f","description":"01…",
//!   "codedWidth":320,"codedHeight":240,"framerate":30,"bitrate":1000000,
//!   "container":{"kind":"legacy"}}}}}
//! ```
//!
//! Publish it as the only frame of a catalog group, and keep that group open
//! while the broadcast lasts: a viewer joining later still finds it.

use core::fmt::{self, Write};

/// One video rendition of a catalog.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VideoRendition<'a> {
    /// The track carrying it, in the same broadcast.
    pub track: &'a str,
    /// The WebCodecs codec string (`avc1.42c01f`, `vp8`, …).
    pub codec: &'a str,
    /// The decoder's out-of-band configuration (an `avc1` track's avcC
    /// record), written as hex; required for `avc1`.
    pub description: Option<&'a [u8]>,
    /// Coded picture width in pixels.
    pub coded_width: u32,
    /// Coded picture height in pixels.
    pub coded_height: u32,
    /// Frames per second, if known (finite and positive).
    pub framerate: Option<f64>,
    /// Bits per second, if known.
    pub bitrate: Option<u64>,
}

/// Why [`write()`] wrote no catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum CatalogError {
    /// The buffer cannot hold the catalog.
    BufferTooSmall,
    /// A frame rate that is not a finite, positive number.
    InvalidFramerate,
    /// An `avc1` rendition without its avcC description.
    MissingDescription,
    /// Two renditions name the same track.
    DuplicateTrack,
}

impl fmt::Display for CatalogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CatalogError::BufferTooSmall => "catalog: buffer too small",
            CatalogError::InvalidFramerate => "catalog: frame rate not finite and positive",
            CatalogError::MissingDescription => "catalog: avc1 rendition without a description",
            CatalogError::DuplicateTrack => "catalog: two renditions of one track",
        })
    }
}

impl core::error::Error for CatalogError {}

/// Writes the catalog of `video` into `out`; returns its length in bytes.
///
/// # Errors
/// [`CatalogError`]: the buffer is too small, or a rendition is invalid.
/// `out` holds unspecified bytes after an error.
pub fn write(video: &[VideoRendition<'_>], out: &mut [u8]) -> Result<usize, CatalogError> {
    for (i, r) in video.iter().enumerate() {
        if r.framerate.is_some_and(|f| !f.is_finite() || f <= 0.0) {
            return Err(CatalogError::InvalidFramerate);
        }
        if r.codec.starts_with("avc1") && r.description.is_none() {
            return Err(CatalogError::MissingDescription);
        }
        if video[..i].iter().any(|o| o.track == r.track) {
            return Err(CatalogError::DuplicateTrack);
        }
    }
    let mut w = Out { buf: out, len: 0 };
    emit(video, &mut w).map_err(|_| CatalogError::BufferTooSmall)?;
    Ok(w.len)
}

/// The catalog's JSON, written through `w`.
fn emit(video: &[VideoRendition<'_>], w: &mut Out<'_>) -> fmt::Result {
    w.write_str("{\"video\":{\"renditions\":{")?;
    for (i, r) in video.iter().enumerate() {
        if i > 0 {
            w.write_char(',')?;
        }
        string(w, r.track)?;
        w.write_str(":{\"codec\":")?;
        string(w, r.codec)?;
        if let Some(d) = r.description {
            w.write_str(",\"description\":\"")?;
            for b in d {
                write!(w, "{b:02x}")?;
            }
            w.write_char('"')?;
        }
        write!(
            w,
            ",\"codedWidth\":{},\"codedHeight\":{}",
            r.coded_width, r.coded_height
        )?;
        if let Some(f) = r.framerate {
            w.write_str(",\"framerate\":")?;
            decimal_milli(w, f)?;
        }
        if let Some(b) = r.bitrate {
            write!(w, ",\"bitrate\":{b}")?;
        }
        w.write_str(",\"container\":{\"kind\":\"legacy\"}}")?;
    }
    w.write_str("}}}")
}

/// A finite, positive `f` as a JSON number rounded to three decimals, trailing
/// zeros dropped (`30`, `29.97`), in integer arithmetic: no float formatting
/// code, which would cost a microcontroller several KiB of flash.
fn decimal_milli(w: &mut Out<'_>, f: f64) -> fmt::Result {
    // Saturates above u64::MAX thousandths; frame rates are nowhere near.
    let milli = (f * 1000.0 + 0.5) as u64;
    let (int, mut frac, mut digits) = (milli / 1000, milli % 1000, 3);
    write!(w, "{int}")?;
    if frac == 0 {
        return Ok(());
    }
    while frac % 10 == 0 {
        frac /= 10;
        digits -= 1;
    }
    write!(w, ".{frac:0digits$}")
}

/// `s` as a JSON string (RFC 8259 §7): quotes, backslashes and control
/// characters escaped, everything else verbatim.
fn string(w: &mut Out<'_>, s: &str) -> fmt::Result {
    w.write_char('"')?;
    for c in s.chars() {
        match c {
            '"' => w.write_str("\\\"")?,
            '\\' => w.write_str("\\\\")?,
            '\n' => w.write_str("\\n")?,
            '\r' => w.write_str("\\r")?,
            '\t' => w.write_str("\\t")?,
            c if u32::from(c) < 0x20 => write!(w, "\\u{:04x}", u32::from(c))?,
            c => w.write_char(c)?,
        }
    }
    w.write_char('"')
}

/// A `fmt::Write` into a fixed buffer that fails when it is full.
struct Out<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl Write for Out<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len.checked_add(s.len()).ok_or(fmt::Error)?;
        let dst = self.buf.get_mut(self.len..end).ok_or(fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;

    fn rendition() -> VideoRendition<'static> {
        VideoRendition {
            track: "video",
            codec: "avc1.42c01f",
            description: Some(&[0x01, 0x42, 0xc0, 0x1f, 0xff]),
            coded_width: 320,
            coded_height: 240,
            framerate: Some(30.0),
            bitrate: Some(1_000_000),
        }
    }

    fn written(video: &[VideoRendition<'_>]) -> heapless::String<512> {
        let mut buf = [0u8; 512];
        let n = write(video, &mut buf).unwrap();
        let mut s = heapless::String::new();
        s.push_str(core::str::from_utf8(&buf[..n]).unwrap())
            .unwrap();
        s
    }

    #[test]
    fn one_avc1_rendition() {
        assert_eq!(
            written(&[rendition()]).as_str(),
            "{\"video\":{\"renditions\":{\"video\":{\"codec\":\"avc1.42c01f\",\
             \"description\":\"0142c01fff\",\"codedWidth\":320,\"codedHeight\":240,\
             \"framerate\":30,\"bitrate\":1000000,\"container\":{\"kind\":\"legacy\"}}}}}"
        );
    }

    #[test]
    fn optional_fields_and_two_renditions() {
        let a = VideoRendition {
            codec: "vp8",
            description: None,
            framerate: Some(29.97),
            bitrate: None,
            ..rendition()
        };
        let b = VideoRendition {
            track: "low",
            framerate: None,
            ..rendition()
        };
        let s = written(&[a, b]);
        assert!(
            s.contains("\"video\":{\"codec\":\"vp8\",\"codedWidth\""),
            "{s}"
        );
        assert!(s.contains("\"framerate\":29.97,\"container\""), "{s}");
        assert!(s.contains("},\"low\":{\"codec\":\"avc1.42c01f\""), "{s}");
        assert_eq!(written(&[]).as_str(), "{\"video\":{\"renditions\":{}}}");
    }

    #[test]
    fn framerates_to_three_decimals() {
        for (f, text) in [
            (30.0, "30"),
            (29.97, "29.97"),
            (30000.0 / 1001.0, "29.97"),
            (0.5, "0.5"),
            (12.0625, "12.063"),
            (1e30, "18446744073709551.615"),
        ] {
            let r = VideoRendition {
                framerate: Some(f),
                ..rendition()
            };
            let s = written(&[r]);
            assert!(
                s.contains(&std::format!("\"framerate\":{text},")),
                "{f}: {s}"
            );
        }
    }

    #[test]
    fn strings_are_escaped() {
        let r = VideoRendition {
            track: "a\"b\\c\n\u{1}é",
            ..rendition()
        };
        assert!(
            written(&[r]).starts_with("{\"video\":{\"renditions\":{\"a\\\"b\\\\c\\n\\u0001é\":{"),
            "{}",
            written(&[r])
        );
    }

    #[test]
    fn errors() {
        let mut buf = [0u8; 512];
        let n = write(&[rendition()], &mut buf).unwrap();
        for short in [0, 1, n / 2, n - 1] {
            assert_eq!(
                write(&[rendition()], &mut buf[..short]),
                Err(CatalogError::BufferTooSmall)
            );
        }
        assert_eq!(write(&[rendition()], &mut buf[..n]), Ok(n));
        for f in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let r = VideoRendition {
                framerate: Some(f),
                ..rendition()
            };
            assert_eq!(write(&[r], &mut buf), Err(CatalogError::InvalidFramerate));
        }
        let r = VideoRendition {
            description: None,
            ..rendition()
        };
        assert_eq!(write(&[r], &mut buf), Err(CatalogError::MissingDescription));
        assert_eq!(
            write(&[rendition(), rendition()], &mut buf),
            Err(CatalogError::DuplicateTrack)
        );
    }
}
