//! The receive path: records and frames in, events out (docs/protocol.md §1.3, §2).

use super::streams::{RecvState, SendState, Stream};
use super::timer::effective_idle;
use super::{
    CloseCause, CloseFrame, Closed, Connection, Event, Input, Peer, State,
    VERSION_NEGOTIATION_FAILED, negotiate, send_limit, slot, utf8_prefix,
};
use crate::time::Instant;
use crate::wire::qmux::{
    ApplicationClose, ConnectionClose, Frame, Record, ResetStream, STREAM_REF, StopSending,
    Stream as StreamFrame, StreamId, StreamRef as StreamRefFrame, TransportError, TransportParams,
};
use crate::wire::{DecodeError, Reader};

/// What handling one frame did.
enum Step<'a> {
    /// The frame was used; report the event, if any.
    Done(Option<Event<'a>>),
    /// The frame first opened a lower stream index; report it and decode the same frame again.
    Again(Event<'a>),
}

type FrameResult<'a> = Result<Step<'a>, TransportError>;

/// What charging received stream data found.
enum Received<'a> {
    /// New bytes at this stream offset: report them.
    New(u64),
    /// Nothing to report; finish the frame with this step.
    Dropped(Step<'a>),
}

impl<const N: usize> Connection<N> {
    /// Processes received bytes up to the next event.
    ///
    /// `input` is everything received and not yet consumed, oldest first. The
    /// call decodes whole records only (a partial record is left alone until more
    /// bytes arrive) and stops after the first frame that produces an [`Event`].
    /// Drop [`Input::consumed`] bytes from the front of the buffer, handle the
    /// event, and call again until `event` is `None`. The event borrows `input`,
    /// so the caller must not compact its buffer while holding it.
    ///
    /// The caller's buffer must be able to hold one whole record: our
    /// `max_record_size` (16382 by default) plus 8 bytes.
    ///
    /// Any QMux violation (docs/protocol.md §2.4) ends the connection with
    /// [`Event::Closed`] ([`CloseCause::Violation`]) and queues a transport close
    /// (code 1002); from then on, and after any other close, input is consumed
    /// and ignored.
    pub fn handle_input<'a>(&mut self, now: Instant, input: &'a [u8]) -> Input<'a> {
        let mut pos = 0;
        while self.state == State::Open {
            if self.record_left == 0 {
                let rest = input.get(pos..).unwrap_or(&[]);
                match Record::decode(rest, self.config.max_record_size) {
                    Err(DecodeError::Incomplete) => break,
                    Err(e) => return self.fail(input, e.into()),
                    Ok(record) => {
                        self.timers.on_recv(now);
                        // Consume the Size varint now; the body follows frame by frame.
                        pos += record.len - record.body.len();
                        self.record_left = record.body.len();
                        continue;
                    }
                }
            }
            // The whole record was present when it was started; if the caller
            // dropped bytes it had not consumed, wait rather than misparse.
            let Some(body) = input.get(pos..pos.saturating_add(self.record_left)) else {
                break;
            };
            let mut r = Reader::new(body);
            let frame = match Frame::decode(&mut r) {
                Ok(frame) => frame,
                Err(e) => return self.fail(input, e.into()),
            };
            match self.on_frame(now, frame) {
                Ok(Step::Done(event)) => {
                    pos += r.position();
                    self.record_left -= r.position();
                    if let Some(mut event) = event {
                        if let Event::StreamData { data, at, .. } = &mut event {
                            // A STREAM frame's data runs to the end of the frame.
                            *at = pos.saturating_sub(data.len());
                        }
                        return Input {
                            consumed: pos,
                            event: Some(event),
                        };
                    }
                }
                Ok(Step::Again(event)) => {
                    return Input {
                        consumed: pos,
                        event: Some(event),
                    };
                }
                Err(e) => return self.fail(input, e),
            }
        }
        if self.state != State::Open {
            // Closed: whatever follows is meaningless.
            return Input {
                consumed: input.len(),
                event: None,
            };
        }
        Input {
            consumed: pos,
            event: None,
        }
    }

    /// Closes on a violation and reports it, consuming all input.
    fn fail<'a>(&mut self, input: &'a [u8], e: TransportError) -> Input<'a> {
        Input {
            consumed: input.len(),
            event: Some(self.violation(e)),
        }
    }

    /// Dispatches one decoded frame.
    fn on_frame<'a>(&mut self, now: Instant, frame: Frame<'a>) -> FrameResult<'a> {
        match frame {
            Frame::Padding
            | Frame::DataBlocked(_)
            | Frame::StreamDataBlocked { .. }
            | Frame::StreamsBlocked { .. }
            | Frame::PingResponse(_) => Ok(Step::Done(None)),
            Frame::TransportParameters(p) => self.on_params(now, p),
            Frame::Stream(s) => self.on_stream(s),
            Frame::StreamRef(s) => self.on_stream_ref(s),
            Frame::ResetStream(r) => self.on_reset(r),
            Frame::StopSending(s) => self.on_stop(s),
            // docs/protocol.md §2.3: a decreasing MAX_* closes the session, as moq-dev does.
            Frame::MaxData(max) => {
                self.conn_send
                    .raise(max)
                    .map_err(|_| TransportError::FlowControl)?;
                Ok(Step::Done(None))
            }
            Frame::MaxStreamData { id, max } => {
                // For a stream we do not know (retired or never ours to send on) it is ignored.
                if let Some(send) = self.streams.get_mut(id).and_then(|s| s.send.as_mut()) {
                    send.credit
                        .raise(max)
                        .map_err(|_| TransportError::FlowControl)?;
                }
                Ok(Step::Done(None))
            }
            Frame::MaxStreams { dir, max } => {
                self.local[slot(dir)]
                    .raise(max)
                    .map_err(|_| TransportError::FlowControl)?;
                Ok(Step::Done(None))
            }
            Frame::PingRequest(seq) => {
                self.queue_pong(seq);
                Ok(Step::Done(None))
            }
            Frame::ConnectionClose(ConnectionClose { code, reason, .. }) => {
                Ok(self.on_close(false, code, reason))
            }
            Frame::ApplicationClose(ApplicationClose { code, reason }) => {
                Ok(self.on_close(true, code, reason))
            }
            Frame::Datagram(d) => {
                // docs/protocol.md §2.7: only if we advertised a size, and the whole frame within it.
                if self.config.max_datagram_frame_size == 0 {
                    return Err(TransportError::DatagramsUnsupported);
                }
                if d.frame_size() as u64 > self.config.max_datagram_frame_size {
                    return Err(TransportError::FrameTooLarge);
                }
                Ok(Step::Done(Some(Event::Datagram(d.data))))
            }
        }
    }

    /// The peer's QX_TRANSPORT_PARAMETERS: apply its limits and negotiate the protocol.
    fn on_params<'a>(&mut self, now: Instant, p: TransportParams<'_>) -> FrameResult<'a> {
        if self.peer.is_some() {
            // A second parameters frame (moq-dev rejects it as well).
            return Err(TransportError::ProtocolViolation);
        }
        self.peer = Some(Peer {
            bidi_local: p.initial_max_stream_data_bidi_local,
            bidi_remote: p.initial_max_stream_data_bidi_remote,
            uni: p.initial_max_stream_data_uni,
            datagram: p.max_datagram_frame_size,
            record: p.record_size_limit(),
        });
        // A MAX_* frame may have raised a limit before the parameters arrived; keep the larger.
        self.conn_send.raise_at_least(p.initial_max_data);
        self.local[0].raise_at_least(p.initial_max_streams_bidi);
        self.local[1].raise_at_least(p.initial_max_streams_uni);
        // Peer streams opened before its parameters (qmux-01 receivers accept that,
        // docs/protocol.md §1.1) get their send credit now.
        let (side, peer) = (self.side, self.peer);
        for s in self.streams.iter_mut() {
            if let Some(send) = s.send.as_mut() {
                send.credit.raise_at_least(send_limit(side, peer, s.id));
            }
        }
        self.timers.on_established(
            now,
            effective_idle(self.config.max_idle_timeout.as_millis(), p.max_idle_timeout),
        );

        let agreed = match self.config.fixed_protocol {
            // docs/protocol.md §9.2: the transport chose; a list from the peer is a violation.
            Some(_) if p.application_protocols.is_some() => {
                return Err(TransportError::TransportParameter);
            }
            Some(fixed) => Some(fixed),
            None => negotiate(self.side, self.config.protocols, p.application_protocols),
        };
        match agreed {
            Some(protocol) => {
                debug!("qmux: established, protocol {}", protocol);
                self.protocol = Some(protocol);
                Ok(Step::Done(Some(Event::Established { protocol })))
            }
            None => {
                // docs/protocol.md §1.5: no overlap is a failure for a moq-lite endpoint; close
                // cleanly with moq-lite's VERSION_NEGOTIATION_FAILED (§3.15).
                const REASON: &str = "no common application protocol";
                debug!("qmux: {}", REASON);
                self.state = State::Closed {
                    pending: Some(CloseFrame::new(true, VERSION_NEGOTIATION_FAILED, REASON)),
                };
                Ok(Step::Done(Some(Event::Closed(Closed {
                    code: VERSION_NEGOTIATION_FAILED,
                    reason: REASON,
                    application: true,
                    cause: CloseCause::NoCommonProtocol,
                }))))
            }
        }
    }

    /// The peer closed the connection; nothing is sent back (docs/protocol.md §2.6).
    fn on_close<'a>(&mut self, application: bool, code: u64, reason: &'a [u8]) -> Step<'a> {
        debug!("qmux: peer closed with code {}", code);
        self.state = State::Closed { pending: None };
        Step::Done(Some(Event::Closed(Closed {
            code,
            reason: utf8_prefix(reason),
            application,
            cause: CloseCause::Peer,
        })))
    }

    /// A STREAM frame.
    fn on_stream<'a>(&mut self, s: StreamFrame<'a>) -> FrameResult<'a> {
        let offset = match self.receive_stream_data(s.id, s.data.len() as u64, s.fin)? {
            Received::New(offset) => offset,
            Received::Dropped(step) => return Ok(step),
        };
        Ok(Step::Done(Some(Event::StreamData {
            id: s.id,
            offset,
            data: s.data,
            // Set by `handle_input`, which knows where the frame ends.
            at: 0,
            fin: s.fin,
        })))
    }

    /// STREAM_REF: stream data by reference, accounted exactly like STREAM.
    fn on_stream_ref<'a>(&mut self, s: StreamRefFrame) -> FrameResult<'a> {
        if !cfg!(feature = "stream-refs") || !self.config.stream_refs {
            return Err(TransportError::InvalidFrameType(STREAM_REF));
        }
        let offset = match self.receive_stream_data(s.id, s.len, s.fin)? {
            Received::New(offset) => offset,
            Received::Dropped(step) => return Ok(step),
        };
        Ok(Step::Done(Some(Event::StreamRef {
            id: s.id,
            offset,
            len: s.len,
            token: s.token,
            fin: s.fin,
        })))
    }

    /// Charges `len` stream bytes (ending the stream if `fin`) to the stream and
    /// connection windows: where they start, or what to do instead of
    /// reporting them.
    fn receive_stream_data<'a>(
        &mut self,
        id: StreamId,
        len: u64,
        fin: bool,
    ) -> Result<Received<'a>, TransportError> {
        // docs/protocol.md §1.6: STREAM on a uni stream only we may send on is an invalid-stream error.
        if !id.can_recv(self.side) {
            return Err(TransportError::InvalidStreamId);
        }
        let Some(stream) = self.streams.get_mut(id) else {
            return self.on_unknown_stream(id, len).map(Received::Dropped);
        };
        let Some(recv) = stream.recv.as_mut() else {
            return Err(TransportError::InvalidStreamId);
        };
        match recv.state {
            RecvState::Open => {}
            RecvState::Stopped => {
                // Data still in flight when our STOP_SENDING left: charge it to the
                // stream (still bounded by its window) and the connection, and give
                // the connection credit straight back.
                recv.window
                    .receive(len)
                    .map_err(|_| TransportError::FlowControl)?;
                self.discard(len)?;
                return Ok(Received::Dropped(Step::Done(None)));
            }
            // After FIN or a reset nothing more may come; a late frame is ignored, but
            // its bytes were charged by the sender, so keep the connection window in step.
            RecvState::Finished | RecvState::Reset => {
                self.discard(len)?;
                return Ok(Received::Dropped(Step::Done(None)));
            }
        }
        // docs/protocol.md §2.4: charge on arrival; over a stream or connection limit is fatal.
        let offset = recv.window.received();
        recv.window
            .receive(len)
            .map_err(|_| TransportError::FlowControl)?;
        self.conn_recv
            .receive(len)
            .map_err(|_| TransportError::FlowControl)?;
        if self.config.connection_credit_on_receipt && self.conn_recv.release(len).is_some() {
            self.max_data_pending = true;
        }
        if fin {
            recv.state = RecvState::Finished;
            // No credit is useful once the peer has finished.
            recv.update_pending = false;
        } else if len == 0 {
            // docs/protocol.md §2.1: an empty non-FIN frame on an existing stream is ignored.
            return Ok(Received::Dropped(Step::Done(None)));
        }
        if fin {
            self.sweep();
        }
        Ok(Received::New(offset))
    }

    /// A STREAM or RESET_STREAM naming a stream that is not in the table.
    fn on_unknown_stream<'a>(&mut self, id: StreamId, len: u64) -> FrameResult<'a> {
        if id.is_local(self.side) {
            // Ours: either retired (ignore) or never opened (the peer cannot name it).
            if id.index() >= self.local[slot(id.dir())].used() {
                return Err(TransportError::InvalidStreamId);
            }
            self.discard(len)?;
            return Ok(Step::Done(None));
        }
        let opened = self.remote[slot(id.dir())].received();
        if id.index() < opened {
            // docs/protocol.md §2.2: late frames for a fully closed stream are ignored.
            self.discard(len)?;
            return Ok(Step::Done(None));
        }
        self.open_next_peer_stream(id)
    }

    /// Opens the lowest unopened peer index of `target`'s kind (docs/protocol.md §1.6:
    /// opening index N opens every lower index) and reports it.
    fn open_next_peer_stream<'a>(&mut self, target: StreamId) -> FrameResult<'a> {
        let dir = target.dir();
        let window = &mut self.remote[slot(dir)];
        // docs/protocol.md §1.6: an index at or beyond our grant is a stream-limit error.
        if target.index() >= window.max() {
            return Err(TransportError::StreamLimit);
        }
        let index = window.received();
        let id =
            StreamId::new(target.initiator(), dir, index).ok_or(TransportError::StreamLimit)?;
        window
            .receive_up_to(index + 1)
            .map_err(|_| TransportError::StreamLimit)?;
        // docs/protocol.md §2.4: streams retired before this one may have left
        // credit below the raise threshold; a peer that now reaches it gets it.
        if window.catch_up().is_some() {
            self.max_streams_pending[slot(dir)] = true;
        }
        let stream = Stream::new(id, self.side, self.send_max(id), self.recv_max(id));
        // Cannot happen while our grants fit the table (see `reserved_for_peer`).
        self.streams
            .insert(stream)
            .map_err(|_| TransportError::StreamLimit)?;
        trace!("qmux: peer opened stream {}", id.value());
        Ok(Step::Again(Event::StreamOpened { id }))
    }

    /// Charges bytes nobody will read to the connection window and releases them at once.
    fn discard(&mut self, len: u64) -> Result<(), TransportError> {
        self.conn_recv
            .receive(len)
            .map_err(|_| TransportError::FlowControl)?;
        if self.conn_recv.release(len).is_some() {
            self.max_data_pending = true;
        }
        Ok(())
    }

    /// A RESET_STREAM frame (docs/protocol.md §2.2).
    fn on_reset<'a>(&mut self, r: ResetStream) -> FrameResult<'a> {
        if !r.id.can_recv(self.side) {
            return Err(TransportError::InvalidStreamId);
        }
        let Some(stream) = self.streams.get_mut(r.id) else {
            // A reset may be the first frame of a peer stream; a late one is ignored
            // (its bytes were already charged when the stream was retired).
            return self.on_unknown_stream(r.id, 0);
        };
        let Some(recv) = stream.recv.as_mut() else {
            return Err(TransportError::InvalidStreamId);
        };
        let report = match recv.state {
            RecvState::Open => true,
            RecvState::Stopped => false,
            // After FIN (moq-dev has dropped the stream by then) or a second reset: ignore.
            RecvState::Finished | RecvState::Reset => return Ok(Step::Done(None)),
        };
        // qmux-01 peers are lenient: use max(final size, bytes received).
        let received = recv.window.received();
        let final_size = r.final_size.max(received);
        let gap = final_size - received;
        recv.window
            .receive(gap)
            .map_err(|_| TransportError::FlowControl)?;
        // Everything the application has not released, and the gap never sent, is
        // released now: nobody will read it (moq-dev credits the gap immediately).
        let unreleased = recv.window.unreleased();
        recv.window.release(unreleased);
        recv.state = RecvState::Reset;
        recv.update_pending = false;
        recv.stop_pending = None;
        self.conn_recv
            .receive(gap)
            .map_err(|_| TransportError::FlowControl)?;
        // Bytes that arrived were given back on receipt in that mode: only the gap is left.
        let conn_unreleased = if self.config.connection_credit_on_receipt {
            gap
        } else {
            unreleased
        };
        if self.conn_recv.release(conn_unreleased).is_some() {
            self.max_data_pending = true;
        }
        self.sweep();
        if !report {
            return Ok(Step::Done(None));
        }
        Ok(Step::Done(Some(Event::StreamReset {
            id: r.id,
            code: r.code,
            final_size,
        })))
    }

    /// A STOP_SENDING frame (docs/protocol.md §2.2).
    fn on_stop<'a>(&mut self, s: StopSending) -> FrameResult<'a> {
        if !s.id.can_send(self.side) {
            return Err(TransportError::InvalidStreamId);
        }
        match self.streams.get_mut(s.id).and_then(|st| st.send.as_mut()) {
            Some(send) => {
                // Ignored for a stream we finished or reset (moq-dev sends it routinely
                // after reading a FIN), and reported once otherwise.
                if send.state != SendState::Open || send.stop_seen {
                    return Ok(Step::Done(None));
                }
                send.stop_seen = true;
                Ok(Step::Done(Some(Event::StopSending {
                    id: s.id,
                    code: s.code,
                })))
            }
            None => {
                // One of ours never opened cannot be named; anything else is a retired
                // stream or one the peer has not opened yet (moq-dev ignores both).
                if s.id.is_local(self.side) && s.id.index() >= self.local[slot(s.id.dir())].used() {
                    return Err(TransportError::InvalidStreamId);
                }
                Ok(Step::Done(None))
            }
        }
    }

    /// Remembers a QX_PING request to answer (docs/protocol.md §2.5).
    ///
    /// Consecutive sequences (moq-dev counts 0, 1, 2 …) are kept as runs, so even
    /// a long backlog costs one slot; if the runs overflow, the oldest is dropped.
    fn queue_pong(&mut self, seq: u64) {
        if let Some((first, count)) = self.pongs.back_mut()
            && first.checked_add(*count) == Some(seq)
        {
            *count += 1;
            return;
        }
        if self.pongs.is_full() {
            debug!("qmux: too many ping requests pending; dropping the oldest");
            self.pongs.pop_front();
        }
        let _ = self.pongs.push_back((seq, 1));
    }
}
