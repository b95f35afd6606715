//! The send path and the application's stream calls: control records, stream
//! records, datagrams, credit release (docs/protocol.md §2.1–2.7).

use super::streams::{RecvState, SendState, Stream};
use super::{
    CloseFrame, Connection, DatagramError, MAX_STREAM_REF_RECORD, OpenError, State, StreamError,
    WriteError, Written, slot,
};
use crate::time::Instant;
use crate::wire::qmux::{
    ApplicationClose, ConnectionClose, DEFAULT_MAX_RECORD_SIZE, Datagram, Dir, Frame, ResetStream,
    StopSending, Stream as StreamFrame, StreamId, StreamRef, encode_record,
    encode_stream_record_header, max_datagram_payload, max_stream_payload,
};
use crate::wire::varint;

/// One STREAM record `write_stream` may send now.
#[derive(Debug, Clone, Copy)]
struct StreamWrite {
    /// Stream offset of the first payload byte.
    offset: u64,
    /// Payload bytes.
    len: usize,
    /// The record carries FIN.
    fin: bool,
}

/// Appends one one-frame record to `out` at `*pos`; false (nothing written) if it does not fit.
fn put(out: &mut [u8], pos: &mut usize, frame: &Frame<'_>, max_record_size: u64) -> bool {
    let Some(buf) = out.get_mut(*pos..) else {
        return false;
    };
    match encode_record(frame, max_record_size, buf) {
        Ok(n) => {
            *pos += n;
            true
        }
        Err(_) => false,
    }
}

impl CloseFrame {
    /// The frame to write: application (`0x1d`) or transport (`0x1c`, frame type 0).
    fn frame(&self) -> Frame<'_> {
        let reason = self.reason.as_bytes();
        if self.application {
            Frame::ApplicationClose(ApplicationClose {
                code: self.code,
                reason,
            })
        } else {
            Frame::ConnectionClose(ConnectionClose {
                code: self.code,
                frame_type: 0,
                reason,
            })
        }
    }
}

impl<const N: usize> Connection<N> {
    /// The peer's record size limit (the default until its parameters arrive).
    fn peer_record_size(&self) -> u64 {
        self.peer.map_or(DEFAULT_MAX_RECORD_SIZE, |p| p.record)
    }

    /// Room that takes any one record we write whole: the peer's record
    /// size limit and the longest `Size` varint (8 bytes).
    pub(crate) fn whole_record_room(&self) -> usize {
        usize::try_from(self.peer_record_size())
            .unwrap_or(usize::MAX)
            .saturating_add(8)
    }

