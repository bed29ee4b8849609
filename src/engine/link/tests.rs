use super::*;
use crate::link::fec::Encoder;
use crate::wire::link::Kind;
use crate::wire::parse_udp4;

/// Frames built in the encoder's headroom (AF_XDP) are valid Ethernet/IPv4/UDP datagrams
/// from our link address to the peer's, carrying exactly the link frame, checksums
/// right; the packet socket's frames (`virtio_net_hdr` + the same headers, checksum left
/// to the device) are the same bytes once the device has summed them.
#[test]
fn frames_built_for_the_link_are_valid_udp() {
    let src = SocketAddrV4::new(Ipv4Addr::new(10, 211, 3, 1), 7000);
    let dst = SocketAddrV4::new(Ipv4Addr::new(10, 211, 3, 2), 7001);
    let (ours, peer) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let mut hdr = WireHeader::new(ours, peer, src, dst, 3);
    let mut vnet = WireHeader::new(ours, peer, src, dst, 3);
    let fec = Fec::parse("2+1").unwrap();
    let mut enc = Encoder::new(3, 9, fec, 8);
    assert!(enc.push(21000, 30000, &[7u8; 1000], 1));
    assert!(enc.push(21000, 30000, &[8u8; crate::wire::link::MAX_PAYLOAD], 2)); // completes the block: + 1 repair
    enc.fill_headroom(|b| hdr.write(b));
    let frames: Vec<&[u8]> = enc.ready().collect();
    let wire: Vec<&[u8]> = enc.ready_wire().collect();
    assert_eq!(wire.len(), 3);
    let mut idents = Vec::new();
    for (f, w) in frames.iter().zip(&wire) {
        assert!(w.len() <= 1514, "fits a 1500-byte MTU");
        assert_eq!(&w[0..6], &peer);
        assert_eq!(&w[6..12], &ours);
        let d = parse_udp4(w).unwrap();
        assert!(d.checksums_ok(false));
        assert_eq!((d.src_addr, d.dst_addr), (*src.ip(), *dst.ip()));
        assert_eq!((d.src_port, d.dst_port), (src.port(), dst.port()));
        assert_eq!(d.payload, *f);
        assert!(LinkPacket::new_checked(d.payload).is_ok());
        idents.push(u16::from_be_bytes([w[18], w[19]]));
        // The packet socket's version of the same frame.
        let mut h = [0u8; 64];
        let n = vnet.write_vnet(&mut h, f.len());
        assert_eq!(n, crate::wire::VNET_UDP4_HEADERS);
        let mut p = h[crate::wire::VNET_HDR_LEN..n].to_vec();
        p.extend_from_slice(f);
        assert_eq!(h[0], 1, "VIRTIO_NET_HDR_F_NEEDS_CSUM");
        assert_eq!(
            u16::from_ne_bytes([h[6], h[7]]),
            34,
            "csum_start: the UDP header"
        );
        let c = crate::wire::checksum::finish(crate::wire::checksum::sum(&p[34..]));
        p[40..42].copy_from_slice(&c.to_be_bytes());
        assert!(parse_udp4(&p).unwrap().checksums_ok(false));
        assert_eq!(p[..40], w[..40]);
        assert_eq!(p[42..], w[42..]);
    }
    assert_eq!(idents, [0, 1, 2]);
}

fn test_config(fec: &str) -> SplitConfig {
    let link = |port: u16| LinkConfig {
        interface: "lo".into(),
        local: SocketAddrV4::new(Ipv4Addr::LOCALHOST, port),
        peer: SocketAddrV4::new(Ipv4Addr::LOCALHOST, port + 1),
        peer_mac: None,
        fec: Fec::parse(fec).unwrap(),
        cpu: None,
        reorder_ms: 0,
        max_datagram: MAX_DATAGRAM,
        key: None,
    };
    SplitConfig {
        half: crate::config::split::Half::B,
        peer_face: Ipv4Addr::new(127, 77, 0, 1),
        out_link: link(7000),
        in_link: link(7100),
        signal: crate::config::split_signal::SignalLink {
            interface: "lo".into(),
            local: SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7200),
            peer: SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7201),
            key: crate::config::split_signal::SignalKey::new(vec![7; 32]),
            heartbeat: std::time::Duration::from_millis(500),
            dead_after: std::time::Duration::from_millis(3000),
        },
    }
}

