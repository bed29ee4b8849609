use super::blocks::{bd, ne_u32, ph, ph2};
use super::filter::DROP_ALL;
use super::*;
use crate::wire::testutil::udp4_frame;
use std::net::Ipv4Addr;

/// A classic BPF interpreter for the opcodes the filter uses, with the kernel's
/// semantics for out-of-bounds loads (the program returns 0).
fn run(prog: &[BpfInsn], pkt: &[u8]) -> u32 {
    use bpf::*;
    let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
    let load = |at: usize, n: usize| -> Option<u32> {
        let s = pkt.get(at..at + n)?;
        Some(s.iter().fold(0u32, |acc, b| acc << 8 | u32::from(*b)))
    };
    loop {
        let i = prog[pc];
        pc += 1;
        let size = |c: u16| match c & 0x18 {
            H => 2,
            B => 1,
            _ => 4,
        };
        match i.code & 0x07 {
            LD => {
                let at = match i.code & 0xe0 {
                    ABS => i.k as usize,
                    IND => x as usize + i.k as usize,
                    m => panic!("mode {m:#x}"),
                };
                match load(at, size(i.code)) {
                    Some(v) => a = v,
                    None => return 0,
                }
            }
            LDX => {
                assert_eq!(i.code & 0xe0, MSH);
                match load(i.k as usize, 1) {
                    Some(v) => x = 4 * (v & 0xf),
                    None => return 0,
                }
            }
            JMP => {
                let t = match i.code & 0xf0 {
                    JEQ => a == i.k,
                    JGT => a > i.k,
                    JGE => a >= i.k,
                    JSET => a & i.k != 0,
                    op => panic!("jmp {op:#x}"),
                };
                pc += usize::from(if t { i.jt } else { i.jf });
            }
            RET => return i.k,
            c => panic!("class {c:#x}"),
        }
    }
}

const S: Ipv4Addr = Ipv4Addr::new(10, 201, 1, 2);
const D: Ipv4Addr = Ipv4Addr::new(10, 201, 1, 1);

#[test]
fn bpf_filter_accepts_only_the_range() {
    let prog = udp_dport_filter(20000, 20099).unwrap();
    for (port, keep) in [
        (19999, false),
        (20000, true),
        (20050, true),
        (20099, true),
        (20100, false),
    ] {
        let f = udp4_frame(None, (S, 5004), (D, port), b"rtp");
        assert_eq!(run(&prog, &f) != 0, keep, "port {port}");
    }
    // IP options move the UDP header: X must follow the IHL.
    let mut f = udp4_frame(None, (S, 5004), (D, 20001), b"rtp");
    f[14] = 0x46;
    f.splice(34..34, [1, 1, 1, 1]);
    assert_ne!(run(&prog, &f), 0);
    f[34 + 4 + 2..34 + 4 + 4].copy_from_slice(&30000u16.to_be_bytes());
    assert_eq!(run(&prog, &f), 0);
}

#[test]
fn bpf_filter_refuses_other_traffic() {
    let prog = udp_dport_filter(20000, 20099).unwrap();
    let good = udp4_frame(None, (S, 5004), (D, 20000), b"rtp");
    let mut tcp = good.clone();
    tcp[23] = 6;
    assert_eq!(run(&prog, &tcp), 0);
    let mut v6 = good.clone();
    v6[12..14].copy_from_slice(&[0x86, 0xdd]);
    assert_eq!(run(&prog, &v6), 0);
    let mut later_frag = good.clone();
    later_frag[20..22].copy_from_slice(&0x0001u16.to_be_bytes());
    assert_eq!(run(&prog, &later_frag), 0);
    let mut first_frag = good.clone();
    first_frag[20..22].copy_from_slice(&0x2000u16.to_be_bytes());
    assert_ne!(run(&prog, &first_frag), 0);
    // The program reads up to the destination port, byte 38.
    for n in 0..38 {
        assert_eq!(run(&prog, &good[..n]), 0, "prefix {n}");
    }
    assert_eq!(run(&DROP_ALL, &good), 0);
    assert!(udp_dport_filter(2, 1).is_err());
    let single = udp_dport_filter(20000, 20000).unwrap();
    assert_ne!(run(&single, &good), 0);
}

