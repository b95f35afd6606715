//! Splits the latency of a fan-out run into its hops, from the logs that
//! `libskiff_timeline.so` wrote for the load generator and the relay
//! (`benches/latency-split.sh` runs both): for each frame, when the
//! publisher's first byte left the generator, when the relay read the first
//! and the last of the frame's bytes, when the relay finished writing it to
//! each subscriber, and when each subscriber's socket gave the generator
//! its last byte. Medians (and 90th percentiles) over the frames.
//!
//! The processes are told apart by what they do: the relay is the process
//! that writes a whole frame in one call to the most descriptors; the
//! generator is the other process with the most logged calls. The
//! publisher's socket is the generator's descriptor with the most bytes
//! written (the relay's with the most bytes read); the subscribers' are the
//! relay's descriptors it writes whole frames to and the generator's
//! descriptors with the most bytes read. A frame starts with a write on the
//! publisher's socket after a gap of at least `--gap-us` (the run must be
//! paced, not `--fps max`).
//!
//! With `--marks` (the file `moq_load --marks` wrote in the same run), the
//! split also covers the generator's own time on each side of the sockets:
//! from the send time the publisher stamped into the frame to its first
//! byte on the socket, and from a subscriber's last byte read to moq-net
//! handing it the whole frame. The rows then add up to the tool's latency.

use std::collections::HashMap;
use std::path::PathBuf;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Split a load run's frame latency into its hops, from the timeline logs")]
struct Cli {
    /// The directory the logs were written to (`SKIFF_TIMELINE_DIR`).
    #[arg(long)]
    dir: PathBuf,
    /// Bytes per frame of the run.
    #[arg(long)]
    frame_bytes: u64,
    /// Subscribers of the run.
    #[arg(long)]
    subscribers: usize,
    /// The least gap between two frames' writes on the publisher's socket.
    #[arg(long, default_value_t = 2000)]
    gap_us: u64,
    /// `moq_load --marks`'s file of the same run: `sent read` lines, both
    /// `CLOCK_MONOTONIC` nanoseconds.
    #[arg(long)]
    marks: Option<PathBuf>,
}

/// The frames the subscribers read, keyed by the publisher's send time,
/// each with the times its subscribers had it whole, sorted.
fn load_marks(path: &std::path::Path) -> Result<Vec<(u64, Vec<u64>)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut by_sent: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
    for (i, line) in text.lines().enumerate() {
        let mut f = line.split_whitespace().map(str::parse::<u64>);
        match (f.next(), f.next(), f.next()) {
            (Some(Ok(sent)), Some(Ok(read)), None) => by_sent.entry(sent).or_default().push(read),
            _ => return Err(format!("{}:{}: not `sent read`", path.display(), i + 1)),
        }
    }
    Ok(by_sent
        .into_iter()
        .map(|(sent, mut reads)| {
            reads.sort_unstable();
            (sent, reads)
        })
        .collect())
}

/// One logged call.
#[derive(Clone, Copy, Debug)]
struct Call {
    ns: u64,
    fd: i32,
    write: bool,
    bytes: u64,
}

fn load(path: &std::path::Path) -> std::io::Result<Vec<Call>> {
    let data = std::fs::read(path)?;
    let mut calls = Vec::new();
    for rec in data.chunks_exact(24) {
        let field =
            |at: usize| u32::from_le_bytes([rec[at], rec[at + 1], rec[at + 2], rec[at + 3]]);
        let ns = u64::from_le_bytes(rec[..8].try_into().unwrap_or([0; 8]));
        if ns == 0 {
            break;
        }
        calls.push(Call {
            ns,
            fd: field(12) as i32,
            write: field(16) == 2,
            bytes: u64::from(field(20)),
        });
    }
    calls.sort_by_key(|c| c.ns);
    Ok(calls)
}

/// Bytes per descriptor, written (`write`) or read.
fn bytes_by_fd(calls: &[Call], write: bool) -> HashMap<i32, u64> {
    let mut by = HashMap::new();
    for c in calls.iter().filter(|c| c.write == write) {
        *by.entry(c.fd).or_insert(0) += c.bytes;
    }
    by
}

