//! The recording's stored files on untrusted bytes: a broadcast's index
//! (`record::index::parse`, what a relay reads back after a crash, and
//! `record::index::compact`, which must replay to the same index), the
//! file names it holds (`record::names::decode`) and a stored media
//! segment's boxes as the export reads them (`mp4-atom`'s `moof`) and as a
//! FETCH answered from the recording reads its samples
//! (`record::fmp4::segment_samples`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use skiff_relay::record::{fmp4, index, names};

fuzz_target!(|data: &[u8]| {
    let parsed = index::parse(data);
    // The good lines are a prefix of the input, each read back the same.
    assert!(parsed.valid_len <= data.len());
    let again: String = parsed.records.iter().map(index::Record::line).collect();
    assert_eq!(index::parse(again.as_bytes()).records, parsed.records);
    let replayed = index::BroadcastIndex::replay(&parsed.records);
    // Compaction keeps what the index says.
    assert_eq!(
        index::BroadcastIndex::replay(&index::compact(&parsed.records)),
        replayed
    );
    for s in replayed.segments() {
        assert!(replayed.tracks[&s.track].last_number >= Some(s.number));
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Some(name) = names::decode(text)
    {
        assert_eq!(names::encode(&name), text);
        assert!(!text.contains('/') && !text.starts_with('.'));
    }
    let _ = <mp4_atom::Moof as mp4_atom::Decode>::decode(&mut &data[..]);
    if let Ok(samples) = fmp4::segment_samples(data) {
        // Every sample is bytes of the segment, and there are not too many.
        assert!(samples.len() <= fmp4::MAX_SEGMENT_SAMPLES);
        assert!(samples.iter().all(|s| s.data.len() <= data.len()));
    }
});
