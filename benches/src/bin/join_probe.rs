//! A small probe for instruction counting: a steady audience, then `ITERS`
//! subscriber join + leave cycles. `benches/callgrind-join.sh` runs it under
//! callgrind at two iteration counts and divides the difference.
//!
//! Usage: `join_probe AUDIENCE ITERS`

use std::hint::black_box;
use std::process::ExitCode;

use skiff_benches::fixture::{self, Node};
use skiff_core::window::Request;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let (Some(Ok(audience)), Some(Ok(iters))) = (args.next(), args.next()) else {
        eprintln!("usage: join_probe AUDIENCE ITERS (two non-negative integers)");
        return ExitCode::from(2);
    };
    if audience >= fixture::MAX_AUDIENCE {
        eprintln!(
            "join_probe: audience must be below {}",
            fixture::MAX_AUDIENCE
        );
        return ExitCode::from(2);
    }
    let node = Node::new(256, 4096);
    for _ in 0..3 {
        node.write_group(30, 1000);
    }
    let mut table = fixture::audience(&node, audience);
    for _ in 0..iters {
        let Ok(id) = fixture::join(&mut table, &node, black_box(Request::LIVE)) else {
            eprintln!("join_probe: join refused");
            return ExitCode::FAILURE;
        };
        black_box(fixture::leave(&mut table, black_box(id)));
    }
    ExitCode::SUCCESS
}
