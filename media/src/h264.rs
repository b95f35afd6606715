//! H.264 through openh264 (Cisco's encoder and decoder, built from source),
//! framed for hang's `avc1` tracks (docs/protocol.md §10.3).
//!
//! [`Encoder`] turns [`Picture`]s into access units of length-prefixed NAL
//! units in a [`Payload`] (a reusable buffer with room for the legacy
//! prefix in front), a keyframe with SPS and PPS every `gop` frames.
//! [`Decoder`] takes the catalog's avcC and such access units back to pictures.

use openh264::OpenH264API;
use openh264::decoder::{DecodedYUV, DecoderConfig, Flush};
use openh264::encoder::{
    BitRate, EncoderConfig, FrameRate, FrameType, IntraFramePeriod, RateControlMode, UsageType,
};
use skiff_core::hang::avc::{self, AvcError, LengthPrefixed};
use skiff_core::hang::frame::{self, FrameError, MAX_PREFIX_LEN};

use crate::picture::Picture;

/// What went wrong in H.264 coding.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// openh264 refused the configuration or a picture.
    #[error("openh264: {0}")]
    Codec(#[from] openh264::Error),
    /// NAL framing or an avcC record is malformed.
    #[error("{0}")]
    Avc(#[from] AvcError),
    /// A frame's timestamp does not fit the legacy container.
    #[error("{0}")]
    Frame(#[from] FrameError),
    /// The encoder's first keyframe carried no SPS or PPS.
    #[error("h264: keyframe without SPS and PPS")]
    NoParameterSets,
}

/// A hang legacy payload being built: [`MAX_PREFIX_LEN`] bytes of room, then
/// the access unit's length-prefixed NAL units.
///
/// Reused frame after frame: once it has held the largest access unit it
/// never allocates again.
#[derive(Debug, Clone)]
pub struct Payload {
    buf: Vec<u8>,
    keyframe: bool,
}

impl Payload {
    /// An empty payload with room for `capacity` bytes of NAL units.
    pub fn with_capacity(capacity: usize) -> Payload {
        let mut buf = Vec::with_capacity(MAX_PREFIX_LEN + capacity);
        buf.resize(MAX_PREFIX_LEN, 0);
        Payload {
            buf,
            keyframe: false,
        }
    }

    /// Empties the access unit.
    pub fn clear(&mut self) {
        self.buf.truncate(MAX_PREFIX_LEN);
        self.keyframe = false;
    }

    /// Appends `nal` (header included, no start code) with its 4-byte length.
    ///
    /// # Errors
    /// [`AvcError::BadNal`] for an empty NAL or one with its forbidden bit set.
    pub fn push_nal(&mut self, nal: &[u8]) -> Result<(), AvcError> {
        let len = u32::try_from(nal.len()).map_err(|_| AvcError::BadNal)?;
        if nal.first().is_none_or(|h| h & 0x80 != 0) {
            return Err(AvcError::BadNal);
        }
        if avc::nal_type(nal[0]) == avc::NAL_IDR {
            self.keyframe = true;
        }
        self.buf.extend_from_slice(&len.to_be_bytes());
        self.buf.extend_from_slice(nal);
        Ok(())
    }

    /// True if an IDR slice was pushed since the last [`Payload::clear`].
    pub fn is_keyframe(&self) -> bool {
        self.keyframe
    }

    /// The access unit alone (length-prefixed NAL units).
    pub fn access_unit(&self) -> &[u8] {
        &self.buf[MAX_PREFIX_LEN..]
    }

    /// The whole legacy frame presented at `pts_us`: its prefix, written in
    /// front of the access unit, then the access unit.
    ///
    /// # Errors
    /// [`FrameError::TimestampTooLarge`] above 2^53 − 1 µs.
    pub fn frame(&mut self, pts_us: u64) -> Result<&[u8], FrameError> {
        let start = MAX_PREFIX_LEN - frame::prefix_len(pts_us);
        frame::encode_prefix(pts_us, &mut self.buf[start..MAX_PREFIX_LEN])?;
        Ok(&self.buf[start..])
    }
}

/// Encoder settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EncodeOptions {
    /// Picture width (even).
    pub width: usize,
    /// Picture height (even).
    pub height: usize,
    /// Frames per second.
    pub fps: f32,
    /// Frames per group: a keyframe every `gop` frames.
    pub gop: u32,
    /// Target bits per second.
    pub bitrate: u32,
}

/// The stream's decoder configuration, known after the first keyframe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamConfig {
    /// The WebCodecs codec string, `avc1.PPCCLL`.
    pub codec: String,
    /// The avcC record (the catalog's `description`).
    pub avcc: Vec<u8>,
}