#[test]
fn bpf_filter_matches_address_and_range_per_domain() {
    let other = Ipv4Addr::new(10, 201, 2, 1);
    let prog = udp_dst_filter(&[
        DstMatch {
            addr: Some(D),
            ports: 20000..=20099,
        },
        DstMatch {
            addr: Some(other),
            ports: 30000..=30099,
        },
    ])
    .unwrap();
    for (dst, port, keep) in [
        (D, 20000, true),
        (D, 20099, true),
        (D, 30000, false),
        (other, 30050, true),
        (other, 20050, false),
        (S, 20050, false),
        (D, 19999, false),
        (other, 30100, false),
    ] {
        let f = udp4_frame(None, (S, 5004), (dst, port), b"rtp");
        assert_eq!(run(&prog, &f) != 0, keep, "{dst}:{port}");
    }
    let mut tcp = udp4_frame(None, (S, 5004), (D, 20000), b"rtp");
    tcp[23] = 6;
    assert_eq!(run(&prog, &tcp), 0);
}

#[test]
fn ring_is_send() {
    fn send<T: Send>() {}
    send::<PacketRing>();
    // Not `Sync`: see the `compile_fail` example on `PacketRing`.
}

#[test]
fn params_are_checked() {
    let ok = RingParams::default();
    assert!(check_params(&ok).is_ok());
    let bad = [
        RingParams {
            block_size: 1000,
            ..ok.clone()
        },
        RingParams {
            block_size: 3 * 4096,
            ..ok.clone()
        },
        RingParams {
            block_count: 0,
            ..ok.clone()
        },
        RingParams {
            frame_size: 40,
            ..ok.clone()
        },
        RingParams {
            frame_size: 2050,
            ..ok.clone()
        },
        RingParams {
            block_timeout_ms: 0,
            ..ok.clone()
        },
        RingParams {
            version: RingVersion::V2,
            frame_size: 32,
            ..ok.clone()
        },
        RingParams {
            block_size: 1 << 30,
            block_count: 8,
            ..ok.clone()
        },
    ];
    for p in bad {
        assert!(
            matches!(check_params(&p), Err(AfPacketError::BadParams(_))),
            "{p:?}"
        );
    }
    // A V2 ring has no block timer.
    let v2 = RingParams {
        version: RingVersion::V2,
        block_timeout_ms: 0,
        ..ok.clone()
    };
    assert!(check_params(&v2).is_ok());
    #[allow(clippy::reversed_empty_ranges)]
    let r = RingParams {
        filter: vec![DstMatch {
            addr: None,
            ports: 10..=9,
        }],
        ..ok
    };
    assert!(matches!(
        check_params(&r),
        Err(AfPacketError::BadPortRange { lo: 10, hi: 9 })
    ));
}

#[test]
fn interface_names_are_checked() {
    for n in ["", "a/b", "has space", "sixteen-chars-xx", "nul\0"] {
        assert!(
            matches!(
                resolve_ifname(n),
                Err(AfPacketError::BadInterfaceName { .. })
            ),
            "{n:?}"
        );
    }
    assert!(matches!(
        resolve_ifname("vgnosuchif0"),
        Err(AfPacketError::NoSuchInterface { .. })
    ));
}

/// A synthetic block laid out like the kernel's, walked by `Frames`; the writable walk
/// (`FramesMut`) over a copy must see the same frames at the same places.
fn frames(blk: &[u8]) -> Vec<Frame<'_>> {
    let left = ne_u32(blk, bd::NUM_PKTS).unwrap();
    let pos = ne_u32(blk, bd::FIRST_PKT).unwrap() as usize;
    let v: Vec<Frame<'_>> = Frames {
        block: blk,
        pos,
        left,
        version: RingVersion::V3,
    }
    .collect();
    let mut copy = blk.to_vec();
    let base = copy.as_ptr() as usize;
    let w: Vec<(usize, usize, u32, u32)> = FramesMut::of_slot(&mut copy, RingVersion::V3)
        .map(|f| {
            (
                f.data.as_ptr() as usize - base,
                f.data.len(),
                f.wire_len,
                f.status,
            )
        })
        .collect();
    let r: Vec<(usize, usize, u32, u32)> = v
        .iter()
        .map(|f| {
            (
                f.data.as_ptr() as usize - blk.as_ptr() as usize,
                f.data.len(),
                f.wire_len,
                f.status,
            )
        })
        .collect();
    assert_eq!(w, r, "FramesMut walks as Frames does");
    v
}

