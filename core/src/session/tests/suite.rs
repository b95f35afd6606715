//! The session suite every transport passes: compiled once per transport
//! ([`super`] names it `Tr`), over the simulated pair of two sessions.

use super::*;

#[allow(clippy::duplicate_mod)]
#[path = "chunks.rs"]
mod chunks;

/// Received bytes the client could not take yet: in its link's inbox (QMux
/// keeps them there) or in its transport's receive queues.
fn waiting(pair: &Pair<Node<'_, '_, '_, 32, Tr>, Node<'_, '_, '_, 32, Tr>>) -> usize {
    pair.ba.unconsumed() + <Tr as Wire>::held(&pair.a.session)
}

#[test]
fn late_joiner_starts_at_the_latest_group() {
    let mut ps = PoolStorage::<64, 128>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<64, 128>::new();
    let cpool = Pool::new(&mut pc);
    published!(pool, o, "live", "video", video, tp);
    for seq in 0..4 {
        write_group(&tp, seq, &[(seq * 100, b"key"), (seq * 100 + 10, b"delta")]);
    }
    let local = track::State::<4>::new(&cpool, track::Info::new("video").unwrap());
    session_pair!(o.handle(), pair);
    let sub = pair
        .a
        .session
        .subscribe("live", local.handle(), Request::LIVE)
        .unwrap();
    assert!(pair.run(2000, |p| p.a.saw(|e| *e
        == Ev::Group {
            subscription: sub,
            sequence: 3
        })));
    pair.settle(Duration::from_millis(50));
    assert!(pair.a.events.contains(&Ev::Started {
        subscription: sub,
        group: 3
    }));
    assert_eq!(local.handle().sequences().collect::<Vec<_>>(), vec![3]);
    assert_eq!(
        read_group(local.handle(), 3),
        frames(&[(300, "key"), (310, "delta")])
    );
    // The next group follows live.
    write_group(&tp, 4, &[(400, b"key")]);
    pair.settle(Duration::from_millis(50));
    assert_eq!(read_group(local.handle(), 4), frames(&[(400, "key")]));
    assert_eq!(pair.b.session.served_count(), 1);
    // The publisher finishes: END 5 (exclusive), FIN, the local track finishes.
    finish_and_see_end!(tp, pair, sub, 5);
    assert_eq!(local.handle().status(), track::Status::Finished);
    pair.settle(Duration::from_millis(50));
    assert_eq!(pair.b.session.served_count(), 0);
    assert_eq!(pair.b.session.sending_groups(), 0);
    // The completed subscription was unregistered from the track.
    assert_eq!(video.handle().subscribers(), 0);
    assert_eq!(video.handle().demand(), None);
}

/// A finished track's SUBSCRIBE_END comes after the last byte of every group
/// it serves, so a reader that ends its track at END (moq-net on lite-05,
/// docs/protocol.md §3.8) holds each group whole by then: here an older 40 KB
/// group paced by a 4 KiB stream window, behind a newer one-frame group.
#[test]
fn subscribe_end_comes_after_the_last_group_stream() {
    let mut ps = PoolStorage::<512, 128>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<512, 128>::new();
    let cpool = Pool::new(&mut pc);
    published!(pool, o, "cam", "video", video, tp);
    let big: Vec<u8> = (0..40_000).map(|i| (i % 253) as u8).collect();
    write_group(&tp, 0, &[(0, &big)]);
    write_group(&tp, 1, &[(33, b"last")]);
    assert!(tp.finish());
    let local = track::State::<4>::new(&cpool, track::Info::new("video").unwrap());
    let small_window = Config {
        conn: conn::Config {
            max_stream_data_uni: 4096,
            ..conn::Config::new()
        },
        ..Config::new()
    };
    session_pair!(o.handle(), small_window, Config::new(), pair);
    pair.ba.chunking = Chunking::Random;
    let sub = pair
        .a
        .session
        .subscribe("cam", local.handle(), from_oldest())
        .unwrap();
    // A reader takes group 0 in as it arrives, which is what renews the window.
    let mut reader = None;
    let ended = pair.run(100_000, |p| {
        read_group_bytes(local.handle(), &mut reader);
        p.a.saw(|e| matches!(e, Ev::Ended { .. }))
    });
    assert!(ended, "{:?}", pair.a.events);
    // The step that delivered END ran the subscriber's input in order: what
    // came before END on the wire is in the local track.
    assert!(group_complete(local.handle(), 0), "group 0 whole at END");
    assert!(group_complete(local.handle(), 1), "group 1 whole at END");
    // A transport that does not order streams closes the subscription
    // after the grace for late groups (docs/protocol.md §11.7).
    pair.settle(Duration::from_millis(1_100));
    assert!(pair.a.events.contains(&Ev::Ended {
        subscription: sub,
        end: 2
    }));
    assert!(pair.a.events.contains(&Ev::SubscriptionClosed {
        subscription: sub,
        code: None
    }));
    assert_eq!(read_group(local.handle(), 0), vec![(0, big)]);
}

/// A relay track filled by an upstream that sends several groups newest
/// first: a subscriber that asked for the oldest still gets the older ones
/// arriving after a newer one.
#[test]
fn groups_an_upstream_sends_newest_first_reach_a_subscriber_from_the_oldest() {
    subscribed_from_oldest!(tp, local, pair, sub);
    for seq in [2, 1, 0] {
        write_group(&tp, seq, &[(seq * 100, b"older")]);
    }
    pair.settle(Duration::from_millis(50));
    assert!(pair.a.events.contains(&Ev::Started {
        subscription: sub,
        group: 0
    }));
    let mut got: Vec<u64> = local.handle().sequences().collect();
    got.sort_unstable();
    assert_eq!(got, vec![0, 1, 2, 3]);
    assert_eq!(read_group(local.handle(), 0), frames(&[(0, "older")]));
}

/// Groups still awaited from upstream do not hold a subscription open once
/// the track finishes without them: it ends with what was delivered.
#[test]
fn groups_awaited_from_upstream_are_given_up_when_the_track_finishes() {
    subscribed_from_oldest!(tp, local, pair, sub);
    pair.settle(Duration::from_millis(50));
    // Groups 0 to 2 are still wanted: the subscription stays.
    assert_eq!(pair.b.session.served_count(), 1);
    finish_and_see_end!(tp, pair, sub, 4);
    pair.settle(Duration::from_millis(50));
    assert_eq!(pair.b.session.served_count(), 0);
    assert_eq!(local.handle().sequences().collect::<Vec<_>>(), vec![3]);
}

/// A subscriber to the latest group of a track that holds none yet starts at
/// the newest group that arrives, not at older ones an upstream sends after it.
#[test]
fn a_latest_subscriber_of_an_empty_track_starts_at_the_newest_that_arrives() {
    let mut ps = PoolStorage::<64, 128>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<64, 128>::new();
    let cpool = Pool::new(&mut pc);
    published!(pool, o, "live", "video", video, tp);
    video.handle().set_upstream_first(3);
    let local = track::State::<4>::new(&cpool, track::Info::new("video").unwrap());
    session_pair!(o.handle(), pair);
    let live_with_budget = Request {
        max_latency: Duration::from_secs(10),
        ..Request::LIVE
    };
    let sub = pair
        .a
        .session
        .subscribe("live", local.handle(), live_with_budget)
        .unwrap();
    pair.settle(Duration::from_millis(50));
    write_group(&tp, 5, &[(500, b"five")]);
    assert!(pair.run(2000, |p| p.a.saw(|e| *e
        == Ev::Group {
            subscription: sub,
            sequence: 5
        })));
    write_group(&tp, 4, &[(400, b"four")]);
    write_group(&tp, 3, &[(300, b"three")]);
    pair.settle(Duration::from_millis(50));
    write_group(&tp, 6, &[(600, b"six")]);
    pair.settle(Duration::from_millis(50));
    assert!(pair.a.events.contains(&Ev::Started {
        subscription: sub,
        group: 5
    }));
    let mut got: Vec<u64> = local.handle().sequences().collect();
    got.sort_unstable();
    assert_eq!(got, vec![5, 6]);
}