impl StreamConfig {
    /// The configuration from an SPS and a PPS NAL unit.
    ///
    /// # Errors
    /// [`AvcError::BadParameterSet`] if they are not an SPS and a PPS.
    pub fn from_parameter_sets(sps: &[u8], pps: &[u8]) -> Result<StreamConfig, AvcError> {
        let codec = avc::codec_string(sps)?;
        let mut avcc = vec![0u8; sps.len() + pps.len() + 16];
        let n = avc::write_avcc(sps, pps, &mut avcc)?;
        avcc.truncate(n);
        Ok(StreamConfig {
            codec: String::from_utf8_lossy(&codec).into_owned(),
            avcc,
        })
    }
}

/// openh264's encoder, keyframes every `gop` frames, output as hang payloads.
pub struct Encoder {
    inner: openh264::encoder::Encoder,
    gop: u64,
    /// Pictures produced since the last keyframe.
    in_gop: u64,
    /// The next picture must be a keyframe.
    key_due: bool,
    config: Option<StreamConfig>,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("gop", &self.gop)
            .field("in_gop", &self.in_gop)
            .finish_non_exhaustive()
    }
}

impl Encoder {
    /// An encoder for `opts` (Baseline-compatible, real-time camera settings,
    /// bitrate control, one thread). To hold the bitrate openh264 may skip a
    /// picture now and then: [`Encoder::encode`] says so.
    ///
    /// # Errors
    /// [`Error::Codec`] if openh264 cannot be set up.
    pub fn new(opts: EncodeOptions) -> Result<Encoder, Error> {
        let config = EncoderConfig::new()
            .bitrate(BitRate::from_bps(opts.bitrate))
            .max_frame_rate(FrameRate::from_hz(opts.fps))
            .rate_control_mode(RateControlMode::Bitrate)
            .usage_type(UsageType::CameraVideoRealTime)
            .skip_frames(true)
            .intra_frame_period(IntraFramePeriod::from_num_frames(opts.gop))
            .num_threads(1);
        let inner =
            openh264::encoder::Encoder::with_api_config(OpenH264API::from_source(), config)?;
        Ok(Encoder {
            inner,
            gop: u64::from(opts.gop.max(1)),
            in_gop: 0,
            key_due: true,
            config: None,
        })
    }

    /// The codec string and avcC, once the first keyframe is encoded.
    pub fn config(&self) -> Option<&StreamConfig> {
        self.config.as_ref()
    }

    /// Encodes the next picture into `out` (cleared first): a keyframe (SPS,
    /// PPS, IDR) every `gop` pictures produced, else a P frame. Returns false
    /// (and leaves `out` empty) when the encoder skipped the picture to hold
    /// its bitrate.
    ///
    /// # Errors
    /// [`Error::Codec`] when openh264 fails; [`Error::NoParameterSets`] for a
    /// first keyframe without them.
    pub fn encode(&mut self, picture: &Picture, out: &mut Payload) -> Result<bool, Error> {
        out.clear();
        if self.key_due || self.in_gop >= self.gop {
            self.inner.force_intra_frame();
            self.key_due = true;
        }
        let stream = self.inner.encode(picture)?;
        if matches!(stream.frame_type(), FrameType::Skip | FrameType::Invalid) {
            return Ok(false);
        }
        let (mut sps, mut pps) = (None, None);
        for l in 0..stream.num_layers() {
            let Some(layer) = stream.layer(l) else {
                continue;
            };
            for i in 0..layer.nal_count() {
                let Some(unit) = layer.nal_unit(i) else {
                    continue;
                };
                for nal in avc::AnnexB::new(unit) {
                    // Kept once, for the stream's configuration.
                    if self.config.is_none() {
                        match avc::nal_type(nal[0]) {
                            avc::NAL_SPS => sps = Some(nal.to_vec()),
                            avc::NAL_PPS => pps = Some(nal.to_vec()),
                            _ => {}
                        }
                    }
                    out.push_nal(nal)?;
                }
            }
        }
        if self.config.is_none() {
            let (Some(sps), Some(pps)) = (sps, pps) else {
                return Err(Error::NoParameterSets);
            };
            self.config = Some(StreamConfig::from_parameter_sets(&sps, &pps)?);
        }
        if out.is_keyframe() {
            self.key_due = false;
            self.in_gop = 0;
        }
        self.in_gop += 1;
        Ok(true)
    }
}

