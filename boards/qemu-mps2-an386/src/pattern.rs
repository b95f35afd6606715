//! The synthetic camera's frames: what the firmware writes and the viewer checks.
//!
//! Shared by source: the firmware declares it as a module and `examples/src/bin/viewer.rs`
//! includes this same file with `#[path]`, so both sides apply one rule. It uses `core`
//! only.
//!
//! A frame is [`FRAME_LEN`] bytes: frame number `n` counts from 0 at boot, its group is
//! `n / FRAMES_PER_GROUP` and its index in the group `n % FRAMES_PER_GROUP`.
//!
//! ```text
//! 0..4     magic b"SKF1"
//! 4..8     n, u32 little-endian
//! 8..12    group, u32 little-endian
//! 12..16   index in the group, u32 little-endian
//! 16..508  the picture: WIDTH columns of grey ramp, shifted by n, with a white bar at
//!          column n % WIDTH (a test pattern that moves one column per frame)
//! 508..512 FNV-1a of bytes 0..508, u32 little-endian
//! ```

/// Bytes per frame.
pub const FRAME_LEN: usize = 512;
/// Frames per second and per group (a group per second).
pub const FRAMES_PER_GROUP: u32 = 30;
/// Columns of the picture.
pub const WIDTH: usize = 32;

const MAGIC: [u8; 4] = *b"SKF1";
const HEADER: usize = 16;
const BODY_END: usize = FRAME_LEN - 4;

/// Where a frame sits in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Frame number since boot.
    pub n: u32,
    /// Group sequence (`n / FRAMES_PER_GROUP`).
    pub group: u32,
    /// Index within the group (`n % FRAMES_PER_GROUP`).
    pub index: u32,
}

impl Position {
    /// Frame number `n` and the group and index it belongs to.
    pub const fn of(n: u32) -> Self {
        Position {
            n,
            group: n / FRAMES_PER_GROUP,
            index: n % FRAMES_PER_GROUP,
        }
    }

    /// The frame's timestamp in milliseconds (the track's default timescale).
    pub const fn timestamp_ms(self) -> u64 {
        self.n as u64 * 1000 / FRAMES_PER_GROUP as u64
    }
}

/// Why [`check`] rejected a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corrupt {
    /// The payload is not [`FRAME_LEN`] bytes.
    Length,
    /// The magic bytes are wrong.
    Magic,
    /// The checksum does not match.
    Checksum,
    /// Group or index disagree with the frame number.
    Position,
    /// A picture byte differs from the rule.
    Picture,
}

impl core::fmt::Display for Corrupt {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            Corrupt::Length => "wrong length",
            Corrupt::Magic => "bad magic",
            Corrupt::Checksum => "bad checksum",
            Corrupt::Position => "group or index do not match the frame number",
            Corrupt::Picture => "picture differs from the test pattern",
        })
    }
}

impl core::error::Error for Corrupt {}

/// Picture byte `i` (0-based, after the header) of frame `n`.
const fn pixel(n: u32, i: usize) -> u8 {
    let x = i % WIDTH;
    let y = i / WIDTH;
    if x == n as usize % WIDTH {
        0xff
    } else {
        ((x * 8 + y + n as usize) % 0xf0) as u8
    }
}

/// FNV-1a, 32 bits.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |h: u32, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Writes frame `n` into `out`.
pub fn fill(out: &mut [u8; FRAME_LEN], n: u32) {
    let pos = Position::of(n);
    out[0..4].copy_from_slice(&MAGIC);
    out[4..8].copy_from_slice(&pos.n.to_le_bytes());
    out[8..12].copy_from_slice(&pos.group.to_le_bytes());
    out[12..16].copy_from_slice(&pos.index.to_le_bytes());
    for (i, b) in out[HEADER..BODY_END].iter_mut().enumerate() {
        *b = pixel(n, i);
    }
    let sum = fnv1a(&out[..BODY_END]);
    out[BODY_END..].copy_from_slice(&sum.to_le_bytes());
}

/// Checks that `payload` is a frame [`fill`] wrote and returns its position.
///
/// # Errors
/// [`Corrupt`] names the first rule the payload breaks.
pub fn check(payload: &[u8]) -> Result<Position, Corrupt> {
    let frame: &[u8; FRAME_LEN] = payload.try_into().map_err(|_| Corrupt::Length)?;
    if frame[0..4] != MAGIC {
        return Err(Corrupt::Magic);
    }
    let word =
        |at: usize| u32::from_le_bytes([frame[at], frame[at + 1], frame[at + 2], frame[at + 3]]);
    if fnv1a(&frame[..BODY_END]) != word(BODY_END) {
        return Err(Corrupt::Checksum);
    }
    let pos = Position::of(word(4));
    if word(8) != pos.group || word(12) != pos.index {
        return Err(Corrupt::Position);
    }
    let picture_ok = frame[HEADER..BODY_END]
        .iter()
        .enumerate()
        .all(|(i, &b)| b == pixel(pos.n, i));
    if !picture_ok {
        return Err(Corrupt::Picture);
    }
    Ok(pos)
}