#[test]
fn subscribing_needs_a_free_track() {
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "live", "video", video, tp);
    let local = track::State::<2>::new(&pool, track::Info::new("video").unwrap());
    let _writer = local.producer().unwrap();
    session_pair!(o.handle(), pair);
    assert_eq!(
        pair.a
            .session
            .subscribe("live", local.handle(), Request::LIVE),
        Err(Error::TrackBusy)
    );
}

#[test]
fn a_client_names_paths_under_the_path_it_dialed() {
    // docs/protocol.md §4.1: the server roots the session at `/room`.
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    let local = track::State::<4>::new(&pool, track::Info::new("video").unwrap());
    let other = track::State::<4>::new(&pool, track::Info::new("video").unwrap());
    let lobby = broadcast::State::<2>::new(Path::new("lobby/cam").unwrap()).unwrap();
    published!(pool, o, "room/cam", "video", video, tp);
    o.handle().announce(lobby.handle()).unwrap();
    write_group(&tp, 0, &[(0, b"key")]);
    let ccfg = Config {
        path: Some("/room/?jwt=x"),
        ..Config::new()
    };
    session_pair!(o.handle(), ccfg, Config::new(), pair);
    let all = pair.a.session.announce_request("").unwrap();
    let sub = pair
        .a
        .session
        .subscribe("cam", local.handle(), Request::LIVE)
        .unwrap();
    let outside = pair
        .a
        .session
        .subscribe("lobby/cam", other.handle(), Request::LIVE)
        .unwrap();
    assert!(pair.run(2000, |p| p.a.saw(|e| *e
        == Ev::Group {
            subscription: sub,
            sequence: 0
        })));
    pair.settle(Duration::from_millis(50));
    assert_eq!(announced(&pair.a.events, all), ["cam"]);
    assert_eq!(read_group(local.handle(), 0), frames(&[(0, "key")]));
    // `lobby/cam` from `/room` is `room/lobby/cam`, which is not there.
    assert!(pair.a.saw(|e| matches!(e,
        Ev::SubscriptionClosed { subscription, code: Some(_) } if *subscription == outside)));
}

#[test]
fn announce_initial_set_walks_the_origin_once() {
    // 500 broadcasts: sending the initial set walks the catalog once (plus the
    // entries skipped again each time a full send buffer makes it resume), not
    // once per broadcast (~B * B / 2 entries).
    const B: usize = 500;
    let names: Vec<std::string::String> = (0..B).map(|i| std::format!("b/{i:03}")).collect();
    let bs: Vec<_> = names
        .iter()
        .map(|n| broadcast::State::<1>::new(Path::new(n).unwrap()).unwrap())
        .collect();
    let o = origin::State::<512, 8>::new();
    for b in &bs {
        o.handle().announce(b.handle()).unwrap();
    }
    // 4 KiB control buffers: the set goes out in a few buffers' worth.
    let mut cst = Storage::<'_, '_, 16, 4096, 4, 4, 8, 8, 32>::new();
    let mut sst = Storage::<'_, '_, 16, 4096, 4, 4, 8, 8, 32>::new();
    let client = Tr::session(Side::Client, Config::new(), Instant::ZERO, &mut cst, None).unwrap();
    let server = Tr::session(
        Side::Server,
        Config::new(),
        Instant::ZERO,
        &mut sst,
        Some(o.handle()),
    )
    .unwrap();
    let mut pair = Pair::new(Node::new(client), Node::new(server));
    assert!(pair.run(1000, |p| p.a.session.is_setup() && p.b.session.is_setup()));
    let req = pair.a.session.announce_request("").unwrap();
    pair.settle(Duration::from_millis(50));
    assert_eq!(announced(&pair.a.events, req), names);
    let visits = pair.b.session.visits.announce;
    assert!(
        visits <= 3 * B,
        "{visits} entries visited for {B} broadcasts"
    );
}

/// The path of the broadcast the initial-set walk of `s` sent last, while one
/// is under way.
fn walk_last(s: &Session<'_, '_, '_, 32, Tr>) -> Option<std::string::String> {
    use super::control::{AnnounceState, Kind};
    (0..s.control.span()).find_map(|slot| match s.control[slot].kind {
        Kind::AnnounceIn {
            state:
                AnnounceState::Initial {
                    prefix,
                    after: Some(n),
                    ..
                },
        } => s
            .rx_kept(slot)
            .get(prefix..prefix + n)
            .map(|b| std::string::String::from_utf8(b.to_vec()).unwrap()),
        _ => None,
    })
}

#[test]
fn catalog_changes_during_the_initial_set_lose_no_broadcast() {
    // The initial set of 60 broadcasts takes many sends (64 bytes of credit at
    // a time); between two of them the catalog changes. Every broadcast active
    // at the end is announced; while the broadcast sent last is untouched,
    // none that did not change is announced twice.
    // Long names: a send buffer holds a few ANNOUNCEs, the walk stays well
    // ahead of the changes.
    let names: Vec<std::string::String> = (0..60)
        .map(|i| std::format!("b/{}{i:02}", "x".repeat(30)))
        .collect();
    let ccfg = Config {
        conn: conn::Config {
            max_stream_data_bidi_local: 64,
            ..conn::Config::new()
        },
        ..Config::new()
    };
    for touch_last in [false, true] {
        let bs: Vec<_> = names
            .iter()
            .map(|n| broadcast::State::<1>::new(Path::new(n).unwrap()).unwrap())
            .collect();
        let late = broadcast::State::<1>::new(Path::new("b/late").unwrap()).unwrap();
        let later = broadcast::State::<1>::new(Path::new("b/later").unwrap()).unwrap();
        let latest = broadcast::State::<1>::new(Path::new("b/latest").unwrap()).unwrap();
        let o = origin::State::<64, 64>::new();
        for b in &bs {
            o.handle().announce(b.handle()).unwrap();
        }
        session_pair!(o.handle(), ccfg, Config::new(), pair);
        let req = pair.a.session.announce_request("").unwrap();
        assert!(pair.run(1000, |p| announced(&p.a.events, req).len() >= 10));
        let sent = announced(&pair.a.events, req);
        assert!(sent.len() < 40, "the set went out at once");
        // The last one the server queued (it runs ahead of what arrived).
        let last = walk_last(&pair.b.session).expect("the walk is under way");
        let o = o.handle();
        let gone = |p: &str| o.unannounce(Path::new(p).unwrap()).unwrap();
        // Two sent already go, one still to send goes; a new one takes the
        // first freed place (behind the walk: only the change log has it).
        // The walk's positions past it moved down by one.
        gone(&sent[1]);
        gone(&sent[2]);
        gone(&names[50]);
        o.announce(late.handle()).unwrap();
        if touch_last {
            // The broadcast sent last goes, new ones take the freed places up
            // to its own, and it comes back further on (where `names[50]` was).
            let b = gone(&last);
            o.announce(later.handle()).unwrap();
            o.announce(latest.handle()).unwrap();
            o.announce(b).unwrap();
            assert_eq!(o.iter().position(|x| x.path().as_str() == last), Some(50));
        }
        pair.settle(Duration::from_millis(50));
        let got = announced(&pair.a.events, req);
        for b in o.iter() {
            let held = b.path();
            let path = held.as_str();
            let n = got.iter().filter(|p| *p == path).count();
            assert!(n >= 1, "{path} never announced");
            if !touch_last && path != "b/late" {
                assert_eq!(n, 1, "{path} announced {n} times");
            }
        }
        for path in [&sent[1], &sent[2]] {
            assert!(pair.a.events.contains(&Ev::Unannounced {
                request: req,
                path: path.clone()
            }));
        }
    }
}

