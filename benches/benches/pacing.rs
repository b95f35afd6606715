//! Criterion: a paced writer and a slow reader on one group.
//!
//! The writer writes 1 KiB frames into a group under a pacing window of
//! 64 KiB: the reader reports that window after each read (as a session's
//! stream reports its credit, `group::Consumer::pace`), and before each write
//! the writer asks the group how far it may run ahead
//! (`group::Producer::allowance`) and writes only if the whole frame fits.
//! The reader takes one chunk (at most
//! a 4 KiB pool block) per `k` writes; when the writer is held back, the
//! reader's next chunk is what lets it go on (it stands for the time the
//! writer waits). Per iteration: one group of 1,024 frames (1 MiB) written
//! and read to the end, then the slot is cleared.
//!
//! Throughput is 1,024 elements: Criterion's element rate is writes per
//! second, reader included. Outside the timing loop the bench asserts the
//! writer was never more than the window ahead of the reader, and prints how
//! often pacing held it back.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use skiff_benches::fixture::Node;
use skiff_core::model::frame::MAX_HEADER_LEN;
use skiff_core::model::group::{self, Next};

const WINDOW: u64 = 64 * 1024;
const FRAME_LEN: usize = 1024;
const FRAMES: usize = 1024;
const EVERY: [usize; 4] = [1, 4, 16, 64];

/// What the runs saw, kept outside the timing.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    groups: u64,
    /// The most the writer was ever ahead of the reader, in bytes.
    max_ahead: u64,
    /// Write attempts refused by pacing.
    held: u64,
}

/// Reads one chunk if there is one and reports the window; returns the bytes read.
#[inline]
fn read_chunk(reader: &mut group::Consumer<'_, '_>) -> usize {
    match reader.chunk() {
        Ok(Next::Ready(chunk)) => {
            let n = chunk.len();
            black_box(chunk);
            reader.advance(n);
            reader.pace(WINDOW);
            n
        }
        _ => 0,
    }
}

/// One group: `FRAMES` paced writes, a chunk read per `k` writes (or per refusal).
fn run_group(slot: &group::State<'_>, seq: u64, k: usize, payload: &[u8], seen: &mut Seen) {
    slot.reset(seq);
    let mut writer = slot.producer().expect("a fresh group has no producer");
    let mut reader = slot.consumer();
    reader.pace(WINDOW);
    let need = (FRAME_LEN + MAX_HEADER_LEN) as u64;
    let (mut writes, mut since_read) = (0, 0);
    while writes < FRAMES {
        if writer.allowance() >= need {
            writer
                .write_frame(writes as u64 * 33, payload)
                .expect("room in the pool");
            writes += 1;
            since_read += 1;
            seen.max_ahead = seen
                .max_ahead
                .max(slot.bytes_written() - slot.furthest_read());
            if since_read == k {
                read_chunk(&mut reader);
                since_read = 0;
            }
        } else {
            seen.held += 1;
            read_chunk(&mut reader);
        }
    }
    writer.finish().expect("finish");
    while read_chunk(&mut reader) > 0 {}
    assert_eq!(
        reader.position(),
        slot.bytes_written(),
        "the reader read the whole group"
    );
    drop(reader);
    drop(writer);
    slot.clear();
    seen.groups += 1;
}

fn pacing(c: &mut Criterion) {
    // About 1 MiB of group plus headers, in 4 KiB blocks.
    let node = Node::new(300, 4096);
    let slot = node.group_slot(u64::MAX);
    let payload = vec![0x5au8; FRAME_LEN];
    let mut seq = 0;

    let mut group = c.benchmark_group("pacing");
    group.throughput(Throughput::Elements(FRAMES as u64));
    for k in EVERY {
        let mut seen = Seen::default();
        group.bench_function(BenchmarkId::new("read_every", k), |b| {
            b.iter(|| {
                run_group(slot, seq, k, &payload, &mut seen);
                seq += 1;
            })
        });
        // Outside the timing loop: pacing held, and bit when the reader was slow.
        assert!(
            seen.max_ahead <= WINDOW,
            "writer {} bytes ahead of a {WINDOW}-byte window",
            seen.max_ahead
        );
        if k >= 16 {
            assert!(
                seen.held > 0,
                "a reader this slow must hold the writer back"
            );
        }
        println!(
            "pacing read_every={k}: writer at most {} of {WINDOW} bytes ahead; held back {:.1} times per group",
            seen.max_ahead,
            seen.held as f64 / seen.groups.max(1) as f64
        );
        assert_eq!(node.pool.in_use(), 0, "every block is back in the pool");
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = pacing
}
criterion_main!(benches);
