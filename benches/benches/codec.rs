//! Criterion: wire codecs on the media path.
//!
//! * `group_encode` / `group_decode`: a whole moq-lite group stream
//!   (docs/protocol.md §3.9): the stream type, the GROUP header
//!   (`wire::lite::Group`), then 30 FRAMEs (`model::frame`: header +
//!   payload) of 100 B, 1 KiB or 16 KiB. Encoding copies every payload into
//!   the output buffer; decoding walks the stream and borrows each payload
//!   (zero-copy).
//! * `qmux_encode` / `qmux_decode`: 16 KiB of stream data as QMux STREAM
//!   frames in records (docs/protocol.md §1.3) under the default record limit of
//!   16,382 bytes, so in two records, as moq-dev would send it. Encoding
//!   copies the data; decoding borrows it.
//!
//! Throughput is the bytes of the encoded stream (group) or of the stream
//! data carried (QMux).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use skiff_core::model::frame::Frame;
use skiff_core::wire::lite::{Group, UniStreamType, read_message, write_message};
use skiff_core::wire::qmux::{
    self, DEFAULT_MAX_RECORD_SIZE, Dir, Record, Side, Stream, StreamId, encode_record,
    max_stream_payload,
};
use skiff_core::wire::{Reader, Writer};

const FRAMES: u64 = 30;
const FRAME_SIZES: [usize; 3] = [100, 1024, 16 * 1024];
const QMUX_PAYLOAD: usize = 16 * 1024;

/// Writes the group stream into `buf`; returns its length.
#[inline]
fn encode_group(buf: &mut [u8], payload: &[u8]) -> usize {
    let mut w = Writer::new(buf);
    UniStreamType::Group.write(&mut w).expect("room");
    write_message(
        &Group {
            subscribe: 1,
            sequence: 42,
        },
        &mut w,
    )
    .expect("room");
    let mut prev = 0;
    for i in 0..FRAMES {
        let timestamp = i * 33;
        Frame::new(timestamp, payload)
            .encode(prev, &mut w)
            .expect("room");
        prev = timestamp;
    }
    w.position()
}

/// Decodes a group stream; returns the group sequence plus payload bytes seen.
#[inline]
fn decode_group(stream: &[u8]) -> u64 {
    let mut r = Reader::new(stream);
    let kind = UniStreamType::read(&mut r).expect("stream type");
    assert!(kind == UniStreamType::Group);
    let group: Group = read_message(&mut r).expect("GROUP");
    let mut sum = group.sequence;
    let mut prev = 0;
    while !r.is_empty() {
        let frame = Frame::decode(&mut r, prev, usize::MAX).expect("FRAME");
        prev = frame.timestamp;
        sum += black_box(frame.payload).len() as u64;
    }
    sum
}

fn group_stream(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec");
    for size in FRAME_SIZES {
        let payload = vec![0x5au8; size];
        let mut buf = vec![0u8; FRAMES as usize * (size + 16) + 64];
        let len = encode_group(&mut buf, &payload);
        assert_eq!(decode_group(&buf[..len]), 42 + FRAMES * size as u64);
        g.throughput(Throughput::Bytes(len as u64));
        g.bench_function(BenchmarkId::new("group_encode", size), |b| {
            b.iter(|| encode_group(black_box(&mut buf), black_box(&payload)))
        });
        let stream = buf[..len].to_vec();
        g.bench_function(BenchmarkId::new("group_decode", size), |b| {
            b.iter(|| decode_group(black_box(&stream)))
        });
    }
    g.finish();
}

/// Writes `data` as STREAM frames in one-frame records; returns the bytes written.
#[inline]
fn encode_stream(out: &mut [u8], id: StreamId, data: &[u8]) -> usize {
    let mut at = 0;
    let mut offset = 0;
    while offset < data.len() {
        let n =
            max_stream_payload(DEFAULT_MAX_RECORD_SIZE, id, offset as u64).min(data.len() - offset);
        let frame = qmux::Frame::Stream(Stream {
            id,
            offset: offset as u64,
            data: &data[offset..offset + n],
            fin: offset + n == data.len(),
        });
        at += encode_record(&frame, DEFAULT_MAX_RECORD_SIZE, &mut out[at..]).expect("room");
        offset += n;
    }
    at
}

/// Decodes records of STREAM frames; returns the stream data bytes seen.
#[inline]
fn decode_stream(mut input: &[u8]) -> usize {
    let mut data = 0;
    while !input.is_empty() {
        let record = Record::decode(input, DEFAULT_MAX_RECORD_SIZE).expect("record");
        for frame in record.frames() {
            if let Ok(qmux::Frame::Stream(s)) = frame {
                data += black_box(s.data).len();
            }
        }
        input = &input[record.len..];
    }
    data
}

fn qmux_stream(c: &mut Criterion) {
    let id = StreamId::new(Side::Server, Dir::Uni, 3).expect("a valid stream id");
    let data = vec![0x5au8; QMUX_PAYLOAD];
    let mut buf = vec![0u8; QMUX_PAYLOAD + 256];
    let len = encode_stream(&mut buf, id, &data);
    assert_eq!(decode_stream(&buf[..len]), QMUX_PAYLOAD);
    let records = buf[..len].to_vec();

    let mut g = c.benchmark_group("codec");
    g.throughput(Throughput::Bytes(QMUX_PAYLOAD as u64));
    g.bench_function(BenchmarkId::new("qmux_encode", QMUX_PAYLOAD), |b| {
        b.iter(|| encode_stream(black_box(&mut buf), id, black_box(&data)))
    });
    g.bench_function(BenchmarkId::new("qmux_decode", QMUX_PAYLOAD), |b| {
        b.iter(|| decode_stream(black_box(&records)))
    });
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = group_stream, qmux_stream
}
criterion_main!(benches);