#[test]
fn session_close_is_reported_to_the_peer() {
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "live", "video", video, tp);
    session_pair!(o.handle(), pair);
    pair.b.session.close(SessionCode::App(2), "bye");
    assert!(pair.run(1000, |p| p.a.closed().is_some()));
    assert_eq!(
        pair.a.closed(),
        Some(&Ev::Closed {
            code: 66,
            reason: "bye".into(),
            application: true,
            local: false
        })
    );
    assert!(pair.b.closed().is_none());
    assert!(pair.b.session.is_drained());
    assert_eq!(
        pair.a
            .session
            .handle_event(pair.now, conn::Event::Datagram(&[0])),
        Err(Error::Closed)
    );
}

#[test]
fn parked_subscriber_holds_the_publisher_at_one_window() {
    parked_subscriber(Mode::Copy);
}

pub(crate) fn parked_subscriber(mode: Mode) {
    const WINDOW: u64 = 4096;
    const FRAME: usize = 512;
    const FRAMES: usize = 64;
    let mut ps = PoolStorage::<320, 128>::new();
    let pool = Pool::new(&mut ps);
    // The subscriber's pool: 320 blocks of bytes and 640 spare metadata slots
    // (for pieces of the publisher's blocks when they are lent).
    let mut cbytes = vec![0u8; 320 * 128];
    let mut cmeta: Vec<BlockMeta> = (0..960).map(|_| BlockMeta::new()).collect();
    let cpool = Pool::from_parts_with_spare(&mut cbytes, &mut cmeta, 640).unwrap();
    published!(pool, o, "cam", "video", video, tp);
    let mut gp = tp.create_group(0).unwrap();
    let lender = Lender::new(&cpool);
    let lend = matches!(mode, Mode::Lend | Mode::LendScarce);
    let scarce = Scarce {
        inner: &lender,
        calls: Cell::new(0),
    };
    {
        let local = track::State::<2>::new(&cpool, track::Info::new("video").unwrap());
        let ccfg = Config {
            conn: conn::Config {
                max_stream_data_uni: WINDOW,
                stream_refs: lend,
                ..conn::Config::new()
            },
            ..Config::new()
        };
        let scfg = Config {
            conn: conn::Config {
                stream_refs: lend,
                ..conn::Config::new()
            },
            ..Config::new()
        };
        session_pair!(o.handle(), ccfg, scfg, pair);
        if mode != Mode::Copy {
            pair.b.gather = Some(Vec::new());
        }
        if lend {
            pair.b.lender = Some(&lender);
            if mode == Mode::LendScarce {
                pair.a.session.set_foreign(Some(&scarce));
            } else {
                pair.a.session.set_foreign(Some(&lender));
            }
        }
        pair.a
            .session
            .subscribe("cam", local.handle(), Request::LIVE)
            .unwrap();

        let payload = |i: usize| vec![(i % 251) as u8; FRAME];
        let mut written = 0usize;
        let mut reader: Option<crate::model::group::Consumer<'_, '_>> = None;
        let mut read = 0u64;
        let mut parked = true;
        let mut max_ahead = 0u64;
        for _ in 0..20_000 {
            // The publisher paces itself through its group, once the
            // session's stream reads it.
            while written < FRAMES {
                let mut cx = core::task::Context::from_waker(core::task::Waker::noop());
                if gp.poll_paced(&mut cx).is_pending() || gp.state().pace_limit().is_none() {
                    break;
                }
                gp.write_frame(written as u64, &payload(written)).unwrap();
                written += 1;
                if written == FRAMES {
                    gp.finish().unwrap();
                }
            }
            let pub_written = gp.state().bytes_written();
            if !parked {
                read += read_group_bytes(local.handle(), &mut reader);
                max_ahead = max_ahead.max(pub_written.saturating_sub(read));
            }
            if !pair.step() {
                if parked {
                    // Quiet with a parked reader: check the bounds, then start reading.
                    assert!(
                        pub_written <= WINDOW + Tr::BUFFERED + FRAME as u64 + 16,
                        "publisher wrote {pub_written} with a parked subscriber"
                    );
                    assert!(written < FRAMES);
                    // The subscriber stored at most one stream window (whole blocks).
                    assert!(local.handle().held_bytes() <= WINDOW + 128);
                    assert!(local.handle().held_bytes() >= WINDOW - 128);
                    parked = false;
                    continue;
                }
                if written == FRAMES && read == pub_written {
                    break;
                }
                match pair.next_time() {
                    Some(t) => pair.now = t,
                    None => break,
                }
            }
        }
        assert_eq!(written, FRAMES);
        let got = read_group(local.handle(), 0);
        assert_eq!(got.len(), FRAMES);
        for (i, (t, p)) in got.iter().enumerate() {
            assert_eq!((*t, p), (i as u64, &payload(i)));
        }
        // Reading as it arrives, the publisher never got more than two windows ahead
        // of the reader (one in flight to the subscriber, one unsent).
        assert!(
            max_ahead <= 2 * (WINDOW + Tr::BUFFERED) + FRAME as u64 + 16,
            "{max_ahead}"
        );
        // In gather mode the payload really went out as pool ranges (one per
        // 128-byte block at least).
        if mode == Mode::Gather {
            assert!(
                pair.b.gathered >= FRAMES * FRAME / 128,
                "{}",
                pair.b.gathered
            );
        }
        if lend {
            // Every 128-byte block went across as a token, none as bytes.
            assert_eq!(pair.b.gathered, 0);
            assert!(lender.count.get() >= FRAMES * FRAME / 128);
            // The subscriber's group holds pieces of the publisher's blocks, which
            // come back once it lets go of them.
            assert!(lender.outstanding() > 0);
        }
    }
    lender.reclaim();
    assert_eq!(lender.outstanding(), 0);
    if mode == Mode::LendScarce {
        assert!(
            scarce.calls.get() >= 2 * lender.count.get(),
            "every reference waited once: {} calls for {} references",
            scarce.calls.get(),
            lender.count.get()
        );
    }
}

