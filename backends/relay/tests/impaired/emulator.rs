//! A small link emulator, for a kernel without netem: one TUN device in each
//! of two namespaces, and a forwarder thread per direction that reads every
//! IP packet from one device and writes it to the other after a delay,
//! dropping a share of them and holding another share back a few
//! milliseconds more (so later packets pass it).
//!
//! - Each device is made by a thread that joined its namespace, so it lives
//!   there; `ip -n` gives it its address and brings it up. Closing the
//!   device's descriptor (on drop) removes it.
//! - A TUN device without a virtio-net header takes no offloads, so the
//!   kernel segments TCP and UDP GSO batches before they reach it: every
//!   packet the forwarder sees is one on the wire.
//! - Drops and reorderings come from a seeded generator (one per direction,
//!   reseeded when a shape is set), so the same shape drops the same packets
//!   by arrival order on every run ([`fates`] replays it); the delays are
//!   real time, as on a link. IPv6 is off on both devices, so only the
//!   tests' IPv4 packets cross.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tun_rs::{DeviceBuilder, SyncDevice};

use super::{Namespaces, run};

/// Largest packet the devices carry (their MTU).
const MTU: usize = 1500;
/// Longest a forwarder waits before it looks at its stop flag again.
const IDLE: Duration = Duration::from_millis(10);

/// What the link does to each packet, in each direction.
#[derive(Clone, Copy, Debug, Default)]
pub struct Shape {
    /// One-way delay (half the round trip it adds).
    pub delay: Duration,
    /// Packets dropped, per thousand.
    pub loss_per_mille: u32,
    /// Packets held back, per thousand.
    pub reorder_per_mille: u32,
    /// The longest extra hold of a held-back packet (each takes 1 ms to this,
    /// at random).
    pub reorder_extra: Duration,
}

/// Packets a direction saw, dropped and held back under the current shape.
#[derive(Default)]
struct Counts {
    seen: AtomicU64,
    dropped: AtomicU64,
    reordered: AtomicU64,
}

/// The shape the forwarders apply, and how many times it was set (a
/// forwarder reseeds its generator when this changes).
struct Control {
    shape: Shape,
    generation: u64,
}

/// A small, seeded random generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Whether an event of `per_mille` chance happens.
    fn chance(&mut self, per_mille: u32) -> bool {
        self.next() % 1000 < u64::from(per_mille)
    }

    /// What `shape` does to the next packet.
    fn fate(&mut self, shape: &Shape) -> Fate {
        if self.chance(shape.loss_per_mille) {
            return Fate::Dropped;
        }
        if self.chance(shape.reorder_per_mille) {
            let extra_ms = shape.reorder_extra.as_millis().max(1) as u64;
            return Fate::Held(Duration::from_millis(1 + self.next() % extra_ms));
        }
        Fate::Delayed
    }
}

/// What the link does to one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Dropped.
    Dropped,
    /// Delivered after the shape's delay.
    Delayed,
    /// Delivered after the shape's delay and this much more.
    Held(Duration),
}