/// The descriptors to which `calls` wrote at least `bytes` in one call.
fn whole_frame_writers(calls: &[Call], bytes: u64) -> Vec<i32> {
    let mut fds: Vec<i32> = calls
        .iter()
        .filter(|c| c.write && c.bytes >= bytes)
        .map(|c| c.fd)
        .collect();
    fds.sort_unstable();
    fds.dedup();
    fds
}

/// When the calls on `fd` in `[from, to)` in direction `write` had moved
/// `bytes` in all.
fn done_at(calls: &[Call], fd: i32, write: bool, from: u64, to: u64, bytes: u64) -> Option<u64> {
    let start = calls.partition_point(|c| c.ns < from);
    let mut sum = 0;
    for c in calls[start..].iter().take_while(|c| c.ns < to) {
        if c.fd == fd && c.write == write {
            sum += c.bytes;
            if sum >= bytes {
                return Some(c.ns);
            }
        }
    }
    None
}

fn first_at(calls: &[Call], fd: i32, write: bool, from: u64, to: u64) -> Option<u64> {
    let start = calls.partition_point(|c| c.ns < from);
    calls[start..]
        .iter()
        .take_while(|c| c.ns < to)
        .find(|c| c.fd == fd && c.write == write)
        .map(|c| c.ns)
}

fn percentile(v: &mut [u64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_unstable();
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i.min(v.len() - 1)] as f64 / 1000.0
}

