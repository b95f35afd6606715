//! GOAWAY: ours, at most one, on a new bidirectional stream, and the peer's,
//! held for [`Session::poll_event`].

use super::decode::decode_within;
use super::{Kind, Step};
use crate::session::{Error, Session};
use crate::transport::Transport;
use crate::wire::lite::{BidiStreamType, Goaway, SessionCode, write_message};
use crate::wire::qmux::{Dir, Side};

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
    /// Sends GOAWAY on a new stream (docs/protocol.md §3.12): the peer should make no
    /// new requests and reconnect to `uri` ("" = the same place) when done.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a second GOAWAY or a non-empty `uri` from a client;
    /// [`Error::TooLarge`] if it does not fit a control buffer;
    /// [`Error::ControlFull`], [`Error::NotReady`], [`Error::Closed`].
    pub fn goaway(&mut self, uri: &str) -> Result<(), Error> {
        self.release_surfaced();
        self.dirty = true;
        self.check_ready()?;
        if self.goaway_sent || (!uri.is_empty() && self.side == Side::Client) {
            return Err(Error::Invalid);
        }
        let slot = self
            .alloc_control(Kind::GoawayOut, Dir::Bidi, None)
            .ok_or(Error::ControlFull)?;
        let written = self.tx_write(slot, |w| {
            BidiStreamType::Goaway.write(w)?;
            write_message(&Goaway { uri }, w)
        });
        if written.is_err() {
            self.free_slot(slot);
            return Err(Error::TooLarge);
        }
        self.control[slot].fin = true;
        self.goaway_sent = true;
        self.open_pending();
        Ok(())
    }

    /// The peer's GOAWAY (docs/protocol.md §3.12).
    pub(super) fn parse_goaway(&mut self, slot: usize, done: bool, limit: usize) -> Step {
        if done {
            self.fail(SessionCode::ProtocolViolation, "data after GOAWAY");
            return Step::Stop;
        }
        let parsed = decode_within::<Goaway<'_>>(self.rx_data(slot), limit)
            .map(|(g, n)| (g.uri.is_empty(), n));
        match parsed {
            Ok((empty, n)) => {
                // Only a server may name a URI (lite-06 rule, applied to lite-05 too).
                if !empty && self.side == Side::Server {
                    self.fail(SessionCode::ProtocolViolation, "GOAWAY URI from a client");
                    return Step::Stop;
                }
                self.control[slot].kind = Kind::GoawayIn { done: true };
                Step::Held(n)
            }
            Err(e) => self.on_decode_error(slot, e),
        }
    }
}
