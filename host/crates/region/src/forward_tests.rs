#![allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]

use proptest::prelude::*;

use super::*;

/// The frames `write_message` puts on the pipe, as ivtrace-forward turns
/// them into events: (kind, data).
fn frames(kind: u32, body: &[u8]) -> Vec<(u32, Vec<u8>)> {
    let mut wire = Vec::new();
    write_message(&mut wire, kind, body).unwrap();
    let frames: Vec<_> = split_frames(&wire)
        .into_iter()
        .map(|(k, d)| (k, d.to_vec()))
        .collect();
    let framed: usize = frames.iter().map(|(_, d)| 8 + d.len()).sum();
    assert_eq!(framed, wire.len(), "every byte is in a frame");
    frames
}

/// A chunk's data: `total, offset`, then `data`.
fn chunk(total: u32, offset: u32, data: &[u8]) -> Vec<u8> {
    let mut d = total.to_le_bytes().to_vec();
    d.extend_from_slice(&offset.to_le_bytes());
    d.extend_from_slice(data);
    d
}

#[test]
fn messages_are_cut_into_chunks_that_fit_a_packet() {
    let body: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    let f = frames(PACKET, &body);
    assert_eq!(f.len(), 4);
    assert!(f
        .iter()
        .all(|(k, d)| *k == PACKET && d.len() <= CHUNK_MAX + 8));
    assert_eq!(frames(CLOCK, &[]).len(), 1, "an empty message is one chunk");
}

#[test]
fn a_message_comes_back_whole() {
    let body: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
    let mut r = Reassembly::default();
    let mut got = None;
    for (k, d) in frames(META, &body) {
        let p = r.push(2, k, &d);
        assert_eq!(p.lost(), 0);
        got = p.outcome.unwrap().or(got);
    }
    assert_eq!(got.as_deref(), Some(&body[..]));
    assert_eq!(r.held_bytes(), 0);
}

#[test]
fn a_truncated_chunk_is_refused_and_lost_alone() {
    let mut r = Reassembly::default();
    for len in 0..8 {
        let p = r.push(0, HELLO, &[0u8; 8][..len]);
        assert_eq!(p.outcome, Err(FrameError::ShortChunk { len }));
        assert_eq!(p.lost(), 1);
    }
}

#[test]
fn a_missing_chunk_drops_its_message_and_is_counted() {
    let f = frames(META, &[5u8; 7000]);
    assert_eq!(f.len(), 3);
    let mut r = Reassembly::default();
    // The second chunk was dropped by L1's writer (ring full).
    assert_eq!(r.push(0, f[0].0, &f[0].1).outcome, Ok(None));
    let p = r.push(0, f[2].0, &f[2].1);
    assert!(matches!(
        p.outcome,
        Err(FrameError::OutOfOrder {
            offset: 6144,
            expected: 3072
        })
    ));
    // The next message's first chunk shows an unfinished one.
    r.push(0, f[0].0, &f[0].1);
    r.push(0, f[1].0, &f[1].1);
    let p = r.push(0, f[0].0, &f[0].1);
    assert!(p.dropped_unfinished);
    assert_eq!(p.lost(), 1);
    // One left unfinished at the end is lost too.
    assert_eq!(r.finish(), vec![0]);
    assert_eq!(r.held_bytes(), 0);
}

