//! The session over QMux, its first transport: the constructor on a
//! [`Connection`] and [`Session::handle_input`], which takes the received
//! bytes of a TCP, TLS or WebSocket connection.

use super::*;

impl<'s, 'a, 'p, const N: usize> Session<'s, 'a, 'p, N, Connection<N>> {
    /// A new session on one end of a just-connected TCP stream, created at `now`.
    ///
    /// `origin` holds the local broadcasts served to the peer (`None` for a pure
    /// subscriber: every request is then UNROUTABLE). Call [`poll_transmit`](Self::poll_transmit) next: it
    /// writes the connection's parameters.
    ///
    /// # Errors
    /// [`ConfigError`] if the QMux configuration does not fit `N` (the advertised
    /// stream counts must leave at least one slot for our own streams), the control
    /// buffers are smaller than [`MIN_BUF`] or cannot hold our SETUP, or the
    /// storage has no control slot.
    pub fn new<
        const CONTROL: usize,
        const BUF: usize,
        const SERVE: usize,
        const SUBS: usize,
        const OUT: usize,
        const IN: usize,
        const CHUNKS: usize,
    >(
        side: Side,
        config: Config<'s>,
        now: Instant,
        storage: &'s mut Storage<'a, 'p, CONTROL, BUF, SERVE, SUBS, OUT, IN, CHUNKS>,
        origin: Option<origin::Ref<'a, 'p>>,
    ) -> Result<Self, ConfigError> {
        check_storage(CONTROL, BUF, CHUNKS)?;
        let conn = Connection::new(side, config.conn, now)?;
        // The connection keeps a slot for every stream the peer may open; advertising
        // the whole table would leave none for our own (SETUP first): the session
        // could never start.
        let (bidi, uni) = config.conn.stream_counts(N)?;
        if bidi.saturating_add(uni) >= N as u64 {
            return Err(ConfigError::Conn(conn::ConfigError::StreamsOverCapacity));
        }
        Self::with_transport(side, config, conn, now, storage, origin)
    }

    /// The QMux connection underneath (read-only: its state, credit, negotiated protocol).
    #[cfg(test)]
    pub fn connection(&self) -> &Connection<N> {
        &self.conn
    }

    /// Processes received bytes: QMux records, then the moq-lite messages and
    /// group data they carry. Returns how many bytes at the front of `input`
    /// were used.
    ///
    /// `input` is everything received and not yet consumed, oldest first; keep
    /// the unconsumed rest at the front of the buffer for the next call. It
    /// must be able to hold one whole QMux record (the connection's
    /// `max_record_size`, 16382 by default, plus 8). The call stops early when
    /// the session cannot take more (see the module documentation on
    /// backpressure); then call [`poll_event`](Self::poll_event) and, once local
    /// readers have consumed data, call again with the same bytes.
    ///
    /// Afterwards drain [`poll_event`](Self::poll_event) and
    /// [`poll_transmit`](Self::poll_transmit).
    ///
    /// # Errors
    /// [`Error::Closed`] once the session is over (the input is meaningless then).
    pub fn handle_input(&mut self, now: Instant, input: &[u8]) -> Result<usize, Error> {
        self.release_surfaced();
        self.dirty = true;
        self.now = now;
        if self.is_closed() {
            return Err(Error::Closed);
        }
        self.resume();
        let mut pos = 0;
        if let Some(st) = self.stall {
            // The caller hands the stalled bytes back first.
            let Some(data) = input.get(..st.len) else {
                return Ok(0);
            };
            let used = self.on_stream_data(now, st.id, u64::MAX, data, None, st.fin);
            if used < st.len {
                self.stall = Some(Stall {
                    len: st.len - used,
                    ..st
                });
                self.drive();
                return Ok(used);
            }
            self.stall = None;
            pos = st.len;
        }
        if cfg!(feature = "stream-refs") && self.stall_ref.is_some() {
            // Data by reference may still open its stream (a Group event):
            // like other input, it waits while the event queue is nearly full.
            if !self.has_event_room() {
                self.drive();
                return Ok(pos);
            }
            if let Some(st) = self.stall_ref.take()
                && !self.take_ref(now, st)
            {
                self.drive();
                return Ok(pos);
            }
        }
        while !self.is_closed() && self.has_event_room() && !self.awaiting_tables {
            let rest = input.get(pos..).unwrap_or(&[]);
            let step = self.conn.handle_input(now, rest);
            let Some(event) = step.event else {
                pos += step.consumed;
                break;
            };
            match event {
                conn::Event::StreamData {
                    id,
                    offset,
                    data,
                    at,
                    fin,
                } => {
                    let used = self.on_stream_data(now, id, offset, data, None, fin);
                    if used < data.len() {
                        // The data ends what the connection consumed, so the
                        // unused tail is handed back: the caller presents it
                        // again at the front of the next call.
                        self.stall = Some(Stall {
                            id,
                            len: data.len() - used,
                            fin,
                        });
                        pos += at + used;
                        break;
                    }
                    pos += step.consumed;
                }
                conn::Event::StreamRef {
                    id,
                    offset,
                    len,
                    token,
                    fin,
                } => {
                    pos += step.consumed;
                    if !cfg!(feature = "stream-refs") {
                        // The connection refuses STREAM_REF without the feature.
                        self.fail(SessionCode::Internal, "stream reference");
                        return Ok(input.len());
                    }
                    let st = StallRef {
                        id,
                        offset,
                        data: RefData::Token(token, len),
                        fin,
                    };
                    if !self.take_ref(now, st) {
                        break;
                    }
                }
                other => {
                    pos += step.consumed;
                    self.on_conn_event(now, other);
                }
            }
        }
        self.drive();
        Ok(pos.min(input.len()))
    }
}
