//! Criterion: fan-out of one stored group. A finished group of 30 frames of
//! 1 KiB is held by the track; per iteration each of 1, 8, 64 or 512
//! subscribers gets a reader at the group's first byte and reads it to the
//! end: every FRAME header, and every payload as zero-copy chunks of the pool
//! blocks the group is stored in (nothing is copied per subscriber; the group
//! was stored once).
//!
//! Throughput is the payload bytes delivered to all subscribers.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use skiff_benches::fixture::{self, Drained, GroupEnd, Node};

const FRAMES: usize = 30;
const FRAME_LEN: usize = 1024;
const SUBSCRIBERS: [usize; 4] = [1, 8, 64, 512];

fn fanout(c: &mut Criterion) {
    let node = Node::new(64, 4096);
    let seq = node.write_group(FRAMES, FRAME_LEN);
    let track = node.track.handle();
    let per_subscriber = (FRAMES * FRAME_LEN) as u64;

    let mut group = c.benchmark_group("fanout");
    for n in SUBSCRIBERS {
        group.throughput(Throughput::Bytes(n as u64 * per_subscriber));
        let mut total = Drained::default();
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| {
                let mut read = Drained::default();
                for _ in 0..n {
                    let mut reader = track.group(seq).expect("the group is held");
                    let end = fixture::read_group(&mut reader, &mut read, |chunk| {
                        black_box(chunk);
                    });
                    debug_assert_eq!(end, GroupEnd::Finished);
                }
                total = read;
                read
            })
        });
        // Outside the timing: the last iteration delivered the whole group to everyone.
        assert_eq!(total.frames, (n * FRAMES) as u64);
        assert_eq!(total.bytes, n as u64 * per_subscriber);
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
    targets = fanout
}
criterion_main!(benches);
