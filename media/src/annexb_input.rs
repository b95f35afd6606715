//! An H.264 Annex-B byte stream (`ffmpeg … -f h264 -`) cut into access units
//! for publishing without re-encoding.
//!
//! Access units are found by the NAL types (docs/protocol.md §10.3): a new one
//! starts at an AUD, SEI, SPS or PPS that follows a slice, or at a slice whose
//! first macroblock is 0. Access units before the first IDR are dropped (a
//! group must start with a keyframe). Each keyframe is given the stream's
//! latest SPS and PPS in front when it does not carry them itself, so every
//! group can be decoded alone. The first keyframe is decoded with openh264 to
//! check it and learn the picture size.

use std::io::Read;

use skiff_core::hang::avc::{self, AvcError};

use crate::h264::{self, Payload, StreamConfig};

/// Why an Annex-B stream was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading the input failed.
    #[error("h264 input: {0}")]
    Io(#[from] std::io::Error),
    /// The input has no start code in its first bytes: not Annex-B.
    #[error("h264 input: no Annex-B start code in the first {0} bytes")]
    NotAnnexB(usize),
    /// A NAL unit is malformed.
    #[error("h264 input: access unit {0}: {1}")]
    Nal(u64, AvcError),
    /// A keyframe came before any SPS and PPS.
    #[error("h264 input: keyframe without a preceding SPS and PPS")]
    NoParameterSets,
    /// The stream ended before a keyframe.
    #[error("h264 input: the stream ended before its first keyframe (truncated or empty?)")]
    NoKeyframe,
    /// The first keyframe does not decode.
    #[error("h264 input: the first keyframe does not decode (truncated stream?): {0}")]
    Undecodable(String),
    /// One NAL unit exceeds the input limit.
    #[error("h264 input: a NAL unit exceeds {0} bytes")]
    TooLarge(usize),
}

/// The largest NAL unit accepted.
pub const MAX_NAL: usize = 8 << 20;

/// An Annex-B stream read access unit by access unit.
pub struct AccessUnits<R: Read> {
    reader: R,
    /// Bytes read and not yet returned; `buf[pos..]` starts at a NAL's first byte.
    buf: Vec<u8>,
    pos: usize,
    eof: bool,
    units: u64,
    sps: Vec<u8>,
    pps: Vec<u8>,
    keyed: bool,
    config: Option<StreamConfig>,
    size: (usize, usize),
}

impl<R: Read> std::fmt::Debug for AccessUnits<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessUnits")
            .field("units", &self.units)
            .finish_non_exhaustive()
    }
}

impl<R: Read> AccessUnits<R> {
    /// Reads up to the first keyframe and checks it; the next
    /// [`AccessUnits::next_into`] returns that keyframe.
    ///
    /// # Errors
    /// [`Error`]: not Annex-B, a bad NAL, no keyframe, or one that does not decode.
    pub fn new(reader: R) -> Result<(AccessUnits<R>, Payload), Error> {
        let mut me = AccessUnits {
            reader,
            buf: Vec::with_capacity(1 << 20),
            pos: 0,
            eof: false,
            units: 0,
            sps: Vec::new(),
            pps: Vec::new(),
            keyed: false,
            config: None,
            size: (0, 0),
        };
        // Skip to the first start code.
        loop {
            if let Some((_, end)) = avc::find_start(&me.buf) {
                me.pos = end;
                break;
            }
            if me.eof || me.buf.len() > 4096 {
                return Err(if me.buf.is_empty() {
                    Error::NoKeyframe
                } else {
                    Error::NotAnnexB(me.buf.len())
                });
            }
            me.fill()?;
        }
        let mut first = Payload::with_capacity(1 << 16);
        if !me.next_into(&mut first)? {
            return Err(Error::NoKeyframe);
        }
        let config =
            StreamConfig::from_parameter_sets(&me.sps, &me.pps).map_err(|e| Error::Nal(0, e))?;
        let mut decoder = h264::Decoder::new().map_err(|e| Error::Undecodable(e.to_string()))?;
        decoder
            .configure(&config.avcc)
            .map_err(|e| Error::Undecodable(e.to_string()))?;
        let picture = decoder
            .decode(first.access_unit())
            .map_err(|e| Error::Undecodable(e.to_string()))?;
        let Some(picture) = picture else {
            return Err(Error::Undecodable("no picture".into()));
        };
        use openh264::formats::YUVSource;
        me.size = picture.dimensions();
        me.config = Some(config);
        Ok((me, first))
    }

    /// The first keyframe's codec string and avcC.
    pub fn config(&self) -> &StreamConfig {
        self.config.as_ref().expect("set by new")
    }

    /// The first keyframe's picture size.
    pub fn size(&self) -> (usize, usize) {
        self.size
    }

    /// Reads more input; sets `eof` at its end.
    fn fill(&mut self) -> Result<(), Error> {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > self.buf.capacity() / 2 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        let old = self.buf.len();
        self.buf.resize(old + 64 * 1024, 0);
        let n = loop {
            match self.reader.read(&mut self.buf[old..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.buf.truncate(old);
                    return Err(e.into());
                }
            }
        };
        self.buf.truncate(old + n);
        self.eof |= n == 0;
        Ok(())
    }

    /// The next NAL unit's span in `buf` (start, end, start of the one after), reading as needed.
    fn peek(&mut self) -> Result<Option<(usize, usize, usize)>, Error> {
        loop {
            let rest = &self.buf[self.pos..];
            if let Some((s, e)) = avc::find_start(rest) {
                let mut end = s;
                while end > 0 && rest[end - 1] == 0 {
                    end -= 1;
                }
                return Ok(Some((self.pos, self.pos + end, self.pos + e)));
            }
            if self.eof {
                if rest.is_empty() {
                    return Ok(None);
                }
                let n = self.buf.len();
                return Ok(Some((self.pos, n, n)));
            }
            if rest.len() > MAX_NAL {
                return Err(Error::TooLarge(MAX_NAL));
            }
            self.fill()?;
        }
    }

