//! After warm-up, a subscriber joining, polling and leaving makes no heap allocation,
//! whatever the audience size.

use skiff_benches::counting::{Counting, measure};
use skiff_benches::fixture::{self, Node};
use skiff_core::model::track::Next;
use skiff_core::window::Request;

#[global_allocator]
static ALLOC: Counting = Counting;

fn join_poll_leave(audience: usize) {
    let node = Node::new(256, 4096);
    for _ in 0..3 {
        node.write_group(10, 500);
    }
    let mut table = fixture::audience(&node, audience);
    // Warm-up: one full cycle outside the measurement.
    let id = fixture::join(&mut table, &node, Request::LIVE).unwrap();
    assert!(fixture::leave(&mut table, id));

    let (frames, allocs) = measure(|| {
        let mut frames = 0;
        for _ in 0..100 {
            let id = fixture::join(&mut table, &node, Request::LIVE).unwrap();
            let viewer = table.get_mut(id).unwrap();
            if let Ok(Next::Ready(mut group)) = viewer.reader.next_group() {
                while let Ok(skiff_core::model::group::Next::Ready(_)) = group.read_frame_header() {
                    frames += 1;
                }
            }
            assert!(fixture::leave(&mut table, id));
        }
        frames
    });
    assert_eq!(
        frames,
        100 * 10,
        "each joiner reads the latest group's 10 frames"
    );
    assert_eq!(allocs.count, 0, "audience {audience}: {allocs:?}");
    assert_eq!(table.len(), audience);
}

#[test]
fn join_poll_leave_allocates_nothing_with_1_viewer() {
    join_poll_leave(1);
}

#[test]
fn join_poll_leave_allocates_nothing_with_100_viewers() {
    join_poll_leave(100);
}

#[test]
fn join_poll_leave_allocates_nothing_with_10000_viewers() {
    join_poll_leave(10_000);
}
