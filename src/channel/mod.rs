//! The one-way channels: what happens to a packet between "received on a gateway port" and
//! "handed to the egress", the same for every engine.
//!
//! [`inspect`] is the per-packet decision (size, source, media validation, RTP accounting),
//! [`Validators`] the per-stream state of the media validator each worker keeps; [`WorkerStats`] holds
//! each worker's per-channel counters, CPU time and heartbeat; [`ChannelTotals`] adds them up
//! for reports. Engines own the receive loop and the egress and call into this module; this
//! module owns no sockets and never blocks or allocates; it logs only media violations,
//! rate-limited.

mod validators;

pub use validators::{Refused, Validators, LEG_SLOTS, WORKER_SLOTS};

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use crate::routes::{Channel, SourceCheck, StreamRoute};
use crate::stats::{DropReason, PacketCounters, Snapshot};
use crate::wire::rtp::RtpPacket;

/// What [`inspect`] decided for a datagram that may be forwarded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admitted {
    /// From the route's known source.
    Known,
    /// Its source has just taken the (`latch`) route: the first latch.
    Latched,
    /// Its source has taken the route from a latched source that had fallen silent
    /// (counted as `relatches`).
    Relatched,
}

/// Decides whether one datagram received for `route` at `now_ms` ([`crate::clock`]) may be
/// forwarded, and accounts its RTP sequence. `truncated` is the engine's word that the
/// datagram did not fit its buffer. A route with a media rule has every datagram from an
/// accepted source checked by the caller's `media` validators (`media_invalid` when refused
/// under `enforce`). A `latch` route latches a source only with a datagram that passed every
/// check and is RTP: a probe or a stray datagram never captures a route.
/// The caller touches the route (`last_seen`) only for admitted datagrams.
#[inline]
pub fn inspect(
    route: &StreamRoute,
    src: SocketAddrV4,
    payload: &[u8],
    truncated: bool,
    max_payload: usize,
    now_ms: u64,
    media: &mut Validators,
) -> Result<Admitted, DropReason> {
    let source = admit_source(route, src, payload.len(), truncated, max_payload, now_ms)
        .inspect_err(|&r| media.refused(route, src, payload, r, None, now_ms))?;
    if let Some(rule) = &route.media {
        if let Err(v) = media.check(route, rule, payload, now_ms) {
            let r = DropReason::MediaInvalid;
            media.refused(route, src, payload, r, Some(v), now_ms);
            return Err(r);
        }
    }
    admit_rtp(route, src, source, payload, now_ms)
        .inspect_err(|&r| media.refused(route, src, payload, r, None, now_ms))
}

/// The checks before the payload is looked at: standby, size, source.
#[inline]
fn admit_source(
    route: &StreamRoute,
    src: SocketAddrV4,
    len: usize,
    truncated: bool,
    max_payload: usize,
    now_ms: u64,
) -> Result<SourceCheck, DropReason> {
    if route.standby() {
        return Err(DropReason::Standby);
    }
    if len == 0 {
        return Err(DropReason::Truncated);
    }
    if truncated || len > max_payload {
        return Err(DropReason::Oversize);
    }
    let source = route.check_source(src, now_ms);
    if source == SourceCheck::Refused {
        return Err(DropReason::SourceMismatch);
    }
    Ok(source)
}

/// The checks after validation: latching a candidate source (only with RTP) and the RTP
/// sequence accounting.
#[inline]
fn admit_rtp(
    route: &StreamRoute,
    src: SocketAddrV4,
    source: SourceCheck,
    payload: &[u8],
    now_ms: u64,
) -> Result<Admitted, DropReason> {
    let rtp = RtpPacket::new_checked(payload).ok();
    let mut admitted = Admitted::Known;
    if let SourceCheck::Candidate(seen) = source {
        if rtp.is_none() {
            return Err(DropReason::NotRtp);
        }
        admitted = match route.latch(seen, src, now_ms) {
            Some(true) => Admitted::Relatched,
            Some(false) => Admitted::Latched,
            None => return Err(DropReason::SourceMismatch),
        };
    }
    match rtp {
        Some(rtp) => route.stats.rtp.observe(rtp.sequence(), rtp.ssrc()),
        None if route.rtp_only => return Err(DropReason::NotRtp),
        None => {}
    }
    Ok(admitted)
}