/// The TCP legs' lane: a partial FEC block left open after a leg's read is closed (its
/// repair frames sent) by whoever calls `close_if_due` once `CLOSE_BLOCK_MS` passed —
/// the incoming link's worker — not at the leg's next read.
#[test]
fn the_legs_partial_block_is_closed_on_time() {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    rx.set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .unwrap();
    let sock = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
    let mut cfg = test_config("8+2");
    cfg.out_link.peer = match rx.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        _ => unreachable!(),
    };
    let stats = Arc::new(SplitStats::new(&cfg));
    let mut tx = LinkTx::new(
        Wire::Udp(sock),
        &cfg.out_link,
        EDGE_LANE,
        1,
        EDGE_BATCH,
        Arc::clone(&stats),
    );
    let t0 = 1_000;
    // A 4000-byte datagram: three fragments of one partial block.
    assert!(tx.push(21000, 30000, 5, &[9u8; 4000], t0, 0));
    tx.flush();
    tx.idle(t0 + 1);
    let edge = EdgeLink::default();
    edge.set(DomainId::A, tx);
    let m = edge.toward(DomainId::A).unwrap();
    edge.sent(&m.lock().unwrap());
    assert_eq!(edge.close_due(), Some(t0 + CLOSE_BLOCK_MS));
    let mut buf = [0u8; 2048];
    let mut frames = Vec::new();
    while let Ok(n) = rx.recv(&mut buf) {
        frames.push(
            LinkPacket::new_checked(&buf[..n - TRAILER_LEN])
                .unwrap()
                .kind(),
        );
    }
    assert_eq!(frames, [Kind::Data; 3], "the data frames went out at once");
    edge.close_if_due(t0 + CLOSE_BLOCK_MS - 1);
    assert!(rx.recv(&mut buf).is_err(), "not due yet");
    edge.close_if_due(t0 + CLOSE_BLOCK_MS);
    let mut frames = Vec::new();
    while let Ok(n) = rx.recv(&mut buf) {
        let p = LinkPacket::new_checked(&buf[..n - TRAILER_LEN]).unwrap();
        frames.push((p.kind(), p.fec_k()));
    }
    assert_eq!(
        frames,
        [(Kind::Repair, 3); 2],
        "the partial block's repairs"
    );
    assert_eq!(edge.close_due(), None);
    assert_eq!(stats.out_link.snapshot().repair_packets, 2);
    assert_eq!(stats.out_link.snapshot().fragmented, 1);
}

