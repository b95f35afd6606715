//! The allocation audit: for every case of `skiff_benches::audit::CASES` and
//! each of its audiences, the heap allocations and bytes one operation makes
//! once warm, measured with the counting global allocator as
//! `(count(2N) - count(N)) / N`.
//!
//! Prints one line per case and audience:
//! `alloc-audit case=<name> audience=<n> allocs_per_op=<x> bytes_per_op=<y>`.
//!
//! `cargo bench -p skiff-benches --bench alloc_audit [-- N]` (N defaults to 2000).

use skiff_benches::audit;
use skiff_benches::counting::Counting;

#[global_allocator]
static ALLOC: Counting = Counting;

const DEFAULT_N: usize = 2000;

fn main() {
    // `cargo bench` passes `--bench`; a bare number is N.
    let n = std::env::args()
        .skip(1)
        .find_map(|a| a.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_N);
    eprintln!("alloc-audit: N = {n} operations (warm-up N, then runs of N and 2N)");
    audit::run_all(n, |r| println!("{r}"));
}
