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
use crate::transport::Transport;
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

impl<'s, 'a, 'p, const N: usize, T: Transport> Session<'s, 'a, 'p, N, T> {
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

#[cfg(test)]
mod tests {
    extern crate std;

    use core::cell::Cell;

    use super::super::harness::{Ev, Node, Pair};
    use super::super::{Config, Session, Storage};
    use super::*;
    use crate::model::path::Path;
    use crate::model::{broadcast, origin, track};
    use crate::pool::{Pool, PoolStorage};
    use crate::time::{Duration, Instant};
    use crate::window::Request;
    use crate::wire::qmux::Side;

    type St<'a, 'p> = Storage<'a, 'p, 16, 256, 4, 4, 8, 8, 32>;

    /// Admits a client that dialed `/live`, and lets it see `live/a` only.
    struct OnlyA {
        admitted: Cell<u32>,
    }

    impl Scope for OnlyA {
        fn admit(&self, path: Option<&str>, _role: Role) -> Result<(), &'static str> {
            self.admitted.set(self.admitted.get() + 1);
            match path {
                Some("/live") => Ok(()),
                _ => Err("unauthorized: test"),
            }
        }

        fn may_subscribe(&self, path: &str) -> bool {
            path == "live/a"
        }
    }

    // ---------------------------------------------------------------------------
    // Admission and scope
    // ---------------------------------------------------------------------------

    #[test]
    fn a_refused_setup_closes_with_unauthorized_and_the_reason() {
        let hook = OnlyA {
            admitted: Cell::new(0),
        };
        let (mut cst, mut sst) = (St::new(), St::new());
        let config = Config {
            path: Some("/no"),
            ..Config::new()
        };
        let client = Session::new(Side::Client, config, Instant::ZERO, &mut cst, None).unwrap();
        let mut server =
            Session::new(Side::Server, Config::new(), Instant::ZERO, &mut sst, None).unwrap();
        server.set_scope(Some(&hook));
        let mut pair = Pair::new(Node::new(client), Node::new(server));
        pair.settle(Duration::from_millis(100));
        assert_eq!(hook.admitted.get(), 1);
        assert!(pair.a.saw(
            |e| matches!(e, Ev::Closed { code: 0x2, reason, .. } if reason == "unauthorized: test")
        ));
        assert!(!pair.b.session.is_setup());
    }

    #[test]
    fn the_scope_filters_announcements_and_subscriptions() {
        let mut ps = PoolStorage::<32, 128>::new();
        let pool = Pool::new(&mut ps);
        let origin = origin::State::<4, 8>::new();
        let a = broadcast::State::<4>::new(Path::new("live/a").unwrap()).unwrap();
        let b = broadcast::State::<4>::new(Path::new("live/b").unwrap()).unwrap();
        let c = broadcast::State::<4>::new(Path::new("live/c").unwrap()).unwrap();
        let ta = track::State::<4>::new(&pool, track::Info::new("v").unwrap());
        let tb = track::State::<4>::new(&pool, track::Info::new("v").unwrap());
        a.producer().unwrap().add(ta.handle()).unwrap();
        b.producer().unwrap().add(tb.handle()).unwrap();
        origin.handle().announce(a.handle()).unwrap();
        origin.handle().announce(b.handle()).unwrap();
        let hook = OnlyA {
            admitted: Cell::new(0),
        };
        let local_a = track::State::<4>::new(&pool, track::Info::new("v").unwrap());
        let local_b = track::State::<4>::new(&pool, track::Info::new("v").unwrap());
        let (mut cst, mut sst) = (St::new(), St::new());
        // Rooted at `live` (docs/protocol.md §4.1): the client names `a` for `live/a`.
        let config = Config {
            path: Some("/live"),
            ..Config::new()
        };
        let client = Session::new(Side::Client, config, Instant::ZERO, &mut cst, None).unwrap();
        let mut server = Session::new(
            Side::Server,
            Config::new(),
            Instant::ZERO,
            &mut sst,
            Some(origin.handle()),
        )
        .unwrap();
        server.set_scope(Some(&hook));
        let mut pair = Pair::new(Node::new(client), Node::new(server));
        assert!(pair.run(1000, |p| p.a.session.is_setup() && p.b.session.is_setup()));
        pair.a.session.announce_request("").unwrap();
        let sa = pair
            .a
            .session
            .subscribe("a", local_a.handle(), Request::LIVE)
            .unwrap();
        let sb = pair
            .a
            .session
            .subscribe("b", local_b.handle(), Request::LIVE)
            .unwrap();
        pair.settle(Duration::from_millis(100));
        assert!(
            pair.a
                .saw(|e| matches!(e, Ev::Announced { path, .. } if path == "a"))
        );
        assert!(
            !pair
                .a
                .saw(|e| matches!(e, Ev::Announced { path, .. } if path == "b"))
        );
        assert!(pair.a.saw(|e| *e
            == Ev::SubscriptionClosed {
                subscription: sb,
                code: Some(0x36)
            }));
        assert!(!pair.a.saw(
            |e| matches!(e, Ev::SubscriptionClosed { subscription, .. } if *subscription == sa)
        ));
        // A broadcast announced later is filtered too.
        origin.handle().announce(c.handle()).unwrap();
        pair.settle(Duration::from_millis(100));
        assert!(
            !pair
                .a
                .saw(|e| matches!(e, Ev::Announced { path, .. } if path == "c"))
        );
    }
}