/// A large frame reaches a reader that only reads when the local track's
/// version changes (as a relay's serving sessions do); returns how many
/// times the version changed (each change wakes the track's readers).
fn version_woken_reader(window: u64, announce_step: u64) -> usize {
    const FRAME: usize = 40_000;
    let mut ps = PoolStorage::<512, 128>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<512, 128>::new();
    let cpool = Pool::new(&mut pc);
    published!(pool, o, "cam", "video", video, tp);
    let payload: Vec<u8> = (0..FRAME).map(|i| (i % 253) as u8).collect();
    let mut gp = tp.create_group(0).unwrap();
    gp.write_frame(0, &payload).unwrap();
    gp.finish().unwrap();
    let total = gp.state().bytes_written();
    let local = track::State::<2>::new(&cpool, track::Info::new("video").unwrap());
    let ccfg = Config {
        conn: conn::Config {
            max_stream_data_uni: window,
            ..conn::Config::new()
        },
        announce_step,
        ..Config::new()
    };
    session_pair!(o.handle(), ccfg, Config::new(), pair);
    // The group arrives in random pieces, the reader looking between them.
    pair.ba.chunking = Chunking::Random;
    pair.a
        .session
        .subscribe("cam", local.handle(), Request::LIVE)
        .unwrap();
    let start = local.handle().version();
    let mut seen = start;
    let mut reader: Option<crate::model::group::Consumer<'_, '_>> = None;
    let mut read = 0u64;
    for _ in 0..100_000 {
        if local.handle().version() != seen {
            seen = local.handle().version();
            read += read_group_bytes(local.handle(), &mut reader);
        }
        if !pair.step() {
            if read == total {
                break;
            }
            match pair.next_time() {
                Some(t) => pair.now = t,
                None => break,
            }
        }
    }
    assert_eq!(read, total, "the reader got the whole group");
    assert_eq!(read_group(local.handle(), 0), vec![(0, payload)]);
    usize::try_from(local.handle().version().wrapping_sub(start)).unwrap()
}

#[test]
fn a_frame_arriving_in_pieces_wakes_its_readers_once() {
    // Ample credit: the group's start, its frame (header and payload, once
    // complete) and its FIN, however many pieces the 40,000 bytes came in.
    let stepped = version_woken_reader(256 * 1024, 64 * 1024);
    let every_piece = version_woken_reader(256 * 1024, 0);
    assert_eq!(stepped, 3);
    assert!(every_piece > stepped + 10, "{every_piece} vs {stepped}");
}

#[test]
fn a_sender_short_of_credit_wakes_the_readers_it_waits_for() {
    // A 4 KiB window against a 64 KiB step: each window's worth is announced,
    // or the sender would wait forever for credit the reader never returns.
    let changes = version_woken_reader(4096, 64 * 1024);
    assert!(changes >= 40_000 / 4096, "{changes}");
}

#[test]
fn exhausted_pool_backpressures_the_input() {
    let mut ps = PoolStorage::<64, 64>::new();
    let pool = Pool::new(&mut ps);
    // The subscriber's pool holds 256 bytes: less than the group.
    let mut pc = PoolStorage::<4, 64>::new();
    let cpool = Pool::new(&mut pc);
    published!(pool, o, "cam", "video", video, tp);
    let big = [7u8; 600];
    write_group(&tp, 0, &[(0, &big[..300]), (1, &big[300..])]);
    let local = track::State::<2>::new(&cpool, track::Info::new("video").unwrap());
    session_pair!(o.handle(), pair);
    pair.a
        .session
        .subscribe("cam", local.handle(), Request::LIVE)
        .unwrap();
    pair.settle(Duration::from_millis(100));
    // The bytes that did not fit wait in the caller's buffer; nothing failed.
    assert!(pair.a.session.is_stalled());
    assert!(waiting(&pair) > 0);
    assert_eq!(cpool.available(), 0);
    assert!(pair.a.closed().is_none() && pair.b.closed().is_none());
    assert_eq!(pair.a.session.receiving_groups(), 1);
    // Input stays stalled (returning 0) until room appears.
    let before = waiting(&pair);
    pair.settle(Duration::from_millis(100));
    assert_eq!(waiting(&pair), before);
    // Closing the session lets the group go.
    pair.a.session.close(SessionCode::NoError, "");
    pair.settle(Duration::from_millis(10));
    assert!(matches!(local.handle().status(), track::Status::Aborted(_)));
}

#[test]
fn unpolled_events_backpressure_the_input() {
    // 40 broadcasts announced; the client does not poll events for a while.
    let names: Vec<std::string::String> = (0..40).map(|i| std::format!("b/{i:02}")).collect();
    let bs: Vec<_> = names
        .iter()
        .map(|n| broadcast::State::<1>::new(Path::new(n).unwrap()).unwrap())
        .collect();
    let o = origin::State::<64, 64>::new();
    for b in &bs {
        o.handle().announce(b.handle()).unwrap();
    }
    session_pair!(o.handle(), pair);
    pair.a.auto_drain = false;
    pair.a.session.announce_request("").unwrap();
    pair.settle(Duration::from_millis(50));
    // One ANNOUNCE waits for poll_event, the rest fill its stream's buffer, then
    // the input stops: the unconsumed bytes stay with the caller.
    assert!(pair.a.session.is_stalled());
    assert!(waiting(&pair) > 0);
    let mut seen = Vec::new();
    for _ in 0..100 {
        while let Some(e) = pair.a.session.poll_event() {
            if let Event::Announced { path, .. } = e {
                seen.push(path.to_string());
            }
        }
        pair.settle(Duration::from_millis(10));
        if seen.len() == names.len() {
            break;
        }
    }
    assert_eq!(seen, names);
    assert!(!pair.a.session.is_stalled());
}

#[test]
fn frame_over_max_frame_bytes_drops_the_group() {
    let mut ps = PoolStorage::<8, 64>::new();
    let pool = Pool::new(&mut ps);
    let mut cps = PoolStorage::<8, 64>::new();
    let cpool = Pool::new(&mut cps);
    published!(pool, o, "b", "t", _t, tp);
    let local = track::State::<4>::new(&cpool, track::Info::new("t").unwrap());
    let ccfg = Config {
        max_frame_bytes: 4,
        ..Config::new()
    };
    session_pair!(o.handle(), ccfg, Config::new(), pair);
    let req = Request {
        start: Start::Latest,
        end: End::Open,
        ordered: false,
        priority: 0,
        max_latency: Duration::ZERO,
    };
    pair.a.session.subscribe("b", local.handle(), req).unwrap();
    pair.settle(Duration::from_millis(10));
    // A 3-byte frame, then a 9-byte one: over the subscriber's 4-byte limit.
    write_group(&tp, 0, &[(0, b"abc"), (1, b"abcdefghi")]);
    pair.settle(Duration::from_millis(50));
    let mut g = local.handle().group(0).expect("group 0 started");
    // However much of the first frame is readable, the group ends aborted.
    let mut end = None;
    for _ in 0..4 {
        match g.read_frame_header() {
            Ok(Next::Ready(h)) => {
                let mut buf = [0u8; 16];
                let _ = g.read_payload(&mut buf[..h.len]);
            }
            other => {
                end = Some(other.map(|_| ()));
                break;
            }
        }
    }
    assert_eq!(
        end,
        Some(Err(crate::model::group::ReadError::Aborted(
            StreamCode::FrameTooLarge.to_code()
        )))
    );
    // Only the group failed: the session goes on.
    assert_eq!(pair.a.closed(), None);
}

#[test]
fn dropping_the_session_releases_local_tracks() {
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "live", "video", video, tp);
    write_group(&tp, 0, &[(0, b"a")]);
    let local = track::State::<2>::new(&pool, track::Info::new("video").unwrap());
    {
        session_pair!(o.handle(), pair);
        pair.a
            .session
            .subscribe("live", local.handle(), Request::LIVE)
            .unwrap();
        pair.settle(Duration::from_millis(50));
        assert!(local.producer().is_err());
    }
    assert_eq!(
        local.handle().status(),
        track::Status::Aborted(StreamCode::SessionClosed.to_code())
    );
    assert!(local.producer().is_ok());
}

