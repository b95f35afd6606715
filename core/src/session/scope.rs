//! Access control: a hook that admits a client at its SETUP and limits the
//! broadcasts of our origin it may learn of and subscribe to
//! (docs/protocol.md §4.10).
//!
//! The session asks [`Scope::admit`] once, synchronously, while it parses
//! the client's SETUP and before any of the client's requests is read, so a
//! request never races the decision. After that, every broadcast it would
//! announce to the peer and every TRACK or SUBSCRIBE the peer sends passes
//! [`Scope::may_subscribe`]. The hook owns the policy; the session only
//! applies the answers.

use super::Session;
use crate::wire::lite::Role;

/// Decides whether a client may use the session, and which broadcasts it may see.
pub trait Scope {
    /// The client's SETUP: its path and query (the one the transport
    /// carried, such as a WebSocket request URI, else SETUP's Path
    /// parameter), if any, and its declared role. `Err(reason)` closes the session with UNAUTHORIZED
    /// (`0x2`) and the reason.
    ///
    /// # Errors
    /// The reason the client is refused.
    fn admit(&self, path: Option<&str>, role: Role) -> Result<(), &'static str>;

    /// Whether the peer may learn of and subscribe to broadcast `path` (a
    /// full, normalized broadcast path of our origin). Refused requests are
    /// reset with UNROUTABLE (`0x36`), refused announcements are not sent.
    fn may_subscribe(&self, path: &str) -> bool;
}

impl<'s, 'a, 'p, const N: usize> Session<'s, 'a, 'p, N> {
    /// Installs (or removes, with `None`) the access-control hook. Install it
    /// before the peer's SETUP arrives: a SETUP parsed without one is admitted.
    pub fn set_scope(&mut self, scope: Option<&'s dyn Scope>) {
        self.scope = scope;
        self.dirty = true;
    }

    /// Whether the hook, if any, lets the peer see broadcast `path`.
    pub(super) fn visible(scope: Option<&dyn Scope>, path: &str) -> bool {
        scope.is_none_or(|s| s.may_subscribe(path))
    }
}
