//! Criterion: subscriber churn. With a steady audience of 1 to 10,000 on a
//! track, `k` subscribers join (request resolved into a window, a reader at
//! its first group, registered in the audience table) and then the same `k`
//! leave, per iteration, for `k` = 1, 8 and 64.
//!
//! Throughput is `k` elements, so Criterion's element rate is joins (each
//! with its leave) per second; the time per element is the cost of one join +
//! leave. Joins and leaves are O(1) in the audience and in `k`, so the
//! per-element time should be flat across the table.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use skiff_benches::fixture::{self, Node};
use skiff_benches::subscribers::Id;
use skiff_core::window::Request;

const AUDIENCES: [usize; 4] = [1, 100, 1_000, 10_000];
const CHURN: [usize; 3] = [1, 8, 64];

fn churn(c: &mut Criterion) {
    let node = Node::new(256, 4096);
    for _ in 0..3 {
        node.write_group(30, 1000);
    }
    let mut group = c.benchmark_group("churn");
    for audience in AUDIENCES {
        let mut table = fixture::audience(&node, audience);
        for k in CHURN {
            group.throughput(Throughput::Elements(k as u64));
            let id = BenchmarkId::new(format!("audience_{audience}"), format!("k_{k}"));
            group.bench_function(id, |b| {
                let mut ids: [Option<Id>; 64] = [None; 64];
                b.iter(|| {
                    for slot in &mut ids[..k] {
                        *slot = fixture::join(&mut table, &node, black_box(Request::LIVE)).ok();
                    }
                    for slot in &mut ids[..k] {
                        let id = slot.take().expect("joined");
                        black_box(fixture::leave(&mut table, id));
                    }
                })
            });
            assert_eq!(table.len(), audience, "every churned subscriber left");
        }
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
    targets = churn
}
criterion_main!(benches);
