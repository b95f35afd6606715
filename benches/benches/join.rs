//! Criterion: one subscriber joins and leaves a track with a steady audience of 1 to 10,000.
//!
//! A join resolves the request against the track's live edge into a window,
//! gives the subscriber a reader at its first group, and registers it in the
//! fixed-capacity audience table; a leave removes it. Both are O(1) in the
//! audience, so the time should be flat across audience sizes.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use skiff_benches::fixture::{self, Node};
use skiff_core::window::Request;

fn join_leave(c: &mut Criterion) {
    let node = Node::new(256, 4096);
    for _ in 0..3 {
        node.write_group(30, 1000);
    }
    let mut group = c.benchmark_group("join_leave");
    group.throughput(Throughput::Elements(1));
    for audience in [1usize, 100, 1_000, 10_000] {
        let mut table = fixture::audience(&node, audience);
        group.bench_with_input(BenchmarkId::from_parameter(audience), &audience, |b, _| {
            b.iter(|| {
                let id = fixture::join(&mut table, &node, black_box(Request::LIVE)).unwrap();
                fixture::leave(&mut table, black_box(id))
            })
        });
        assert_eq!(table.len(), audience);
    }
    group.finish();
}

criterion_group!(benches, join_leave);
criterion_main!(benches);
