//! The host camera's media: a synthetic capture source, a small real encoder
//! and the matching decoder, all on buffers sized once.
//!
//! * [`Capture`] draws frame `n` of a moving test pattern (eight grey bars,
//!   a box travelling diagonally with inverted colours, a white line sweeping
//!   down) into its own reusable picture, 8-bit grey, [`Format::width`] ×
//!   [`Format::height`].
//! * [`Encoder`] turns a picture into a payload: a key frame (the first of
//!   every group of [`Format::gop`] frames) is the picture run-length coded;
//!   a delta frame is the XOR with the previous picture, run-length coded
//!   (the bars do not change, so a delta is mostly one long run of zeros).
//! * [`Decoder`] undoes it and [`check`] compares the result with the pattern.
//!
//! None of them allocates after construction: the encoder writes into a
//! buffer with room for the worst case ([`Format::max_payload`]), the
//! decoder into a picture it sizes at the first key frame of a format.
//!
//! Payload layout (integers little-endian):
//!
//! ```text
//! 0..4    magic b"SKC1"
//! 4       kind: 0 key frame, 1 delta frame
//! 5..7    width  u16      7..9   height u16
//! 9..11   fps    u16      11..13 gop    u16 (frames per group)
//! 13..21  n      u64 (frame number from 0; group n / gop, index n % gop)
//! 21..25  FNV-1a of the decoded picture, u32
//! 25..    runs: (length 1..=255, byte) pairs covering width × height bytes
//!         (key: picture bytes; delta: picture XOR previous picture)
//! ```

use core::fmt;

/// The payload's first four bytes.
pub const MAGIC: [u8; 4] = *b"SKC1";

/// Bytes before the runs.
pub const HEADER_LEN: usize = 25;

/// The largest picture a [`Format`] may describe (pixels).
pub const MAX_PIXELS: usize = 4096 * 4096;

/// Grey levels of the eight vertical bars, left to right.
const BARS: [u8; 8] = [235, 210, 180, 150, 120, 90, 60, 16];

/// Kind byte of a key frame.
const KEY: u8 = 0;

/// Kind byte of a delta frame.
const DELTA: u8 = 1;

/// Picture size, rate and group length of a camera stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    /// Columns.
    pub width: u16,
    /// Rows.
    pub height: u16,
    /// Frames per second.
    pub fps: u16,
    /// Frames per group (the first of each is a key frame).
    pub gop: u16,
}

/// Why [`Format::new`] refused a format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatError {
    /// A dimension, the rate or the group length is 0.
    Zero,
    /// More than [`MAX_PIXELS`] pixels.
    TooLarge,
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FormatError::Zero => "width, height, fps and gop must be at least 1",
            FormatError::TooLarge => "picture larger than 4096x4096 pixels",
        })
    }
}

impl core::error::Error for FormatError {}

impl Format {
    /// 320×240 at 30 fps, a group per second.
    pub const DEFAULT: Format = Format {
        width: 320,
        height: 240,
        fps: 30,
        gop: 30,
    };

    /// A checked format.
    ///
    /// # Errors
    /// [`FormatError`] for a zero field or a picture over [`MAX_PIXELS`].
    pub fn new(width: u16, height: u16, fps: u16, gop: u16) -> Result<Format, FormatError> {
        if width == 0 || height == 0 || fps == 0 || gop == 0 {
            return Err(FormatError::Zero);
        }
        let f = Format {
            width,
            height,
            fps,
            gop,
        };
        if f.pixels() > MAX_PIXELS {
            return Err(FormatError::TooLarge);
        }
        Ok(f)
    }

    /// Bytes of one picture.
    pub fn pixels(&self) -> usize {
        usize::from(self.width) * usize::from(self.height)
    }

    /// The largest payload [`Encoder::encode`] can produce (every run of length 1).
    pub fn max_payload(&self) -> usize {
        HEADER_LEN + 2 * self.pixels()
    }

    /// The group frame `n` belongs to.
    pub fn group(&self, n: u64) -> u64 {
        n / u64::from(self.gop)
    }

    /// Frame `n`'s index within its group.
    pub fn index(&self, n: u64) -> u64 {
        n % u64::from(self.gop)
    }

    /// Frame `n`'s timestamp in milliseconds (the track's default timescale).
    pub fn timestamp_ms(&self, n: u64) -> u64 {
        n.saturating_mul(1000) / u64::from(self.fps)
    }

