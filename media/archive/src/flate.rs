//! Group-scoped raw DEFLATE (docs/protocol.md §10.8): the frames of one
//! moq-lite group are one raw DEFLATE stream (RFC 1951, no zlib header),
//! flushed with a sync flush after each frame, so each frame is a
//! byte-aligned slice that later frames compress against. Every sync flush
//! ends in the same four bytes, `00 00 ff ff`, which are left off the wire
//! and put back before inflating.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The DEFLATE level frames are compressed at (zlib's default).
pub const LEVEL: u32 = 6;

/// The bytes every sync flush ends with, not sent.
const FLUSH_TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// Output scratch per (de)compress call.
const SCRATCH: usize = 8 << 10;

/// Why a frame could not be compressed or inflated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlateError {
    /// The slice is not a continuation of the group's DEFLATE stream.
    #[error("not a DEFLATE frame of this group")]
    Corrupt,
    /// The frame inflates to more than the decoder's bound.
    #[error("frame inflates past {0} bytes")]
    TooLarge(usize),
    /// The compressor did not end the frame with a sync flush.
    #[error("the compressor did not flush the frame")]
    Unflushed,
}

/// Compresses one group's frames, each into its slice of the stream.
pub struct Deflater {
    stream: Box<Compress>,
}

impl std::fmt::Debug for Deflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deflater")
            .field("total_in", &self.stream.total_in())
            .finish()
    }
}

impl Default for Deflater {
    fn default() -> Self {
        Deflater::new()
    }
}

impl Deflater {
    /// A compressor for a new group (empty window).
    pub fn new() -> Deflater {
        Deflater {
            stream: Box::new(Compress::new(Compression::new(LEVEL), false)),
        }
    }

    /// The slice of the stream that carries `frame`, without the flush tail
    /// (empty for an empty frame).
    ///
    /// # Errors
    /// [`FlateError::Unflushed`] if the compressor's output does not end in
    /// a sync flush (the frame would not be decodable on its own).
    pub fn frame(&mut self, frame: &[u8]) -> Result<Vec<u8>, FlateError> {
        let mut out = Vec::with_capacity(frame.len() / 2 + 16);
        if frame.is_empty() {
            return Ok(out);
        }
        let mut scratch = [0u8; SCRATCH];
        let mut rest = frame;
        loop {
            let (in0, out0) = (self.stream.total_in(), self.stream.total_out());
            self.stream
                .compress(rest, &mut scratch, FlushCompress::Sync)
                .map_err(|_| FlateError::Unflushed)?;
            let used = usize::try_from(self.stream.total_in() - in0).unwrap_or(rest.len());
            let made = usize::try_from(self.stream.total_out() - out0).unwrap_or(0);
            out.extend_from_slice(&scratch[..made.min(SCRATCH)]);
            rest = &rest[used.min(rest.len())..];
            // A full scratch buffer means the flush may have more to give.
            if made < SCRATCH {
                break;
            }
        }
        if !out.ends_with(&FLUSH_TAIL) {
            return Err(FlateError::Unflushed);
        }
        out.truncate(out.len() - FLUSH_TAIL.len());
        Ok(out)
    }
}

/// Inflates one group's frame slices, in order, each to at most a bound.
pub struct Inflater {
    stream: Box<Decompress>,
    max: usize,
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater").field("max", &self.max).finish()
    }
}

impl Inflater {
    /// An inflater for a new group whose frames inflate to at most `max` bytes each.
    pub fn new(max: usize) -> Inflater {
        Inflater {
            stream: Box::new(Decompress::new(false)),
            max,
        }
    }

    /// The frame `slice` carries, written to `out` (cleared first).
    ///
    /// # Errors
    /// [`FlateError::Corrupt`] for bytes that do not continue the stream,
    /// [`FlateError::TooLarge`] once the frame passes the bound.
    pub fn frame(&mut self, slice: &[u8], out: &mut Vec<u8>) -> Result<(), FlateError> {
        out.clear();
        if slice.is_empty() {
            return Ok(());
        }
        let mut scratch = [0u8; SCRATCH];
        for part in [slice, &FLUSH_TAIL[..]] {
            let mut rest = part;
            loop {
                let (in0, out0) = (self.stream.total_in(), self.stream.total_out());
                let status = self
                    .stream
                    .decompress(rest, &mut scratch, FlushDecompress::Sync)
                    .map_err(|_| FlateError::Corrupt)?;
                let used = usize::try_from(self.stream.total_in() - in0).unwrap_or(rest.len());
                let made = usize::try_from(self.stream.total_out() - out0).unwrap_or(SCRATCH);
                if out.len().saturating_add(made) > self.max {
                    return Err(FlateError::TooLarge(self.max));
                }
                out.extend_from_slice(&scratch[..made.min(SCRATCH)]);
                rest = &rest[used.min(rest.len())..];
                // A final block ends the group's stream: nothing may follow.
                if status == Status::StreamEnd {
                    return Err(FlateError::Corrupt);
                }
                if (rest.is_empty() && made < SCRATCH) || (used == 0 && made == 0) {
                    break;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_later_ones_reuse_the_window() {
        let text = b"{\"push\":{\"segment\":1,\"pts\":1000,\"duration\":1000}}";
        let mut d = Deflater::new();
        let a = d.frame(text).unwrap();
        let b = d.frame(text).unwrap();
        assert!(b.len() < a.len(), "{} {}", b.len(), a.len());
        let mut i = Inflater::new(1 << 20);
        let mut out = Vec::new();
        i.frame(&a, &mut out).unwrap();
        assert_eq!(out, text);
        i.frame(&b, &mut out).unwrap();
        assert_eq!(out, text);
        assert!(d.frame(b"").unwrap().is_empty());
        i.frame(b"", &mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn a_frame_past_the_bound_or_garbage_is_refused() {
        let zeros = vec![0u8; 100_000];
        let slice = Deflater::new().frame(&zeros).unwrap();
        let mut out = Vec::new();
        assert_eq!(
            Inflater::new(50_000).frame(&slice, &mut out),
            Err(FlateError::TooLarge(50_000))
        );
        assert!(Inflater::new(1 << 20).frame(&slice, &mut out).is_ok());
        assert_eq!(out.len(), zeros.len());
        assert!(
            Inflater::new(1 << 20)
                .frame(b"\xff\xff\xff garbage", &mut out)
                .is_err()
        );
    }

    #[test]
    fn incompressible_frames_larger_than_the_scratch_round_trip() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..70_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut d = Deflater::new();
        let mut i = Inflater::new(1 << 20);
        let mut out = Vec::new();
        for len in [31_000, 32_768, 33_001, 70_000] {
            let slice = d.frame(&noise[..len]).unwrap();
            i.frame(&slice, &mut out).unwrap();
            assert_eq!(out, &noise[..len]);
        }
    }
}
