//! Every case of the allocation audit makes no heap allocation per operation
//! once warm (a short run of the cases `cargo bench --bench alloc_audit` prints),
//! except the encoder cases (`audit::ENCODER_CASES`), which are only reported.

use std::hint::black_box;

use skiff_benches::audit::{self, CASES, Case, ENCODER_CASES, Op, Report};
use skiff_benches::counting::{Allocs, Counting, measure};

#[global_allocator]
static ALLOC: Counting = Counting;

/// Operations per measured run: small, so the test stays quick in debug builds.
const N: usize = 20;

fn audit_case(name: &str) {
    let case = CASES
        .iter()
        .find(|c| c.name == name)
        .expect("a case of that name");
    for &audience in case.audiences {
        let r = audit::run(case, audience, N);
        println!("{r}");
        assert_eq!(r.allocs_per_op(), 0.0, "{r}: {r:?}");
        assert_eq!(r.bytes_per_op(), 0.0, "{r}: {r:?}");
    }
}

#[test]
fn join_leave_allocates_nothing() {
    audit_case("join_leave");
}

#[test]
fn frame_write_allocates_nothing() {
    audit_case("frame_write");
}

#[test]
fn frame_fanout_allocates_nothing() {
    audit_case("frame_fanout");
}

#[test]
fn group_cycle_allocates_nothing() {
    audit_case("group_cycle");
}

#[test]
fn relay_frame_allocates_nothing() {
    audit_case("relay_frame");
}

#[test]
fn camera_frame_allocates_nothing() {
    audit_case("camera_frame");
}

/// The encoder is counted on its own line and may allocate (a real codec
/// might); ours reuses its buffers, so it reports 0 too, but that is not required.
#[test]
fn camera_encode_is_reported() {
    let case = CASES
        .iter()
        .find(|c| c.name == "camera_encode")
        .expect("the encoder case");
    for &audience in case.audiences {
        println!("{}", audit::run(case, audience, N));
    }
}

#[test]
fn every_case_is_covered_above() {
    let names: Vec<&str> = CASES.iter().map(|c| c.name).collect();
    assert_eq!(
        names,
        [
            "join_leave",
            "frame_write",
            "frame_fanout",
            "group_cycle",
            "relay_frame",
            "camera_frame",
            "camera_encode"
        ]
    );
    assert_eq!(ENCODER_CASES, ["camera_encode"]);
}

// ---- the audit itself ----

/// A control that allocates one 24-byte block per operation, once warm.
struct Allocates;

impl Op for Allocates {
    fn run(&mut self) {
        black_box(vec![0u8; 24]);
    }
}

/// A control that allocates only on its first operation (a one-off cost).
struct Once(Option<Vec<u8>>);

impl Op for Once {
    fn run(&mut self) {
        if self.0.is_none() {
            self.0 = Some(vec![0u8; 64]);
        }
    }
}

#[test]
fn the_audit_counts_per_operation_allocations() {
    let case = Case {
        name: "control",
        audiences: &[0],
        build: |_| Box::new(Allocates),
    };
    let r = audit::run(&case, 0, N);
    assert_eq!((r.allocs_per_op(), r.bytes_per_op()), (1.0, 24.0), "{r:?}");
    assert_eq!(
        r.to_string(),
        "alloc-audit case=control audience=0 allocs_per_op=1.000 bytes_per_op=24.000"
    );
}

#[test]
fn the_audit_leaves_out_one_off_costs() {
    let case = Case {
        name: "once",
        audiences: &[0],
        build: |_| Box::new(Once(None)),
    };
    let r: Report = audit::run(&case, 0, N);
    assert_eq!(r.allocs_per_op(), 0.0, "{r:?}");
}

/// A control whose operation allocates twice, once in a part it excludes.
#[derive(Default)]
struct Excludes(Allocs);

impl Op for Excludes {
    fn run(&mut self) {
        black_box(vec![0u8; 16]);
        let ((), a) = measure(|| {
            black_box(vec![0u8; 100]);
        });
        self.0.count += a.count;
        self.0.bytes += a.bytes;
    }

    fn excluded(&self) -> Allocs {
        self.0
    }
}

#[test]
fn the_audit_leaves_out_excluded_parts() {
    let case = Case {
        name: "excludes",
        audiences: &[0],
        build: |_| Box::<Excludes>::default(),
    };
    let r = audit::run(&case, 0, N);
    assert_eq!((r.allocs_per_op(), r.bytes_per_op()), (1.0, 16.0), "{r:?}");
}
