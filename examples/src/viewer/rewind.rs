//! The viewer's rewind (`--from -30s`): play a hang broadcast from a time
//! before its live edge on to live, without a gap.
//!
//! 1. The relay's replay broadcast `PATH/replay` (docs/protocol.md §10)
//!    carries the recording's catalog, whose root `archive` entry names the
//!    timeline track, a window of one record per segment: its span of
//!    content time and the groups carrying it on each track.
//! 2. The record holding "live edge minus `--from`" gives the first group.
//! 3. A live subscription to the video track gives the first live group; it
//!    asks for every group (a long max latency) so none is skipped while the
//!    past is read.
//! 4. The groups from the first one up to the first live one are fetched
//!    (FETCH, docs/protocol.md §3.10) one at a time, from the relay's cache
//!    or its recording, and checked; then the live groups follow.
//!
//! Every frame goes through the same checks as in live viewing, and the
//! camera's stamps must rise by exactly one across the whole run.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use skiff_archive::timeline::Timeline;
use skiff_archive::window::DecoderConfig;
use skiff_archive::{Archive, Record};
use skiff_media::node::wall_clock_us;
use skiff_monoio::sdk::{End, Request, Start};
use skiff_monoio::{Client, Error};

use super::Args;
use super::hang::{Checker, rendition};

/// The replay broadcast's name under the recorded broadcast's path.
const REPLAY: &str = "replay";

/// The timeline is taken as read once no frame came for this long: the
/// frames a group already holds come back to back on its stream.
const CAUGHT_UP: Duration = Duration::from_millis(50);

/// How long a group the recording has not stored yet is asked for again.
const FETCH_PATIENCE: Duration = Duration::from_secs(3);

/// The catalog fields the rewind needs beyond the renditions.
#[derive(serde::Deserialize)]
struct ArchivedCatalog {
    archive: Option<Archive>,
}

/// Plays `args.broadcast` from `back` before its live edge on to live.
pub(super) async fn read(
    args: &Args,
    client: &Client,
    back: Duration,
    intact: &AtomicU64,
    started: Instant,
) -> Result<(), String> {
    let replay = format!("{}/{REPLAY}", args.broadcast);
    let (rendition, json) = rendition(args, client, &replay, started).await?;
    let archive = serde_json::from_slice::<ArchivedCatalog>(&json)
        .map_err(|e| format!("corrupt replay catalog: {e}"))?
        .archive
        .ok_or_else(|| format!("{replay}: the catalog has no archive entry"))?;
    let timeline = timeline(client, &replay, &archive).await?;
    let (first, record) =
        start_group(timeline.records(), &rendition.name, back, archive.timescale)?;
    let scale = f64::from(archive.timescale);
    let last = edge(timeline.records());
    println!(
        "viewer: rewind: segment {} at {:.1} s, {:.1} s before the live edge, starts at group {first} ({:.1} s)",
        record.segment,
        record.pts as f64 / scale,
        last.saturating_sub(record.pts) as f64 / scale,
        started.elapsed().as_secs_f64()
    );

    let name = &rendition.name;
    let mut live = client
        .subscribe(&args.broadcast, name, every_group())
        .await
        .map_err(|e| format!("subscription to {name} failed: {e}"))?;
    let mut group = match live.next_group().await {
        Ok(Some(g)) => g,
        Ok(None) => return Err("the live track finished".into()),
        Err(e) => return Err(format!("live track: {e}")),
    };
    let live_first = group.sequence();
    if live_first < first {
        return Err(format!(
            "the live edge (group {live_first}) is before the rewind's start (group {first})"
        ));
    }

    let mut checker = Checker::new(args, &rendition, intact, started)?;
    checker.consecutive = true;
    for sequence in first..live_first {
        let mut past = fetch(client, &args.broadcast, name, sequence).await?;
        if sequence == first {
            println!(
                "viewer: rewind: first past group after {:.3} s",
                started.elapsed().as_secs_f64()
            );
        }
        let done = checker.group(&mut past, first).await?;
        if sequence == first
            && let Some(stamp) = checker.first_stamp
        {
            println!(
                "viewer: rewind: first frame captured {:.1} s ago, checked after {:.3} s",
                wall_clock_us().saturating_sub(stamp.time_us) as f64 / 1e6,
                started.elapsed().as_secs_f64()
            );
        }
        if done {
            return Ok(());
        }
    }
    println!(
        "viewer: rewind: {} past groups read, live from group {live_first} ({:.1} s)",
        live_first - first,
        started.elapsed().as_secs_f64()
    );
    loop {
        if group.skipped() > 0 {
            return Err(format!(
                "gap: {} groups skipped before live group {}",
                group.skipped(),
                group.sequence()
            ));
        }
        if checker.group(&mut group, first).await? {
            return Ok(());
        }
        group = match live.next_group().await {
            Ok(Some(g)) => g,
            Ok(None) => {
                return Err(format!(
                    "track finished after {} frames",
                    checker.stats.frames
                ));
            }
            Err(e) => return Err(format!("{e} after {} frames", checker.stats.frames)),
        };
    }
}