/// [`inspect`] for an engine that can rewrite the datagram in its buffer: a route whose
/// media rule strips ([`crate::media::Policy::strip`]) has what the strip action removes cut
/// out of `payload` in place; `Ok` gives the length to forward (`payload.len()` when
/// nothing was cut). A datagram stripped away is dropped as `media_stripped`. Every other
/// route is decided exactly as by [`inspect`].
#[inline]
pub fn inspect_mut(
    route: &StreamRoute,
    src: SocketAddrV4,
    payload: &mut [u8],
    truncated: bool,
    max_payload: usize,
    now_ms: u64,
    media: &mut Validators,
) -> Result<(Admitted, usize), DropReason> {
    match &route.media {
        Some(rule) if rule.policy.strip => {}
        _ => {
            return inspect(route, src, payload, truncated, max_payload, now_ms, media)
                .map(|a| (a, payload.len()))
        }
    }
    let source = admit_source(route, src, payload.len(), truncated, max_payload, now_ms)
        .inspect_err(|&r| media.refused(route, src, payload, r, None, now_ms))?;
    // A capture armed on the route wants the bytes as they arrived: copied before the strip
    // rewrites them (one relaxed load per packet of a strip route otherwise).
    let held = media.hold(route, payload, now_ms);
    let decided = match &route.media {
        Some(rule) => match media.check_mut(route, rule, payload, now_ms) {
            Ok(len) => Ok(len),
            Err(Refused::Invalid(v)) => Err((DropReason::MediaInvalid, Some(v))),
            Err(Refused::StrippedAway(v)) => Err((DropReason::MediaStripped, Some(v))),
        },
        None => Ok(payload.len()),
    }
    // What passed the validator is RTP (it checked the header).
    .and_then(|len| {
        admit_rtp(route, src, source, &payload[..len], now_ms)
            .map(|a| (a, len))
            .map_err(|r| (r, None))
    });
    match (decided, held) {
        (Ok(a), None) => Ok(a),
        (Ok(a), Some(h)) => {
            media.admitted_held(h);
            Ok(a)
        }
        (Err((r, _)), None) => Err(r),
        (Err((r, v)), Some(h)) => {
            media.refused_held(h, src, r, v);
            Err(r)
        }
    }
}

/// One worker's counters, written by the worker, read by reports and the watchdog.
#[derive(Debug)]
pub struct WorkerStats {
    pub index: usize,
    /// The CPU the config assigns the worker (what it tries to pin to).
    pub cpu: Option<usize>,
    /// The CPU the worker ran on right after pinning (`sched_getcpu`); `u64::MAX`: unknown.
    running_cpu: AtomicU64,
    /// Whether the worker is pinned to its configured CPU.
    pinned: AtomicBool,
    /// Per channel, indexed by [`Channel::index`].
    pub channels: [PacketCounters; 2],
    /// Thread CPU time, nanoseconds.
    pub cpu_ns: AtomicU64,
    /// Last loop iteration ([`crate::clock::now_ms`]): a stalled worker stops moving it.
    pub heartbeat_ms: AtomicU64,
    /// Set once the worker is receiving.
    pub ready: AtomicBool,
    /// Set when the worker has exited (normally or not).
    pub exited: AtomicBool,
    /// Ring engines: packets the kernel dropped because the worker's rings were full (also
    /// counted as `rx_overflow` in the channel counters).
    pub ring_drops: AtomicU64,
    /// Ring engines: times a ring froze (tnapi: every block held by user space; afxdp: a TX
    /// ring kept frames with none taken by the kernel between two samples).
    pub ring_freezes: AtomicU64,
}

impl WorkerStats {
    pub fn new(index: usize, cpu: Option<usize>) -> WorkerStats {
        WorkerStats {
            index,
            cpu,
            running_cpu: AtomicU64::new(u64::MAX),
            pinned: AtomicBool::new(false),
            channels: Default::default(),
            cpu_ns: AtomicU64::new(0),
            heartbeat_ms: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            exited: AtomicBool::new(false),
            ring_drops: AtomicU64::new(0),
            ring_freezes: AtomicU64::new(0),
        }
    }

    pub fn channel(&self, c: Channel) -> &PacketCounters {
        &self.channels[c.index()]
    }

    /// Records where the worker runs after its pinning attempt.
    pub fn record_cpu(&self, running: Option<usize>, pinned: bool) {
        self.running_cpu
            .store(running.map_or(u64::MAX, |c| c as u64), Relaxed);
        self.pinned.store(pinned, Relaxed);
    }