fn main() -> Result<(), String> {
    let cli = Cli::parse();
    let mut logs = Vec::new();
    for entry in std::fs::read_dir(&cli.dir).map_err(|e| format!("{}: {e}", cli.dir.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("ev."))
        {
            let calls = load(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            if !calls.is_empty() {
                logs.push((path, calls));
            }
        }
    }
    let relay_at = logs
        .iter()
        .enumerate()
        .max_by_key(|(_, (_, c))| whole_frame_writers(c, cli.frame_bytes).len())
        .map(|(i, _)| i)
        .ok_or("no logs in the directory")?;
    let tool_at = logs
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != relay_at)
        .max_by_key(|(_, (_, c))| c.len())
        .map(|(i, _)| i)
        .ok_or("only one process logged")?;
    let relay = &logs[relay_at].1;
    let tool = &logs[tool_at].1;
    let relay_subs = whole_frame_writers(relay, cli.frame_bytes);
    if relay_subs.len() < cli.subscribers {
        return Err(format!(
            "the relay ({}) wrote whole frames to {} descriptors, not {}: was it on its epoll driver (--driver legacy)?",
            logs[relay_at].0.display(),
            relay_subs.len(),
            cli.subscribers
        ));
    }
    let max_fd = |m: HashMap<i32, u64>| m.into_iter().max_by_key(|&(_, b)| b).map(|(fd, _)| fd);
    let relay_pub = max_fd(bytes_by_fd(relay, false)).ok_or("the relay read nothing")?;
    let tool_pub = max_fd(bytes_by_fd(tool, true)).ok_or("the generator wrote nothing")?;
    let mut by_read: Vec<(i32, u64)> = bytes_by_fd(tool, false).into_iter().collect();
    by_read.sort_by_key(|&(_, b)| std::cmp::Reverse(b));
    let tool_subs: Vec<i32> = by_read
        .iter()
        .take(cli.subscribers)
        .map(|&(fd, _)| fd)
        .collect();

    // Frame starts: a publisher write after a gap.
    let gap = cli.gap_us * 1000;
    let mut starts = Vec::new();
    let mut last = 0;
    for c in tool.iter().filter(|c| c.write && c.fd == tool_pub) {
        if c.ns.saturating_sub(last) >= gap {
            starts.push(c.ns);
        }
        last = c.ns;
    }
    let marks = cli.marks.as_deref().map(load_marks).transpose()?;
    let mut names = vec![
        "publisher's first byte -> relay reads it",
        "relay's first read -> frame complete at the relay",
        "frame complete at the relay -> first subscriber written",
        "frame complete at the relay -> median subscriber written",
        "frame complete at the relay -> last subscriber written",
        "publisher's first byte -> median subscriber written (relay's share)",
        "median subscriber written -> median subscriber's last byte read",
        "first subscriber's last byte read -> median subscriber's",
        "publisher's first byte -> median subscriber's last byte read",
        "publisher's first byte -> last subscriber's last byte read",
    ];
    if marks.is_some() {
        names.extend([
            "send time stamped -> publisher's first byte (moq-net's publisher)",
            "median subscriber's last byte read -> median has the frame (moq-net's reader)",
            "send time stamped -> median subscriber has the frame (the tool's latency)",
        ]);
    }
    let mut cols: Vec<Vec<u64>> = vec![Vec::new(); names.len()];
    let mut frames = 0;
    for w in starts.windows(2).skip(10) {
        let (t0, end) = (w[0], w[1]);
        let Some(r_first) = first_at(relay, relay_pub, false, t0, end) else {
            continue;
        };
        let Some(r_done) = done_at(relay, relay_pub, false, t0, end, cli.frame_bytes) else {
            continue;
        };
        let mut sent: Vec<u64> = relay_subs
            .iter()
            .filter_map(|&fd| done_at(relay, fd, true, r_first, end, cli.frame_bytes))
            .collect();
        let mut got: Vec<u64> = tool_subs
            .iter()
            .filter_map(|&fd| done_at(tool, fd, false, t0, end, cli.frame_bytes))
            .collect();
        if sent.len() < cli.subscribers || got.len() < cli.subscribers {
            continue;
        }
        sent.sort_unstable();
        got.sort_unstable();
        let mid = cli.subscribers / 2;
        let mut row = vec![
            r_first - t0,
            r_done - r_first,
            sent[0].saturating_sub(r_done),
            sent[mid].saturating_sub(r_done),
            sent[sent.len() - 1].saturating_sub(r_done),
            sent[mid] - t0,
            got[mid].saturating_sub(sent[mid]),
            got[mid] - got[0],
            got[mid] - t0,
            got[got.len() - 1] - t0,
        ];
        if let Some(marks) = &marks {
            // The frame's stamp is the latest send time before its first
            // byte, within one gap; its reads must be every subscriber's.
            let at = marks.partition_point(|(stamp, _)| *stamp <= t0);
            let Some((stamp, reads)) = at.checked_sub(1).map(|i| &marks[i]) else {
                continue;
            };
            if t0 - stamp >= gap || reads.len() < cli.subscribers {
                continue;
            }
            let had = reads[reads.len() / 2];
            row.extend([
                t0 - stamp,
                had.saturating_sub(got[mid]),
                had.saturating_sub(*stamp),
            ]);
        }
        for (c, v) in cols.iter_mut().zip(row) {
            c.push(v);
        }
        frames += 1;
    }
    if frames == 0 {
        return Err("no frame was seen whole at every hop".into());
    }
    println!(
        "timeline-split: {frames} frames, relay log {}, generator log {}",
        logs[relay_at].0.display(),
        logs[tool_at].0.display()
    );
    println!("{:70} {:>8} {:>8}", "hop (µs)", "p50", "p90");
    for (name, col) in names.iter().zip(cols.iter_mut()) {
        let p50 = percentile(col, 0.5);
        let p90 = percentile(col, 0.9);
        println!("{name:70} {p50:8.1} {p90:8.1}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marks_file(name: &str, text: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("skiff-marks-{}-{name}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn marks_group_each_frames_reads_by_its_send_time_in_order() {
        let path = marks_file("ok", "100 180\n200 260\n100 150\n100 170\n");
        let marks = load_marks(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(marks, vec![(100, vec![150, 170, 180]), (200, vec![260])]);
    }

    #[test]
    fn a_marks_line_that_is_not_two_numbers_names_its_line() {
        for (name, text) in [
            ("short", "100 180\n200\n"),
            ("long", "100 180 7\n"),
            ("word", "x 1\n"),
        ] {
            let path = marks_file(name, text);
            let err = load_marks(&path).unwrap_err();
            std::fs::remove_file(&path).unwrap();
            let line = if name == "short" { 2 } else { 1 };
            assert!(
                err.ends_with(&format!(":{line}: not `sent read`")),
                "{name}: {err}"
            );
        }
    }
}
