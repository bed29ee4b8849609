use super::*;

#[test]
fn value_layout_is_what_the_program_reads() {
    let v = FastValue {
        flags: ACTIVE | CHECK_ADDR,
        src: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 9), 5004),
        mtu: 1500,
        saddr: Ipv4Addr::new(10, 0, 1, 1),
        daddr: Ipv4Addr::new(10, 0, 1, 2),
        sport: 30000,
        dport: 40000,
        devkey: 1,
        slot: 7,
        dmac: [1, 2, 3, 4, 5, 6],
        smac: [7, 8, 9, 10, 11, 12],
    }
    .encode();
    assert_eq!(u32::from_ne_bytes(v[0..4].try_into().unwrap()), 3);
    assert_eq!(&v[4..10], &[10, 0, 0, 9, 0x13, 0x8c]);
    assert_eq!(u16::from_ne_bytes([v[10], v[11]]), 1500);
    assert_eq!(&v[12..20], &[10, 0, 1, 1, 10, 0, 1, 2]);
    assert_eq!(&v[20..24], &[0x75, 0x30, 0x9c, 0x40]);
    assert_eq!(u32::from_ne_bytes(v[24..28].try_into().unwrap()), 1);
    assert_eq!(u32::from_ne_bytes(v[28..32].try_into().unwrap()), 7);
    assert_eq!(&v[32..44], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
}

#[test]
fn failures_come_off_the_frames_they_follow_and_sent_is_confirmed_a_poll_later() {
    // Poll 1: 10 redirected, none failed yet: held.
    let (sent, held) = confirm((0, 0), (10, 1000), 0);
    assert_eq!((sent, held), ((0, 0), (10, 1000)));
    // Poll 2: 3 of them failed (seen late), 5 new: 7 confirmed, the 5 held.
    let (sent, held) = confirm(held, (5, 500), 3);
    assert_eq!((sent, held), ((7, 700), (5, 500)));
    // Poll 3: nothing new, 5 failed: all accounted, nothing held.
    let (sent, held) = confirm(held, (0, 0), 5);
    assert_eq!((sent, held), ((0, 0), (0, 0)));
    // Failures beyond the held frames of this and the last poll take what there is.
    let (sent, held) = confirm((2, 200), (1, 100), 5);
    assert_eq!((sent, held), ((0, 0), (0, 0)));
    // Nothing new and nothing failed: the old ones are sent.
    assert_eq!(confirm((4, 400), (0, 0), 0), ((4, 400), (0, 0)));
}

#[test]
fn watch_programs_jump_inside_and_exit() {
    let off = DevOffsets {
        ifindex: 224,
        nd_net: 264,
        inum: 176,
    };
    for p in [
        redirect_err_program(5, 77),
        devmap_xmit_program(5, off, &[(1, 3)], &[3], 0xf000_0001),
        devmap_xmit_program(5, off, &[(0, 2), (1, 3)], &[2, 3], 4026531840),
        devmap_xmit_program(5, off, &[(0, 2)], &[2, 3, 4], 4026531840),
    ] {
        for (i, insn) in p.iter().enumerate() {
            let class = insn.code & 0x07;
            if (class == 0x05 || class == 0x06) && insn.code != CALL && insn.code != EXIT {
                let target = i as isize + 1 + insn.off as isize;
                assert!(target > i as isize && (target as usize) < p.len(), "{i}");
            }
        }
        let maps: Vec<i32> = p
            .iter()
            .filter(|i| i.code == LD_IMM64)
            .map(|i| i.imm)
            .collect();
        assert_eq!(maps, vec![5]);
        assert_eq!(p.last().map(|i| i.code), Some(EXIT));
    }
}