#[test]
fn lengths_past_the_end_are_refused() {
    let mut r = Reassembly::default();
    // A chunk with more bytes than the message it claims.
    let p = r.push(0, PACKET, &chunk(4, 0, &[1; 10]));
    assert_eq!(p.outcome, Err(FrameError::PastTotal { end: 10, total: 4 }));
    // A total past the largest message.
    let p = r.push(0, PACKET, &chunk(MESSAGE_MAX + 1, 0, &[1]));
    assert_eq!(
        p.outcome,
        Err(FrameError::TooLarge {
            total: MESSAGE_MAX + 1
        })
    );
    assert_eq!(r.held_bytes(), 0);
    // A forward event whose length passes its payload carries nothing.
    let mut classes = EventClasses::default();
    let forward = EventClass::new(4, abi::IVT_STREAM_USER, FORWARD_CLASS.into(), vec![]);
    assert!(classes.stream_mut(abi::IVT_STREAM_USER).insert(forward));
    let mut ev = ForwardEvents::for_classes(&classes).unwrap();
    let mut payload = PACKET.to_le_bytes().to_vec();
    payload.extend_from_slice(&u32::MAX.to_le_bytes());
    payload.extend_from_slice(&[0; 16]);
    ev.event_payload(4, 1, &payload);
    ev.event_payload(4, 1, &payload[..6]);
    assert!(ev.found.is_empty());
}

#[test]
fn offsets_and_totals_that_would_overflow_are_refused() {
    let mut r = Reassembly::default();
    r.push(1, PACKET, &chunk(100, 0, &[1; 10]));
    let p = r.push(1, PACKET, &chunk(100, u32::MAX, &[1; 10]));
    assert!(matches!(
        p.outcome,
        Err(FrameError::OutOfOrder {
            offset: u32::MAX,
            ..
        })
    ));
    r.push(1, PACKET, &chunk(100, 0, &[1; 10]));
    let p = r.push(1, PACKET, &chunk(u32::MAX, 10, &[1; 10]));
    assert!(matches!(
        p.outcome,
        Err(FrameError::TooLarge { total: u32::MAX })
    ));
    r.push(1, PACKET, &chunk(100, 0, &[1; 10]));
    let p = r.push(1, CLOCK, &chunk(100, 10, &[1; 10]));
    assert_eq!(
        p.outcome,
        Err(FrameError::KindChanged {
            kind: CLOCK,
            was: PACKET
        })
    );
    assert_eq!(r.held_bytes(), 0);
}

#[test]
fn a_short_packet_message_is_refused() {
    for len in 0..8 {
        let msg = vec![0u8; len];
        assert_eq!(
            PacketMessage::parse(&msg),
            Err(FrameError::ShortPacket { len })
        );
    }
    let m = PacketMessage {
        chan: 3,
        stream: 1,
        packet: &[9, 9],
    };
    assert_eq!(PacketMessage::parse(&m.to_bytes()), Ok(m));
}

/// 4096 channels each start a 16 MiB message and never finish it: the
/// buffers of all of them together stay within one largest message, the
/// rest are refused and counted (issue 23, case 5).
#[test]
fn unfinished_messages_share_one_cap() {
    let mut r = Reassembly::default();
    let data = vec![1u8; CHUNK_MAX];
    let mut lost = 0u64;
    for chan in 0..4096u32 {
        for i in 0..8u32 {
            lost += r
                .push(
                    chan,
                    PACKET,
                    &chunk(MESSAGE_MAX, i * CHUNK_MAX as u32, &data),
                )
                .lost();
            let held: usize = r.partial.values().map(|p| p.buf.capacity()).sum();
            assert_eq!(held, r.held_bytes());
            assert!(held <= PARTIAL_TOTAL_MAX, "{held} bytes held");
        }
    }
    assert!(r.over_cap() > 3000, "{}", r.over_cap());
    assert!(lost >= r.over_cap());
    r.finish();
    assert_eq!(r.held_bytes(), 0);
}

#[test]
fn forwarded_classes_are_checked_like_region_metadata() {
    let class = |stream, id, name: &str, fields: &[(&str, &str, bool)]| ClassWire {
        stream,
        id,
        name: name.into(),
        fields: fields
            .iter()
            .map(|(n, t, tid)| ((*n).into(), (*t).into(), false, *tid))
            .collect(),
    };
    let wire = vec![
        class(9, 1, "bad stream", &[]),
        class(1, 2, "bad type", &[("x", "f128", false)]),
        class(1, 3, "ok", &[("b", "bytes", false), ("b_len", "u32", true)]),
        class(1, 4, &"a".repeat(5000), &[]),
    ];
    let (classes, skipped) = classes_from_wire(&wire);
    assert_eq!(skipped, 2);
    let c = classes.stream(1).get(3).unwrap();
    assert_ne!(c.fields[0].name, c.fields[1].name);
    assert!(
        c.fields[1].name != "b_len",
        "b's length field keeps its name"
    );
    assert!(classes.stream(1).get(4).unwrap().name.len() < abi::IVT_NAME_MAX);
}

