//! Connection IDs that name the worker owning a connection
//! (docs/protocol.md §11.8).
//!
//! A relay runs one QUIC endpoint per worker thread, all on one UDP port
//! (SO_REUSEPORT). Each endpoint issues connection IDs whose first byte,
//! taken modulo the number of workers, is that worker's index; a socket
//! filter in the kernel reads the same byte of each datagram's destination
//! connection ID and hands the datagram to that worker's socket. A
//! connection's datagrams so reach the worker that owns it whatever address
//! they come from.
//!
//! An ID is [`CID_LEN`] bytes: the steering byte (`k·N + worker`, `k`
//! random), four random bytes, and three bytes of a keyed hash of the five
//! before, private to the endpoint, which lets it drop a datagram naming an
//! ID it never issued without looking further.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use quinn_proto::{ConnectionId, ConnectionIdGenerator, InvalidCid};
use rustls::crypto::SecureRandom;

/// Length of the connection IDs a steered endpoint issues.
pub const CID_LEN: usize = 8;

/// Most workers one steering byte can name.
pub const MAX_WORKERS: usize = 256;

/// Random bytes after the steering byte.
const NONCE: usize = 4;

/// Where the destination connection ID starts in a long-header packet:
/// flags (1), version (4), DCID length (1) (RFC 8999 §5.1).
pub const LONG_HEADER_DCID: usize = 6;

/// Where it starts in a short-header packet: after the flags byte.
pub const SHORT_HEADER_DCID: usize = 1;

/// The steering byte of a datagram: the first byte of its destination
/// connection ID, wherever its header form puts it; `None` for a datagram
/// too short to have one. The kernel's socket filter reads the same byte.
pub fn steering_byte(datagram: &[u8]) -> Option<u8> {
    let first = *datagram.first()?;
    let at = if first & 0x80 != 0 {
        LONG_HEADER_DCID
    } else {
        SHORT_HEADER_DCID
    };
    datagram.get(at).copied()
}

/// The worker of `workers` (1 to [`MAX_WORKERS`]) that a steering byte
/// names.
pub fn worker_of(byte: u8, workers: usize) -> usize {
    usize::from(byte) % workers.max(1)
}

/// A steering byte naming `worker` of `workers` (1 to [`MAX_WORKERS`]),
/// made from the random byte `r`: the multiple of `workers` at or below `r`
/// (one lower if that would pass 255), plus `worker`.
fn steering(r: u8, worker: usize, workers: usize) -> u8 {
    let n = workers.clamp(1, MAX_WORKERS);
    let w = worker % n;
    let r = usize::from(r);
    let mut b = r - r % n + w;
    if b > usize::from(u8::MAX) {
        b -= n;
    }
    u8::try_from(b).unwrap_or(u8::MAX)
}

/// A quinn-proto connection ID generator for one worker's endpoint: every
/// ID it issues names the worker (see the module's description).
#[derive(Debug)]
pub struct WorkerCids {
    worker: usize,
    workers: usize,
    /// The key of the IDs' hash, this endpoint's own.
    key: RandomState,
    random: &'static dyn SecureRandom,
    /// Counts IDs issued; hashed for the random bytes if the system's
    /// random source fails.
    issued: u64,
}

impl WorkerCids {
    /// The generator of worker `worker` of `workers`; `workers` is held to
    /// 1 to [`MAX_WORKERS`] and `worker` taken modulo it.
    pub fn new(worker: usize, workers: usize) -> Self {
        let workers = workers.clamp(1, MAX_WORKERS);
        WorkerCids {
            worker: worker % workers,
            workers,
            key: RandomState::new(),
            random: rustls::crypto::aws_lc_rs::default_provider().secure_random,
            issued: 0,
        }
    }

    /// The hash that signs an ID's first five bytes.
    fn signature(&self, head: &[u8]) -> [u8; CID_LEN - 1 - NONCE] {
        let h = self.key.hash_one(head).to_le_bytes();
        [h[0], h[1], h[2]]
    }
}

impl ConnectionIdGenerator for WorkerCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut id = [0u8; CID_LEN];
        self.issued = self.issued.wrapping_add(1);
        if self.random.fill(&mut id[..=NONCE]).is_err() {
            // No system randomness: the endpoint's secret hash of a count
            // stands in (unpredictable without the key).
            let r = self.key.hash_one(self.issued).to_le_bytes();
            id[..=NONCE].copy_from_slice(&r[..=NONCE]);
        }
        id[0] = steering(id[0], self.worker, self.workers);
        let sig = self.signature(&id[..=NONCE]);
        id[NONCE + 1..].copy_from_slice(&sig);
        ConnectionId::new(&id)
    }

    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        let (Some(head), Some(sig)) = (cid.get(..=NONCE), cid.get(NONCE + 1..)) else {
            return Err(InvalidCid);
        };
        let ours = head
            .first()
            .is_some_and(|&b| worker_of(b, self.workers) == self.worker)
            && sig == self.signature(head);
        if ours { Ok(()) } else { Err(InvalidCid) }
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_id_names_its_worker_and_validates_only_there() {
        for workers in [1, 2, 3, 4, 7, 64, 255, 256] {
            let mut gens: Vec<WorkerCids> =
                (0..workers).map(|w| WorkerCids::new(w, workers)).collect();
            for w in 0..workers {
                for _ in 0..50 {
                    let cid = gens[w].generate_cid();
                    assert_eq!(cid.len(), CID_LEN);
                    assert_eq!(worker_of(cid[0], workers), w, "{workers} workers");
                    assert!(gens[w].validate(&cid).is_ok());
                    let other = (w + 1) % workers;
                    if other != w {
                        assert!(gens[other].validate(&cid).is_err());
                    }
                }
            }
        }
    }

    #[test]
    fn the_steering_byte_stays_a_byte_and_keeps_the_random_part() {
        for workers in 1..=MAX_WORKERS {
            for worker in 0..workers {
                for r in [0u8, 1, 127, 200, 254, 255] {
                    let b = steering(r, worker, workers);
                    assert_eq!(usize::from(b) % workers, worker);
                    // Within one block of `workers` below or at `r`.
                    assert!(usize::from(b).abs_diff(usize::from(r)) < 2 * workers);
                }
            }
        }
    }

    #[test]
    fn steering_byte_reads_the_dcid_of_either_header_form() {
        // Long header: flags, version, DCID length 8, DCID.
        let long = [0xc3, 0, 0, 0, 1, 8, 0x2a, 9, 9, 9, 9, 9, 9, 9];
        assert_eq!(steering_byte(&long), Some(0x2a));
        // Short header: flags, then the DCID.
        let short = [0x43, 0x17, 1, 2, 3];
        assert_eq!(steering_byte(&short), Some(0x17));
        assert_eq!(steering_byte(&[0xc0, 0, 0]), None);
        assert_eq!(steering_byte(&[0x40]), None);
        assert_eq!(steering_byte(&[]), None);
    }

    #[test]
    fn ids_differ() {
        let mut g = WorkerCids::new(1, 4);
        let ids: std::collections::HashSet<Vec<u8>> =
            (0..1000).map(|_| g.generate_cid().to_vec()).collect();
        assert_eq!(ids.len(), 1000);
    }
}