#[test]
fn publisher_skips_a_trimmed_group() {
    let mut ps = PoolStorage::<64, 64>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<64, 64>::new();
    let cpool = Pool::new(&mut pc);
    published!(pool, o, "live", "video", video, tp);
    // Group 0 outgrows the 256-byte budget with nobody reading: it is trimmed.
    video.handle().set_budget(256);
    let big = [9u8; 100];
    let five: Vec<(u64, &[u8])> = (0..5).map(|t| (t, &big[..])).collect();
    write_group(&tp, 0, &five);
    assert_eq!(
        pool.in_use(),
        0,
        "a trimmed, finished, unread group holds nothing"
    );
    write_group(&tp, 1, &[(10, b"key")]);
    let local = track::State::<4>::new(&cpool, track::Info::new("video").unwrap());
    session_pair!(o.handle(), pair);
    let req = Request {
        start: Start::Group(0),
        end: End::Open,
        max_latency: Duration::from_secs(10),
        ..Request::LIVE
    };
    let sub = pair
        .a
        .session
        .subscribe("live", local.handle(), req)
        .unwrap();
    assert!(pair.run(2000, |p| p.a.saw(|e| *e
        == Ev::Group {
            subscription: sub,
            sequence: 1
        })));
    pair.settle(Duration::from_millis(50));
    assert_eq!(read_group(local.handle(), 1), frames(&[(10, "key")]));
    assert_eq!(pair.b.session.sending_groups(), 0, "no stream for group 0");
    // Delivery goes on: the next group, then the end.
    write_group(&tp, 2, &[(20, b"next")]);
    tp.finish();
    assert!(pair.run(2000, |p| {
        p.a.saw(|e| matches!(e, Ev::SubscriptionClosed { code: None, .. }))
    }));
    assert_eq!(read_group(local.handle(), 2), frames(&[(20, "next")]));
    let mut held: Vec<u64> = local.handle().sequences().collect();
    held.sort_unstable();
    assert_eq!(held, vec![1, 2]);
    assert!(!pair.a.saw(|e| matches!(e, Ev::Group { sequence: 0, .. })));
    pair.settle(Duration::from_millis(50));
    assert_eq!(pair.b.session.served_count(), 0);
    assert!(pair.a.closed().is_none() && pair.b.closed().is_none());
}

#[test]
fn failover_keeps_the_local_track_across_a_session_loss() {
    let mut ps = PoolStorage::<64, 128>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<64, 128>::new();
    let cpool = Pool::new(&mut pc);
    published!(pool, o, "live", "video", video, tp);
    write_group(&tp, 0, &[(0, b"key")]);
    let local = track::State::<4>::new(&cpool, track::Info::new("video").unwrap());
    local.handle().set_failover(true);
    let mut reader = local.consumer(Start::Group(0));
    {
        session_pair!(o.handle(), pair);
        pair.a
            .session
            .subscribe("live", local.handle(), Request::LIVE)
            .unwrap();
        pair.settle(Duration::from_millis(50));
        assert_eq!(read_group(local.handle(), 0), frames(&[(0, "key")]));
        assert!(local.producer().is_err(), "the session holds the producer");
        // The upstream session goes away.
        pair.a.session.close(SessionCode::NoError, "");
        pair.settle(Duration::from_millis(10));
        assert_eq!(local.handle().status(), track::Status::Open);
    }
    assert_eq!(local.handle().status(), track::Status::Open);
    assert!(!local.handle().has_producer());
    assert_eq!(
        reader.next_group().unwrap().ready().map(|g| g.sequence()),
        Some(0)
    );
    assert!(matches!(reader.next_group(), Ok(track::Next::Pending)));
    // A new session continues the same local track.
    write_group(&tp, 1, &[(100, b"more")]);
    session_pair!(o.handle(), pair);
    pair.a
        .session
        .subscribe("live", local.handle(), Request::LIVE)
        .unwrap();
    pair.settle(Duration::from_millis(50));
    assert_eq!(read_group(local.handle(), 1), frames(&[(100, "more")]));
    assert_eq!(
        reader.next_group().unwrap().ready().map(|g| g.sequence()),
        Some(1)
    );
    assert_eq!(local.handle().status(), track::Status::Open);
}

#[test]
fn served_subscriptions_are_counted_and_aggregated_on_the_track() {
    let mut ps = PoolStorage::<32, 64>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<32, 64>::new();
    let cpool = Pool::new(&mut pc);
    published!(pool, o, "live", "video", video, tp);
    write_group(&tp, 0, &[(0, b"a")]);
    let l1 = track::State::<4>::new(&cpool, track::Info::new("video").unwrap());
    let l2 = track::State::<4>::new(&cpool, track::Info::new("video").unwrap());
    session_pair!(o.handle(), pair);
    assert_eq!(video.handle().subscribers(), 0);
    assert_eq!(video.handle().demand(), None);
    let a = pair
        .a
        .session
        .subscribe(
            "live",
            l1.handle(),
            Request::test(3, 100, Start::Latest, End::Open),
        )
        .unwrap();
    assert!(pair.run(1000, |p| p.b.session.served_count() == 1));
    // One subscriber: its own request (max age clamped to the track's 5 s).
    assert_eq!(video.handle().subscribers(), 1);
    assert_eq!(
        video.handle().demand(),
        Some(Request::test(3, 100, Start::Latest, End::Open))
    );
    let b = pair
        .a
        .session
        .subscribe(
            "live",
            l2.handle(),
            Request::test(7, 60_000, Start::Group(0), End::Group(10)),
        )
        .unwrap();
    assert!(pair.run(1000, |p| p.b.session.served_count() == 2));
    // Priority and max age are the maxima (the max age clamped), start is
    // latest because one asks for latest, end is open because one is open.
    assert_eq!(video.handle().subscribers(), 2);
    assert_eq!(
        video.handle().demand(),
        Some(Request::test(7, 5000, Start::Latest, End::Open))
    );
    // An update raises the priority.
    pair.a
        .session
        .update(a, Request::test(9, 100, Start::Latest, End::Open))
        .unwrap();
    assert!(pair.run(1000, |_| {
        video.handle().demand().is_some_and(|d| d.priority == 9)
    }));
    // The latest-start, open-ended one leaves: b's request is the aggregate.
    pair.a.session.unsubscribe(a).unwrap();
    assert!(pair.run(1000, |p| p.b.session.served_count() == 1));
    assert_eq!(video.handle().subscribers(), 1);
    assert_eq!(
        video.handle().demand(),
        Some(Request::test(7, 5000, Start::Group(0), End::Group(10)))
    );
    // With one subscriber an update is exact.
    pair.a
        .session
        .update(b, Request::test(1, 20, Start::Group(0), End::Group(10)))
        .unwrap();
    assert!(pair.run(1000, |_| {
        video.handle().demand().is_some_and(|d| d.priority == 1)
    }));
    assert_eq!(
        video.handle().demand(),
        Some(Request::test(1, 20, Start::Group(0), End::Group(10)))
    );
    pair.a.session.unsubscribe(b).unwrap();
    assert!(pair.run(1000, |p| p.b.session.served_count() == 0));
    assert_eq!(video.handle().subscribers(), 0);
    assert_eq!(video.handle().demand(), None);
}