/// A real ring on `lo`: rounds of several blocks taken at once see every datagram once,
/// and give their blocks back (the ring is smaller than what passes through it, so a
/// block kept would freeze it and lose the later rounds). Needs CAP_NET_RAW.
#[test]
fn try_blocks_takes_several_blocks_and_gives_them_all_back() {
    rounds_through_a_small_ring(RingVersion::V3);
}

/// The same with a V2 ring: 16 frames of 2 KiB, 48 datagrams through it.
#[test]
fn try_blocks_takes_several_v2_frames_and_gives_them_all_back() {
    rounds_through_a_small_ring(RingVersion::V2);
}

fn rounds_through_a_small_ring(version: RingVersion) {
    use std::net::UdpSocket;
    use std::time::{Duration, Instant};
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = sink.local_addr().unwrap().port();
    let params = RingParams {
        version,
        block_size: 4096,
        block_count: 8,
        frame_size: 2048,
        block_timeout_ms: 1,
        filter: vec![DstMatch {
            addr: Some(Ipv4Addr::LOCALHOST),
            ports: port..=port,
        }],
    };
    let mut ring = match PacketRing::open("lo", FanoutGroup::Unique, Fanout::Hash, &params) {
        Ok(r) => r,
        Err(e) => {
            crate::test_did_not_run(
                "try_blocks on a real ring",
                format!("no AF_PACKET ring on lo ({e})"),
            );
            return;
        }
    };
    let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (mut seen, mut multi) = (Vec::new(), 0);
    for round in 0..4u8 {
        // 12 datagrams of 1000 bytes: about 4 blocks of 4 KiB, so 16 blocks in all
        // through a ring of 8.
        for i in 0..12u8 {
            sender
                .send_to(&[round * 16 + i; 1000], ("127.0.0.1", port))
                .unwrap();
        }
        let until = Instant::now() + Duration::from_secs(5);
        let want = 12 * (usize::from(round) + 1);
        while seen.len() < want && Instant::now() < until {
            let blocks = ring.try_blocks(16);
            multi += usize::from(blocks.len() > 1);
            for k in 0..blocks.len() {
                for f in blocks.frames(k) {
                    assert!(!f.truncated(), "{version:?}: a 1000-byte datagram fits");
                    if let Ok(d) = crate::wire::parse_udp4(f.data) {
                        if d.dst_port == port {
                            assert_eq!(d.payload.len(), 1000);
                            seen.push(d.payload[0]);
                        }
                    }
                }
            }
            drop(blocks);
            std::thread::sleep(Duration::from_millis(3));
        }
        assert_eq!(seen.len(), want, "round {round}: every datagram once");
    }
    let mut sorted = seen.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 48, "no datagram twice: {seen:?}");
    assert_eq!(
        ring.stats().unwrap().drops,
        0,
        "the ring never ran out of blocks"
    );
    eprintln!("rounds that took more than one block: {multi}");
}

#[test]
fn a_v2_slot_holds_one_frame_and_its_bounds_are_checked() {
    let mut slot = vec![0u8; 2048];
    let w = |slot: &mut Vec<u8>, off: usize, v: u32| {
        slot[off..off + 4].copy_from_slice(&v.to_ne_bytes())
    };
    let status = libc::TP_STATUS_USER | libc::TP_STATUS_CSUMNOTREADY | libc::TP_STATUS_VLAN_VALID;
    w(&mut slot, ph2::STATUS, status);
    w(&mut slot, ph2::LEN, 110);
    w(&mut slot, ph2::SNAPLEN, 100);
    w(&mut slot, ph2::SEC, 7);
    w(&mut slot, ph2::NSEC, 9);
    slot[ph2::MAC..ph2::MAC + 2].copy_from_slice(&82u16.to_ne_bytes());
    slot[ph2::VLAN_TCI..ph2::VLAN_TCI + 2].copy_from_slice(&0x2005u16.to_ne_bytes());
    slot[82] = 0xab;
    let got: Vec<Frame<'_>> = Frames::of_slot(&slot, RingVersion::V2).collect();
    assert_eq!(got.len(), 1);
    let f = got[0];
    assert_eq!((f.data.len(), f.data[0], f.wire_len), (100, 0xab, 110));
    assert!(f.truncated() && f.csum_not_ready());
    assert_eq!(
        (f.vlan_tci, f.rxhash, f.sec, f.nsec),
        (Some(0x2005), 0, 7, 9)
    );
    // A snap length past the slot's end ends the walk, no panic.
    w(&mut slot, ph2::SNAPLEN, 2000);
    assert_eq!(Frames::of_slot(&slot, RingVersion::V2).count(), 0);
    assert_eq!(Frames::of_slot(&slot[..10], RingVersion::V2).count(), 0);
}

