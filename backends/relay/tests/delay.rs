//! Delay, loss and reordering on an emulated link (issue 34, "Loss and
//! delay"): one publisher and ten viewers of skiff's SDK reach a relay
//! through the link emulator of `impaired/emulator.rs` (a TUN device in each
//! of two namespaces this test makes, and a forwarder between them), at
//! 40 ms round trip with 1 % of the packets dropped, then 3 % dropped and
//! 3 % held back 1–10 ms (so later packets pass them), in both directions.
//!
//! The rows, checks and report are the ones the impaired-link tests share
//! (`impaired/mod.rs` says what is asserted): skiff-relay and moq-relay,
//! each over TCP and QUIC; p50/p99 frame latency, frames within 500 ms and
//! groups skipped are printed, as medians and spread over the runs.
//!
//! Bounded to under two minutes: `DELAY_RUNS` (default 2) sets the runs per
//! row, and runs that do not start within 40 s per condition
//! (`DELAY_BUDGET_SECS`) are left out, as the report says. `DELAY_SEED`
//! seeds the emulator's drops and reorderings; `DELAY_VERBOSE`,
//! `DELAY_TRACE` and `DELAY_ROWS=TEXT` are described in `impaired/mod.rs`.
//! Without root, `ip` or `/dev/net/tun` the test prints why it skips.

mod common;
mod impaired;
mod peers;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use impaired::emulator::{Emulator, Shape};
use impaired::{Namespaces, Settings};

/// Bound on the runs at one condition (`DELAY_BUDGET_SECS` sets another);
/// runs not started by then are not run, and the report says so.
const BUDGET_PER_CONDITION: Duration = Duration::from_secs(40);

/// The relay's and the clients' addresses on the emulated link.
const RELAY_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);

/// The conditions measured: their labels and shapes (20 ms each way is a
/// 40 ms round trip).
fn conditions() -> [(&'static str, Shape); 2] {
    let delay = Duration::from_millis(20);
    [
        (
            "40 ms RTT, 1 % loss",
            Shape {
                delay,
                loss_per_mille: 10,
                ..Shape::default()
            },
        ),
        (
            "40 ms RTT, 3 % loss, 3 % reordered",
            Shape {
                delay,
                loss_per_mille: 30,
                reorder_per_mille: 30,
                reorder_extra: Duration::from_millis(10),
            },
        ),
    ]
}

/// The emulated link, as the shared runs see it.
struct Emulated {
    emulator: Emulator,
    seed: u64,
}

impl impaired::Link for Emulated {
    fn describe(&self) -> String {
        format!(
            "TUN emulator {RELAY_IP} ({}) <-> {CLIENT_IP} ({}), seed {}",
            self.emulator.names[0], self.emulator.names[1], self.seed
        )
    }

    fn conditions(&self) -> Vec<String> {
        conditions().iter().map(|(l, _)| (*l).to_owned()).collect()
    }

    fn set_condition(&self, k: usize) -> Result<(), String> {
        let (_, shape) = conditions()
            .get(k)
            .copied()
            .ok_or_else(|| format!("no condition {k}"))?;
        self.emulator.set(shape);
        Ok(())
    }

    fn counters(&self) -> (u64, u64) {
        let (seen, dropped, _) = self.emulator.counters();
        (seen, dropped)
    }
}

#[test]
fn frames_survive_delay_loss_and_reordering_through_each_relay() {
    const TEST: &str = "delay";
    if let Some(reason) = impaired::missing(&["ip"]) {
        return impaired::skip(TEST, &reason);
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return impaired::skip(TEST, "no /dev/net/tun (the kernel's TUN driver)");
    }
    let settings = Settings::from_env(TEST, "DELAY", 2, BUDGET_PER_CONDITION);
    let seed = std::env::var("DELAY_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(34);
    let ns = match Namespaces::create(TEST) {
        Ok(ns) => ns,
        Err(e) => return impaired::skip(TEST, &format!("could not make the namespaces: {e}")),
    };
    let emulator = match Emulator::start(&ns, RELAY_IP, CLIENT_IP, seed) {
        Ok(e) => e,
        Err(e) => return impaired::skip(TEST, &format!("could not make the TUN link: {e}")),
    };
    let link = Emulated { emulator, seed };
    impaired::measure(&ns, IpAddr::V4(RELAY_IP), &link, &settings);
}
