//! Fragmented MP4 (CMAF) of recorded tracks, made with the `mp4-atom`
//! crate's box types (every box is encoded by the crate, none by hand: the
//! box layouts, versions and flags are the crate's, kept against the
//! ISO/IEC 14496-12 test files it carries).
//!
//! * [`init_segment`]: `ftyp` + `moov` (one track: `avc1` with its `avcC`
//!   from the hang catalog's `description`, or `Opus` with its `dOps`;
//!   `mvex` for fragments);
//! * [`media_segment`]: one `moof` + `mdat` holding one moq-lite group (a
//!   GOP: its first frame is a keyframe; every audio frame is one);
//! * [`catalog`]: the renditions of a hang catalog this module can store.
//!
//! Times are the hang frames' own: microseconds, so the MP4 timescale is
//! 1 000 000 and a sample's decode time is its presentation time (no
//! B-frames are reordered: hang's legacy container carries one timestamp).

use mp4_atom::{
    Atom, Audio, Avc1, Avcc, Codec, Decode, Dinf, Dops, Dref, Encode, Ftyp, Hdlr, Header, Mdat,
    Mdhd, Mdia, Mehd, Mfhd, Minf, Moof, Moov, Mvex, Mvhd, Opus, Smhd, Stbl, Stco, Stsc, Stsd, Stsz,
    Stts, Tfdt, Tfhd, Tkhd, Traf, Trak, Trex, Trun, TrunEntry, Url, Visual, Vmhd,
};

/// MP4 timescale of recorded tracks: microseconds, as hang's timestamps.
pub const TIMESCALE: u32 = 1_000_000;

/// Sample flags of a keyframe: depends on no other sample (sync sample).
const FLAGS_KEY: u32 = 0x0200_0000;
/// Sample flags of a delta frame: depends on others, not a sync sample.
const FLAGS_DELTA: u32 = 0x0101_0000;

/// An Opus audio rendition of a hang catalog (mono or stereo).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AudioTrack {
    /// The track carrying it.
    pub name: String,
    /// The input sample rate, Hz (the catalog's `sampleRate`).
    pub sample_rate: u32,
    /// Channels: 1 or 2.
    pub channels: u8,
}

/// A rendition this module stores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendition {
    /// H.264 video.
    Video(VideoTrack),
    /// Opus audio.
    Audio(AudioTrack),
}

impl Rendition {
    /// The track carrying it.
    pub fn name(&self) -> &str {
        match self {
            Rendition::Video(v) => &v.name,
            Rendition::Audio(a) => &a.name,
        }
    }

    /// True for audio (every frame is a sync sample).
    pub fn is_audio(&self) -> bool {
        matches!(self, Rendition::Audio(_))
    }
}

/// An H.264 video rendition of a hang catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VideoTrack {
    /// The track carrying it.
    pub name: String,
    /// The avcC record (the catalog's `description`, hex-decoded).
    pub avcc: Vec<u8>,
    /// Coded width in pixels.
    pub width: u16,
    /// Coded height in pixels.
    pub height: u16,
}