    /// True if frame `n` starts a group (and is coded as a key frame).
    pub fn is_key(&self, n: u64) -> bool {
        self.index(n) == 0
    }
}

// ---------------------------------------------------------------------------
// The test pattern and capture
// ---------------------------------------------------------------------------

/// Where the moving parts of frame `n` are: (box column, box row, box side, line row).
fn moving_parts(format: &Format, n: u64) -> (usize, usize, usize, usize) {
    let (w, h) = (u64::from(format.width), u64::from(format.height));
    let side = (usize::from(format.height) / 6).max(1);
    let bx = (n.wrapping_mul(4) % w) as usize;
    let by = (n.wrapping_mul(2) % h) as usize;
    let line = (n % h) as usize;
    (bx, by, side, line)
}

/// Draws frame `n` of the test pattern into `out` (one picture, row by row).
///
/// # Panics
/// If `out` is not [`Format::pixels`] bytes long.
pub fn draw(format: &Format, n: u64, out: &mut [u8]) {
    assert_eq!(out.len(), format.pixels(), "picture size");
    let (w, h) = (usize::from(format.width), usize::from(format.height));
    let (bx, by, side, line) = moving_parts(format, n);
    for (y, row) in out.chunks_exact_mut(w).enumerate() {
        if y == line {
            row.fill(0xff);
            continue;
        }
        for (x, px) in row.iter_mut().enumerate() {
            *px = BARS[x * BARS.len() / w];
        }
        // The box wraps around the edges.
        if (y + h - by) % h < side {
            for k in 0..side.min(w) {
                let x = (bx + k) % w;
                row[x] ^= 0xff;
            }
        }
    }
}

/// True if `picture` is frame `n` of the test pattern (compared without a second buffer).
pub fn is_pattern(format: &Format, n: u64, picture: &[u8]) -> bool {
    if picture.len() != format.pixels() {
        return false;
    }
    let (w, h) = (usize::from(format.width), usize::from(format.height));
    let (bx, by, side, line) = moving_parts(format, n);
    picture.chunks_exact(w).enumerate().all(|(y, row)| {
        row.iter().enumerate().all(|(x, &px)| {
            let want = if y == line {
                0xff
            } else {
                let in_box = (y + h - by) % h < side && (x + w - bx) % w < side.min(w);
                BARS[x * BARS.len() / w] ^ if in_box { 0xff } else { 0 }
            };
            px == want
        })
    })
}

/// A synthetic camera: frame after frame of the test pattern into one reusable picture.
#[derive(Debug)]
pub struct Capture {
    format: Format,
    picture: Vec<u8>,
    next: u64,
}

impl Capture {
    /// A camera of `format` whose next frame is frame 0.
    pub fn new(format: Format) -> Capture {
        Capture {
            format,
            picture: vec![0; format.pixels()],
            next: 0,
        }
    }

    /// The stream's format.
    pub fn format(&self) -> Format {
        self.format
    }

    /// Captures the next frame; returns its number and picture.
    pub fn capture(&mut self) -> (u64, &[u8]) {
        let n = self.next;
        draw(&self.format, n, &mut self.picture);
        self.next = n.wrapping_add(1);
        (n, &self.picture)
    }
}

// ---------------------------------------------------------------------------
// Encoder
// ---------------------------------------------------------------------------

/// FNV-1a, 32 bits.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |h: u32, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Why [`Encoder::encode`] refused a picture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodeError {
    /// The picture is not [`Format::pixels`] bytes.
    PictureSize,
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("picture size does not match the format")
    }
}

impl core::error::Error for EncodeError {}

/// Run-length key frames and XOR-delta frames into one reusable payload buffer.
#[derive(Debug)]
pub struct Encoder {
    format: Format,
    /// The picture the next delta is taken against.
    reference: Vec<u8>,
    /// The frame number of `reference`, once there is one.
    last: Option<u64>,
    out: Vec<u8>,
}

impl Encoder {
    /// An encoder for `format` (its buffers are sized here, once).
    pub fn new(format: Format) -> Encoder {
        Encoder {
            format,
            reference: vec![0; format.pixels()],
            last: None,
            out: Vec::with_capacity(format.max_payload()),
        }
    }