#[test]
fn closing_the_serving_session_unregisters_its_subscriptions() {
    let mut ps = PoolStorage::<32, 64>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<32, 64>::new();
    let cpool = Pool::new(&mut pc);
    published!(pool, o, "live", "video", video, tp);
    write_group(&tp, 0, &[(0, b"a")]);
    let local = track::State::<4>::new(&cpool, track::Info::new("video").unwrap());
    {
        session_pair!(o.handle(), pair);
        pair.a
            .session
            .subscribe("live", local.handle(), Request::LIVE)
            .unwrap();
        assert!(pair.run(1000, |p| p.b.session.served_count() == 1));
        assert_eq!(video.handle().subscribers(), 1);
        // The subscriber's side goes away: the peer's close ends what it served.
        pair.a.session.close(SessionCode::NoError, "bye");
        assert!(pair.run(1000, |p| p.b.closed().is_some()));
        assert_eq!(pair.b.session.served_count(), 0);
        assert_eq!(video.handle().subscribers(), 0);
    }
    // Dropping a session that still serves unregisters too.
    let local2 = track::State::<4>::new(&cpool, track::Info::new("video").unwrap());
    {
        session_pair!(o.handle(), pair);
        pair.a
            .session
            .subscribe("live", local2.handle(), Request::LIVE)
            .unwrap();
        assert!(pair.run(1000, |p| p.b.session.served_count() == 1));
        assert_eq!(video.handle().subscribers(), 1);
    }
    assert_eq!(video.handle().subscribers(), 0);
    assert_eq!(video.handle().demand(), None);
}

#[test]
fn sessions_report_the_tracks_they_changed() {
    let mut ps = PoolStorage::<64, 128>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<64, 128>::new();
    let cpool = Pool::new(&mut pc);
    published!(pool, o, "live", "video", video, tp);
    write_group(&tp, 0, &[(0, b"key")]);
    let local = track::State::<4>::new(&cpool, track::Info::new("video").unwrap());
    session_pair!(o.handle(), pair);
    let sub = pair
        .a
        .session
        .subscribe("live", local.handle(), Request::LIVE)
        .unwrap();
    assert!(pair.run(2000, |p| p.a.saw(
        |e| matches!(e, Ev::Group { subscription, .. } if *subscription == sub)
    )));
    pair.settle(Duration::from_millis(50));
    // The subscriber filled its local track; the publisher served and read its source.
    let filled = changes_of(&mut pair.a.session);
    assert!(
        filled.contains(&Change::Media(local.handle().key())),
        "{filled:?}"
    );
    let served = changes_of(&mut pair.b.session);
    assert!(
        served.contains(&Change::Demand(video.handle().key())),
        "{served:?}"
    );
    assert!(
        served.contains(&Change::Consumed(video.handle().key())),
        "{served:?}"
    );
    // Reported once: a quiet session has nothing more to say.
    assert_eq!(changes_of(&mut pair.a.session), vec![]);
    // A new group: its media again, and nothing about other tracks.
    write_group(&tp, 1, &[(100, b"key")]);
    pair.settle(Duration::from_millis(50));
    assert_eq!(
        changes_of(&mut pair.a.session),
        vec![Change::Media(local.handle().key())]
    );
    assert_eq!(
        changes_of(&mut pair.b.session),
        vec![Change::Consumed(video.handle().key())]
    );
}

/// What one run of the clock session produced.
pub(crate) struct Outcome {
    client: Vec<Ev>,
    server: Vec<Ev>,
    pub(crate) c2s: Vec<u8>,
    pub(crate) s2c: Vec<u8>,
    groups: Vec<(u64, Frames)>,
    done: bool,
}

/// Server (hop 0x1111) publishes clock/seconds with groups 5 and 6, finished;
/// the client (hop 0x2222) asks for announcements and subscribes with the
/// SUBSCRIBE of V8 (priority 3, max age 250 ms, groups 5..=9).
pub(crate) fn clock_session(
    configure: impl FnOnce(&mut Pair<Node<'_, '_, '_, 32, Tr>, Node<'_, '_, '_, 32, Tr>>),
) -> Outcome {
    let mut ps = PoolStorage::<64, 128>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<64, 128>::new();
    let cpool = Pool::new(&mut pc);

    let seconds = track::State::<4>::new(&pool, track::Info::new("seconds").unwrap());
    let clock = broadcast::State::<4>::new(Path::new("clock").unwrap()).unwrap();
    let origin = origin::State::<4, 8>::new();
    let bp = clock.producer().unwrap();
    bp.add(seconds.handle()).unwrap();
    origin.handle().announce(clock.handle()).unwrap();
    let mut tp = seconds.producer().unwrap();
    write_group(&tp, 5, &[(1000, b"hello"), (1033, b"world!")]);
    write_group(&tp, 6, &[(2000, b"hello"), (2033, b"world!")]);
    tp.finish();

    let local = track::State::<4>::new(&cpool, track::Info::new("seconds").unwrap());

    let mut ss = St::new();
    let mut cs = St::new();
    let server = Tr::session(
        Side::Server,
        cfg(0x1111),
        Instant::ZERO,
        &mut ss,
        Some(origin.handle()),
    )
    .unwrap();
    let client = Tr::session(Side::Client, cfg(0x2222), Instant::ZERO, &mut cs, None).unwrap();
    let mut pair = Pair::new(Node::new(client), Node::new(server));
    configure(&mut pair);

    let mut asked = false;
    let done = pair.run(20_000, |p| {
        if !asked && p.a.saw(|e| matches!(e, Ev::Connected { .. })) {
            asked = true;
            p.a.session.announce_request("").unwrap();
            let req = Request {
                start: Start::Group(5),
                end: End::Group(9),
                ordered: false,
                priority: 3,
                max_latency: Duration::from_millis(250),
            };
            p.a.session.subscribe("clock", local.handle(), req).unwrap();
        }
        p.a.saw(|e| matches!(e, Ev::SubscriptionClosed { .. }))
            && p.a.saw(|e| matches!(e, Ev::Announced { .. }))
    });
    pair.settle(Duration::from_millis(100));
    let groups = [5, 6]
        .into_iter()
        .filter(|s| local.handle().group(*s).is_some())
        .map(|s| (s, read_group(local.handle(), s)))
        .collect();
    Outcome {
        client: pair.a.events.clone(),
        server: pair.b.events.clone(),
        c2s: pair.ab.log.clone(),
        s2c: pair.ba.log.clone(),
        groups,
        done,
    }
}

/// The facts every correct run of the clock session shows.
pub(crate) fn check_clock(o: &Outcome) {
    assert!(o.done, "session did not complete: {:?}", o.client);
    let sub = SubscriptionId(0);
    assert_eq!(
        o.groups,
        vec![
            (5, frames(&[(1000, "hello"), (1033, "world!")])),
            (6, frames(&[(2000, "hello"), (2033, "world!")])),
        ]
    );
    assert!(o.client.contains(&Ev::Started {
        subscription: sub,
        group: 5
    }));
    assert!(o.client.contains(&Ev::Ended {
        subscription: sub,
        end: 7
    }));
    assert!(o.client.contains(&Ev::SubscriptionClosed {
        subscription: sub,
        code: None
    }));
    assert!(o.client.contains(&Ev::Announced {
        request: AnnounceId(0),
        path: "clock".into(),
        hops: vec![],
        publisher: 0x1111,
    }));
    assert!(o.client.contains(&Ev::Setup {
        hop: 0x1111,
        role: Role::Both,
        path: None
    }));
    assert!(o.server.contains(&Ev::Setup {
        hop: 0x2222,
        role: Role::Both,
        path: None
    }));
    assert!(o.client.iter().all(|e| !matches!(e, Ev::Closed { .. })));
    assert!(o.server.iter().all(|e| !matches!(e, Ev::Closed { .. })));
}

