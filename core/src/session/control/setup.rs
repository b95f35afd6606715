//! SETUP: ours, sent on a unidirectional stream as soon as the connection is
//! established, and the peer's, held for [`Session::poll_event`].

use super::Kind;
use super::Step;
use super::decode::{Too, decode_within};
use crate::model::path::PathBuf;
use crate::session::{MAX_PATH, Peer, Session};
use crate::transport::Transport;
use crate::wire::lite::{Param, SessionCode, Setup, UniStreamType, message_len, write_message};
use crate::wire::qmux::{Dir, Side};

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
    /// Our SETUP parameters (docs/protocol.md §3.5): client Path and Role, both Hop;
    /// no Probe (we do not implement probing, §3.11).
    fn setup_params(&self) -> ([Param<'s>; 3], usize) {
        let mut params = [Param::Hop(0); 3];
        let mut n = 0;
        // A server's `path` is the transport's (a WebSocket request URI), never sent.
        if let Some(path) = self.path.filter(|_| self.side == Side::Client) {
            params[n] = Param::Path(path);
            n += 1;
        }
        if self.role != crate::wire::lite::Role::Both {
            params[n] = Param::Role(self.role);
            n += 1;
        }
        if self.hop != 0 {
            params[n] = Param::Hop(self.hop);
            n += 1;
        }
        (params, n)
    }

    /// The encoded size of our Setup stream (type and SETUP), if it encodes.
    pub(in crate::session) fn setup_len(&self) -> Option<usize> {
        let (params, n) = self.setup_params();
        let setup = Setup::new(params.get(..n)?);
        Some(UniStreamType::Setup.encoded_len() + message_len(&setup).ok()?)
    }

    /// Opens our Setup stream with SETUP and FIN (docs/protocol.md §3.4: promptly, always).
    pub(in crate::session) fn send_setup(&mut self) {
        if self.setup_sent {
            return;
        }
        self.setup_sent = true;
        let Some(slot) = self.alloc_control(Kind::SetupOut, Dir::Uni, None) else {
            self.fail(SessionCode::Internal, "no control slot for SETUP");
            return;
        };
        let (params, n) = self.setup_params();
        let written = self.tx_write(slot, |w| {
            UniStreamType::Setup.write(w)?;
            write_message(&Setup::new(params.get(..n).unwrap_or(&[])), w)
        });
        if written.is_err() {
            self.fail(SessionCode::Internal, "SETUP does not fit");
            return;
        }
        let c = &mut self.control[slot];
        c.fin = true;
        c.rx_done = true;
        self.open_pending();
    }

    /// The peer's SETUP (docs/protocol.md §3.5).
    pub(super) fn parse_setup(&mut self, slot: usize, done: bool, limit: usize) -> Step {
        if done {
            self.fail(SessionCode::ProtocolViolation, "data after SETUP");
            return Step::Stop;
        }
        let scope = match self.side {
            Side::Server => self.scope,
            Side::Client => None,
        };
        // The path the transport carried (a WebSocket request URI), else SETUP's.
        let carried = self.path;
        let parsed = match decode_within::<Setup<'_>>(self.rx_data(slot), limit) {
            // docs/protocol.md §4.10: the client is admitted or refused here,
            // before any of its requests is read.
            Ok((setup, n)) => {
                let dialed = carried.or(setup.path());
                let admitted = scope.map_or(Ok(()), |s| s.admit(dialed, setup.role()));
                // docs/protocol.md §4.1: a client's session is rooted at the path it dialed.
                let root = match self.side {
                    Side::Server => dialed_root(dialed),
                    Side::Client => Some(PathBuf::new()),
                };
                Ok((
                    setup.hop(),
                    setup.role(),
                    n,
                    admitted.and(root.ok_or("the dialed path is malformed")),
                ))
            }
            Err(e) => Err(e),
        };
        match parsed {
            Ok((_, _, _, Err(reason))) => {
                self.fail(SessionCode::Unauthorized, reason);
                Step::Stop
            }
            Ok((hop, role, n, Ok(root))) => {
                self.root = root;
                // Role and Path are client parameters; a server's are ignored.
                let role = match self.side {
                    Side::Server => role,
                    Side::Client => crate::wire::lite::Role::Both,
                };
                self.peer = Some(Peer { hop, role });
                self.control[slot].kind = Kind::SetupIn { done: true };
                // Tables for either direction come with the application's
                // answer to the SETUP: read on once it has seen it.
                if self.served.capacity() == 0 && self.subs.capacity() == 0 {
                    self.awaiting_tables = true;
                }
                debug!("session: peer SETUP, hop {}", hop);
                Step::Held(n)
            }
            Err(Too::Malformed) => {
                self.fail(SessionCode::ProtocolViolation, "malformed SETUP");
                Step::Stop
            }
            Err(e) => self.on_decode_error(slot, e),
        }
    }
}

/// The root of a session dialed at `dialed` (a path and maybe a query): its
/// path part, normalized; the origin's root when absent; `None` when malformed.
fn dialed_root(dialed: Option<&str>) -> Option<PathBuf<{ MAX_PATH }>> {
    let path = dialed.map_or("", |d| d.split_once('?').map_or(d, |(p, _)| p));
    PathBuf::normalize(path).ok()
}