    /// Encodes frame `n`: a key frame if it starts a group or does not follow the
    /// previous frame encoded, a delta frame otherwise. Returns the payload.
    ///
    /// # Errors
    /// [`EncodeError::PictureSize`] if `picture` does not fit the format.
    pub fn encode(&mut self, n: u64, picture: &[u8]) -> Result<&[u8], EncodeError> {
        if picture.len() != self.format.pixels() {
            return Err(EncodeError::PictureSize);
        }
        let key = self.format.is_key(n) || self.last != n.checked_sub(1);
        let f = self.format;
        self.out.clear();
        self.out.extend_from_slice(&MAGIC);
        self.out.push(if key { KEY } else { DELTA });
        for v in [f.width, f.height, f.fps, f.gop] {
            self.out.extend_from_slice(&v.to_le_bytes());
        }
        self.out.extend_from_slice(&n.to_le_bytes());
        self.out.extend_from_slice(&fnv1a(picture).to_le_bytes());
        let out = &mut self.out;
        let mut push_run = |len: u8, byte: u8| {
            out.push(len);
            out.push(byte);
        };
        let mut run: Option<(u8, u8)> = None;
        for (i, &px) in picture.iter().enumerate() {
            let b = if key { px } else { px ^ self.reference[i] };
            run = match run {
                Some((len, v)) if v == b && len < u8::MAX => Some((len + 1, v)),
                Some((len, v)) => {
                    push_run(len, v);
                    Some((1, b))
                }
                None => Some((1, b)),
            };
        }
        if let Some((len, v)) = run {
            push_run(len, v);
        }
        self.reference.copy_from_slice(picture);
        self.last = Some(n);
        debug_assert!(self.out.len() <= self.format.max_payload());
        Ok(&self.out)
    }
}

// ---------------------------------------------------------------------------
// Decoder
// ---------------------------------------------------------------------------

/// Why [`Decoder::decode`] rejected a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than the header.
    Short,
    /// Not `SKC1`.
    Magic,
    /// An unknown kind byte.
    Kind,
    /// The format fields are invalid.
    Format,
    /// A delta frame that does not follow the last frame decoded.
    NoReference,
    /// The runs do not cover the picture exactly (or a run is empty).
    Runs,
    /// The decoded picture's checksum differs from the header's.
    Checksum,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DecodeError::Short => "payload shorter than the header",
            DecodeError::Magic => "bad magic",
            DecodeError::Kind => "unknown frame kind",
            DecodeError::Format => "invalid format fields",
            DecodeError::NoReference => "delta frame without its previous frame",
            DecodeError::Runs => "runs do not cover the picture",
            DecodeError::Checksum => "decoded picture fails its checksum",
        })
    }
}

impl core::error::Error for DecodeError {}

/// What a payload's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The stream's format.
    pub format: Format,
    /// Frame number.
    pub n: u64,
    /// A key frame (decodable alone).
    pub key: bool,
    /// FNV-1a of the picture.
    pub checksum: u32,
}

impl Header {
    /// Parses the header of `payload`.
    ///
    /// # Errors
    /// [`DecodeError::Short`], [`DecodeError::Magic`], [`DecodeError::Kind`] or
    /// [`DecodeError::Format`].
    pub fn parse(payload: &[u8]) -> Result<Header, DecodeError> {
        let h: &[u8; HEADER_LEN] = payload
            .get(..HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .ok_or(DecodeError::Short)?;
        if h[0..4] != MAGIC {
            return Err(DecodeError::Magic);
        }
        let key = match h[4] {
            KEY => true,
            DELTA => false,
            _ => return Err(DecodeError::Kind),
        };
        let u16_at = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]);
        let format = Format::new(u16_at(5), u16_at(7), u16_at(9), u16_at(11))
            .map_err(|_| DecodeError::Format)?;
        let mut n = [0u8; 8];
        n.copy_from_slice(&h[13..21]);
        let mut sum = [0u8; 4];
        sum.copy_from_slice(&h[21..25]);
        Ok(Header {
            format,
            n: u64::from_le_bytes(n),
            key,
            checksum: u32::from_le_bytes(sum),
        })
    }
}

/// Decodes payloads of one stream in order into one reusable picture.
#[derive(Debug, Default)]
pub struct Decoder {
    picture: Vec<u8>,
    /// Format and number of the frame in `picture`, if it is whole.
    last: Option<(Format, u64)>,
}