#[test]
fn frames_walk_and_bounds() {
    let mut blk = vec![0u8; 4096];
    let first = 48usize;
    blk[bd::NUM_PKTS..bd::NUM_PKTS + 4].copy_from_slice(&2u32.to_ne_bytes());
    blk[bd::FIRST_PKT..bd::FIRST_PKT + 4].copy_from_slice(&(first as u32).to_ne_bytes());
    let put = |blk: &mut Vec<u8>, pos: usize, next: u32, snap: u32, status: u32| {
        let w = |blk: &mut Vec<u8>, off: usize, v: u32| {
            blk[pos + off..pos + off + 4].copy_from_slice(&v.to_ne_bytes())
        };
        w(blk, ph::NEXT_OFFSET, next);
        w(blk, ph::SNAPLEN, snap);
        w(blk, ph::LEN, snap + 10);
        w(blk, ph::STATUS, status);
        w(blk, ph::VLAN_TCI, 0x2005);
        w(blk, ph::RXHASH, 0xdead_beef);
        blk[pos + ph::MAC..pos + ph::MAC + 2].copy_from_slice(&66u16.to_ne_bytes());
    };
    put(
        &mut blk,
        first,
        256,
        60,
        libc::TP_STATUS_USER | libc::TP_STATUS_VLAN_VALID,
    );
    put(
        &mut blk,
        first + 256,
        0,
        100,
        libc::TP_STATUS_USER | libc::TP_STATUS_LOSING,
    );
    let v = frames(&blk);
    assert_eq!(v.len(), 2);
    assert_eq!(
        (v[0].data.len(), v[0].vlan_tci, v[0].rxhash),
        (60, Some(0x2005), 0xdead_beef)
    );
    assert!(v[0].truncated() && !v[0].losing());
    assert_eq!((v[1].data.len(), v[1].vlan_tci), (100, None));
    assert!(v[1].losing());
    // Snaplen running past the block: iteration stops, no panic.
    let mut bad = blk.clone();
    bad[first + 256 + ph::SNAPLEN..first + 256 + ph::SNAPLEN + 4]
        .copy_from_slice(&5000u32.to_ne_bytes());
    assert_eq!(frames(&bad).len(), 1);
    // More packets announced than chained: stops at the zero next-offset.
    let mut bad = blk.clone();
    bad[bd::NUM_PKTS..bd::NUM_PKTS + 4].copy_from_slice(&9u32.to_ne_bytes());
    assert_eq!(frames(&bad).len(), 2);
    // First packet offset outside the block.
    let mut bad = blk.clone();
    bad[bd::FIRST_PKT..bd::FIRST_PKT + 4].copy_from_slice(&u32::MAX.to_ne_bytes());
    assert_eq!(frames(&bad).len(), 0);
    // A chain that goes back into the first frame's bytes: the read-only walk would hand
    // out overlapping frames, the writable one stops after the first.
    let mut back = blk.clone();
    back[first + ph::NEXT_OFFSET..first + ph::NEXT_OFFSET + 4].copy_from_slice(&4u32.to_ne_bytes());
    let n = FramesMut::of_slot(&mut back, RingVersion::V3).count();
    assert_eq!(n, 1);
    // Writing every frame's bytes touches only those bytes.
    let mut w = blk.clone();
    for f in FramesMut::of_slot(&mut w, RingVersion::V3) {
        f.data.fill(0xa5);
    }
    let marked = w.iter().zip(&blk).filter(|(a, b)| a != b).count();
    assert_eq!(marked, 60 + 100, "exactly the two frames' bytes changed");
}