/// Why a catalog or a track could not be turned into MP4.
#[derive(Debug, thiserror::Error)]
pub enum Mp4Error {
    /// The catalog is not JSON, or not a hang catalog.
    #[error("catalog: {0}")]
    Catalog(String),
    /// The avcC record does not parse.
    #[error("avcC: {0}")]
    Avcc(mp4_atom::Error),
    /// The box encoder refused (a value out of its range).
    #[error("mp4: {0}")]
    Encode(mp4_atom::Error),
    /// A group without frames, or with more than an MP4 run holds.
    #[error("segment: {0}")]
    Segment(&'static str),
}

/// The renditions of the hang catalog `json` this module stores, in the
/// catalog's order (video, then audio), and the names of the renditions
/// skipped: video other than H.264 with an avcC `description` (`avc1`),
/// audio other than mono or stereo Opus.
///
/// # Errors
/// [`Mp4Error::Catalog`] if `json` is not a JSON object.
pub fn catalog(json: &[u8]) -> Result<(Vec<Rendition>, Vec<String>), Mp4Error> {
    let value: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| Mp4Error::Catalog(e.to_string()))?;
    let root = value
        .as_object()
        .ok_or_else(|| Mp4Error::Catalog("not a JSON object".into()))?;
    let renditions = |kind: &str| {
        root.get(kind)
            .and_then(|v| v.get("renditions"))
            .and_then(|r| r.as_object())
            .into_iter()
            .flatten()
    };
    let mut tracks = Vec::new();
    let mut skipped = Vec::new();
    for (name, r) in renditions("video") {
        let codec = r.get("codec").and_then(|c| c.as_str()).unwrap_or("");
        let avcc = r
            .get("description")
            .and_then(|d| d.as_str())
            .and_then(hex_decode);
        let dim = |key: &str| {
            r.get(key)
                .and_then(|v| v.as_u64())
                .and_then(|v| u16::try_from(v).ok())
        };
        match (
            codec.starts_with("avc1"),
            avcc,
            dim("codedWidth"),
            dim("codedHeight"),
        ) {
            (true, Some(avcc), Some(width), Some(height)) => {
                tracks.push(Rendition::Video(VideoTrack {
                    name: name.clone(),
                    avcc,
                    width,
                    height,
                }));
            }
            _ => skipped.push(name.clone()),
        }
    }
    for (name, r) in renditions("audio") {
        let codec = r.get("codec").and_then(|c| c.as_str()).unwrap_or("");
        let rate = r
            .get("sampleRate")
            .and_then(|v| v.as_u64())
            .and_then(|v| u32::try_from(v).ok())
            .filter(|&v| v > 0);
        let channels = r
            .get("numberOfChannels")
            .and_then(|v| v.as_u64())
            .and_then(|v| u8::try_from(v).ok())
            .filter(|c| (1..=2).contains(c));
        match (codec == "opus", rate, channels) {
            (true, Some(sample_rate), Some(channels)) => {
                tracks.push(Rendition::Audio(AudioTrack {
                    name: name.clone(),
                    sample_rate,
                    channels,
                }));
            }
            _ => skipped.push(name.clone()),
        }
    }
    Ok((tracks, skipped))
}

/// `text` as bytes if it is an even number of hex digits.
fn hex_decode(text: &str) -> Option<Vec<u8>> {
    let b = text.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    b.chunks(2)
        .map(|p| {
            let d = |c: u8| char::from(c).to_digit(16);
            Some((d(p[0])? * 16 + d(p[1])?) as u8)
        })
        .collect()
}

