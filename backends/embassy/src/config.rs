//! Where the publisher connects and how it retries: [`Config`].

use embassy_net::IpEndpoint;
use embassy_time::Duration;
use skiff_core::session;
use skiff_core::wire::lite::Role;

/// Settings of a [`Runner`](crate::Runner): the relay, the session it opens there and
/// the reconnect policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config<'a> {
    /// The relay's TCP endpoint (its `tcp://` address; moq-relay listens on one port
    /// for QMux over TCP).
    pub relay: IpEndpoint,
    /// The moq-lite session: Hop ID, SETUP path, role and QMux parameters. [`Config::new`]
    /// sets the role to [`Role::Publisher`], so the relay never asks us for broadcasts
    /// (docs/protocol.md §4.1).
    pub session: session::Config<'a>,
    /// How long one TCP connect may take before it counts as a failed attempt.
    pub connect_timeout: Duration,
    /// The wait before the first reconnect after a failure, and after any session
    /// that got as far as the relay's SETUP.
    pub backoff_min: Duration,
    /// The longest wait between attempts: each failure before SETUP doubles the wait
    /// up to this.
    pub backoff_max: Duration,
    /// How long a closing session may spend sending its close and TCP FIN before
    /// the socket is dropped.
    pub close_timeout: Duration,
}

impl<'a> Config<'a> {
    /// A publisher of Hop ID `hop` dialing `relay` with SETUP path `path` (the URL's
    /// path and query, e.g. `/anon` or `/room?jwt=...`; `""` sends none), with the
    /// default session settings, a 10 s connect timeout and backoff from 1 s to 30 s.
    ///
    /// Give a publisher a stable non-zero Hop ID (docs/protocol.md §4.3).
    pub const fn new(relay: IpEndpoint, path: &'a str, hop: u64) -> Self {
        let mut session = session::Config::new();
        session.hop = hop;
        session.path = Some(path);
        session.role = Role::Publisher;
        Config {
            relay,
            session,
            connect_timeout: Duration::from_secs(10),
            backoff_min: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
            close_timeout: Duration::from_secs(1),
        }
    }

    /// The same configuration with reconnect waits from `min` to `max`.
    #[must_use]
    pub const fn with_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff_min = min;
        self.backoff_max = max;
        self
    }
}

/// The next wait after a failed attempt: double, capped at `max` (and never below `min`).
pub(crate) fn next_backoff(current: Duration, min: Duration, max: Duration) -> Duration {
    let doubled = Duration::from_ticks(current.as_ticks().saturating_mul(2));
    doubled.max(min).min(max.max(min))
}

#[cfg(test)]
mod tests {
    use super::*;
    use embassy_net::Ipv4Address;

    // ---- backoff ----

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let min = Duration::from_millis(100);
        let max = Duration::from_millis(700);
        let mut d = min;
        let mut seen = [Duration::from_ticks(0); 5];
        for s in seen.iter_mut() {
            *s = d;
            d = next_backoff(d, min, max);
        }
        let ms: [u64; 5] = seen.map(|d| d.as_millis());
        assert_eq!(ms, [100, 200, 400, 700, 700]);
    }

    #[test]
    fn backoff_survives_degenerate_settings() {
        let zero = Duration::from_ticks(0);
        assert_eq!(next_backoff(zero, zero, zero), zero);
        let big = Duration::from_ticks(u64::MAX);
        assert_eq!(next_backoff(big, zero, big), big);
        // max below min: min wins.
        let min = Duration::from_secs(2);
        assert_eq!(next_backoff(min, min, Duration::from_secs(1)), min);
    }

    // ---- defaults ----

    #[test]
    fn new_publishes_with_hop_and_path() {
        let relay = IpEndpoint::new(Ipv4Address::new(10, 0, 2, 2).into(), 4443);
        let c = Config::new(relay, "/anon", 7);
        assert_eq!(c.session.hop, 7);
        assert_eq!(c.session.path, Some("/anon"));
        assert_eq!(c.session.role, Role::Publisher);
        assert_eq!(c.relay.port, 4443);
    }
}