impl Decoder {
    /// A decoder with no picture yet (its first payload must be a key frame).
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// The last picture decoded (empty before the first).
    pub fn picture(&self) -> &[u8] {
        &self.picture
    }

    /// Decodes `payload` into [`Decoder::picture`]; returns its header.
    ///
    /// A delta frame must follow the frame decoded last. After an error the
    /// decoder waits for the next key frame.
    ///
    /// # Errors
    /// [`DecodeError`] names what is wrong with the payload.
    pub fn decode(&mut self, payload: &[u8]) -> Result<Header, DecodeError> {
        let last = self.last.take();
        let header = Header::parse(payload)?;
        let pixels = header.format.pixels();
        if header.key {
            if self.picture.len() != pixels {
                // A new format: sized once per format.
                self.picture.clear();
                self.picture.resize(pixels, 0);
            }
        } else if last != header.n.checked_sub(1).map(|p| (header.format, p)) {
            return Err(DecodeError::NoReference);
        }
        let body = payload.get(HEADER_LEN..).unwrap_or(&[]);
        let mut at = 0usize;
        for pair in body.chunks(2) {
            let &[len, byte] = pair else {
                return Err(DecodeError::Runs);
            };
            let len = usize::from(len);
            let run = self
                .picture
                .get_mut(at..at + len)
                .filter(|r| !r.is_empty())
                .ok_or(DecodeError::Runs)?;
            if header.key {
                run.fill(byte);
            } else {
                run.iter_mut().for_each(|p| *p ^= byte);
            }
            at += len;
        }
        if at != pixels {
            return Err(DecodeError::Runs);
        }
        if fnv1a(&self.picture) != header.checksum {
            return Err(DecodeError::Checksum);
        }
        self.last = Some((header.format, header.n));
        Ok(header)
    }
}

/// Why [`check`] rejected a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corrupt {
    /// It does not decode.
    Decode(DecodeError),
    /// It decodes to something other than the test pattern of its frame number.
    Picture,
}

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Corrupt::Decode(e) => write!(f, "does not decode: {e}"),
            Corrupt::Picture => f.write_str("picture differs from the test pattern"),
        }
    }
}

impl core::error::Error for Corrupt {}