#[test]
fn the_tightest_sync_bracket_wins_and_a_lone_phase_is_ignored() {
    let mut s = SyncBrackets::default();
    s.push(0, 10, 100, 0);
    s.push(0, 0, 200, 1);
    s.push(1, 20, 300, 1);
    s.push(0, 30, 400, 0);
    s.push(0, 0, 420, 1);
    let b = s.best().unwrap();
    assert_eq!((b.at_ns, b.mono_before, b.mono_after), (30, 400, 420));
    s.push(0, 40, 500, 0);
    s.push(0, 0, 490, 1);
    assert_eq!(
        s.best().unwrap().at_ns,
        30,
        "a bracket going backwards is no bracket"
    );
}

proptest! {
    /// Any chunks on any channels: no panic, the held bytes stay within
    /// the cap and match the buffers, every message that comes out is
    /// within its limit, and finishing frees everything.
    #[test]
    fn hostile_chunks_stay_within_bounds(
        pushes in proptest::collection::vec(
            (0u32..4, 0u32..6, any::<u32>(), 0u32..20_000, 0usize..4000, any::<bool>()),
            0..200,
        )
    ) {
        let mut r = Reassembly::default();
        for (chan, kind, total, offset, len, honest) in pushes {
            let total = if honest { total % 20_000 } else { total };
            let data = if len < 8 { vec![0u8; len] } else { chunk(total, offset, &vec![0; len]) };
            let p = r.push(chan, kind, &data);
            if let Ok(Some(msg)) = &p.outcome {
                prop_assert!(msg.len() <= MESSAGE_MAX as usize);
            }
            prop_assert!(r.held_bytes() <= PARTIAL_TOTAL_MAX);
            let held: usize = r.partial.values().map(|p| p.buf.capacity()).sum();
            prop_assert_eq!(held, r.held_bytes());
        }
        r.finish();
        prop_assert_eq!(r.held_bytes(), 0);
    }

    /// Messages of two channels, their chunks interleaved, come back whole
    /// and nothing is lost.
    #[test]
    fn interleaved_channels_reassemble(
        a in proptest::collection::vec(any::<u8>(), 0..9000),
        b in proptest::collection::vec(any::<u8>(), 0..9000),
    ) {
        let (fa, fb) = (frames(PACKET, &a), frames(META, &b));
        let mut r = Reassembly::default();
        let mut got = HashMap::new();
        for i in 0..fa.len().max(fb.len()) {
            for (chan, f) in [(0u32, &fa), (1, &fb)] {
                if let Some((k, d)) = f.get(i) {
                    let p = r.push(chan, *k, d);
                    prop_assert_eq!(p.lost(), 0);
                    if let Ok(Some(m)) = p.outcome {
                        got.insert(chan, m);
                    }
                }
            }
        }
        prop_assert_eq!(got.get(&0), Some(&a));
        prop_assert_eq!(got.get(&1), Some(&b));
    }
}

#[test]
fn a_cut_frame_ends_the_split() {
    let mut wire = Vec::new();
    write_message(&mut wire, HELLO, &[1; 100]).unwrap();
    write_message(&mut wire, META, &[2; 100]).unwrap();
    // A frame: kind, len, then total, offset and the 100 bytes.
    let first = 8 + 8 + 100;
    for cut in [wire.len() - 1, first + 7, first + 3] {
        assert_eq!(split_frames(&wire[..cut]).len(), 1, "cut at {cut}");
    }
    let mut huge = wire.clone();
    huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(split_frames(&huge).is_empty());
}