/// The poll's batch read of the counter slots gives what one lookup per slot gives,
/// across batch boundaries and for a range that is not a multiple of the batch. Needs
/// CAP_BPF (the namespace tests' privileges); says so and returns without it, except
/// under `CI=true`, where a missing prerequisite is a failure.
#[test]
fn batch_read_of_the_counters_matches_one_lookup_per_slot() {
    let fp = match FastPath::new([None, None], &[], 1316) {
        Ok(f) => f,
        Err(e) => {
            crate::test_did_not_run(
                "batch_read_of_the_counters_matches_one_lookup_per_slot",
                format!("no BPF maps here ({e})"),
            );
            return;
        }
    };
    let ncpu = fp.stats.lookup_len() / 16;
    let slots = 2 * BATCH as u32 + 37;
    for slot in (0..slots).step_by(7) {
        let mut v = Vec::new();
        for cpu in 0..ncpu as u64 {
            v.extend_from_slice(&(u64::from(slot) * 10 + cpu).to_ne_bytes());
            v.extend_from_slice(&(u64::from(slot) * 1000 + cpu).to_ne_bytes());
        }
        fp.stats.update(&slot.to_ne_bytes(), &v).unwrap();
    }
    let mut st = fp.lock();
    // As if every block held a slot in use (none is read otherwise).
    st.free.in_block.fill(1);
    assert!(fp.read_slots(&mut st, slots));
    assert!(
        !st.no_batch,
        "this kernel (6.x) takes batch lookups of per-CPU arrays"
    );
    assert_eq!(st.sums.len(), slots as usize);
    let cpus: u64 = (0..ncpu as u64).sum();
    let mut buf = vec![0u8; fp.stats.lookup_len()];
    for slot in 0..slots {
        let one = fp.read(&mut buf, slot).unwrap();
        assert_eq!(st.sums[slot as usize], one, "slot {slot}");
        if slot % 7 == 0 {
            let n = ncpu as u64;
            assert_eq!(
                one,
                (
                    u64::from(slot) * 10 * n + cpus,
                    u64::from(slot) * 1000 * n + cpus
                )
            );
        } else {
            assert_eq!(one, (0, 0));
        }
    }
    // The per-slot fallback gives the same; the poll after the last retry tries a batch
    // again.
    st.no_batch = true;
    st.batch_retry = 2;
    let batched = std::mem::take(&mut st.sums);
    assert!(fp.read_slots(&mut st, slots));
    assert_eq!(st.sums, batched);
    assert!(st.no_batch, "one retry left");
    assert!(fp.read_slots(&mut st, slots));
    assert!(!st.no_batch, "batch lookups again");
    assert_eq!(st.sums, batched);
    // A block with no slot in use is not read (its slots read as zero), in both ways.
    st.free.in_block[1] = 0;
    let mut skipped = batched.clone();
    skipped[BATCH..2 * BATCH].fill((0, 0));
    assert_ne!(skipped, batched, "block 1 holds counters");
    assert!(fp.read_slots(&mut st, slots));
    assert_eq!(st.sums, skipped);
    st.no_batch = true;
    st.batch_retry = 2;
    assert!(fp.read_slots(&mut st, slots));
    assert_eq!(st.sums, skipped);
    // A slot that cannot be read (beyond the map) makes the read fail, in both ways,
    // with nothing in `sums` (the fallback once made it (0, 0), a wrapped growth).
    st.free.in_block.fill(1);
    for no_batch in [true, false] {
        st.no_batch = no_batch;
        st.batch_retry = 2;
        assert!(!fp.read_slots(&mut st, SLOTS + 1), "no_batch {no_batch}");
        if no_batch {
            assert!(st.sums.is_empty());
        }
    }
}

/// Slots are handed out lowest first, and counted per block.
#[test]
fn the_lowest_free_slot_is_handed_out_first() {
    let mut s = Slots::new();
    assert_eq!((s.take(), s.take(), s.take()), (Some(0), Some(1), Some(2)));
    assert_eq!(s.in_block[0], 3);
    s.put(1);
    s.put(0);
    assert_eq!(s.take(), Some(0));
    assert_eq!(s.take(), Some(1));
    assert_eq!(s.take(), Some(3));
    for x in [0, 1, 2, 3] {
        s.put(x);
    }
    assert!(!s.block_used(0));
    assert!(
        s.block_used(s.in_block.len()),
        "beyond the map: read (and fail)"
    );
    let all: Vec<u32> = std::iter::from_fn(|| s.take()).collect();
    assert_eq!(all, (0..SLOTS).collect::<Vec<_>>());
    assert!(s.in_block.iter().all(|&n| n as usize == BATCH));
}

#[test]
fn only_decidable_routes_get_an_entry() {
    use crate::routes::RouteSpec;
    let spec = |policy, expected, rtp_only| RouteSpec {
        ingress: DomainId::A,
        port: 20000,
        dest: SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, 2), 40000),
        egress_port: 30000,
        policy,
        expected,
        rtp_only,
        label: "t".into(),
        media: None,
    };
    let src = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 9), 5004);
    let r = |p, e, o| StreamRoute::new(spec(p, e, o), 1);
    assert_eq!(
        entry_policy(&r(SourcePolicy::Any, None, false)).unwrap().0,
        ACTIVE
    );
    assert!(
        entry_policy(&r(SourcePolicy::Any, None, true)).is_none(),
        "rtp_only"
    );
    assert!(entry_policy(&r(SourcePolicy::Strict, None, false)).is_none());
    let mut validated = spec(SourcePolicy::Any, None, false);
    validated.media = Some(crate::media::Rule {
        enforce: true,
        spec: crate::media::StreamSpec::new(None).with(96, crate::media::Codec::H264, 90000),
        policy: Default::default(),
    });
    assert!(
        entry_policy(&StreamRoute::new(validated, 1)).is_none(),
        "a route that validates its media stays in user space"
    );
    let addr_only = SocketAddrV4::new(*src.ip(), 0);
    assert_eq!(
        entry_policy(&r(SourcePolicy::Strict, Some(addr_only), false)),
        Some((ACTIVE | CHECK_ADDR, addr_only))
    );
    let latch = r(SourcePolicy::Latch, Some(addr_only), false);
    assert!(entry_policy(&latch).is_none(), "not latched yet");
    let crate::routes::SourceCheck::Candidate(seen) = latch.check_source(src, 1) else {
        panic!("an unlatched route takes a candidate");
    };
    assert_eq!(latch.latch(seen, src, 1), Some(false));
    assert_eq!(
        entry_policy(&latch),
        Some((ACTIVE | CHECK_ADDR | CHECK_PORT, src))
    );
}