/// The same through the real incoming link worker, asleep (nothing due; its longest
/// sleep made 20 s here, 100 ms in service) when a leg leaves a partial block open: the
/// leg's `sent` wakes it, and it closes the block about [`CLOSE_BLOCK_MS`] later. The
/// bound (5 s) is generous for a loaded machine, and far below the sleep a missing
/// wakeup would leave it in.
#[test]
fn the_incoming_workers_sleep_does_not_hold_the_legs_block() {
    use crate::routes::PortHooks;
    use std::time::{Duration, Instant};
    let registry = Arc::new(PortRegistry::new([Ipv4Addr::LOCALHOST; 2]));
    let routes = Arc::new(Routes::new(
        &crate::config::Config::embedded_default(),
        Arc::clone(&registry) as Arc<dyn PortHooks>,
    ));
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut cfg = test_config("8+2");
    cfg.out_link.peer = match rx.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        _ => unreachable!(),
    };
    let stats = Arc::new(SplitStats::new(&cfg));
    let tx = LinkTx::new(
        Wire::Udp(Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap())),
        &cfg.out_link,
        EDGE_LANE,
        1,
        EDGE_BATCH,
        Arc::clone(&stats),
    );
    registry.edge_link.set(DomainId::A, tx);
    // The incoming link's worker, its peer not this host: a datagram we send it is
    // counted `foreign_source`, which tells us it is awake and about to sleep.
    let link_sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let link_addr = link_sock.local_addr().unwrap();
    let wake = registry.attach_sender().unwrap();
    registry.edge_link.set_waker(Arc::clone(&wake.wake));
    let path = RxPath {
        sock: link_sock,
        registry: Arc::clone(&registry),
        face: cfg.link_face(),
        peer_face: cfg.peer_face,
        peer: Ipv4Addr::new(192, 0, 2, 1),
        split: Arc::clone(&stats),
        local: EgressSockets::new(),
        batch: 8,
        fec: cfg.in_link.fec,
        reorder_ms: 0,
        max_payload: MAX_DATAGRAM,
        overflow_seen: 0,
        auth: LinkAuth::new(None),
        replay: Replay::default(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let worker = spawn(0, None, &routes, &stop, Some(wake), move |_: &Shell| {
        Ok(RxState {
            rx: RecvBatch::new(path.batch, FRAME_CAP + 1),
            dec: Decoder::with_reorder(path.fec, path.reorder_ms),
            join: Joiner::new(false),
            out: Delivery::new(path.batch * BUDGET),
            path,
            idle_cap_ms: 20_000,
        })
    })
    .unwrap();
    let poke = UdpSocket::bind("127.0.0.1:0").unwrap();
    let foreign = || stats.in_link.snapshot().drop_count(LinkDrop::ForeignSource);
    let mut buf = [0u8; 2048];
    for round in 1..=3 {
        poke.send_to(b"wake up", link_addr).unwrap();
        while foreign() < round {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Let it go back to sleep (nothing due: 20 s).
        std::thread::sleep(Duration::from_millis(5));
        let m = registry.edge_link.toward(DomainId::A).unwrap();
        let t0 = Instant::now();
        {
            let mut tx = m.lock().unwrap();
            assert!(tx.push(21000, 30000, round as u32, &[9u8; 4000], now_ms(), 0));
            tx.flush();
            registry.edge_link.sent(&tx);
        }
        let mut kinds = Vec::new();
        while kinds.len() < 5 {
            let n = rx.recv(&mut buf).expect("the block's frames and repairs");
            kinds.push(
                LinkPacket::new_checked(&buf[..n - TRAILER_LEN])
                    .unwrap()
                    .kind(),
            );
        }
        let took = t0.elapsed();
        assert_eq!(
            kinds,
            [
                Kind::Data,
                Kind::Data,
                Kind::Data,
                Kind::Repair,
                Kind::Repair
            ]
        );
        assert!(
            took < Duration::from_secs(5),
            "round {round}: the repairs came after {took:?}"
        );
        // The worker clears the due time just after it sent the repairs (`close_if_due`:
        // `idle` then `sent`), so the frames can arrive here first: wait for it.
        let until = Instant::now() + Duration::from_secs(5);
        while registry.edge_link.close_due().is_some() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(registry.edge_link.close_due(), None);
    }
    stop.store(true, Relaxed);
    // Wake it to see the stop (its sleep is long here).
    poke.send_to(b"stop", link_addr).unwrap();
    worker.thread.join().unwrap();
}

/// Frames a keyed sender sends, as the receiver's [`open_frame`] takes them: each once,
/// with FEC off and on; a forged one (right header, no key) and a replayed one refused
/// with their reasons; after the sender starts again (a new `LinkTx`: a new epoch), the
/// first process's frames are refused as `stale_epoch`.
#[test]
fn keyed_frames_are_taken_once_and_forgeries_and_replays_refused() {
    use crate::link::auth::LinkKey;
    for fec in ["off", "4+2"] {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .unwrap();
        let mut cfg = test_config(fec);
        cfg.out_link.peer = match rx.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        let key = LinkKey::derive(&[0x5a; 32], "b");
        cfg.out_link.key = Some(key.clone());
        let stats = Arc::new(SplitStats::new(&cfg));
        let sock = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
        let send = |n: u32| {
            let mut tx = LinkTx::new(
                Wire::Udp(Arc::clone(&sock)),
                &cfg.out_link,
                2,
                1,
                8,
                Arc::clone(&stats),
            );
            for i in 0..n {
                assert!(tx.push(21000, 30000, i, &[i as u8; 1316], 0, 0));
            }
            tx.flush();
            tx.idle(u64::MAX / 2);
            let mut buf = [0u8; 2048];
            let mut frames = Vec::new();
            while let Ok(n) = rx.recv(&mut buf) {
                frames.push(buf[..n].to_vec());
            }
            frames
        };
        let first = send(8);
        let data = 8;
        let repairs = if fec == "off" { 0 } else { 4 };
        assert_eq!(first.len(), data + repairs, "fec {fec}");
        let auth = LinkAuth::new(Some(&key));
        let mut replay = Replay::default();
        for f in &first {
            assert!(open_frame(&auth, &mut replay, f).is_ok(), "fec {fec}");
        }
        for f in &first {
            assert_eq!(
                open_frame(&auth, &mut replay, f).err(),
                Some(LinkDrop::Duplicate),
                "fec {fec}: a replay"
            );
        }
        // A forgery: a well-formed frame of a later sequence, trailer without the key.
        let mut forged = first[0].clone();
        forged[8..12].copy_from_slice(&1000u32.to_be_bytes());
        LinkAuth::new(None).seal(&mut forged, u64::MAX);
        assert_eq!(
            open_frame(&auth, &mut replay, &forged).err(),
            Some(LinkDrop::BadMac)
        );
        // Another direction's key does not open it either.
        let other = LinkAuth::new(Some(&LinkKey::derive(&[0x5a; 32], "a")));
        assert_eq!(
            open_frame(&other, &mut Replay::default(), &first[0]).err(),
            Some(LinkDrop::BadMac)
        );
        // The sender restarts: its frames start a new epoch; the old ones are stale.
        let second = send(8);
        for f in &second {
            assert!(open_frame(&auth, &mut replay, f).is_ok(), "fec {fec}");
        }
        for f in &first {
            assert_eq!(
                open_frame(&auth, &mut replay, f).err(),
                Some(LinkDrop::StaleEpoch),
                "fec {fec}"
            );
        }
        // Unkeyed, the trailer still carries the epoch: replays are refused all the same.
        let mut plain = Replay::default();
        let none = LinkAuth::new(None);
        assert!(open_frame(&none, &mut plain, &second[0]).is_ok());
        assert_eq!(
            open_frame(&none, &mut plain, &second[0]).err(),
            Some(LinkDrop::Duplicate)
        );
    }
}

/// A hot-standby pair of half A ([`crate::ha`]): the standby's lane started *before* the
/// active's, so its start epoch is older than the one half B's window holds. When it takes
/// over (the gate's openings move) its lane takes a new epoch at its next flush and half B
/// takes its frames; without following the gate every one of them would be `stale_epoch`.
#[test]
fn a_standby_that_takes_over_sends_a_newer_epoch_than_the_old_active() {
    use crate::link::auth::LinkKey;
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    rx.set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .unwrap();
    let mut cfg = test_config("off");
    cfg.out_link.peer = match rx.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        _ => unreachable!(),
    };
    let key = LinkKey::derive(&[0x3c; 32], "a");
    cfg.out_link.key = Some(key.clone());
    let stats = Arc::new(SplitStats::new(&cfg));
    let sock = Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
    let lane = |activations: &Arc<AtomicU64>| {
        LinkTx::new(
            Wire::Udp(Arc::clone(&sock)),
            &cfg.out_link,
            0,
            1,
            8,
            Arc::clone(&stats),
        )
        .follow_activations(Arc::clone(activations))
    };
    let frames = |tx: &mut LinkTx, from: u32, n: u32| {
        for i in from..from + n {
            assert!(tx.push(21000, 30000, i, &[i as u8; 200], 0, 0));
        }
        tx.flush();
        let mut buf = [0u8; 2048];
        let mut out = Vec::new();
        while let Ok(n) = rx.recv(&mut buf) {
            out.push(buf[..n].to_vec());
        }
        out
    };
    // The standby node's lane first (older epoch), then the active's.
    let standby_gate = Arc::new(AtomicU64::new(0));
    let mut standby = lane(&standby_gate);
    let active_gate = Arc::new(AtomicU64::new(0));
    let mut active = lane(&active_gate);
    let auth = LinkAuth::new(Some(&key));
    let mut replay = Replay::default();
    for f in frames(&mut active, 0, 20) {
        assert!(open_frame(&auth, &mut replay, &f).is_ok());
    }
    // What the standby's lane would send without a takeover: older than the active's.
    let mut unfollowed = LinkTx::new(
        Wire::Udp(Arc::clone(&sock)),
        &cfg.out_link,
        0,
        1,
        8,
        Arc::clone(&stats),
    );
    unfollowed.epoch = standby.epoch;
    for f in frames(&mut unfollowed, 0, 3) {
        assert_eq!(
            open_frame(&auth, &mut replay, &f).err(),
            Some(LinkDrop::StaleEpoch)
        );
    }
    // The active dies; the standby's gate opens (Routes::set_standby(false) counts it).
    standby_gate.fetch_add(1, Relaxed);
    let after = frames(&mut standby, 0, 20);
    assert_eq!(after.len(), 20);
    for f in &after {
        assert!(open_frame(&auth, &mut replay, f).is_ok());
    }
    // The old active's frames, replayed after the takeover: stale now.
    let old = frames(&mut active, 20, 2);
    for f in &old {
        assert_eq!(
            open_frame(&auth, &mut replay, f).err(),
            Some(LinkDrop::StaleEpoch)
        );
    }
    // No gate movement: the epoch stays (frames continue in the window).
    let more = frames(&mut standby, 20, 5);
    for f in &more {
        assert!(open_frame(&auth, &mut replay, f).is_ok());
    }
}
