//! The QMux record layer on a byte stream: `Size (i)` then `Size` bytes of whole frames (docs/protocol.md §1.3).
//!
//! [`Record::decode`] cuts one record off the front of received TCP bytes,
//! refusing an oversized `Size` as soon as the varint is readable;
//! [`Frames`] walks the frames of a record body. [`encode_record`] writes a
//! one-frame record (what moq-dev sends) and [`RecordWriter`] batches several
//! frames into one record.

use crate::wire::{DecodeError, EncodeError, Reader, Writer, varint};

use super::frame::Frame;

/// One complete record found at the front of the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Record<'a> {
    /// The frames, `Size` bytes, borrowed from the input.
    pub body: &'a [u8],
    /// Input bytes the record takes: the `Size` varint plus the body.
    pub len: usize,
}

impl<'a> Record<'a> {
    /// Decodes the record at the front of `input` (bytes received from TCP, in order).
    ///
    /// `max_record_size` is the value *we* advertised (16382 for moq-dev and
    /// when absent). Nothing is consumed unless `Ok` is returned; on `Ok` drop
    /// [`len`](Record::len) bytes from the input.
    ///
    /// # Errors
    /// [`DecodeError::Incomplete`] if the input ends inside the `Size` varint
    /// or the body (wait for more bytes); [`DecodeError::TooLarge`] as soon as
    /// the `Size` varint is readable and exceeds `max_record_size`, without
    /// waiting for the body (close the connection: docs/protocol.md §2.4).
    pub fn decode(input: &'a [u8], max_record_size: u64) -> Result<Record<'a>, DecodeError> {
        let (size, head) = varint::decode(input)?;
        if size > max_record_size {
            debug!(
                "qmux: record size {} over our limit {}",
                size, max_record_size
            );
            return Err(DecodeError::TooLarge);
        }
        let size = usize::try_from(size).map_err(|_| DecodeError::TooLarge)?;
        let body = input
            .get(head..)
            .and_then(|rest| rest.get(..size))
            .ok_or(DecodeError::Incomplete)?;
        Ok(Record {
            body,
            len: head + size,
        })
    }

    /// The frames of the body, PADDING skipped.
    #[must_use]
    pub fn frames(&self) -> Frames<'a> {
        Frames::new(self.body)
    }
}

/// Iterator over the frames of one record body; PADDING is skipped and an empty body yields nothing.
///
/// After the first error the iterator is exhausted: a malformed frame makes
/// the rest of the record unreadable (and the connection must close).
#[derive(Debug, Clone)]
pub struct Frames<'a> {
    r: Reader<'a>,
    failed: bool,
}

impl<'a> Frames<'a> {
    /// Frames of `body`, which must be a whole record body.
    #[must_use]
    pub const fn new(body: &'a [u8]) -> Self {
        Frames {
            r: Reader::new(body),
            failed: false,
        }
    }

    /// Body bytes not yet decoded.
    #[must_use]
    pub fn remaining(&self) -> &'a [u8] {
        self.r.rest()
    }
}

impl<'a> Iterator for Frames<'a> {
    type Item = Result<Frame<'a>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.failed && !self.r.is_empty() {
            match Frame::decode(&mut self.r) {
                Ok(Frame::Padding) => {}
                Ok(f) => return Some(Ok(f)),
                Err(e) => {
                    debug!(
                        "qmux: bad frame at body offset {}: {}",
                        self.r.position(),
                        e
                    );
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        }
        None
    }
}

impl core::iter::FusedIterator for Frames<'_> {}

/// Bytes [`encode_record`] writes for `frame`: the `Size` varint plus the frame.
#[must_use]
pub fn record_len(frame: &Frame<'_>) -> usize {
    let n = frame.encoded_len();
    varint::len(n as u64) + n
}

/// Writes a one-frame record (`Size` + `frame`) at the front of `out`, returning the bytes written.
///
/// `max_record_size` is the *peer's* limit (16382 if it sent none): moq-dev
/// closes the connection on a larger record.
///
/// # Errors
/// [`EncodeError::ValueTooLarge`] if the frame is longer than
/// `max_record_size` or holds a value over 2^62 - 1;
/// [`EncodeError::BufferTooSmall`] if `out` is shorter than [`record_len`].
pub fn encode_record(
    frame: &Frame<'_>,
    max_record_size: u64,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    let n = frame.encoded_len();
    if n as u64 > max_record_size {
        return Err(EncodeError::ValueTooLarge);
    }
    if out.len() < varint::len(n as u64) + n {
        return Err(EncodeError::BufferTooSmall);
    }
    let mut w = Writer::new(out);
    w.varint(n as u64)?;
    frame.encode(&mut w)?;
    Ok(w.position())
}

