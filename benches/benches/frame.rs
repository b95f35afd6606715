//! Criterion: one frame written into a track and read back by one consumer.
//!
//! Per iteration the publisher writes one frame of 100 B, 1 KiB or 64 KiB
//! into the open group (FRAME header + payload copied into pool blocks), and
//! a follower of the track reads it back: the FRAME header, then the payload
//! copied out into its own buffer. A group is finished and the next one
//! started once it holds 256 KiB; the track's ring of 8 groups evicts the
//! oldest, so the pool is reused in steady state.
//!
//! Throughput is the payload bytes of the frame.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use skiff_benches::fixture::{Drained, Node};
use skiff_core::window::Start;

const SIZES: [usize; 3] = [100, 1024, 64 * 1024];
const GROUP_BYTES: u64 = 256 * 1024;

fn frame(c: &mut Criterion) {
    let mut group = c.benchmark_group("frame");
    for size in SIZES {
        // 4 MiB: the ring's 8 groups of about 256 KiB, the open one, and slack.
        let node = Node::new(1024, 4096);
        let mut writer = node.producer.append_group().expect("first group");
        let mut follower = node.follower(Start::Group(writer.sequence()));
        let payload = vec![0x5au8; size];
        let mut out = vec![0u8; size];
        let mut timestamp = 0u64;
        let mut total = Drained::default();
        let mut iters = 0u64;

        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(BenchmarkId::from_parameter(size), |b| {
            b.iter(|| {
                if writer.state().bytes_written() >= GROUP_BYTES {
                    writer.finish().expect("finish");
                    writer = node.producer.append_group().expect("next group");
                }
                writer
                    .write_frame(timestamp, black_box(&payload))
                    .expect("room in the pool");
                timestamp += 33;
                let mut at = 0;
                let read = follower.drain(|chunk| {
                    out[at..at + chunk.len()].copy_from_slice(chunk);
                    at += chunk.len();
                });
                total += read;
                iters += 1;
                black_box(&out);
            })
        });
        // Outside the timing: every frame written was read back whole.
        assert_eq!(total.frames, iters);
        assert_eq!(total.bytes, iters * size as u64);
        assert_eq!(node.pool.exhausted_count(), 0);
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
    targets = frame
}
criterion_main!(benches);