#[test]
fn clock_session_matches_protocol_vectors() {
    let o = clock_session(|_| {});
    check_clock(&o);
    let c2s = Tr::tap(&o.c2s);
    let s2c = Tr::tap(&o.s2c);

    // V5-style SETUPs: only Hop (we advertise no Probe), client uni 2, server uni 3.
    assert_eq!(c2s.stream(2), hex("01 05 01 05 02 62 22"));
    assert!(c2s.fin(2));
    assert_eq!(s2c.stream(3), hex("01 05 01 05 02 51 11"));
    assert!(s2c.fin(3));
    // V6: ANNOUNCE_REQUEST with Exclude Hop = our hop; V7: ANNOUNCE_OK + ANNOUNCE.
    assert_eq!(c2s.stream(0), hex("01 03 00 62 22"));
    assert_eq!(s2c.stream(0), hex("03 51 11 01 08 01 05 63 6c 6f 63 6b 00"));
    // V10: TRACK, then TRACK_INFO and FIN; we FIN after reading it.
    assert_eq!(
        c2s.stream(4),
        hex("06 0e 05 63 6c 6f 63 6b 07 73 65 63 6f 6e 64 73")
    );
    assert!(c2s.fin(4));
    assert_eq!(s2c.stream(4), hex("06 7f 00 53 88 43 e8"));
    assert!(s2c.fin(4));
    // V8: the SUBSCRIBE, sent only after TRACK_INFO; V9: START 5, END 7, FIN.
    assert_eq!(
        c2s.stream(8),
        hex("02 15 00 05 63 6c 6f 63 6b 07 73 65 63 6f 6e 64 73 03 00 40 fa 06 0a")
    );
    assert_eq!(s2c.stream(8), hex("00 01 05 01 01 07"));
    assert!(s2c.fin(8));
    // V11/V12: one uni stream per group, newest first, FIN after the last frame.
    let g6 = hex("00 02 00 06 4f a0 05 68 65 6c 6c 6f 40 42 06 77 6f 72 6c 64 21");
    let g5 = hex("00 02 00 05 47 d0 05 68 65 6c 6c 6f 40 42 06 77 6f 72 6c 64 21");
    assert_eq!(s2c.stream(7), g6);
    assert_eq!(s2c.stream(11), g5);
    assert!(s2c.fin(7) && s2c.fin(11));
    let pos = |id| s2c.order.iter().position(|&s| s == id).unwrap();
    assert!(pos(7) < pos(11), "group 6 goes before group 5");
    // Nothing was reset or closed.
    assert!(s2c.resets.is_empty(), "{:?}", s2c.resets);
    assert_eq!(s2c.close, None);
    assert_eq!(c2s.close, None);
}

#[test]
fn clock_session_with_random_chunks_and_latency() {
    for seed in 1..=40u64 {
        let o = clock_session(|p| {
            p.rng = Rng::new(seed);
            p.ab.chunking = Chunking::Random;
            p.ba.chunking = Chunking::Random;
            p.ab.latency = Duration::from_millis(seed % 7);
            p.ba.latency = Duration::from_millis(seed % 5 + 1);
        });
        check_clock(&o);
    }
}

#[test]
fn unknown_track_and_broadcast_are_refused() {
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "live", "video", video, tp);
    let audio = track::State::<2>::new(&pool, track::Info::new("audio").unwrap());
    let other = track::State::<2>::new(&pool, track::Info::new("video").unwrap());
    session_pair!(o.handle(), pair);
    let a = pair
        .a
        .session
        .subscribe("live", audio.handle(), Request::LIVE)
        .unwrap();
    let b = pair
        .a
        .session
        .subscribe("nowhere", other.handle(), Request::LIVE)
        .unwrap();
    pair.settle(Duration::from_millis(50));
    // docs/protocol.md §4.4: NOT_FOUND for a missing track, UNROUTABLE for a missing broadcast.
    assert!(pair.a.events.contains(&Ev::SubscriptionClosed {
        subscription: a,
        code: Some(0x33)
    }));
    assert!(pair.a.events.contains(&Ev::SubscriptionClosed {
        subscription: b,
        code: Some(0x36)
    }));
    assert_eq!(audio.handle().status(), track::Status::Aborted(0x33));
    // The tracks are free again.
    assert!(audio.producer().is_ok());
    // No SUBSCRIBE went out for either.
    let c2s = Tr::tap(&pair.ab.log);
    assert!(c2s.streams.values().all(|(d, _)| d.first() != Some(&0x02)));
}

#[test]
fn announcements_follow_the_origin() {
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    let cam = broadcast::State::<2>::new(Path::new("room/cam").unwrap()).unwrap();
    let hidden = broadcast::State::<2>::new(Path::new("room/.private").unwrap()).unwrap();
    published!(pool, o, "clock", "seconds", seconds, tp);
    let ccfg = Config {
        hop: 0x2222,
        ..Config::new()
    };
    let scfg = Config {
        hop: 0x1111,
        ..Config::new()
    };
    session_pair!(o.handle(), ccfg, scfg, pair);
    let all = pair.a.session.announce_request("").unwrap();
    let room = pair.a.session.announce_request("/room/").unwrap();
    pair.settle(Duration::from_millis(50));
    assert!(pair.a.events.contains(&Ev::Announced {
        request: all,
        path: "clock".into(),
        hops: vec![],
        publisher: 0x1111
    }));
    // Later changes, under both prefixes; dot-segments are not announced (§3.6).
    o.handle().announce(cam.handle()).unwrap();
    o.handle().announce(hidden.handle()).unwrap();
    pair.settle(Duration::from_millis(50));
    for request in [all, room] {
        assert!(pair.a.events.contains(&Ev::Announced {
            request,
            path: "room/cam".into(),
            hops: vec![],
            publisher: 0x1111
        }));
    }
    assert!(
        !pair
            .a
            .saw(|e| matches!(e, Ev::Announced { path, .. } if path.contains("private")))
    );
    o.handle().unannounce(Path::new("room/cam").unwrap());
    pair.settle(Duration::from_millis(50));
    assert!(pair.a.events.contains(&Ev::Unannounced {
        request: room,
        path: "room/cam".into()
    }));
    // Wire check (V7 form): ANNOUNCE_OK for "room" counted nothing at first.
    let s2c = Tr::tap(&pair.ba.log);
    assert_eq!(&s2c.stream(4)[..4], &hex("03 51 11 00")[..]);
    // Cancelling ends the stream.
    pair.a.session.cancel_announce(all).unwrap();
    pair.settle(Duration::from_millis(50));
    assert_eq!(pair.a.session.cancel_announce(all), Err(Error::Unknown));
}

