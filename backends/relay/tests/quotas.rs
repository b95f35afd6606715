//! Each per-peer quota of the relay ([`skiff_relay::config::Quotas`]): the
//! request past it is refused with its code and counted, nothing is kept for
//! it, and what runs already (and other peers) goes on.

mod common;
mod peers;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use peers::*;
use skiff_core::model::path::Path;
use skiff_core::model::{broadcast, origin, track};
use skiff_core::session::Config;
use skiff_monoio::driver::DriverKind;
use skiff_relay::config::{Quotas, RelayConfig};
use skiff_relay::relay::RelayHandler;
use skiff_relay::server::{self, ServerHandle};

/// EVICTED: what a relay over a quota answers a track request with.
const EVICTED: u64 = 0x35;

fn start(quotas: Quotas) -> ServerHandle {
    let cfg = RelayConfig {
        quotas,
        ..config(1, DriverKind::Legacy)
    };
    server::start(cfg, RelayHandler::factory(1).unwrap()).expect("start relay")
}

/// A publisher announcing `paths`, pumped until the relay routes `want`
/// broadcasts in all.
fn publisher(h: &ServerHandle, paths: &[&str], want: u64) -> Raw {
    let o: &'static origin::State<'static, 'static, 8, 64> =
        Box::leak(Box::new(origin::State::new()));
    for p in paths {
        let b: &'static broadcast::State<'static, 'static, 1> = Box::leak(Box::new(
            broadcast::State::new(Path::new(p).unwrap()).unwrap(),
        ));
        o.handle().announce(b.handle()).unwrap();
    }
    let mut raw = Raw::connect_with(h.local_addr(), Config::new(), None, Some(o.handle()));
    raw.handshake();
    let ok = raw.pump_until(IO_TIMEOUT, |_| h.metrics().total().broadcasts == want);
    assert!(
        ok,
        "{} broadcasts routed, wanted {want}",
        h.metrics().total().broadcasts
    );
    raw
}

/// A subscriber asking for track `name` of `path` (the source never answers:
/// the request stays pending unless refused).
fn ask(raw: &mut Raw, path: &str, name: &str) {
    let local = scratch_track();
    local.reopen(track::Info::new(name).unwrap());
    raw.session
        .subscribe(path, local.current(), live_request())
        .expect("subscribe");
    raw.send_output();
}

fn subscriber(addr: SocketAddr) -> Raw {
    let mut raw = Raw::connect(addr, Config::new(), None);
    raw.handshake();
    raw
}

/// Asks for tracks x, y and z of `live`: the third must be refused with
/// EVICTED, the first two must not.
fn third_is_evicted(s: &mut Raw, what: &str) {
    for n in ["x", "y", "z"] {
        ask(s, "live", n);
    }
    let ok = s.pump_until(IO_TIMEOUT, |r| !r.refused.is_empty());
    assert!(ok, "the third {what} was not refused");
    assert_eq!(s.refused, [Some(EVICTED)]);
}

fn refused(h: &ServerHandle) -> u64 {
    h.metrics().total().quota_refused
}

#[test]
fn announces_past_the_quota_are_ignored() {
    within(30, || {
        let h = start(Quotas {
            announces: 2,
            ..Quotas::default()
        });
        let _a = publisher(&h, &["a/1", "a/2", "a/3"], 2);
        assert_eq!(refused(&h), 1, "the third announce was counted");
        // Another connection has its own quota.
        let _b = publisher(&h, &["b/1", "b/2"], 4);
        assert_eq!(refused(&h), 1);
        h.shutdown().unwrap();
    });
}

#[test]
fn pending_track_requests_past_the_connection_quota_are_refused() {
    within(30, || {
        let h = start(Quotas {
            pending_tracks: 2,
            ..Quotas::default()
        });
        let _src = publisher(&h, &["live"], 1);
        let mut s = subscriber(h.local_addr());
        third_is_evicted(&mut s, "request");
        assert_eq!(refused(&h), 1);
        // Nothing kept for the refused request: two relay tracks, not three.
        eventually("gauges published", || h.metrics().total().relay_tracks == 2);
        // Another connection asks for its own.
        let mut t = subscriber(h.local_addr());
        ask(&mut t, "live", "w");
        t.pump_until(Duration::from_millis(300), |_| false);
        assert!(t.refused.is_empty());
        eventually("a third track", || h.metrics().total().relay_tracks == 3);
        h.shutdown().unwrap();
    });
}

#[test]
fn pending_track_requests_past_the_broadcast_quota_are_refused() {
    within(30, || {
        let h = start(Quotas {
            pending_tracks_per_broadcast: 2,
            ..Quotas::default()
        });
        let _src = publisher(&h, &["live", "other"], 2);
        let mut s = subscriber(h.local_addr());
        let mut t = subscriber(h.local_addr());
        ask(&mut s, "live", "x");
        ask(&mut t, "live", "y");
        s.pump_until(Duration::from_millis(300), |_| false);
        ask(&mut s, "live", "z");
        let ok = s.pump_until(IO_TIMEOUT, |r| !r.refused.is_empty());
        assert!(ok, "the third request in the broadcast was not refused");
        assert_eq!(s.refused, [Some(EVICTED)]);
        // Another broadcast is not affected.
        ask(&mut t, "other", "z");
        t.pump_until(Duration::from_millis(300), |_| false);
        assert!(t.refused.is_empty());
        assert_eq!(refused(&h), 1);
        h.shutdown().unwrap();
    });
}

#[test]
fn a_full_track_table_refuses_new_tracks() {
    within(30, || {
        let h = start(Quotas {
            relay_tracks: 2,
            ..Quotas::default()
        });
        let _src = publisher(&h, &["live"], 1);
        let mut s = subscriber(h.local_addr());
        third_is_evicted(&mut s, "track");
        assert_eq!(refused(&h), 1);
        h.shutdown().unwrap();
    });
}

#[test]
fn track_requests_waiting_past_the_quota_are_refused() {
    within(30, || {
        let h = start(Quotas {
            waiting_track_requests: 2,
            ..Quotas::default()
        });
        let _src = publisher(&h, &["live"], 1);
        let mut s = subscriber(h.local_addr());
        third_is_evicted(&mut s, "TRACK request");
        eventually("counted", || refused(&h) == 1);
        // Nothing was made for the refused one.
        eventually("two relay tracks", || h.metrics().total().relay_tracks == 2);
        h.shutdown().unwrap();
    });
}