/// The generator's seed for direction `k` (0: from the relay's side, 1:
/// from the clients').
fn direction_seed(seed: u64, k: usize) -> u64 {
    seed ^ (k as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// The fates of the first `n` packets direction `k` carries after `shape`
/// was set on an emulator seeded with `seed`: what the link will do, for a
/// test to compare with what it did.
pub fn fates(seed: u64, k: usize, shape: &Shape, n: usize) -> Vec<Fate> {
    let mut rng = Rng(direction_seed(seed, k));
    (0..n).map(|_| rng.fate(shape)).collect()
}

/// The emulated link: two devices, two forwarders; stops and removes the
/// devices on drop.
pub struct Emulator {
    control: Arc<Mutex<Control>>,
    counts: [Arc<Counts>; 2],
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// The devices' names, relay's side first.
    pub names: [String; 2],
}

/// Makes a TUN device named `name` inside namespace `ns` and gives it
/// `addr/24`.
fn device_in(ns: &str, name: &str, addr: Ipv4Addr) -> Result<SyncDevice, String> {
    let (ns_owned, name_owned) = (ns.to_owned(), name.to_owned());
    let device = std::thread::spawn(move || -> Result<SyncDevice, String> {
        Namespaces::enter(&ns_owned)?;
        let device = DeviceBuilder::new()
            .name(name_owned.as_str())
            .mtu(MTU as u16)
            .build_sync()
            .map_err(|e| format!("TUN device {name_owned}: {e}"))?;
        // No IPv6 on the link: the kernel's own IPv6 packets (router and
        // multicast listener solicitations) would take draws from the
        // generator. /proc/sys/net is this thread's namespace's; a kernel
        // without IPv6 has no such file, and nothing to turn off.
        let _ = std::fs::write(
            format!("/proc/sys/net/ipv6/conf/{name_owned}/disable_ipv6"),
            "1",
        );
        Ok(device)
    })
    .join()
    .map_err(|_| "the device thread panicked".to_owned())??;
    run(
        "ip",
        &["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", name],
    )?;
    run("ip", &["-n", ns, "link", "set", name, "up"])?;
    device
        .set_nonblocking(true)
        .map_err(|e| format!("TUN device {name}: {e}"))?;
    Ok(device)
}

impl Emulator {
    /// Puts a TUN device in each namespace (`relay_addr` in the relay's,
    /// `client_addr` in the clients', on one /24) and starts forwarding
    /// between them with no impairment; `seed` seeds the generators.
    pub fn start(
        ns: &Namespaces,
        relay_addr: Ipv4Addr,
        client_addr: Ipv4Addr,
        seed: u64,
    ) -> Result<Emulator, String> {
        let pid = std::process::id();
        let names = [format!("sdr{pid}"), format!("sdc{pid}")];
        let relay = Arc::new(device_in(&ns.relay, &names[0], relay_addr)?);
        let client = Arc::new(device_in(&ns.client, &names[1], client_addr)?);
        let control = Arc::new(Mutex::new(Control {
            shape: Shape::default(),
            generation: 0,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let counts = [Arc::<Counts>::default(), Arc::<Counts>::default()];
        let mut threads = Vec::new();
        for (k, (from, to)) in [(relay.clone(), client.clone()), (client, relay)]
            .into_iter()
            .enumerate()
        {
            let forwarder = Forwarder {
                from,
                to,
                control: control.clone(),
                counts: counts[k].clone(),
                stop: stop.clone(),
                seed: direction_seed(seed, k),
            };
            threads.push(
                std::thread::Builder::new()
                    .name(format!("link-emulator-{k}"))
                    .spawn(move || forwarder.run())
                    .map_err(|e| format!("forwarder thread: {e}"))?,
            );
        }
        Ok(Emulator {
            control,
            counts,
            stop,
            threads,
            names,
        })
    }

    /// Applies `shape` to both directions from the next packet on, reseeds
    /// the generators and starts the counters anew.
    pub fn set(&self, shape: Shape) {
        let mut control = self.control.lock().unwrap_or_else(|p| p.into_inner());
        control.shape = shape;
        control.generation += 1;
        for c in &self.counts {
            c.seen.store(0, Ordering::Relaxed);
            c.dropped.store(0, Ordering::Relaxed);
            c.reordered.store(0, Ordering::Relaxed);
        }
    }

    /// Packets seen, dropped and held back in both directions since the
    /// shape was set.
    pub fn counters(&self) -> (u64, u64, u64) {
        self.counts.iter().fold((0, 0, 0), |(s, d, r), c| {
            (
                s + c.seen.load(Ordering::Relaxed),
                d + c.dropped.load(Ordering::Relaxed),
                r + c.reordered.load(Ordering::Relaxed),
            )
        })
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// One direction of the link.
struct Forwarder {
    from: Arc<SyncDevice>,
    to: Arc<SyncDevice>,
    control: Arc<Mutex<Control>>,
    counts: Arc<Counts>,
    stop: Arc<AtomicBool>,
    seed: u64,
}

impl Forwarder {
    /// Reads what arrives, queues each packet for its release time, and
    /// writes out every packet whose time came, until told to stop.
    fn run(self) {
        let mut rng = Rng(self.seed);
        let mut generation = u64::MAX;
        let mut shape = Shape::default();
        // Packets in flight by release time, then arrival order (so packets
        // of one release time leave in the order they came).
        let mut queue: BinaryHeap<Reverse<(Instant, u64, Vec<u8>)>> = BinaryHeap::new();
        let mut spare: Vec<Vec<u8>> = Vec::new();
        let mut arrivals = 0u64;
        while !self.stop.load(Ordering::Relaxed) {
            let wait = queue.peek().map_or(IDLE, |Reverse((at, _, _))| {
                at.saturating_duration_since(Instant::now()).min(IDLE)
            });
            if wait_readable(&self.from, wait) {
                {
                    let control = self.control.lock().unwrap_or_else(|p| p.into_inner());
                    if control.generation != generation {
                        generation = control.generation;
                        shape = control.shape;
                        rng = Rng(self.seed);
                    }
                }
                loop {
                    let mut buf = spare.pop().unwrap_or_else(|| vec![0; MTU]);
                    buf.resize(MTU, 0);
                    let n = match self.from.recv(&mut buf) {
                        Ok(n) => n,
                        Err(_) => {
                            spare.push(buf);
                            break;
                        }
                    };
                    buf.truncate(n);
                    let mut at = Instant::now() + shape.delay;
                    // Only TCP and UDP (IPv4 protocol 6 and 17) take the
                    // link's fates: what the kernel sends on its own at
                    // random times (IGMP reports) crosses with the delay
                    // alone and draws nothing, so the seeded sequence stays
                    // the test's packets'.
                    if !matches!(buf.get(9), Some(6 | 17)) {
                        arrivals += 1;
                        queue.push(Reverse((at, arrivals, buf)));
                        continue;
                    }
                    self.counts.seen.fetch_add(1, Ordering::Relaxed);
                    match rng.fate(&shape) {
                        Fate::Dropped => {
                            self.counts.dropped.fetch_add(1, Ordering::Relaxed);
                            spare.push(buf);
                            continue;
                        }
                        Fate::Held(extra) => {
                            self.counts.reordered.fetch_add(1, Ordering::Relaxed);
                            at += extra;
                        }
                        Fate::Delayed => {}
                    }
                    arrivals += 1;
                    queue.push(Reverse((at, arrivals, buf)));
                }
            }
            let now = Instant::now();
            while queue.peek().is_some_and(|Reverse((at, _, _))| *at <= now) {
                let Some(Reverse((_, _, buf))) = queue.pop() else {
                    break;
                };
                // A full device queue on the far side drops the packet, as
                // a full link would.
                let _ = self.to.send(&buf);
                spare.push(buf);
            }
        }
    }
}

/// Waits up to `wait` for `device` to have a packet to read.
fn wait_readable(device: &SyncDevice, wait: Duration) -> bool {
    let mut fd = libc::pollfd {
        fd: device.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: wait.as_secs() as libc::time_t,
        tv_nsec: wait.subsec_nanos() as libc::c_long,
    };
    // SAFETY: one valid pollfd, a valid timespec, no signal mask.
    let rc = unsafe { libc::ppoll(&mut fd, 1, &ts, std::ptr::null()) };
    rc > 0 && fd.revents & libc::POLLIN != 0
}