/// openh264's decoder fed hang `avc1` access units.
pub struct Decoder {
    inner: openh264::decoder::Decoder,
    annexb: Vec<u8>,
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decoder").finish_non_exhaustive()
    }
}

impl Decoder {
    /// A decoder with no parameter sets yet.
    ///
    /// # Errors
    /// [`Error::Codec`] if openh264 cannot be set up.
    pub fn new() -> Result<Decoder, Error> {
        let config = DecoderConfig::new().flush_after_decode(Flush::NoFlush);
        let inner =
            openh264::decoder::Decoder::with_api_config(OpenH264API::from_source(), config)?;
        Ok(Decoder {
            inner,
            annexb: Vec::with_capacity(64 << 10),
        })
    }

    /// Feeds the SPS and PPS of an avcC record (a catalog's `description`).
    ///
    /// # Errors
    /// [`Error::Avc`] for a malformed record; [`Error::Codec`] if openh264 refuses it.
    pub fn configure(&mut self, avcc: &[u8]) -> Result<(), Error> {
        let (sps, pps, size) = avc::parse_avcc(avcc)?;
        if size != avc::LENGTH_SIZE {
            return Err(AvcError::BadRecord.into());
        }
        self.annexb.clear();
        for nal in [sps, pps] {
            self.annexb.extend_from_slice(&[0, 0, 0, 1]);
            self.annexb.extend_from_slice(nal);
        }
        self.inner.decode(&self.annexb)?;
        Ok(())
    }

    /// Decodes one access unit of length-prefixed NAL units; `None` when the
    /// decoder has no picture to show for it.
    ///
    /// # Errors
    /// [`Error::Avc`] for broken framing; [`Error::Codec`] when openh264 fails.
    pub fn decode(&mut self, access_unit: &[u8]) -> Result<Option<DecodedYUV<'_>>, Error> {
        self.annexb.clear();
        for nal in LengthPrefixed::new(access_unit) {
            self.annexb.extend_from_slice(&[0, 0, 0, 1]);
            self.annexb.extend_from_slice(nal?);
        }
        if self.annexb.is_empty() {
            return Ok(None);
        }
        Ok(self.inner.decode(&self.annexb)?)
    }
}

#[cfg(test)]
mod tests {
    use openh264::formats::YUVSource;

    use super::*;
    use crate::pattern::{self, Stamp};

    fn opts() -> EncodeOptions {
        EncodeOptions {
            width: 320,
            height: 240,
            fps: 30.0,
            gop: 10,
            bitrate: 600_000,
        }
    }

    #[test]
    fn encode_decode_reads_the_stamp_back() {
        let mut enc = Encoder::new(opts()).unwrap();
        let mut dec = Decoder::new().unwrap();
        let mut pic = Picture::new(320, 240);
        let mut out = Payload::with_capacity(1 << 16);
        for n in 0..25u32 {
            let stamp = Stamp {
                frame: n,
                time_us: 1_700_000_000_000_000 + u64::from(n) * 33_333,
            };
            pattern::draw(&mut pic, stamp);
            assert!(enc.encode(&pic, &mut out).unwrap(), "frame {n} skipped");
            assert_eq!(out.is_keyframe(), n % 10 == 0, "frame {n}");
            if n == 0 {
                let cfg = enc.config().unwrap();
                assert!(cfg.codec.starts_with("avc1.42"), "{}", cfg.codec);
                dec.configure(&cfg.avcc).unwrap();
            }
            let au = out.access_unit().to_vec();
            let pts = u64::from(n) * 33_333;
            let whole = out.frame(pts).unwrap().to_vec();
            assert_eq!(frame::decode(&whole), Ok((pts, &au[..])));
            let yuv = dec.decode(&au).unwrap().expect("a picture per access unit");
            assert_eq!(yuv.dimensions(), (320, 240));
            let (stride, _, _) = yuv.strides();
            assert_eq!(pattern::read_stamp(yuv.y(), stride, 320, 240), Some(stamp));
        }
    }

    #[test]
    fn bad_access_units_are_errors() {
        let mut dec = Decoder::new().unwrap();
        assert!(matches!(
            dec.decode(&[0, 0, 0, 9, 0x65]),
            Err(Error::Avc(AvcError::Truncated))
        ));
        assert!(matches!(dec.configure(&[1, 2, 3]), Err(Error::Avc(_))));
        let mut p = Payload::with_capacity(4);
        assert_eq!(p.push_nal(&[]), Err(AvcError::BadNal));
        assert_eq!(p.push_nal(&[0x80]), Err(AvcError::BadNal));
    }
}