    /// Reads the next access unit into `out` (cleared first): false at the end of the stream.
    ///
    /// # Errors
    /// [`Error::Nal`] for a NAL with its forbidden bit set; [`Error::NoParameterSets`]
    /// for a keyframe before any SPS and PPS; [`Error::Io`].
    pub fn next_into(&mut self, out: &mut Payload) -> Result<bool, Error> {
        loop {
            out.clear();
            let mut has_slice = false;
            let mut has_sets = false;
            while let Some((start, end, next)) = self.peek()? {
                let nal = &self.buf[start..end];
                let Some(&h) = nal.first() else {
                    self.pos = next;
                    continue;
                };
                let t = avc::nal_type(h);
                let is_slice = (avc::NAL_SLICE..=avc::NAL_IDR).contains(&t);
                // After a slice: SEI, SPS, PPS, AUD, types 14 to 18, or a
                // picture's first slice begin the next access unit.
                let opens =
                    matches!(t, avc::NAL_SEI..=avc::NAL_AUD | 14..=18) || avc::starts_picture(nal);
                if has_slice && opens {
                    break;
                }
                if h & 0x80 != 0 {
                    return Err(Error::Nal(self.units, AvcError::BadNal));
                }
                match t {
                    avc::NAL_SPS => {
                        self.sps.clear();
                        self.sps.extend_from_slice(nal);
                        has_sets = true;
                    }
                    avc::NAL_PPS => {
                        self.pps.clear();
                        self.pps.extend_from_slice(nal);
                    }
                    avc::NAL_IDR if !has_sets && !has_slice => {
                        if self.sps.is_empty() || self.pps.is_empty() {
                            return Err(Error::NoParameterSets);
                        }
                        let units = self.units;
                        out.push_nal(&self.sps).map_err(|e| Error::Nal(units, e))?;
                        out.push_nal(&self.pps).map_err(|e| Error::Nal(units, e))?;
                        has_sets = true;
                    }
                    _ => {}
                }
                has_slice |= is_slice;
                if t != avc::NAL_AUD {
                    let nal = &self.buf[start..end];
                    out.push_nal(nal).map_err(|e| Error::Nal(self.units, e))?;
                }
                self.pos = next;
            }
            if !has_slice {
                return Ok(false);
            }
            self.units += 1;
            if out.is_keyframe() {
                self.keyed = true;
            }
            if self.keyed {
                return Ok(true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::h264::{EncodeOptions, Encoder};
    use crate::pattern::{self, Stamp};
    use crate::picture::Picture;

    /// `frames` frames of the pattern as an Annex-B stream, a keyframe every `gop`.
    fn stream(frames: u32, gop: u32) -> Vec<u8> {
        let opts = EncodeOptions {
            width: 160,
            height: 120,
            fps: 30.0,
            gop,
            bitrate: 300_000,
        };
        let mut enc = Encoder::new(opts).unwrap();
        let mut pic = Picture::new(160, 120);
        let mut out = Payload::with_capacity(1 << 16);
        let mut annexb = Vec::new();
        for n in 0..frames {
            pattern::draw(
                &mut pic,
                Stamp {
                    frame: n,
                    time_us: 0,
                },
            );
            if enc.encode(&pic, &mut out).unwrap() {
                for nal in avc::LengthPrefixed::new(out.access_unit()) {
                    annexb.extend_from_slice(&[0, 0, 0, 1]);
                    annexb.extend_from_slice(nal.unwrap());
                }
            }
        }
        annexb
    }

    #[test]
    fn splits_into_access_units_with_keyframes_first() {
        let data = stream(25, 10);
        let (mut units, first) = AccessUnits::new(&data[..]).unwrap();
        assert!(first.is_keyframe());
        assert_eq!(units.size(), (160, 120));
        assert!(units.config().codec.starts_with("avc1."));
        let mut out = Payload::with_capacity(1 << 16);
        let mut keys = vec![true];
        while units.next_into(&mut out).unwrap() {
            keys.push(out.is_keyframe());
        }
        assert_eq!(keys.len(), 25);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(*k, i % 10 == 0, "unit {i}");
        }
    }

    #[test]
    fn bad_streams_are_named() {
        let e = AccessUnits::new(&[][..]).unwrap_err();
        assert!(matches!(e, Error::NoKeyframe), "{e}");
        let e = AccessUnits::new(&[7u8; 5000][..]).unwrap_err();
        assert!(matches!(e, Error::NotAnnexB(_)), "{e}");
        let data = stream(3, 10);
        // Cut inside the first keyframe.
        let idr = data.windows(4).position(|w| w == [0, 0, 1, 0x65]).unwrap();
        for cut in [idr + 20, idr + 200, 30] {
            let e = AccessUnits::new(&data[..cut]).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::Undecodable(_) | Error::NoKeyframe | Error::Nal(..)
                ),
                "cut {cut}: {e}"
            );
        }
        // A keyframe without parameter sets.
        let e = AccessUnits::new(&data[idr - 1..]).unwrap_err();
        assert!(matches!(e, Error::NoParameterSets), "{e}");
        // The forbidden bit.
        let mut bad = data.clone();
        bad[idr + 3] |= 0x80;
        assert!(AccessUnits::new(&bad[..]).is_err());
    }
}