/// Packs several frames into one record in a caller buffer; [`finish`](Self::finish) writes the `Size`.
///
/// Room for the largest possible `Size` varint is reserved up front; if the
/// final body is shorter, `finish` moves it down so the record starts at the
/// front of the buffer with a shortest-form `Size`, as moq-dev writes it.
#[derive(Debug)]
pub struct RecordWriter<'b> {
    buf: &'b mut [u8],
    /// Bytes reserved at the front for the `Size` varint.
    head: usize,
    /// Body bytes written after `head`.
    len: usize,
    /// Most body bytes allowed: the record limit or the buffer, whichever is smaller.
    limit: usize,
    /// False once a frame that runs to the end of the record was pushed.
    open: bool,
}

impl<'b> RecordWriter<'b> {
    /// A record in `buf` whose body may not exceed `max_record_size` (the peer's limit).
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`] if `buf` cannot hold even an empty record.
    pub fn new(buf: &'b mut [u8], max_record_size: u64) -> Result<Self, EncodeError> {
        if buf.is_empty() {
            return Err(EncodeError::BufferTooSmall);
        }
        let most = max_record_size.min(buf.len() as u64);
        let head = varint::len(most);
        let limit = most.min(buf.len().saturating_sub(head) as u64) as usize;
        Ok(RecordWriter {
            buf,
            head,
            len: 0,
            limit,
            open: true,
        })
    }

    /// Body bytes still available for frames.
    #[must_use]
    pub fn remaining(&self) -> usize {
        if self.open { self.limit - self.len } else { 0 }
    }

    /// Body bytes written so far.
    #[must_use]
    pub fn body_len(&self) -> usize {
        self.len
    }

    /// True if no frame was pushed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends one frame to the body.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`] if it does not fit in
    /// [`remaining`](Self::remaining) (including after a `0x30` DATAGRAM, which
    /// must end its record); [`EncodeError::ValueTooLarge`] for a value over
    /// 2^62 - 1. The record is unchanged on error.
    pub fn push(&mut self, frame: &Frame<'_>) -> Result<(), EncodeError> {
        let n = frame.encoded_len();
        if n > self.remaining() {
            return Err(EncodeError::BufferTooSmall);
        }
        let start = self.head + self.len;
        let out = self
            .buf
            .get_mut(start..start + n)
            .ok_or(EncodeError::BufferTooSmall)?;
        frame.encode(&mut Writer::new(out))?;
        self.len += n;
        if frame.is_rest_of_record() {
            self.open = false;
        }
        Ok(())
    }

    /// Writes the `Size` and returns the record's length, which starts at the front of the buffer.
    #[must_use]
    pub fn finish(self) -> usize {
        let mut size = [0u8; 8];
        // `len <= limit`, whose varint fits in the `head` bytes reserved, so this cannot fail.
        let s = varint::encode(self.len as u64, &mut size).unwrap_or(0);
        self.buf.copy_within(self.head..self.head + self.len, s);
        self.buf[..s].copy_from_slice(&size[..s]);
        s + self.len
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::wire::qmux::frame::{Datagram, Stream};
    use crate::wire::qmux::stream_id::StreamId;
    use proptest::prelude::*;

    // ---- decoding ----

    #[test]
    fn every_prefix_is_incomplete() {
        let rec = [0x09, 0x0e, 0x00, 0x00, 0x05, 0x01, 0x03, 0x00, 0x62, 0x22];
        for cut in 0..rec.len() {
            assert_eq!(
                Record::decode(&rec[..cut], 16382),
                Err(DecodeError::Incomplete),
                "cut {cut}"
            );
        }
        let r = Record::decode(&rec, 16382).unwrap();
        assert_eq!((r.body, r.len), (&rec[1..], 10));
        // Trailing input is the next record and is not consumed.
        let mut two = Vec::from(rec);
        two.extend_from_slice(&[0x00]);
        assert_eq!(Record::decode(&two, 16382).unwrap().len, 10);
    }

    #[test]
    fn too_large_is_known_from_size_alone() {
        // 16383 = `7f ff`, no body yet.
        assert_eq!(
            Record::decode(&[0x7f, 0xff], 16382),
            Err(DecodeError::TooLarge)
        );
        assert_eq!(
            Record::decode(&[0x7f, 0xfe], 16382),
            Err(DecodeError::Incomplete)
        );
        assert_eq!(
            Record::decode(&[0xff; 8], 16382),
            Err(DecodeError::TooLarge)
        );
        assert_eq!(
            Record::decode(&[0xff; 8], u64::MAX),
            Err(DecodeError::Incomplete)
        );
        assert_eq!(
            Record::decode(&[0xff; 7], 16382),
            Err(DecodeError::Incomplete)
        );
    }

    #[test]
    fn empty_record_and_padding() {
        let r = Record::decode(&[0x00], 16382).unwrap();
        assert_eq!(r.len, 1);
        assert_eq!(r.frames().count(), 0);
        let r = Record::decode(&[0x03, 0x00, 0x00, 0x00], 16382).unwrap();
        assert_eq!(r.frames().count(), 0);
    }

    #[test]
    fn several_frames_per_record() {
        // PADDING, MAX_DATA 5, PADDING, PADDING, STREAM 0x0a (LEN) on stream 2, STREAM 0x09 (rest, FIN) on stream 6.
        let body = [
            0x00, 0x10, 0x05, 0x00, 0x00, 0x0a, 0x02, 0x01, 0xaa, 0x09, 0x06, 0xbb, 0xcc,
        ];
        let mut f = Frames::new(&body);
        assert_eq!(f.next(), Some(Ok(Frame::MaxData(5))));
        assert_eq!(
            f.next(),
            Some(Ok(Frame::Stream(Stream {
                id: StreamId(2),
                offset: 0,
                data: &[0xaa],
                fin: false
            })))
        );
        assert_eq!(
            f.next(),
            Some(Ok(Frame::Stream(Stream {
                id: StreamId(6),
                offset: 0,
                data: &[0xbb, 0xcc],
                fin: true
            })))
        );
        assert_eq!(f.next(), None);
    }

    #[test]
    fn errors_end_the_iteration() {
        let body = [0x10, 0x05, 0x06, 0x00, 0x10, 0x07];
        let mut f = Frames::new(&body);
        assert_eq!(f.next(), Some(Ok(Frame::MaxData(5))));
        assert_eq!(f.next(), Some(Err(DecodeError::UnknownType(0x06))));
        assert_eq!(f.remaining(), &body[2..]);
        assert_eq!(f.next(), None);
        // A frame cut by the record end is short, not incomplete.
        let mut f = Frames::new(&[0x11, 0x07]);
        assert_eq!(f.next(), Some(Err(DecodeError::ShortBody)));
    }

    // ---- encoding ----

    #[test]
    fn one_frame_record() {
        let f = Frame::MaxData(1_572_864);
        let mut buf = [0u8; 16];
        assert_eq!(record_len(&f), 6);
        assert_eq!(encode_record(&f, 16382, &mut buf), Ok(6));
        assert_eq!(&buf[..6], &[0x05, 0x10, 0x80, 0x18, 0x00, 0x00]);
        assert_eq!(
            encode_record(&f, 4, &mut buf),
            Err(EncodeError::ValueTooLarge)
        );
        assert_eq!(
            encode_record(&f, 16382, &mut buf[..5]),
            Err(EncodeError::BufferTooSmall)
        );
    }

    #[test]
    fn max_payload_fills_a_record_exactly() {
        let data = [7u8; 20_000];
        let id = StreamId(3);
        for (limit, offset) in [(16382u64, 0u64), (16382, 1 << 40), (100, 5), (65, 0)] {
            let n = crate::wire::qmux::frame::max_stream_payload(limit, id, offset);
            let f = Frame::Stream(Stream {
                id,
                offset,
                data: &data[..n],
                fin: false,
            });
            let mut buf = [0u8; 16400];
            let len = encode_record(&f, limit, &mut buf).unwrap();
            let r = Record::decode(&buf[..len], limit).unwrap();
            assert_eq!(r.len, len);
            assert!(r.body.len() as u64 <= limit);
        }
    }

    #[test]
    fn batched_record() {
        let mut buf = [0u8; 64];
        let mut rw = RecordWriter::new(&mut buf, 16382).unwrap();
        assert!(rw.is_empty());
        rw.push(&Frame::MaxData(5)).unwrap();
        rw.push(&Frame::PingResponse(0)).unwrap();
        rw.push(&Frame::Datagram(Datagram {
            data: b"hi",
            length_prefixed: false,
        }))
        .unwrap();
        // A rest-of-record DATAGRAM closes the record.
        assert_eq!(rw.remaining(), 0);
        assert_eq!(rw.push(&Frame::Padding), Err(EncodeError::BufferTooSmall));
        let n = rw.finish();
        let want = [
            0x0e, 0x10, 0x05, 0xf4, 0x8c, 0x67, 0x52, 0x9e, 0xf8, 0xc7, 0xbe, 0x00, 0x30, b'h',
            b'i',
        ];
        assert_eq!(&buf[..n], &want);
        let r = Record::decode(&buf[..n], 16382).unwrap();
        let frames: Vec<_> = r.frames().map(Result::unwrap).collect();
        assert_eq!(frames.len(), 3);
    }

    #[test]
    fn batched_record_limits() {
        // The record limit binds before the buffer does.
        let mut buf = [0u8; 64];
        let mut rw = RecordWriter::new(&mut buf, 4).unwrap();
        rw.push(&Frame::MaxData(1 << 20)).unwrap_err();
        rw.push(&Frame::MaxData(1)).unwrap();
        rw.push(&Frame::MaxData(1)).unwrap();
        assert_eq!(rw.remaining(), 0);
        assert_eq!(rw.finish(), 5);
        assert_eq!(&buf[..5], &[0x04, 0x10, 0x01, 0x10, 0x01]);
        // The buffer binds; an empty record is one byte.
        let mut buf = [0u8; 1];
        let rw = RecordWriter::new(&mut buf, 16382).unwrap();
        assert_eq!(rw.remaining(), 0);
        assert_eq!(rw.finish(), 1);
        assert_eq!(buf, [0x00]);
        assert!(RecordWriter::new(&mut [], 16382).is_err());
    }

    #[test]
    fn batched_record_size_width_is_shortest() {
        // A big buffer reserves 2 bytes for Size; a 1-byte body must still produce `01 00`.
        let mut buf = [0xeeu8; 20_000];
        let mut rw = RecordWriter::new(&mut buf, 16382).unwrap();
        assert_eq!(rw.remaining(), 16382);
        rw.push(&Frame::Padding).unwrap();
        assert_eq!(rw.finish(), 2);
        assert_eq!(&buf[..2], &[0x01, 0x00]);
        // A 100-byte body needs the 2-byte form.
        let mut buf = [0u8; 20_000];
        let mut rw = RecordWriter::new(&mut buf, 16382).unwrap();
        let data = [1u8; 96];
        rw.push(&Frame::Datagram(Datagram::new(&data))).unwrap();
        rw.push(&Frame::Padding).unwrap();
        assert_eq!(rw.body_len(), 1 + 2 + 96 + 1);
        let n = rw.finish();
        assert_eq!(n, 102);
        assert_eq!(&buf[..3], &[0x40, 100, 0x31]);
        assert_eq!(
            Record::decode(&buf[..n], 16382).unwrap().frames().count(),
            1
        );
    }

    // ---- properties ----

    proptest! {
        #[test]
        fn random_input_never_panics(b in proptest::collection::vec(any::<u8>(), 0..256), limit in 0u64..300) {
            match Record::decode(&b, limit) {
                Ok(r) => {
                    prop_assert!(r.len <= b.len() && r.body.len() as u64 <= limit);
                    for f in r.frames() {
                        let _ = f;
                    }
                }
                Err(e) => prop_assert!(e == DecodeError::Incomplete || e == DecodeError::TooLarge),
            }
            // Treat the whole input as a record body too.
            let mut n = 0;
            for f in Frames::new(&b) {
                n += 1;
                if let Ok(f) = f {
                    // Whatever decodes re-encodes and decodes to the same frame.
                    let mut out = [0u8; 512];
                    let len = encode_record(&f, u64::MAX, &mut out).unwrap();
                    let r = Record::decode(&out[..len], u64::MAX).unwrap();
                    let mut again = r.frames();
                    prop_assert_eq!(again.next(), Some(Ok(f)));
                }
            }
            prop_assert!(n <= b.len());
        }

        #[test]
        fn every_prefix_of_a_batched_record_is_incomplete(
            seqs in proptest::collection::vec(0..=varint::MAX, 0..20),
            data in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let mut buf = [0u8; 1024];
            let mut rw = RecordWriter::new(&mut buf, 16382).unwrap();
            for s in &seqs {
                rw.push(&Frame::PingRequest(*s)).unwrap();
            }
            rw.push(&Frame::Stream(Stream { id: StreamId(4), offset: 9, data: &data, fin: true })).unwrap();
            let n = rw.finish();
            let rec = &buf[..n];
            for cut in 0..n {
                prop_assert_eq!(Record::decode(&rec[..cut], 16382), Err(DecodeError::Incomplete));
            }
            let r = Record::decode(rec, 16382).unwrap();
            prop_assert_eq!(r.len, n);
            let frames: Vec<_> = r.frames().collect::<Result<_, _>>().unwrap();
            prop_assert_eq!(frames.len(), seqs.len() + 1);
            for (f, s) in frames.iter().zip(&seqs) {
                prop_assert_eq!(*f, Frame::PingRequest(*s));
            }
        }
    }
}
