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
//! Before the relays run, the test checks the emulator itself: numbered
//! datagrams cross it, and exactly those its seeded generator spares arrive,
//! none sooner than the delay.
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

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use impaired::emulator::{Emulator, Fate, Shape, fates};
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

/// Datagrams the emulator's own check sends, and their spacing.
const PROBES: usize = 300;
const PROBE_GAP: Duration = Duration::from_millis(1);

/// Checks the emulator before the relays use it: [`PROBES`] numbered UDP
/// datagrams from the clients' side to the relay's under 10 % loss and 10 %
/// held back. Exactly the datagrams the seeded generator spares arrive, each
/// once and none sooner than the delay, and the link counts every one;
/// prints how many arrived after a later one.
fn check_emulator(ns: &Namespaces, emulator: &Emulator, seed: u64) {
    let shape = Shape {
        delay: Duration::from_millis(20),
        loss_per_mille: 100,
        reorder_per_mille: 100,
        reorder_extra: Duration::from_millis(10),
    };
    emulator.set(shape);
    let to = SocketAddr::new(IpAddr::V4(RELAY_IP), 5000);
    let relay_ns = ns.relay.clone();
    let (ready_tx, ready_rx) = mpsc::channel();
    let receiver = std::thread::spawn(move || {
        Namespaces::enter(&relay_ns).expect("the relay's namespace");
        let socket = UdpSocket::bind(to).expect("bind the probe receiver");
        socket
            .set_read_timeout(Some(Duration::from_millis(300)))
            .expect("read timeout");
        ready_tx.send(()).expect("ready");
        let mut arrivals = Vec::new();
        let mut buf = [0u8; 64];
        while let Ok(n) = socket.recv(&mut buf) {
            let Some(index) = buf[..n].first_chunk::<8>() else {
                continue;
            };
            arrivals.push((u64::from_le_bytes(*index) as usize, Instant::now()));
        }
        arrivals
    });
    ready_rx.recv().expect("the probe receiver started");
    let client_ns = ns.client.clone();
    let sent = std::thread::spawn(move || {
        Namespaces::enter(&client_ns).expect("the clients' namespace");
        let socket = UdpSocket::bind((CLIENT_IP, 0)).expect("bind the probe sender");
        let mut sent = Vec::new();
        for k in 0..PROBES {
            sent.push(Instant::now());
            socket
                .send_to(&(k as u64).to_le_bytes(), to)
                .expect("send a probe");
            std::thread::sleep(PROBE_GAP);
        }
        sent
    })
    .join()
    .expect("the probe sender");
    let arrivals = receiver.join().expect("the probe receiver");

    let expected = fates(seed, 1, &shape, PROBES);
    let spared: Vec<usize> = (0..PROBES)
        .filter(|&k| expected[k] != Fate::Dropped)
        .collect();
    let held = expected
        .iter()
        .filter(|f| matches!(f, Fate::Held(_)))
        .count();
    let mut got: Vec<usize> = arrivals.iter().map(|(k, _)| *k).collect();
    let passed = got.windows(2).filter(|w| w[1] < w[0]).count();
    got.sort_unstable();
    assert_eq!(got, spared, "the datagrams the generator spares, each once");
    for (k, at) in &arrivals {
        assert!(
            at.duration_since(sent[*k]) >= shape.delay,
            "datagram {k} arrived before the link's delay"
        );
    }
    assert_eq!(
        emulator.counters(),
        (PROBES as u64, (PROBES - spared.len()) as u64, held as u64),
        "the link's counts: seen, dropped, held back"
    );
    println!(
        "emulator check: {PROBES} datagrams, {} dropped and {held} held back as the seed says, \
         {passed} arrived after a later one, none sooner than {:?}",
        PROBES - spared.len(),
        shape.delay
    );
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
    check_emulator(&ns, &emulator, seed);
    let link = Emulated { emulator, seed };
    impaired::measure(&ns, IpAddr::V4(RELAY_IP), &link, &settings);
}
