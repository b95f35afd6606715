//! Relay processes for the tests that run one: a `skiff-relay serve` child
//! on loopback ([`RelayProcess`]), and where to find the published
//! `moq-relay` the interop tests run against ([`moq_relay_binary`]).
//!
//! Cargo names a package's own binaries to that package's tests only
//! (`env!("CARGO_BIN_EXE_skiff-relay")`), so the caller passes the
//! `skiff-relay` binary's path.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Where the per-machine cache keeps moq-relay, under the cache directory.
pub const CACHED_MOQ_RELAY: &str = "skiff/moq-relay-0.17.10/bin/moq-relay";

/// A `skiff-relay serve` child process on loopback, killed when dropped.
#[derive(Debug)]
pub struct RelayProcess {
    /// The child process.
    pub child: Child,
    /// The address it listens on for moq-lite (and HTTP).
    pub addr: SocketAddr,
    /// The address of its metrics endpoint.
    pub metrics: SocketAddr,
}

impl RelayProcess {
    /// Starts `binary` (a `skiff-relay`) as `serve` on 127.0.0.1 with one
    /// worker and metrics on, with `extra` flags after those, and waits for
    /// the addresses it prints. `SKIFF_RELAY_LOG=LEVEL` shows its log on the
    /// test's stderr at that level.
    ///
    /// # Panics
    /// If the process cannot start or does not print both addresses within
    /// 20 s (a test's setup failing).
    pub fn start(binary: &Path, extra: &[&str]) -> RelayProcess {
        RelayProcess::start_threads(binary, 1, extra)
    }

    /// [`RelayProcess::start`] with `threads` workers.
    ///
    /// # Panics
    /// As [`RelayProcess::start`].
    pub fn start_threads(binary: &Path, threads: usize, extra: &[&str]) -> RelayProcess {
        RelayProcess::start_on(binary, "127.0.0.1:0", threads, extra)
    }

    /// [`RelayProcess::start_threads`] listening on `listen` (an address
    /// such as `127.0.0.1:PORT`, where a killed relay's peers dial it again).
    ///
    /// # Panics
    /// As [`RelayProcess::start`].
    pub fn start_on(binary: &Path, listen: &str, threads: usize, extra: &[&str]) -> RelayProcess {
        let threads = threads.to_string();
        // Both ports are the relay's to pick (a port found free here could be
        // taken by another test's relay before this one binds it); it prints
        // each address it bound.
        let log = std::env::var("SKIFF_RELAY_LOG").ok();
        let child = Command::new(binary)
            .args(["serve", "--listen", listen, "--threads", &threads])
            .args(["--metrics", "127.0.0.1:0"])
            .args(["--log", log.as_deref().unwrap_or("info")])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(if log.is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
        RelayProcess::from_child(child, log.is_some())
    }

    /// Waits for the addresses `child` (a `skiff-relay serve` with its
    /// stdout piped and metrics on) prints, then keeps draining its stdout;
    /// `echo` copies each stdout line to the test's stderr.
    ///
    /// # Panics
    /// If its stdout is not piped, or it does not print both addresses
    /// within 20 s (it is killed first: the process must not outlive the
    /// test).
    pub fn from_child(mut child: Child, echo: bool) -> RelayProcess {
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // The binary prints "listening on ADDR", then "metrics on ADDR".
            let (mut listen, mut metrics) = (None, None);
            let mut sent = false;
            let after = |l: &str, marker: &str| -> Option<String> {
                let i = l.find(marker)? + marker.len();
                Some(l[i..].chars().take_while(|c| !c.is_whitespace()).collect())
            };
            for l in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if echo {
                    eprintln!("relay: {l}");
                }
                listen = listen.or_else(|| after(&l, "listening on "));
                metrics = metrics.or_else(|| after(&l, "metrics on "));
                if !sent && let (Some(a), Some(m)) = (&listen, &metrics) {
                    let _ = tx.send((a.clone(), m.clone()));
                    sent = true;
                }
            }
        });
        let (addr, metrics) = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(lines) => lines,
            Err(e) => {
                // The test fails here: the process must not outlive it.
                let _ = child.kill();
                let _ = child.wait();
                panic!("relay startup lines: {e:?}");
            }
        };
        let addr = addr.parse().expect("listen address");
        let metrics = metrics.parse().expect("metrics address");
        RelayProcess {
            child,
            addr,
            metrics,
        }
    }

    /// Resident memory of the relay process, bytes (VmRSS).
    ///
    /// # Panics
    /// If `/proc` has no VmRSS for it (the process is gone).
    pub fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the relay's /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .expect("VmRSS")
            * 1024
    }

    /// Its resident memory once its pools' trims have run: the least of three
    /// samples half a second apart, since a trim (once a second) is what hands
    /// a burst's buffers back, and a sample between the burst and the trim
    /// counts memory the relay no longer keeps.
    pub fn settled_rss(&self) -> u64 {
        let mut least = self.rss();
        for _ in 0..2 {
            std::thread::sleep(Duration::from_millis(500));
            least = least.min(self.rss());
        }
        least
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `moq-relay` binary to test against, if one is installed: `$MOQ_RELAY`,
/// else the per-machine cache ([`CACHED_MOQ_RELAY`] under `$XDG_CACHE_HOME`
/// or `~/.cache`), else the first `moq-relay` on `$PATH`.
pub fn moq_relay_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MOQ_RELAY").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")));
    if let Some(cached) = cache
        .map(|dir| dir.join(CACHED_MOQ_RELAY))
        .filter(|p| p.is_file())
    {
        return Some(cached);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("moq-relay"))
            .find(|p| p.is_file())
    })
}