    /// The CPU the worker really ran on after pinning (not the configured one).
    pub fn running_cpu(&self) -> Option<usize> {
        match self.running_cpu.load(Relaxed) {
            u64::MAX => None,
            c => Some(c as usize),
        }
    }

    /// Whether the worker is pinned to its configured CPU.
    pub fn pinned(&self) -> bool {
        self.pinned.load(Relaxed)
    }

    pub fn cpu_seconds(&self) -> f64 {
        self.cpu_ns.load(Relaxed) as f64 / 1e9
    }
}

/// Totals per channel over all workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelTotals {
    pub channels: [Snapshot; 2],
}

impl ChannelTotals {
    pub fn gather<'a>(workers: impl IntoIterator<Item = &'a WorkerStats>) -> ChannelTotals {
        let mut t = ChannelTotals::default();
        for w in workers {
            for c in Channel::ALL {
                t.channels[c.index()].add(&w.channel(c).snapshot());
            }
        }
        t
    }

    pub fn channel(&self, c: Channel) -> &Snapshot {
        &self.channels[c.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DomainId, SourcePolicy};
    use crate::routes::RouteSpec;

    fn route(policy: SourcePolicy, rtp_only: bool) -> StreamRoute {
        StreamRoute::new(
            RouteSpec {
                ingress: DomainId::A,
                port: 20000,
                dest: "127.0.0.2:4000".parse().unwrap(),
                egress_port: 30000,
                policy,
                expected: Some("127.0.0.1:5000".parse().unwrap()),
                rtp_only,
                label: "t".into(),
                media: None,
            },
            1,
        )
    }

    fn validators() -> Validators {
        Validators::new(LEG_SLOTS, Default::default())
    }

    fn rtp(seq: u16) -> [u8; 20] {
        let mut b = [0u8; 20];
        crate::wire::rtp::write_header(&mut b, 96, seq, 0, 1).unwrap();
        b
    }

    #[test]
    fn decisions_and_reasons() {
        let mut v = validators();
        let src = "127.0.0.1:5000".parse().unwrap();
        let bad = "127.0.0.1:5001".parse().unwrap();
        let r = route(SourcePolicy::Strict, false);
        assert_eq!(
            inspect(&r, src, &rtp(1), false, 1472, 1, &mut v),
            Ok(Admitted::Known)
        );
        assert_eq!(
            inspect(&r, src, &[], false, 1472, 1, &mut v),
            Err(DropReason::Truncated)
        );
        assert_eq!(
            inspect(&r, src, &[0; 1500], false, 1472, 1, &mut v),
            Err(DropReason::Oversize)
        );
        assert_eq!(
            inspect(&r, src, &rtp(2), true, 1472, 1, &mut v),
            Err(DropReason::Oversize)
        );
        assert_eq!(
            inspect(&r, bad, &rtp(3), false, 1472, 1, &mut v),
            Err(DropReason::SourceMismatch)
        );
        assert_eq!(
            inspect(&r, src, b"garbage!", false, 1472, 1, &mut v),
            Ok(Admitted::Known)
        );
        assert_eq!(
            inspect(&r, src, &rtp(5), false, 1472, 1, &mut v),
            Ok(Admitted::Known)
        );
        let s = r.stats.rtp.snapshot();
        assert_eq!(
            (s.packets, s.lost),
            (2, 3),
            "2 and 3 were dropped before accounting, 4 never came"
        );
        let only = route(SourcePolicy::Strict, true);
        assert_eq!(
            inspect(&only, src, b"garbage!", false, 1472, 1, &mut v),
            Err(DropReason::NotRtp)
        );
    }

    #[test]
    fn only_rtp_that_passed_every_check_latches() {
        let mut v = validators();
        let r = StreamRoute::new(
            RouteSpec {
                ingress: DomainId::A,
                port: 20000,
                dest: "127.0.0.2:4000".parse().unwrap(),
                egress_port: 30000,
                policy: SourcePolicy::Latch,
                expected: Some("127.0.0.1:0".parse().unwrap()),
                rtp_only: false,
                label: "t".into(),
                media: None,
            },
            1,
        );
        let probe = "127.0.0.1:40000".parse().unwrap();
        let sender = "127.0.0.1:5000".parse().unwrap();
        let restarted = "127.0.0.1:5002".parse().unwrap();
        assert_eq!(
            inspect(&r, probe, b"nmap probe", false, 1472, 1000, &mut v),
            Err(DropReason::NotRtp)
        );
        assert_eq!(
            inspect(&r, probe, &[0x80; 1500], false, 1472, 1000, &mut v),
            Err(DropReason::Oversize)
        );
        assert_eq!(r.latched(), None, "nothing that failed a check latched");
        assert_eq!(
            inspect(&r, sender, &rtp(1), false, 1472, 1000, &mut v),
            Ok(Admitted::Latched)
        );
        assert_eq!(
            inspect(
                &r,
                sender,
                b"not rtp, latched source",
                false,
                1472,
                1001,
                &mut v
            ),
            Ok(Admitted::Known)
        );
        r.touch(1001);
        assert_eq!(
            inspect(&r, restarted, &rtp(1), false, 1472, 2000, &mut v),
            Err(DropReason::SourceMismatch)
        );
        assert_eq!(
            inspect(&r, restarted, b"junk", false, 1472, 9000, &mut v),
            Err(DropReason::NotRtp),
            "after the silence only RTP re-latches"
        );
        assert_eq!(
            inspect(&r, restarted, &rtp(2), false, 1472, 9000, &mut v),
            Ok(Admitted::Relatched)
        );
        assert_eq!(r.latched(), Some(restarted));
    }

    fn h264_route(enforce: bool, policy: SourcePolicy) -> StreamRoute {
        StreamRoute::new(
            RouteSpec {
                ingress: DomainId::A,
                port: 20000,
                dest: "127.0.0.2:4000".parse().unwrap(),
                egress_port: 30000,
                policy,
                expected: Some("127.0.0.1:0".parse().unwrap()),
                rtp_only: false,
                label: "v".into(),
                media: Some(crate::media::Rule {
                    enforce,
                    spec: crate::media::StreamSpec::new(None).with(
                        96,
                        crate::media::Codec::H264,
                        90000,
                    ),
                    policy: Default::default(),
                }),
            },
            1,
        )
    }

    /// An H.264 single-NAL packet (an SPS-like type 7 NAL of zeros) or, `junk`, random bytes
    /// behind the same valid RTP header.
    fn h264(seq: u16, ts: u32, junk: bool) -> Vec<u8> {
        let mut b = vec![0u8; 12];
        crate::wire::rtp::write_header(&mut b, 96, seq, ts, 7).unwrap();
        b[1] |= 0x80; // marker: one NAL per frame
        if junk {
            let mut x = 0x1234_5678u32;
            b.extend((0..200).map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 24) as u8 | 0x80 // forbidden bit set
            }));
        } else {
            b.extend_from_slice(&[0x06, 0x06, 0x01, 0x84, 0x80]); // SEI recovery point
        }
        b
    }

    #[test]
    fn media_rule_drops_or_counts_violations_by_reason() {
        use crate::media::Violation;
        let src = "127.0.0.1:5000".parse().unwrap();
        let mut v = validators();
        let r = h264_route(true, SourcePolicy::Strict);
        assert_eq!(
            inspect(&r, src, &h264(1, 0, false), false, 1472, 1, &mut v),
            Ok(Admitted::Known)
        );
        assert_eq!(
            inspect(&r, src, &h264(2, 3000, true), false, 1472, 2, &mut v),
            Err(DropReason::MediaInvalid)
        );
        assert_eq!(
            inspect(&r, src, &h264(3, 6000, false), false, 1472, 3, &mut v),
            Ok(Admitted::Known),
            "the stream goes on after a refused packet"
        );
        let m = r.stats.media.snapshot();
        assert_eq!(m.total(), 1);
        assert_eq!(m.get(Violation::NalForbiddenBit), 1);
        assert_eq!(v.len(), 1, "one stream held");

        // `count`: the same packet crosses, counted.
        let c = h264_route(false, SourcePolicy::Strict);
        assert_eq!(
            inspect(&c, src, &h264(1, 0, true), false, 1472, 1, &mut v),
            Ok(Admitted::Known)
        );
        assert_eq!(c.stats.media.snapshot().get(Violation::NalForbiddenBit), 1);
        assert_eq!(v.len(), 2);

        // The totals of the channel add every validator's counts.
        let totals = std::sync::Arc::new(crate::stats::media::MediaTotals::default());
        let mut w = Validators::new(LEG_SLOTS, std::sync::Arc::clone(&totals));
        let x = h264_route(true, SourcePolicy::Strict);
        let _ = inspect(&x, src, &h264(1, 0, true), false, 1472, 1, &mut w);
        assert_eq!(
            totals.channels[Channel::Forward.index()]
                .snapshot()
                .get(Violation::NalForbiddenBit),
            1
        );
    }

    #[test]
    fn invalid_media_never_latches_a_route() {
        let mut v = validators();
        let r = h264_route(true, SourcePolicy::Latch);
        let src = "127.0.0.1:5000".parse().unwrap();
        assert_eq!(
            inspect(&r, src, &h264(1, 0, true), false, 1472, 1, &mut v),
            Err(DropReason::MediaInvalid)
        );
        assert_eq!(r.latched(), None);
        assert_eq!(
            inspect(&r, src, &h264(2, 3000, false), false, 1472, 2, &mut v),
            Ok(Admitted::Latched)
        );
    }

    #[test]
    fn a_full_table_gives_up_the_stream_seen_longest_ago() {
        let totals = std::sync::Arc::new(crate::stats::media::MediaTotals::default());
        let mut v = Validators::new(LEG_SLOTS, std::sync::Arc::clone(&totals));
        let src = "127.0.0.1:5000".parse().unwrap();
        let routes: Vec<_> = (0..LEG_SLOTS + 1)
            .map(|_| h264_route(true, SourcePolicy::Strict))
            .collect();
        for (i, r) in routes.iter().enumerate() {
            let now = 10 + i as u64;
            assert!(inspect(r, src, &h264(1, 0, false), false, 1472, now, &mut v).is_ok());
        }
        assert_eq!(v.len(), LEG_SLOTS);
        assert_eq!(totals.evictions.load(Relaxed), 1);
        // The newest streams are still held: their next packet continues them.
        let last = routes.last().unwrap();
        assert!(inspect(last, src, &h264(2, 3000, false), false, 1472, 99, &mut v).is_ok());
        assert_eq!(totals.evictions.load(Relaxed), 1);
    }

    #[test]
    fn strip_cuts_in_place_and_counts_what_it_cut() {
        use crate::media::Violation;
        let src = "127.0.0.1:5000".parse().unwrap();
        let totals = std::sync::Arc::new(crate::stats::media::MediaTotals::default());
        let mut v = Validators::new(LEG_SLOTS, std::sync::Arc::clone(&totals));
        let mut r = h264_route(true, SourcePolicy::Strict);
        if let Some(rule) = r.media.as_mut() {
            rule.policy.strip = true;
        }
        // An SEI NAL unit with 20 bytes of user data: stripped away.
        let mut sei = h264(1, 0, false);
        sei.truncate(12);
        sei.extend_from_slice(&[0x06, 0x05, 20]);
        sei.extend_from_slice(&[0x41; 20]);
        sei.push(0x80);
        assert_eq!(
            inspect_mut(&r, src, &mut sei, false, 1472, 1, &mut v),
            Err(DropReason::MediaStripped)
        );
        // A STAP-A of a recovery point SEI and the user data: the user data goes.
        let mut stap = h264(2, 3000, false);
        stap.truncate(12);
        stap.extend_from_slice(&[0x18, 0x00, 0x05, 0x06, 0x06, 0x01, 0x84, 0x80, 0x00, 24]);
        stap.extend_from_slice(&[0x06, 0x05, 20]);
        stap.extend_from_slice(&[0x41; 20]);
        stap.push(0x80);
        let n = stap.len();
        let (admitted, len) = inspect_mut(&r, src, &mut stap, false, 1472, 2, &mut v).unwrap();
        assert_eq!(admitted, Admitted::Known);
        assert_eq!(len, n - 26);
        assert_eq!(
            &stap[12..len],
            &[0x18, 0x00, 0x05, 0x06, 0x06, 0x01, 0x84, 0x80]
        );
        // The sequence number closes the gap of the packet stripped away.
        assert_eq!(u16::from_be_bytes([stap[2], stap[3]]), 1);
        let m = r.stats.media.snapshot();
        assert_eq!(m.stripped(Violation::SeiUserData), 2);
        // Stripped away: the whole datagram (36 bytes) was not forwarded; rewritten: 26 cut.
        assert_eq!(m.stripped_bytes, 36 + 26);
        assert_eq!(m.total(), 0, "nothing refused");
        let c = totals.channels[Channel::Forward.index()].snapshot();
        assert_eq!(
            (c.stripped(Violation::SeiUserData), c.stripped_bytes),
            (2, 62)
        );
        // A refusal is still a refusal.
        assert_eq!(
            inspect_mut(&r, src, &mut h264(3, 6000, true), false, 1472, 3, &mut v),
            Err(DropReason::MediaInvalid)
        );
        // Without strip, inspect_mut decides as inspect and leaves the packet alone.
        let e = h264_route(true, SourcePolicy::Strict);
        let mut p = h264(1, 0, false);
        let before = p.clone();
        assert_eq!(
            inspect_mut(&e, src, &mut p, false, 1472, 1, &mut v),
            Ok((Admitted::Known, before.len()))
        );
        assert_eq!(p, before);
    }

    #[test]
    fn an_armed_capture_takes_exactly_the_refused_packets_as_they_arrived() {
        use crate::routes::capture::{RefusalCapture, Target};
        use std::sync::Arc;
        let cap = Arc::new(RefusalCapture::default());
        let mut v = Validators::with_capture(LEG_SLOTS, Default::default(), Arc::clone(&cap));
        let src = "127.0.0.1:5000".parse().unwrap();
        let stranger = "127.0.0.3:6000".parse().unwrap();
        let mut strip = h264_route(true, SourcePolicy::Strict);
        if let Some(rule) = strip.media.as_mut() {
            rule.policy.strip = true;
        }
        let other = h264_route(true, SourcePolicy::Strict);
        let target = |r: &StreamRoute| Target {
            route: r.id,
            channel: r.channel,
            port: r.port,
            label: "v".into(),
            dst: "127.0.0.1:20000".parse().unwrap(),
        };
        // Nothing armed: refusals pass by the capture.
        let _ = inspect(&other, src, &h264(1, 0, true), false, 1472, 1, &mut v);
        let a = cap.arm(target(&strip), 3, 10_000, 1472, 1).unwrap();
        let _ = inspect(&other, src, &h264(2, 3000, true), false, 1472, 2, &mut v);
        // Strip route: a valid packet (not taken), an SEI with user data stripped away (taken
        // as it arrived, not as the strip left it), junk (taken), a stranger (taken), and a
        // fourth refusal past N (not taken).
        let mut ok = h264(1, 0, false);
        assert!(inspect_mut(&strip, src, &mut ok, false, 1472, 3, &mut v).is_ok());
        let mut sei = h264(2, 3000, false);
        sei.truncate(12);
        sei.extend_from_slice(&[0x06, 0x05, 20]);
        sei.extend_from_slice(&[0x41; 20]);
        sei.push(0x80);
        let sei_in = sei.clone();
        assert_eq!(
            inspect_mut(&strip, src, &mut sei, false, 1472, 4, &mut v),
            Err(DropReason::MediaStripped)
        );
        let mut junk = h264(3, 6000, true);
        let junk_in = junk.clone();
        assert_eq!(
            inspect_mut(&strip, src, &mut junk, false, 1472, 5, &mut v),
            Err(DropReason::MediaInvalid)
        );
        let mut late = h264(4, 9000, false);
        let late_in = late.clone();
        assert_eq!(
            inspect_mut(&strip, stranger, &mut late, false, 1472, 6, &mut v),
            Err(DropReason::SourceMismatch)
        );
        let mut more = h264(5, 12000, true);
        let _ = inspect_mut(&strip, src, &mut more, false, 1472, 7, &mut v);
        let (st, pkts) = cap.drain(a.id, 100, 8).unwrap();
        assert_eq!(st.captured, 3);
        let got: Vec<_> = pkts
            .iter()
            .map(|p| {
                (
                    p.payload.clone(),
                    p.reason,
                    p.violation.map(|v| v.name()),
                    p.src,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    sei_in,
                    DropReason::MediaStripped,
                    Some("sei_user_data"),
                    src
                ),
                (
                    junk_in,
                    DropReason::MediaInvalid,
                    Some("nal_forbidden_bit"),
                    src
                ),
                (late_in, DropReason::SourceMismatch, None, stranger),
            ]
        );
        assert_eq!(cap.overflow_total(), 0);
    }
}