    /// Writes pending control records into `out` and returns how many bytes it wrote.
    ///
    /// Order: our QX_TRANSPORT_PARAMETERS (first record of the connection),
    /// RESET_STREAM and STOP_SENDING, MAX_DATA / MAX_STREAMS / MAX_STREAM_DATA,
    /// QX_PING responses, a QX_PING request. Once closing, only the parameters
    /// (if never sent) and the close frame are written, and nothing after that.
    /// Each frame gets its own record, as moq-dev sends them; a record that does
    /// not fit in what is left of `out` stays pending. Call it until it returns 0
    /// before adding stream records, so control frames keep priority (docs/protocol.md §2.8).
    ///
    /// `out` must hold at least our parameters record (86 bytes with the default
    /// protocol list; a few hundred bytes cover any list and every other frame).
    #[must_use]
    pub fn poll_transmit(&mut self, now: Instant, out: &mut [u8]) -> usize {
        let record = self.peer_record_size();
        let mut pos = 0;
        'fill: {
            if !self.params_sent {
                if self.is_drained() {
                    // Closed before anything was sent, with nothing to say.
                    break 'fill;
                }
                let [bidi, uni] = self.initial_streams;
                let params = Frame::TransportParameters(self.config.transport_params(bidi, uni));
                if !put(out, &mut pos, &params, record) {
                    break 'fill;
                }
                self.params_sent = true;
            }
            if let State::Closed { pending } = &mut self.state {
                if let Some(close) = pending
                    && put(out, &mut pos, &close.frame(), record)
                {
                    *pending = None;
                }
                break 'fill;
            }

            // Stream aborts.
            let mut sent_any = false;
            let mut full = false;
            for s in self.streams.iter_mut() {
                if let Some(send) = s.send.as_mut()
                    && let Some(code) = send.reset_pending
                {
                    // docs/protocol.md §2.2: Final Size = bytes we actually wrote.
                    let f = Frame::ResetStream(ResetStream {
                        id: s.id,
                        code,
                        final_size: send.credit.used(),
                    });
                    if !put(out, &mut pos, &f, record) {
                        full = true;
                        break;
                    }
                    send.reset_pending = None;
                    sent_any = true;
                }
                if let Some(recv) = s.recv.as_mut()
                    && let Some(code) = recv.stop_pending
                {
                    let f = Frame::StopSending(StopSending { id: s.id, code });
                    if !put(out, &mut pos, &f, record) {
                        full = true;
                        break;
                    }
                    recv.stop_pending = None;
                    sent_any = true;
                }
            }
            if sent_any {
                self.sweep();
            }
            if full {
                break 'fill;
            }

            // Credit (docs/protocol.md §2.3: each value is higher than the last one sent).
            if self.max_data_pending {
                if !put(out, &mut pos, &Frame::MaxData(self.conn_recv.max()), record) {
                    break 'fill;
                }
                self.max_data_pending = false;
            }
            for dir in [Dir::Bidi, Dir::Uni] {
                if self.max_streams_pending[slot(dir)] {
                    let f = Frame::MaxStreams {
                        dir,
                        max: self.remote[slot(dir)].max(),
                    };
                    if !put(out, &mut pos, &f, record) {
                        break 'fill;
                    }
                    self.max_streams_pending[slot(dir)] = false;
                }
            }
            for s in self.streams.iter_mut() {
                if let Some(recv) = s.recv.as_mut()
                    && recv.update_pending
                {
                    let f = Frame::MaxStreamData {
                        id: s.id,
                        max: recv.window.max(),
                    };
                    if !put(out, &mut pos, &f, record) {
                        break 'fill;
                    }
                    recv.update_pending = false;
                }
            }

            // Liveness (docs/protocol.md §2.5): answer every request, then our own.
            while let Some(&(first, count)) = self.pongs.front() {
                if !put(out, &mut pos, &Frame::PingResponse(first), record) {
                    break 'fill;
                }
                match (count > 1, self.pongs.front_mut()) {
                    (true, Some(run)) => *run = (first.saturating_add(1), count - 1),
                    _ => {
                        self.pongs.pop_front();
                    }
                }
            }
            if self.ping_pending {
                if !put(out, &mut pos, &Frame::PingRequest(self.ping_seq), record) {
                    break 'fill;
                }
                self.ping_seq += 1;
                self.ping_pending = false;
            }
        }
        if pos > 0 {
            self.timers.on_send(now);
        }
        pos
    }

    /// Opens a stream of our own in direction `dir` and returns its ID.
    ///
    /// Nothing is sent until the first [`write_stream`](Self::write_stream) (or
    /// [`reset_stream`](Self::reset_stream)) on it; IDs are handed out in order.
    ///
    /// # Errors
    /// [`OpenError::Limit`] when the peer's MAX_STREAMS grant is used up (always
    /// before its parameters arrive); [`OpenError::TableFull`] when every free
    /// slot is reserved for streams the peer may open; [`OpenError::Closed`].
    pub fn open_stream(&mut self, dir: Dir) -> Result<StreamId, OpenError> {
        if self.state != State::Open {
            return Err(OpenError::Closed);
        }
        let credit = self.local[slot(dir)];
        if credit.available() == 0 {
            return Err(OpenError::Limit);
        }
        if self.streams.len().saturating_add(self.reserved_for_peer()) >= N {
            return Err(OpenError::TableFull);
        }
        let id = StreamId::new(self.side, dir, credit.used()).ok_or(OpenError::Limit)?;
        let stream = Stream::new(id, self.side, self.send_max(id), self.recv_max(id));
        self.streams
            .insert(stream)
            .map_err(|_| OpenError::TableFull)?;
        self.local[slot(dir)].claim(1);
        trace!("qmux: opened stream {}", id.value());
        Ok(id)
    }

    /// Bytes [`write_stream`](Self::write_stream) may send on `id` right now: the
    /// smaller of the stream's and the connection's credit (0 if the stream is
    /// unknown, finished, reset, receive-only, or the connection is not established).
    pub fn send_credit(&self, id: StreamId) -> u64 {
        if !self.is_established() {
            return 0;
        }
        match self.streams.get(id).and_then(|s| s.send) {
            Some(send) if send.state == SendState::Open => {
                send.credit.available().min(self.conn_send.available())
            }
            _ => 0,
        }
    }

    /// Bytes the peer may still send on `id` before it runs out of the credit we
    /// granted: the smaller of the stream's and the connection's (0 if the stream
    /// is unknown or its receiving half is done).
    pub fn recv_credit(&self, id: StreamId) -> u64 {
        match self.streams.get(id).and_then(|s| s.recv.as_ref()) {
            Some(recv) if recv.state == RecvState::Open => {
                let stream = recv.window.max() - recv.window.received();
                stream.min(self.conn_recv.max() - self.conn_recv.received())
            }
            _ => 0,
        }
    }

    /// Frames the longest prefix of `data` that credit allows into one record at the
    /// front of `out`, with FIN if `fin` is set and all of `data` fits.
    ///
    /// The record holds one STREAM frame with OFF and LEN (type `0x0e`/`0x0f`, as
    /// moq-dev sends), at most 16352 payload bytes and never more than the peer's
    /// `max_record_size` (docs/protocol.md §1.3, §2.1). The bytes taken are charged to
    /// the stream and connection credit at once: send the record before anything
    /// else written later. An empty `data` with `fin` writes a lone FIN (needs no
    /// credit); an empty `data` without `fin` writes an empty frame, which opens
    /// the stream at the peer. Call again with the rest of `data` while
    /// [`Written::data`] is short of it.
    ///
    /// # Errors
    /// [`WriteError::Blocked`] when no credit is left for non-empty data;
    /// [`WriteError::BufferTooSmall`] when `out` cannot hold a record with one
    /// data byte; [`WriteError::NotReady`] before establishment; the stream-state
    /// errors. Nothing is written or charged on error.
    pub fn write_stream(
        &mut self,
        now: Instant,
        id: StreamId,
        data: &[u8],
        fin: bool,
        out: &mut [u8],
    ) -> Result<Written, WriteError> {
        let plan = self.plan_stream_write(id, data.len(), fin, out.len(), true, false)?;
        let payload = data.get(..plan.len).ok_or(WriteError::BufferTooSmall)?;
        let frame = Frame::Stream(StreamFrame {
            id,
            offset: plan.offset,
            data: payload,
            fin: plan.fin,
        });
        let written = encode_record(&frame, self.peer_record_size(), out)
            .map_err(|_| WriteError::BufferTooSmall)?;
        self.commit_stream_write(now, id, plan);
        Ok(Written {
            data: plan.len,
            out: written,
        })
    }

    /// Like [`write_stream`](Self::write_stream), for a sender that keeps the
    /// payload where it lies: writes into `out` only the record up to the
    /// payload (record `Size` and STREAM frame header, see
    /// [`encode_stream_record_header`]) for the first [`Written::data`] of
    /// `len` bytes. Those payload bytes must be sent right after the
    /// [`Written::out`] header bytes (a gathered write); the credit is charged
    /// at once, as for `write_stream`.
    ///
    /// # Errors
    /// As [`write_stream`](Self::write_stream), where [`WriteError::BufferTooSmall`]
    /// means `out` cannot hold the header.
    pub fn write_stream_header(
        &mut self,
        now: Instant,
        id: StreamId,
        len: usize,
        fin: bool,
        out: &mut [u8],
    ) -> Result<Written, WriteError> {
        let plan = self.plan_stream_write(id, len, fin, out.len(), false, false)?;
        let written = encode_stream_record_header(id, plan.offset, plan.len, plan.fin, out)
            .map_err(|_| WriteError::BufferTooSmall)?;
        self.commit_stream_write(now, id, plan);
        Ok(Written {
            data: plan.len,
            out: written,
        })
    }

    /// Writes one STREAM_REF record (only with
    /// [`Config::stream_refs`](super::Config::stream_refs)) for up to `len`
    /// bytes of `id`: `lend` is told how many the credit allows and returns the
    /// token that names them for the peer. The record is small (at most
    /// [`MAX_STREAM_REF_RECORD`] bytes) and not bound by the record size.
    ///
    /// `Ok(None)` (nothing written or charged) if references are off or `lend`
    /// returns `None`: send the bytes with a STREAM record instead.
    ///
    /// # Errors
    /// As [`write_stream_header`](Self::write_stream_header).
    pub fn write_stream_ref(
        &mut self,
        now: Instant,
        id: StreamId,
        len: usize,
        fin: bool,
        out: &mut [u8],
        lend: impl FnOnce(usize) -> Option<u64>,
    ) -> Result<Option<Written>, WriteError> {
        if !cfg!(feature = "stream-refs") || !self.config.stream_refs {
            return Ok(None);
        }
        if out.len() < MAX_STREAM_REF_RECORD {
            return Err(WriteError::BufferTooSmall);
        }
        let plan = self.plan_stream_write(id, len, fin, out.len(), false, true)?;
        let Some(token) = lend(plan.len) else {
            return Ok(None);
        };
        let frame = Frame::StreamRef(StreamRef {
            id,
            offset: plan.offset,
            len: plan.len as u64,
            token,
            fin: plan.fin,
        });
        let written =
            encode_record(&frame, u64::MAX, out).map_err(|_| WriteError::BufferTooSmall)?;
        self.commit_stream_write(now, id, plan);
        Ok(Some(Written {
            data: plan.len,
            out: written,
        }))
    }

    /// How much of `len` bytes one STREAM record for `id` may carry now: the
    /// stream and connection credit, the peer's record size, and `room` bytes
    /// of output (for the whole record if `payload_in_room`, else for its
    /// header). Nothing is charged.
    fn plan_stream_write(
        &mut self,
        id: StreamId,
        len: usize,
        fin: bool,
        room: usize,
        payload_in_room: bool,
        by_ref: bool,
    ) -> Result<StreamWrite, WriteError> {
        if self.state != State::Open {
            return Err(WriteError::Closed);
        }
        if !self.is_established() {
            return Err(WriteError::NotReady);
        }
        let record = self.peer_record_size();
        let conn_available = self.conn_send.available();
        let stream = self.streams.get_mut(id).ok_or(WriteError::UnknownStream)?;
        let send = stream.send.as_mut().ok_or(WriteError::NotSendable)?;
        match send.state {
            SendState::Open => {}
            SendState::Finished => return Err(WriteError::Finished),
            SendState::Reset => return Err(WriteError::Reset),
        }
        let offset = send.credit.used();
        let credit = send.credit.available().min(conn_available);
        let mut n = len.min(usize::try_from(credit).unwrap_or(usize::MAX));
        if !by_ref {
            n = n.min(max_stream_payload(record, id, offset));
        }
        // Shrink until what goes into `out` fits; each step removes at least the overrun.
        loop {
            let header = 1 + varint::len(id.value()) + varint::len(offset) + varint::len(n as u64);
            let frame = header + n;
            let total = varint::len(frame as u64) + frame;
            let needed = if payload_in_room { total } else { total - n };
            if needed <= room {
                break;
            }
            if n == 0 || !payload_in_room {
                return Err(WriteError::BufferTooSmall);
            }
            n = n.saturating_sub(needed - room);
        }
        if n == 0 && len > 0 {
            return Err(if credit == 0 {
                WriteError::Blocked
            } else {
                WriteError::BufferTooSmall
            });
        }
        Ok(StreamWrite {
            offset,
            len: n,
            fin: fin && n == len,
        })
    }

    /// Charges a planned STREAM record to the stream and connection credit.
    fn commit_stream_write(&mut self, now: Instant, id: StreamId, plan: StreamWrite) {
        let n = plan.len as u64;
        if let Some(send) = self.streams.get_mut(id).and_then(|s| s.send.as_mut()) {
            send.credit.claim(n);
            if plan.fin {
                send.state = SendState::Finished;
            }
        }
        self.conn_send.claim(n);
        if plan.fin {
            self.sweep();
        }
        self.timers.on_send(now);
    }

    /// Gives back credit for `n` bytes of stream `id` the application has finished with.
    ///
    /// This is the only way the peer gets more credit (docs/protocol.md §2.4): the
    /// stream window and the connection window are raised by moq-dev's rule and
    /// MAX_STREAM_DATA / MAX_DATA queued for `poll_transmit`. `n` is clamped to
    /// the bytes delivered and not yet released; calls for unknown, reset or
    /// stopped streams do nothing (their bytes were released already). A stream
    /// whose FIN arrived is retired once everything is released.
    pub fn release(&mut self, id: StreamId, n: u64) {
        let Some(recv) = self.streams.get_mut(id).and_then(|s| s.recv.as_mut()) else {
            return;
        };
        if !matches!(recv.state, RecvState::Open | RecvState::Finished) {
            return;
        }
        let n = n.min(recv.window.unreleased());
        if recv.window.release(n).is_some() && recv.state == RecvState::Open {
            recv.update_pending = true;
        }
        let finished = recv.state == RecvState::Finished && recv.window.unreleased() == 0;
        if !self.config.connection_credit_on_receipt && self.conn_recv.release(n).is_some() {
            self.max_data_pending = true;
        }
        if finished {
            self.sweep();
        }
    }

    /// Abandons our sending half of `id` with an application (moq-lite stream) error
    /// code; `poll_transmit` writes the RESET_STREAM (docs/protocol.md §2.2).
    ///
    /// Resetting a stream we already finished or reset does nothing (moq-dev never
    /// sends both FIN and RESET on one stream). The Final Size counts every byte
    /// `write_stream` framed, so send those records before the reset.
    ///
    /// # Errors
    /// [`StreamError::UnknownStream`]; [`StreamError::WrongDirection`] for a
    /// receive-only stream; [`StreamError::Closed`].
    pub fn reset_stream(&mut self, id: StreamId, code: u64) -> Result<(), StreamError> {
        if self.state != State::Open {
            return Err(StreamError::Closed);
        }
        let stream = self.streams.get_mut(id).ok_or(StreamError::UnknownStream)?;
        let send = stream.send.as_mut().ok_or(StreamError::WrongDirection)?;
        if send.state == SendState::Open {
            send.state = SendState::Reset;
            send.reset_pending = Some(code);
        }
        Ok(())
    }

    /// Tells the peer we will not read `id` any more; `poll_transmit` writes the
    /// STOP_SENDING (docs/protocol.md §2.2).
    ///
    /// Everything delivered and not yet released counts as released, and data
    /// still arriving is dropped (its credit returned at once). After a FIN no
    /// frame is needed and only the release happens; after a reset, or a second
    /// call, nothing happens.
    ///
    /// # Errors
    /// [`StreamError::UnknownStream`]; [`StreamError::WrongDirection`] for a
    /// send-only stream; [`StreamError::Closed`].
    pub fn stop_sending(&mut self, id: StreamId, code: u64) -> Result<(), StreamError> {
        if self.state != State::Open {
            return Err(StreamError::Closed);
        }
        let stream = self.streams.get_mut(id).ok_or(StreamError::UnknownStream)?;
        let recv = stream.recv.as_mut().ok_or(StreamError::WrongDirection)?;
        let unreleased = recv.window.unreleased();
        match recv.state {
            RecvState::Open => {
                recv.state = RecvState::Stopped;
                recv.stop_pending = Some(code);
                recv.update_pending = false;
            }
            RecvState::Finished => {}
            RecvState::Reset | RecvState::Stopped => return Ok(()),
        }
        recv.window.release(unreleased);
        if !self.config.connection_credit_on_receipt && self.conn_recv.release(unreleased).is_some()
        {
            self.max_data_pending = true;
        }
        self.sweep();
        Ok(())
    }

    /// The largest datagram payload the peer accepts; 0 if it accepts none or its
    /// parameters have not arrived (docs/protocol.md §2.7).
    pub fn max_datagram_payload(&self) -> usize {
        match self.peer {
            Some(p) if p.datagram > 0 => max_datagram_payload(p.datagram.min(p.record)),
            _ => 0,
        }
    }

    /// Writes one DATAGRAM record (type `0x31`) carrying `data` at the front of `out`
    /// and returns its length. Datagrams use no flow-control credit.
    ///
    /// # Errors
    /// [`DatagramError::Unsupported`] if the peer advertised no
    /// `max_datagram_frame_size`; [`DatagramError::TooLarge`] over
    /// [`max_datagram_payload`](Self::max_datagram_payload);
    /// [`DatagramError::BufferTooSmall`]; [`DatagramError::NotReady`] before
    /// establishment; [`DatagramError::Closed`].
    pub fn send_datagram(
        &mut self,
        now: Instant,
        data: &[u8],
        out: &mut [u8],
    ) -> Result<usize, DatagramError> {
        if self.state != State::Open {
            return Err(DatagramError::Closed);
        }
        if !self.is_established() {
            return Err(DatagramError::NotReady);
        }
        let max = self.max_datagram_payload();
        if max == 0 {
            return Err(DatagramError::Unsupported);
        }
        if data.len() > max {
            return Err(DatagramError::TooLarge);
        }
        let n = encode_record(
            &Frame::Datagram(Datagram::new(data)),
            self.peer_record_size(),
            out,
        )
        .map_err(|_| DatagramError::BufferTooSmall)?;
        self.timers.on_send(now);
        Ok(n)
    }
}