/// Decodes `payload` with `decoder` and checks the picture is its frame of the pattern.
///
/// # Errors
/// [`Corrupt`] if it does not decode or shows the wrong picture.
pub fn check(decoder: &mut Decoder, payload: &[u8]) -> Result<Header, Corrupt> {
    let h = decoder.decode(payload).map_err(Corrupt::Decode)?;
    if is_pattern(&h.format, h.n, decoder.picture()) {
        Ok(h)
    } else {
        Err(Corrupt::Picture)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Format {
        Format::new(64, 48, 30, 10).unwrap()
    }

    // ---- the pattern ----

    #[test]
    fn drawn_frames_are_the_pattern_and_move() {
        for f in [small(), Format::DEFAULT, Format::new(7, 5, 1, 1).unwrap()] {
            let mut cam = Capture::new(f);
            let mut prev = Vec::new();
            for _ in 0..40 {
                let (n, pic) = cam.capture();
                assert!(is_pattern(&f, n, pic), "{f:?} frame {n}");
                assert!(!is_pattern(&f, n + 1, pic), "{f:?} frame {n} vs next");
                assert_ne!(prev, pic);
                prev = pic.to_vec();
            }
        }
    }

    #[test]
    fn format_rules() {
        assert_eq!(Format::new(0, 1, 1, 1), Err(FormatError::Zero));
        assert_eq!(Format::new(1, 1, 1, 0), Err(FormatError::Zero));
        assert_eq!(
            Format::new(u16::MAX, u16::MAX, 1, 1),
            Err(FormatError::TooLarge)
        );
        let f = Format::DEFAULT;
        assert_eq!((f.group(61), f.index(61)), (2, 1));
        assert_eq!(f.timestamp_ms(30), 1000);
        assert!(f.is_key(60) && !f.is_key(61));
    }

    // ---- encode / decode ----

    #[test]
    fn round_trip_over_groups() {
        let f = small();
        let (mut cam, mut enc, mut dec) = (Capture::new(f), Encoder::new(f), Decoder::new());
        for _ in 0..35 {
            let (n, pic) = cam.capture();
            let pic = pic.to_vec();
            let payload = enc.encode(n, &pic).unwrap();
            let h = check(&mut dec, payload).unwrap();
            assert_eq!((h.n, h.key, h.format), (n, f.is_key(n), f));
            assert_eq!(dec.picture(), pic);
        }
    }

    #[test]
    fn deltas_are_small_and_keys_compress() {
        let f = Format::DEFAULT;
        let (mut cam, mut enc) = (Capture::new(f), Encoder::new(f));
        let (n, pic) = cam.capture();
        let key = enc.encode(n, pic).unwrap().len();
        let (n, pic) = cam.capture();
        let delta = enc.encode(n, pic).unwrap().len();
        assert!(key < f.pixels() / 4, "key {key}");
        assert!(delta < key, "delta {delta} key {key}");
    }

    #[test]
    fn encoding_reuses_its_buffer() {
        let f = Format::DEFAULT;
        let (mut cam, mut enc) = (Capture::new(f), Encoder::new(f));
        let mut pic = vec![0; f.pixels()];
        let first = {
            let (n, p) = cam.capture();
            pic.copy_from_slice(p);
            enc.encode(n, &pic).unwrap().as_ptr()
        };
        for _ in 0..60 {
            let (n, p) = cam.capture();
            pic.copy_from_slice(p);
            assert_eq!(enc.encode(n, &pic).unwrap().as_ptr(), first);
        }
        // Worst case (noise) still fits the reserved room.
        let noise: Vec<u8> = (0..f.pixels()).map(|i| (i * 7 + i / 3) as u8).collect();
        let out = enc.encode(1_000, &noise).unwrap();
        assert!(out.len() <= f.max_payload());
        assert_eq!(out.as_ptr(), first);
    }

    #[test]
    fn a_skipped_frame_forces_a_key_frame() {
        let f = small();
        let mut enc = Encoder::new(f);
        let mut pic = vec![0; f.pixels()];
        draw(&f, 1, &mut pic);
        assert_eq!(enc.encode(1, &pic).unwrap()[4], KEY);
        draw(&f, 2, &mut pic);
        assert_eq!(enc.encode(2, &pic).unwrap()[4], DELTA);
        draw(&f, 4, &mut pic);
        let p = enc.encode(4, &pic).unwrap();
        assert_eq!(p[4], KEY);
        let mut dec = Decoder::new();
        assert_eq!(check(&mut dec, p).map(|h| h.n), Ok(4));
    }

    #[test]
    fn bad_payloads_are_named() {
        let f = small();
        let (mut cam, mut enc) = (Capture::new(f), Encoder::new(f));
        let (n, pic) = cam.capture();
        let key = enc.encode(n, pic).unwrap().to_vec();
        let (n, pic) = cam.capture();
        let delta = enc.encode(n, pic).unwrap().to_vec();

        let mut dec = Decoder::new();
        assert_eq!(dec.decode(&key[..10]), Err(DecodeError::Short));
        assert_eq!(dec.decode(&delta), Err(DecodeError::NoReference));
        let mut bad = key.clone();
        bad[0] = b'X';
        assert_eq!(dec.decode(&bad), Err(DecodeError::Magic));
        let mut bad = key.clone();
        bad[4] = 9;
        assert_eq!(dec.decode(&bad), Err(DecodeError::Kind));
        let mut bad = key.clone();
        bad[5..7].copy_from_slice(&0u16.to_le_bytes());
        assert_eq!(dec.decode(&bad), Err(DecodeError::Format));
        assert_eq!(dec.decode(&key[..key.len() - 1]), Err(DecodeError::Runs));
        assert_eq!(dec.decode(&key[..key.len() - 2]), Err(DecodeError::Runs));
        let mut bad = key.clone();
        bad[HEADER_LEN] = 0;
        assert_eq!(dec.decode(&bad), Err(DecodeError::Runs));
        let mut bad = key.clone();
        bad[HEADER_LEN + 1] ^= 1;
        assert_eq!(dec.decode(&bad), Err(DecodeError::Checksum));
        // A good key frame, then its delta.
        assert!(dec.decode(&key).is_ok());
        assert_eq!(check(&mut dec, &delta).map(|h| h.n), Ok(1));
        // A valid frame showing the wrong picture: the checksum matches, the pattern not.
        let mut other = Encoder::new(f);
        let wrong = other.encode(7, &vec![3; f.pixels()]).unwrap();
        assert_eq!(check(&mut dec, wrong), Err(Corrupt::Picture));
    }
}