/// A live subscription that wants every group from the latest on: the
/// relay keeps sending older ones while the rewind reads the past.
fn every_group() -> Request {
    Request {
        start: Start::Latest,
        end: End::Open,
        ordered: true,
        priority: 1,
        max_latency: skiff_core::time::Duration::from_secs(60),
    }
}

/// The records of the timeline's newest group: its header (the retained
/// window) and the pushes and pops after it.
async fn timeline(client: &Client, replay: &str, archive: &Archive) -> Result<Timeline, String> {
    let mut track = client
        .subscribe(replay, &archive.track, Request::LIVE)
        .await
        .map_err(|e| format!("timeline subscription failed: {e}"))?;
    let mut group = match track.next_group().await {
        Ok(Some(g)) => g,
        Ok(None) => return Err("the timeline track finished empty".into()),
        Err(e) => return Err(format!("timeline: {e}")),
    };
    let mut timeline = Timeline::new(DecoderConfig {
        compression: archive.track.ends_with(".z"),
        ..DecoderConfig::default()
    });
    timeline.start_group();
    // The header restates the window; the pushes after it in the same group
    // bring it up to date. A group stays open for more pushes, so reading
    // stops once none came for a while.
    loop {
        let wait = if timeline.records().next().is_none() {
            Duration::from_secs(10)
        } else {
            CAUGHT_UP
        };
        let payload = match monoio::time::timeout(wait, group.read_frame()).await {
            Ok(Ok(Some(f))) => f.payload.to_vec(),
            Ok(Ok(None)) | Err(_) => break,
            Ok(Err(e)) => return Err(format!("timeline: {e}")),
        };
        timeline
            .decode(&payload)
            .map_err(|e| format!("corrupt timeline: {e}"))?;
    }
    if timeline.records().next().is_none() {
        return Err("the recording has no complete segment yet".into());
    }
    Ok(timeline)
}

/// The end of the newest of `records` (oldest first): the live edge.
fn edge<'r>(mut records: impl DoubleEndedIterator<Item = &'r Record>) -> u64 {
    records.next_back().map_or(0, |r| r.pts + r.duration)
}

/// The first group of `track` to play for a start `back` before the live
/// edge (the end of the newest of `records`, oldest first), and the record
/// it opens. A recording shorter than `back` starts at its oldest segment.
fn start_group<'r, I>(
    records: I,
    track: &str,
    back: Duration,
    timescale: u32,
) -> Result<(u64, &'r Record), String>
where
    I: DoubleEndedIterator<Item = &'r Record> + Clone,
{
    let back = u64::try_from(back.as_millis() * u128::from(timescale) / 1000).unwrap_or(u64::MAX);
    let at = edge(records.clone()).saturating_sub(back);
    let record = records
        .into_iter()
        .find(|r| r.pts + r.duration > at && r.tracks.contains_key(track))
        .ok_or_else(|| format!("the timeline names no group of {track}"))?;
    let range = record.tracks[track]
        .first()
        .ok_or_else(|| format!("segment {} has no range of {track}", record.segment))?;
    Ok((range.start, record))
}

/// Fetches group `sequence`, asking again for a little while if neither
/// the relay's cache nor its recording holds it yet (the recorder stores a
/// group once it is complete).
async fn fetch(
    client: &Client,
    broadcast: &str,
    track: &str,
    sequence: u64,
) -> Result<skiff_monoio::sdk::GroupConsumer, String> {
    let since = Instant::now();
    loop {
        match client.fetch(broadcast, track, sequence).await {
            Ok(g) => return Ok(g),
            Err(Error::NotFound) if since.elapsed() < FETCH_PATIENCE => {
                monoio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(format!("fetch of group {sequence}: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skiff_archive::Range;
    use std::collections::BTreeMap;

    fn record(segment: u64, pts: u64, group: u64) -> Record {
        let mut r = Record::new(segment, pts, 2000);
        r.tracks
            .insert("video".into(), vec![Range::new(group, group)]);
        r
    }

    #[test]
    fn the_start_is_the_segment_holding_the_time_asked_for() {
        let records: BTreeMap<u64, Record> =
            (0..30).map(|i| (i, record(i, i * 2000, 100 + i))).collect();
        // Live edge 60 s; 30 s back is 30 s, inside segment 15.
        let (g, r) = start_group(records.values(), "video", Duration::from_secs(30), 1000).unwrap();
        assert_eq!((g, r.segment), (115, 15));
        let (g, _) = start_group(
            records.values(),
            "video",
            Duration::from_millis(29_999),
            1000,
        )
        .unwrap();
        assert_eq!(g, 115);
        // Further back than the recording: its oldest segment.
        let (g, _) =
            start_group(records.values(), "video", Duration::from_secs(600), 1000).unwrap();
        assert_eq!(g, 100);
        assert!(start_group(records.values(), "audio", Duration::from_secs(1), 1000).is_err());
    }
}