#[test]
fn a_server_names_a_rooted_clients_paths_in_full() {
    // The client at `/room` publishes `cam`: the server's origin calls it `room/cam`.
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    let local = track::State::<4>::new(&pool, track::Info::new("video").unwrap());
    let other = track::State::<4>::new(&pool, track::Info::new("video").unwrap());
    published!(pool, o, "cam", "video", video, tp);
    write_group(&tp, 0, &[(0, b"key")]);
    let (mut cst, mut sst) = (St::new(), St::new());
    let ccfg = Config {
        path: Some("/room"),
        ..Config::new()
    };
    let client = Tr::session(
        Side::Client,
        ccfg,
        Instant::ZERO,
        &mut cst,
        Some(o.handle()),
    )
    .unwrap();
    let server = Tr::session(Side::Server, Config::new(), Instant::ZERO, &mut sst, None).unwrap();
    let mut pair = Pair::new(Node::new(client), Node::new(server));
    assert!(pair.run(1000, |p| p.a.session.is_setup() && p.b.session.is_setup()));
    let all = pair.b.session.announce_request("").unwrap();
    let under = pair.b.session.announce_request("room").unwrap();
    assert_eq!(
        pair.b.session.announce_request("lobby"),
        Err(Error::Invalid)
    );
    let sub = pair
        .b
        .session
        .subscribe("room/cam", local.handle(), Request::LIVE)
        .unwrap();
    assert_eq!(
        pair.b
            .session
            .subscribe("lobby/cam", other.handle(), Request::LIVE),
        Err(Error::Invalid)
    );
    assert!(pair.run(2000, |p| p.b.saw(|e| *e
        == Ev::Group {
            subscription: sub,
            sequence: 0
        })));
    pair.settle(Duration::from_millis(50));
    assert_eq!(announced(&pair.b.events, all), ["room/cam"]);
    assert_eq!(announced(&pair.b.events, under), ["room/cam"]);
    assert_eq!(read_group(local.handle(), 0), frames(&[(0, "key")]));
    // On the wire the client was asked for its own names.
    let s2c = Tr::tap(&pair.ba.log);
    assert!(
        s2c.streams
            .values()
            .any(|(d, _)| d.windows(4).any(|w| w == b"\x03cam"))
    );
}

#[test]
fn announce_initial_set_larger_than_a_buffer() {
    // Seven broadcasts with long names: the initial set is sent a few at a time.
    let names: Vec<std::string::String> = (0..7)
        .map(|i| std::format!("room/{}{}", "x".repeat(60), i))
        .collect();
    let bs: Vec<_> = names
        .iter()
        .map(|n| broadcast::State::<1>::new(Path::new(n).unwrap()).unwrap())
        .collect();
    let big = origin::State::<16, 8>::new();
    for b in &bs {
        big.handle().announce(b.handle()).unwrap();
    }
    session_pair!(big.handle(), pair);
    let req = pair.a.session.announce_request("room").unwrap();
    pair.settle(Duration::from_millis(50));
    let got: Vec<_> = pair
        .a
        .events
        .iter()
        .filter_map(|e| match e {
            Ev::Announced { request, path, .. } if *request == req => Some(path.clone()),
            _ => None,
        })
        .collect();
    let mut want = names.clone();
    want.sort();
    assert_eq!(got, want);
    // ANNOUNCE_OK said 7.
    let s2c = Tr::tap(&pair.ba.log);
    assert_eq!(&s2c.stream(0)[..3], &hex("02 00 07")[..]);
}

#[test]
fn goaway_is_reported_and_blocks_new_requests() {
    let mut ps = PoolStorage::<16, 64>::new();
    let pool = Pool::new(&mut ps);
    published!(pool, o, "live", "video", video, tp);
    let local = track::State::<2>::new(&pool, track::Info::new("video").unwrap());
    session_pair!(o.handle(), pair);
    assert_eq!(pair.a.session.goaway("elsewhere"), Err(Error::Invalid));
    pair.b.session.goaway("").unwrap();
    assert_eq!(pair.b.session.goaway(""), Err(Error::Invalid));
    assert!(pair.run(1000, |p| p.a.saw(|e| *e == Ev::Goaway { uri: "".into() })));
    assert_eq!(
        pair.a
            .session
            .subscribe("live", local.handle(), Request::LIVE),
        Err(Error::GoingAway)
    );
    // V13: type + empty URI, then FIN.
    let s2c = Tr::tap(&pair.ba.log);
    let id = *s2c.order.iter().find(|&&id| id % 4 == 1).unwrap();
    assert_eq!(s2c.stream(id), hex("05 01 00"));
    assert!(s2c.fin(id));
}

#[test]
fn unsubscribe_cancels_and_the_publisher_finishes() {
    let mut ps = PoolStorage::<32, 64>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<32, 64>::new();
    let cpool = Pool::new(&mut pc);
    published!(pool, o, "live", "video", video, tp);
    write_group(&tp, 0, &[(0, b"a")]);
    let open = tp.create_group(1).unwrap();
    let local = track::State::<4>::new(&cpool, track::Info::new("video").unwrap());
    session_pair!(o.handle(), pair);
    let sub = pair
        .a
        .session
        .subscribe("live", local.handle(), Request::LIVE)
        .unwrap();
    assert!(pair.run(1000, |p| p.b.session.sending_groups() == 1));
    pair.a.session.unsubscribe(sub).unwrap();
    assert!(pair.run(1000, |p| {
        p.a.saw(|e| matches!(e, Ev::SubscriptionClosed { code: None, .. }))
    }));
    pair.settle(Duration::from_millis(50));
    // The publisher dropped the subscription and reset the open group stream with CANCEL.
    assert_eq!(pair.b.session.served_count(), 0);
    assert_eq!(pair.b.session.sending_groups(), 0);
    let s2c = Tr::tap(&pair.ba.log);
    assert!(
        s2c.resets
            .iter()
            .any(|&(_, c)| c == StreamCode::Cancel.to_code())
    );
    assert_eq!(local.handle().status(), track::Status::Finished);
    drop(open);
}

#[test]
fn a_fetch_brings_a_held_group_and_a_missing_one_is_refused() {
    // docs/protocol.md §3.10: TRACK, then FETCH on a bidi stream; the answer
    // is the group's FRAMEs on that stream, or a reset with the code.
    let mut ps = PoolStorage::<64, 128>::new();
    let pool = Pool::new(&mut ps);
    let mut pc = PoolStorage::<64, 128>::new();
    let cpool = Pool::new(&mut pc);
    published!(pool, o, "live", "video", video, tp);
    let big = [9u8; 1500];
    for seq in 0..3 {
        write_group(&tp, seq, &[(seq * 100, b"key"), (seq * 100 + 10, &big)]);
    }
    let local = track::State::<2>::new(&cpool, track::Info::new("video").unwrap());
    let gone = track::State::<2>::new(&cpool, track::Info::new("video").unwrap());
    session_pair!(o.handle(), pair);
    let f = pair.a.session.fetch("live", local.handle(), 1, 0).unwrap();
    let g = pair.a.session.fetch("live", gone.handle(), 7, 0).unwrap();
    assert!(pair.run(5000, |p| {
        p.a.events
            .iter()
            .filter(|e| matches!(e, Ev::SubscriptionClosed { .. }))
            .count()
            == 2
    }));
    assert!(pair.a.events.contains(&Ev::SubscriptionClosed {
        subscription: f,
        code: None
    }));
    assert!(pair.a.events.contains(&Ev::SubscriptionClosed {
        subscription: g,
        code: Some(StreamCode::NotFound.to_code())
    }));
    assert_eq!(read_group(local.handle(), 1), read_group(video.handle(), 1));
    assert_eq!(pair.b.session.sending_groups(), 0);
}