/// The init segment (`ftyp` + `moov`) of `rendition` as MP4 track `track_id`.
///
/// # Errors
/// [`Mp4Error::Avcc`] if the avcC record does not parse; [`Mp4Error::Encode`].
pub fn init_segment(track_id: u32, rendition: &Rendition) -> Result<Vec<u8>, Mp4Error> {
    let (tkhd, hdlr, minf) = match rendition {
        Rendition::Video(v) => video_parts(track_id, v)?,
        Rendition::Audio(a) => audio_parts(track_id, a),
    };
    let ftyp = Ftyp {
        major_brand: b"iso6".into(),
        minor_version: 0,
        compatible_brands: vec![b"iso6".into(), b"cmfc".into(), b"mp41".into()],
    };
    let moov = Moov {
        mvhd: Mvhd {
            timescale: TIMESCALE,
            next_track_id: track_id.saturating_add(1),
            rate: 1.into(),
            volume: 1.into(),
            ..Default::default()
        },
        mvex: Some(Mvex {
            mehd: None,
            trex: vec![Trex {
                track_id,
                default_sample_description_index: 1,
                ..Default::default()
            }],
        }),
        trak: vec![Trak {
            tkhd,
            mdia: Mdia {
                mdhd: Mdhd {
                    timescale: TIMESCALE,
                    language: "und".into(),
                    ..Default::default()
                },
                hdlr,
                minf,
            },
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut out = Vec::new();
    ftyp.encode(&mut out).map_err(Mp4Error::Encode)?;
    moov.encode(&mut out).map_err(Mp4Error::Encode)?;
    Ok(out)
}

/// The sample table of a fragmented track: no samples (they are in the
/// fragments), only `entry` describing them.
fn empty_stbl(entry: Codec) -> Stbl {
    Stbl {
        stsd: Stsd {
            codecs: vec![entry],
        },
        stts: Stts::default(),
        stsc: Stsc::default(),
        stsz: Stsz::default(),
        stco: Some(Stco::default()),
        ..Default::default()
    }
}

/// The `dinf` every track has: its media is in this file.
fn self_contained() -> Dinf {
    Dinf {
        dref: Dref {
            entries: vec![Url::default().into()],
        },
    }
}

/// The track header, handler and media information of an H.264 track.
fn video_parts(track_id: u32, video: &VideoTrack) -> Result<(Tkhd, Hdlr, Minf), Mp4Error> {
    let avcc = Avcc::decode_body(&mut video.avcc.as_slice()).map_err(Mp4Error::Avcc)?;
    let tkhd = Tkhd {
        track_id,
        enabled: true,
        in_movie: true,
        width: video.width.into(),
        height: video.height.into(),
        ..Default::default()
    };
    let hdlr = Hdlr {
        handler: b"vide".into(),
        name: "skiff video".into(),
    };
    let entry = Codec::Avc1(Avc1 {
        visual: Visual {
            data_reference_index: 1,
            width: video.width,
            height: video.height,
            ..Default::default()
        },
        avcc,
        ..Default::default()
    });
    let minf = Minf {
        vmhd: Some(Vmhd::default()),
        dinf: self_contained(),
        stbl: empty_stbl(entry),
        ..Default::default()
    };
    Ok((tkhd, hdlr, minf))
}

/// The track header, handler and media information of an Opus track
/// (RFC 7845's defaults: 48 kHz output, 312 samples of pre-skip, channel
/// mapping family 0).
fn audio_parts(track_id: u32, audio: &AudioTrack) -> (Tkhd, Hdlr, Minf) {
    let tkhd = Tkhd {
        track_id,
        enabled: true,
        in_movie: true,
        alternate_group: 1,
        volume: 1.into(),
        ..Default::default()
    };
    let hdlr = Hdlr {
        handler: b"soun".into(),
        name: "skiff audio".into(),
    };
    let entry = Codec::Opus(Opus {
        audio: Audio {
            data_reference_index: 1,
            channel_count: u16::from(audio.channels),
            sample_size: 16,
            sample_rate: 48_000.into(),
        },
        dops: Dops {
            output_channel_count: audio.channels,
            pre_skip: 312,
            input_sample_rate: audio.sample_rate,
            output_gain: 0,
            channel_mapping: None,
        },
        btrt: None,
    });
    let minf = Minf {
        smhd: Some(Smhd::default()),
        dinf: self_contained(),
        stbl: empty_stbl(entry),
        ..Default::default()
    };
    (tkhd, hdlr, minf)
}

/// The stored init segment `init` made the head of an exported file of
/// `duration_us`: the movie and its track say how long they last (`mvhd`,
/// `tkhd`, and `mehd` for the fragments).
///
/// # Errors
/// [`Mp4Error::Encode`] if `init` is not an `ftyp` + `moov` this module wrote.
pub fn export_init(init: &[u8], duration_us: u64) -> Result<Vec<u8>, Mp4Error> {
    let buf = &mut &init[..];
    let ftyp = Ftyp::decode(buf).map_err(Mp4Error::Encode)?;
    let mut moov = Moov::decode(buf).map_err(Mp4Error::Encode)?;
    moov.mvhd.duration = duration_us;
    if let Some(mvex) = moov.mvex.as_mut() {
        mvex.mehd = Some(Mehd {
            fragment_duration: duration_us,
        });
    }
    for trak in &mut moov.trak {
        trak.tkhd.duration = duration_us;
    }
    let mut out = Vec::new();
    ftyp.encode(&mut out).map_err(Mp4Error::Encode)?;
    moov.encode(&mut out).map_err(Mp4Error::Encode)?;
    Ok(out)
}

/// The stored media segment `segment` with its decode times moved
/// `shift_us` earlier (an exported file starts at time 0): its `tfdt` is
/// rewritten and the run's data offset follows the `moof`'s new size; the
/// `mdat` is kept as it is.
///
/// # Errors
/// [`Mp4Error::Encode`] if `segment` does not start with a `moof` this
/// module wrote; [`Mp4Error::Segment`] if it has no `tfdt` or run.
pub fn rebase_segment(segment: &[u8], shift_us: u64) -> Result<Vec<u8>, Mp4Error> {
    let buf = &mut &segment[..];
    let mut moof = Moof::decode(buf).map_err(Mp4Error::Encode)?;
    let rest: &[u8] = buf;
    let traf = moof.traf.first_mut().ok_or(Mp4Error::Segment("no traf"))?;
    let tfdt = traf.tfdt.as_mut().ok_or(Mp4Error::Segment("no tfdt"))?;
    tfdt.base_media_decode_time = tfdt.base_media_decode_time.saturating_sub(shift_us);
    let trun = traf.trun.first_mut().ok_or(Mp4Error::Segment("no trun"))?;
    trun.data_offset = Some(0);
    let mut probe = Vec::new();
    moof.encode(&mut probe).map_err(Mp4Error::Encode)?;
    let offset = i32::try_from(probe.len() + 8).map_err(|_| Mp4Error::Segment("moof too large"))?;
    if let Some(trun) = moof.traf.first_mut().and_then(|t| t.trun.first_mut()) {
        trun.data_offset = Some(offset);
    }
    let mut out = Vec::with_capacity(segment.len());
    moof.encode(&mut out).map_err(Mp4Error::Encode)?;
    out.extend_from_slice(rest);
    Ok(out)
}

/// One frame of a group: its presentation time (µs) and its codec payload
/// (an H.264 access unit as length-prefixed NAL units, as hang's `avc1`
/// frames carry it, or one Opus packet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Presentation time, µs.
    pub pts_us: u64,
    /// The payload.
    pub data: Vec<u8>,
}

/// The media segment (`moof` + `mdat`) of one group's `samples` as MP4
/// track `track_id`, fragment `sequence`; the last sample lasts
/// `last_duration_us` (the group's next one is not known yet). The first
/// sample is flagged a keyframe (a hang group opens with one), the rest
/// delta frames unless `all_sync` (audio). Returns the bytes and the
/// segment's duration in µs.
///
/// # Errors
/// [`Mp4Error::Segment`] for no samples, or timestamps that go back;
/// [`Mp4Error::Encode`].
pub fn media_segment(
    sequence: u32,
    track_id: u32,
    samples: &[Sample],
    last_duration_us: u32,
    all_sync: bool,
) -> Result<(Vec<u8>, u64), Mp4Error> {
    let first = samples.first().ok_or(Mp4Error::Segment("no frames"))?;
    let mut entries = Vec::with_capacity(samples.len());
    let mut payload_len = 0usize;
    for (i, s) in samples.iter().enumerate() {
        let duration = match samples.get(i + 1) {
            Some(next) => next
                .pts_us
                .checked_sub(s.pts_us)
                .and_then(|d| u32::try_from(d).ok())
                .ok_or(Mp4Error::Segment("timestamps go back or jump"))?,
            None => last_duration_us,
        };
        let size = u32::try_from(s.data.len()).map_err(|_| Mp4Error::Segment("frame too large"))?;
        payload_len += s.data.len();
        entries.push(TrunEntry {
            duration: Some(duration),
            size: Some(size),
            flags: Some(if i == 0 || all_sync {
                FLAGS_KEY
            } else {
                FLAGS_DELTA
            }),
            cts: None,
        });
    }
    let duration: u64 = entries
        .iter()
        .map(|e| u64::from(e.duration.unwrap_or(0)))
        .sum();
    let mut moof = Moof {
        mfhd: Mfhd {
            sequence_number: sequence,
        },
        traf: vec![Traf {
            tfhd: Tfhd {
                track_id,
                default_base_is_moof: true,
                ..Default::default()
            },
            tfdt: Some(Tfdt {
                base_media_decode_time: first.pts_us,
            }),
            trun: vec![Trun {
                data_offset: Some(0),
                samples: entries.into(),
            }],
            ..Default::default()
        }],
    };
    // The data offset counts from the moof's first byte to the first sample:
    // the moof's own size plus the mdat's 8-byte header (its size is the same
    // whatever the offset's value).
    let mut probe = Vec::new();
    moof.encode(&mut probe).map_err(Mp4Error::Encode)?;
    let offset = i32::try_from(probe.len() + 8).map_err(|_| Mp4Error::Segment("moof too large"))?;
    if let Some(trun) = moof.traf.first_mut().and_then(|t| t.trun.first_mut()) {
        trun.data_offset = Some(offset);
    }
    let mut out = Vec::with_capacity(probe.len() + 16 + payload_len);
    moof.encode(&mut out).map_err(Mp4Error::Encode)?;
    // The mdat's header from the crate, its payload appended frame by frame:
    // the crate's `Mdat` encodes its bytes one call per byte, which made this
    // copy most of the writer thread's CPU. The bytes are the same.
    Header {
        kind: Mdat::KIND,
        size: Some(payload_len),
    }
    .encode(&mut out)
    .map_err(Mp4Error::Encode)?;
    for s in samples {
        out.extend_from_slice(&s.data);
    }
    Ok((out, duration))
}

/// Most samples [`segment_samples`] reads from one segment: a run may claim
/// up to 2^32 samples of size 0 in a few bytes.
pub const MAX_SEGMENT_SAMPLES: usize = 1 << 16;

/// The samples of the media segment `segment` (one `moof` with one track
/// fragment, then the data its runs address, as [`media_segment`] writes
/// it): each one's presentation time in the track's timescale (µs here) and
/// its bytes. A sample's decode time is the `tfdt` time plus the durations
/// of the samples before it; its presentation time adds its composition
/// offset. Offsets count from the segment's first byte (the `moof`'s).
///
/// # Errors
/// [`Mp4Error::Encode`] if the `moof` does not decode; [`Mp4Error::Segment`]
/// for no or several track fragments, no `tfdt`, a sample without a size,
/// a sample outside the segment, a time out of range, or more than
/// [`MAX_SEGMENT_SAMPLES`] samples.
pub fn segment_samples(segment: &[u8]) -> Result<Vec<Sample>, Mp4Error> {
    let moof = Moof::decode(&mut &segment[..]).map_err(Mp4Error::Encode)?;
    let [traf] = moof.traf.as_slice() else {
        return Err(Mp4Error::Segment("not one track fragment"));
    };
    let mut dts = traf
        .tfdt
        .as_ref()
        .ok_or(Mp4Error::Segment("no tfdt"))?
        .base_media_decode_time;
    let base = traf.tfhd.base_data_offset.unwrap_or(0);
    let mut out = Vec::new();
    // Where the previous run's data ended: a run without an offset follows it.
    let mut next = base;
    for trun in &traf.trun {
        let mut at = match trun.data_offset {
            Some(offset) => base
                .checked_add_signed(i64::from(offset))
                .ok_or(Mp4Error::Segment("a run starts before the segment"))?,
            None => next,
        };
        if trun.samples.len() > MAX_SEGMENT_SAMPLES.saturating_sub(out.len()) {
            return Err(Mp4Error::Segment("too many samples"));
        }
        for e in trun.samples.iter() {
            let size = e
                .size
                .or(traf.tfhd.default_sample_size)
                .ok_or(Mp4Error::Segment("a sample without a size"))?;
            let duration = e
                .duration
                .or(traf.tfhd.default_sample_duration)
                .unwrap_or(0);
            let pts = dts
                .checked_add_signed(e.cts.unwrap_or(0))
                .ok_or(Mp4Error::Segment("a time out of range"))?;
            let end = at
                .checked_add(u64::from(size))
                .ok_or(Mp4Error::Segment("a sample lies outside the segment"))?;
            let data = usize::try_from(at)
                .ok()
                .zip(usize::try_from(end).ok())
                .and_then(|(a, b)| segment.get(a..b))
                .ok_or(Mp4Error::Segment("a sample lies outside the segment"))?;
            out.push(Sample {
                pts_us: pts,
                data: data.to_vec(),
            });
            at = end;
            dts = dts
                .checked_add(u64::from(duration))
                .ok_or(Mp4Error::Segment("a time out of range"))?;
        }
        next = at;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test card's catalog, as the core writes it.
    fn testcard_catalog() -> Vec<u8> {
        let card = skiff_core::hang::testcard::TestCard::new(160, 96, 30).unwrap();
        let mut buf = [0u8; skiff_core::hang::testcard::CATALOG_MAX_LEN];
        let n = card.catalog("video", &mut buf).unwrap();
        buf[..n].to_vec()
    }

    #[test]
    fn a_media_segment_reads_back_as_its_samples() {
        let samples: Vec<Sample> = (0..5u64)
            .map(|i| Sample {
                pts_us: 1_000_000 + i * 33_333,
                data: vec![i as u8; 10 + i as usize * 7],
            })
            .collect();
        let (seg, _) = media_segment(3, 1, &samples, 33_333, false).unwrap();
        assert_eq!(segment_samples(&seg).unwrap(), samples);
        // Cut anywhere inside, it is refused, never read past its end.
        for n in 0..seg.len() {
            assert!(segment_samples(&seg[..n]).is_err(), "cut at {n}");
        }
    }

    #[test]
    fn composition_offsets_and_defaults_give_presentation_times() {
        let moof = Moof {
            mfhd: Mfhd { sequence_number: 1 },
            traf: vec![Traf {
                tfhd: Tfhd {
                    track_id: 1,
                    default_sample_duration: Some(40),
                    default_base_is_moof: true,
                    ..Default::default()
                },
                tfdt: Some(Tfdt {
                    base_media_decode_time: 1000,
                }),
                trun: vec![Trun {
                    data_offset: Some(0),
                    samples: vec![
                        TrunEntry {
                            cts: Some(80),
                            size: Some(2),
                            ..Default::default()
                        },
                        TrunEntry {
                            cts: Some(0),
                            size: Some(3),
                            ..Default::default()
                        },
                    ]
                    .into(),
                }],
                ..Default::default()
            }],
        };
        let mut probe = Vec::new();
        moof.encode(&mut probe).unwrap();
        let mut moof = moof;
        moof.traf[0].trun[0].data_offset = Some(i32::try_from(probe.len() + 8).unwrap());
        let mut seg = Vec::new();
        moof.encode(&mut seg).unwrap();
        Mdat {
            data: b"abcde".to_vec(),
        }
        .encode(&mut seg)
        .unwrap();
        let got = segment_samples(&seg).unwrap();
        assert_eq!(
            got,
            [
                Sample {
                    pts_us: 1080,
                    data: b"ab".to_vec()
                },
                Sample {
                    pts_us: 1040,
                    data: b"cde".to_vec()
                }
            ]
        );
    }

    #[test]
    fn the_test_cards_catalog_gives_an_init_segment_that_reads_back() {
        let (tracks, skipped) = catalog(&testcard_catalog()).unwrap();
        assert!(skipped.is_empty());
        assert_eq!(tracks.len(), 1);
        let Rendition::Video(v) = &tracks[0] else {
            panic!("{tracks:?}")
        };
        assert_eq!((v.width, v.height), (160, 96));
        let init = init_segment(1, &tracks[0]).unwrap();
        let buf = &mut init.as_slice();
        Ftyp::decode(buf).unwrap();
        let moov = Moov::decode(buf).unwrap();
        assert!(buf.is_empty());
        assert_eq!(moov.trak[0].tkhd.track_id, 1);
        assert_eq!(moov.trak[0].mdia.mdhd.timescale, TIMESCALE);
    }

    #[test]
    fn an_opus_rendition_gives_an_audio_init_segment() {
        let json = br#"{"audio":{"renditions":{"audio":{"codec":"opus","sampleRate":48000,"numberOfChannels":2,"container":{"kind":"legacy"}}}}}"#;
        let (tracks, skipped) = catalog(json).unwrap();
        assert!(skipped.is_empty());
        assert!(tracks[0].is_audio());
        let init = init_segment(2, &tracks[0]).unwrap();
        let buf = &mut init.as_slice();
        Ftyp::decode(buf).unwrap();
        let moov = Moov::decode(buf).unwrap();
        let trak = &moov.trak[0];
        assert_eq!(trak.mdia.hdlr.handler, b"soun".into());
        let Codec::Opus(opus) = &trak.mdia.minf.stbl.stsd.codecs[0] else {
            panic!("{:?}", trak.mdia.minf.stbl.stsd.codecs)
        };
        assert_eq!(opus.dops.output_channel_count, 2);
        assert_eq!(opus.dops.input_sample_rate, 48_000);
    }

    #[test]
    fn a_media_segments_offset_points_at_its_first_sample() {
        let samples = [
            Sample {
                pts_us: 1_000,
                data: vec![0, 0, 0, 1, 0x65],
            },
            Sample {
                pts_us: 34_333,
                data: vec![0, 0, 0, 2, 0x41, 7],
            },
        ];
        let (seg, duration) = media_segment(9, 1, &samples, 33_333, false).unwrap();
        assert_eq!(duration, 66_666);
        let buf = &mut seg.as_slice();
        let moof = Moof::decode(buf).unwrap();
        let mdat = Mdat::decode(buf).unwrap();
        assert_eq!(mdat.data, [0, 0, 0, 1, 0x65, 0, 0, 0, 2, 0x41, 7]);
        // Byte for byte what the crate's own `Mdat` encoding gives.
        let mut whole = Vec::new();
        moof.encode(&mut whole).unwrap();
        Mdat {
            data: mdat.data.clone(),
        }
        .encode(&mut whole)
        .unwrap();
        assert_eq!(whole, seg);
        let offset = moof.traf[0].trun[0].data_offset.unwrap() as usize;
        assert_eq!(&seg[offset..offset + 5], &[0, 0, 0, 1, 0x65]);
        assert_eq!(
            moof.traf[0].tfdt.as_ref().unwrap().base_media_decode_time,
            1_000
        );
        // Moved to start at 0: same samples, the offset follows the new moof.
        let moved = rebase_segment(&seg, 1_000).unwrap();
        let buf = &mut moved.as_slice();
        let moof = Moof::decode(buf).unwrap();
        assert_eq!(Mdat::decode(buf).unwrap().data, mdat.data);
        assert_eq!(
            moof.traf[0].tfdt.as_ref().unwrap().base_media_decode_time,
            0
        );
        let offset = moof.traf[0].trun[0].data_offset.unwrap() as usize;
        assert_eq!(&moved[offset..offset + 5], &[0, 0, 0, 1, 0x65]);
        assert!(rebase_segment(b"not a box", 0).is_err());
        assert!(media_segment(1, 1, &[], 1, false).is_err());
        let back = [samples[1].clone(), samples[0].clone()];
        assert!(media_segment(1, 1, &back, 1, false).is_err());
    }

    #[test]
    fn catalogs_that_are_not_hang_json_are_refused_or_skipped() {
        assert!(catalog(b"not json").is_err());
        assert!(catalog(b"[1]").is_err());
        let (t, s) = catalog(
            br#"{"video":{"renditions":{"v":{"codec":"vp8"}}},"audio":{"renditions":{"a":{"codec":"opus","sampleRate":48000,"numberOfChannels":6}}}}"#,
        )
        .unwrap();
        assert!(t.is_empty());
        assert_eq!(s, ["v", "a"]);
        let (t, s) = catalog(br#"{"video":{"renditions":{"v":{"codec":"avc1.42c01f","description":"0g","codedWidth":16,"codedHeight":16}}}}"#).unwrap();
        assert!(t.is_empty());
        assert_eq!(s, ["v"]);
    }
}