#[test]
fn an_egress_without_ndo_xdp_xmit_is_refused_for_the_fast_path() {
    let why = redirects_refused("gb", Ok(1 | 2 | 32)).expect("refused");
    assert!(why.starts_with("egress gb takes no XDP redirects"), "{why}");
    assert!(why.contains("its routes use the AF_XDP path"), "{why}");
    assert_eq!(
        redirects_refused("gb", Ok(1 | 2 | bpf::XDP_ACT_NDO_XMIT)),
        None
    );
    // A kernel without the netdev family cannot say: the fast path is used, failures counted.
    let old = io::Error::new(io::ErrorKind::NotFound, "no netdev netlink family");
    assert_eq!(redirects_refused("gb", Err(old)), None);
}

#[test]
fn an_egress_refusing_most_redirects_goes_off_the_fast_path_a_transient_one_not() {
    // A black hole at 250 packets/s: 25 frames per poll, failures one poll behind.
    let mut j = Judge::default();
    assert_eq!(j.observe(25, 0, 100), Verdict::Keep);
    assert_eq!(j.observe(25, 25, 200), Verdict::Fall(25, 50));
    // A full ring under a burst: 5 % refused, for longer than a window.
    let mut j = Judge::default();
    for t in 1..=200u64 {
        assert_eq!(j.observe(100, 5, t * 100), Verdict::Keep, "poll {t}");
    }
    // Fewer than FALL_MIN failures: off only at the window's end, if half of its frames.
    let mut j = Judge::default();
    assert_eq!(j.observe(1, 0, 0), Verdict::Keep);
    assert_eq!(j.observe(0, 1, 5_000), Verdict::Keep);
    assert_eq!(j.observe(1, 1, WINDOW_MS), Verdict::Fall(2, 2));
    // Nothing sent: nothing judged.
    let mut j = Judge::default();
    for t in 0..300u64 {
        assert_eq!(j.observe(0, 0, t * 100), Verdict::Keep);
    }
}

#[test]
fn an_egress_off_the_fast_path_comes_back_when_its_features_change_or_after_a_wait() {
    let no = || Ok(1 | 2);
    let yes = || Ok(1 | 2 | bpf::XDP_ACT_NDO_XMIT);
    // veth whose peer lost GRO: features say no, then yes: back at once.
    let mut j = Judge::default();
    j.fell(1_000, false);
    assert_eq!(j.look_again(1_000, no), Retry::Wait(true));
    assert_eq!(
        j.look_again(1_500, yes),
        Retry::Wait(false),
        "checked every 1 s"
    );
    assert_eq!(j.look_again(2_000, no), Retry::Wait(false));
    assert_eq!(j.look_again(3_000, yes), Retry::Try(true));
    // Features that say yes throughout: tried after BACKOFF_MS, then twice as long.
    let mut j = Judge::default();
    j.fell(0, false);
    let mut t = 0;
    while j.look_again(t, yes) == Retry::Wait(false) {
        t += 100;
    }
    assert_eq!(t, BACKOFF_MS);
    j.fell(t, false);
    let from = t;
    while j.look_again(t, yes) == Retry::Wait(false) {
        t += 100;
    }
    assert_eq!(t - from, 2 * BACKOFF_MS);
    // Capped; a try that lasts a window resets the wait.
    for _ in 0..20 {
        j.fell(t, false);
    }
    assert_eq!(j.backoff, BACKOFF_MAX_MS);
    assert_eq!(j.observe(2000, 0, t), Verdict::Keep);
    assert_eq!(j.backoff, 0);
    // A kernel that cannot say: only the timed tries, without asking every second.
    let mut j = Judge::default();
    j.fell(0, false);
    let cannot = || Err(io::Error::new(io::ErrorKind::NotFound, "no netdev family"));
    assert_eq!(j.look_again(0, cannot), Retry::Wait(false));
    assert_eq!(j.next_check, BACKOFF_MS);
    assert_eq!(j.look_again(BACKOFF_MS, cannot), Retry::Try(false));
}
