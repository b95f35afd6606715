//! One session's admission and scope: the relay's [`Scope`] hook.

use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::{Duration as StdDuration, SystemTime};

use skiff_core::session::Scope;
use skiff_core::time::{Duration, Instant};
use skiff_core::wire::lite::Role;

use super::{Auth, Grant, Refusal};

/// What one client session may do: decided at its SETUP by [`Auth::admit`],
/// then asked for each broadcast it publishes, sees or subscribes to.
pub struct Gate {
    auth: Arc<Auth>,
    /// The session's clock at admission and the wall clock then, to place
    /// the token's `exp` on the session's clock.
    now: Box<dyn Fn() -> (Instant, SystemTime)>,
    grant: RefCell<Option<Grant>>,
    refusal: RefCell<Option<Refusal>>,
    deadline: Cell<Option<Instant>>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("grant", &self.grant)
            .field("refusal", &self.refusal)
            .finish_non_exhaustive()
    }
}

impl Gate {
    /// The gate of a session decided by `auth`; `now` reads the session's
    /// clock and the wall clock.
    pub fn new(auth: Arc<Auth>, now: impl Fn() -> (Instant, SystemTime) + 'static) -> Self {
        Gate {
            auth,
            now: Box::new(now),
            grant: RefCell::new(None),
            refusal: RefCell::new(None),
            deadline: Cell::new(None),
        }
    }

    /// Whether the session may announce broadcast `path` (nothing before admission).
    pub fn may_publish(&self, path: &str) -> bool {
        self.grant
            .borrow()
            .as_ref()
            .is_some_and(|g| g.access.publish.matches(path))
    }

    /// Whether the session was admitted with publish and subscribe over the
    /// whole tree (`**` from the relay's root, both ways): what a cluster
    /// peer's token must grant (docs/protocol.md §4.10).
    pub fn grants_everything(&self) -> bool {
        let everything = |p: &moq_pattern::Patterns| p.iter().any(|p| p.as_str() == "**");
        self.grant
            .borrow()
            .as_ref()
            .is_some_and(|g| everything(&g.access.publish) && everything(&g.access.subscribe))
    }

    /// When the session's token expires, on the session's clock.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline.get()
    }

    /// Why the session was refused, once it was.
    pub fn refusal(&self) -> Option<Refusal> {
        self.refusal.borrow().clone()
    }
}

impl Scope for Gate {
    fn admit(&self, path: Option<&str>, role: Role) -> Result<(), &'static str> {
        // The core passes the transport's path (WebSocket) or SETUP's (TCP).
        // No transport of ours carries a token in SETUP: the path has it.
        let dialed = path;
        let (mono, wall) = (self.now)();
        match self.auth.admit(dialed, None, role, wall) {
            Ok(grant) => {
                if let Some(exp) = grant.expires {
                    // No grace: the session ends at `exp` exactly.
                    let at = u64::try_from(exp).ok().and_then(|s| {
                        SystemTime::UNIX_EPOCH.checked_add(StdDuration::from_secs(s))
                    });
                    let left = at
                        .and_then(|at| at.duration_since(wall).ok())
                        .unwrap_or_default();
                    let micros = u64::try_from(left.as_micros()).unwrap_or(u64::MAX);
                    self.deadline
                        .set(Some(mono.saturating_add(Duration::from_micros(micros))));
                }
                *self.grant.borrow_mut() = Some(grant);
                Ok(())
            }
            Err(refusal) => {
                let reason = refusal.reason();
                *self.refusal.borrow_mut() = Some(refusal);
                Err(reason)
            }
        }
    }

    fn may_subscribe(&self, path: &str) -> bool {
        self.grant
            .borrow()
            .as_ref()
            .is_some_and(|g| g.access.subscribe.matches(path))
    }
}
