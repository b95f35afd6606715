//! Our SUBSCRIBEs: the peer's typed responses on them.

use super::Step;
use crate::session::Session;
use crate::transport::Transport;
use crate::wire::DecodeError;
use crate::wire::lite::{SessionCode, SubscribeResponse};

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
    /// A typed response on our SUBSCRIBE (docs/protocol.md §3.8).
    pub(super) fn parse_response(&mut self, slot: usize, sub: u64) -> Step {
        match SubscribeResponse::decode(self.rx_data(slot)) {
            Ok((r, n)) => {
                self.on_response(sub, r);
                Step::Consumed(n)
            }
            Err(DecodeError::Incomplete) => Step::Wait,
            Err(_) => {
                self.fail(
                    SessionCode::ProtocolViolation,
                    "malformed subscribe response",
                );
                Step::Stop
            }
        }
    }
}
