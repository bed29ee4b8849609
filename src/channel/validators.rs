//! The per-stream state of the media validator ([`crate::media`]) on the data path: one table
//! per worker (and per stream leg, per incoming split link), never shared, so a packet's check
//! takes no lock and no atomic read-modify-write.
//!
//! A route's packets stay on one worker (the kernel and the NIC spread flows, never one flow,
//! over sockets and queues), so the worker that sees a stream holds its whole state. The table
//! is allocated once, when its owner starts; a route's slot is found by the route's
//! [`StreamRoute::id`] (never reused, so a route made anew on the same port starts fresh)
//! within [`PROBE`] slots of its hash. When those are all taken by live streams the one seen
//! longest ago gives its slot up (counted as `evictions`: that stream's checks restart, which
//! costs a PS stream up to one frame).
//!
//! Violations are counted by reason on the route and on the channel's totals (relaxed atomic
//! adds: only on a violation), and the first of each stream-burst is logged, rate-limited,
//! with the route, the reason and the first bytes of the packet.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use std::net::SocketAddrV4;

use crate::logging::RateLimit;
use crate::media::{Rule, Stream, StreamSpec, Verdict, Violation};
use crate::routes::capture::{Held, RefusalCapture};
use crate::routes::{Routes, StreamRoute};
use crate::stats::media::MediaTotals;
use crate::stats::DropReason;

/// Slots probed for a route before one is given up.
pub const PROBE: usize = 8;

/// A worker's table: 4096 streams (about 1 MB), beyond the streams one core can carry.
pub const WORKER_SLOTS: usize = 4096;

/// A stream leg's table (one or two routes feed it).
pub const LEG_SLOTS: usize = PROBE;

struct Slot {
    /// [`StreamRoute::id`]; 0: free.
    route: u64,
    /// [`crate::clock::now_ms`] of the slot's last check.
    last_ms: u64,
    stream: Stream,
}

/// The validator state of the streams one thread checks.
pub struct Validators {
    slots: Box<[Slot]>,
    mask: usize,
    totals: Arc<MediaTotals>,
    /// Where refused packets go while an operator captures them ([`crate::routes::capture`]).
    capture: Arc<RefusalCapture>,
}

/// Why [`Validators::check_mut`] did not pass a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Refused for this violation (`media_invalid`).
    Invalid(Violation),
    /// Everything it carried was cut, all of it this (`media_stripped`).
    StrippedAway(Violation),
}

static VIOLATION_LOG: RateLimit = RateLimit::new(1000);

impl Validators {
    /// A table of at least `slots` streams (rounded up to a power of two, at least
    /// [`PROBE`]), counting into `totals` (the gateway's, [`crate::routes::Routes::media_totals`]).
    /// Refused packets go to a capture of their own (never armed): for tests and tools.
    pub fn new(slots: usize, totals: Arc<MediaTotals>) -> Validators {
        Validators::with_capture(slots, totals, Default::default())
    }

    /// A table of at least `slots` streams counting into the gateway's totals and feeding
    /// its refusal capture: what the data path's threads make.
    pub fn for_routes(slots: usize, routes: &Routes) -> Validators {
        Validators::with_capture(
            slots,
            Arc::clone(routes.media_totals()),
            Arc::clone(routes.capture()),
        )
    }

    /// A table of at least `slots` streams counting into `totals` and feeding `capture`.
    pub fn with_capture(
        slots: usize,
        totals: Arc<MediaTotals>,
        capture: Arc<RefusalCapture>,
    ) -> Validators {
        let n = slots.max(PROBE).next_power_of_two();
        let empty = Stream::new(StreamSpec::new(None));
        let slots = (0..n)
            .map(|_| Slot {
                route: 0,
                last_ms: 0,
                stream: empty.clone(),
            })
            .collect();
        Validators {
            slots,
            mask: n - 1,
            totals,
            capture,
        }
    }

    /// A packet of `route` from `src` refused for `reason` (`violation`: the validator's),
    /// for the refusal capture: one relaxed load unless a capture is armed on the route.
    #[inline]
    pub fn refused(
        &self,
        route: &StreamRoute,
        src: SocketAddrV4,
        payload: &[u8],
        reason: DropReason,
        violation: Option<Violation>,
        now_ms: u64,
    ) {
        if self.capture.wants(route.id) && captured_reason(reason) {
            self.capture
                .record(route.id, src, payload, reason, violation, now_ms);
        }
    }

    /// A copy of `payload` before a strip rewrites it, when a capture is armed on `route`
    /// (one relaxed load otherwise): hand it to [`Validators::refused_held`] or
    /// [`Validators::admitted_held`].
    #[inline]
    pub fn hold(&self, route: &StreamRoute, payload: &[u8], now_ms: u64) -> Option<Held> {
        if self.capture.wants(route.id) {
            self.capture.take(route.id, payload, now_ms)
        } else {
            None
        }
    }

    /// The packet held by [`Validators::hold`] was refused.
    #[cold]
    pub fn refused_held(
        &self,
        held: Held,
        src: SocketAddrV4,
        reason: DropReason,
        violation: Option<Violation>,
    ) {
        if captured_reason(reason) {
            self.capture.commit(held, src, reason, violation);
        } else {
            self.capture.give_back(held);
        }
    }

    /// The packet held by [`Validators::hold`] was admitted.
    #[cold]
    pub fn admitted_held(&self, held: Held) {
        self.capture.give_back(held);
    }

    /// Checks one packet of `route` (which has `rule`) at `now_ms`: `Err` when the rule
    /// enforces and the packet is refused. A violation is counted (route and channel) and
    /// logged (rate-limited) in either mode.
    #[inline]
    pub fn check(
        &mut self,
        route: &StreamRoute,
        rule: &Rule,
        payload: &[u8],
        now_ms: u64,
    ) -> Result<(), Violation> {
        let i = self.slot(route, rule, now_ms);
        let slot = &mut self.slots[i];
        slot.last_ms = now_ms;
        match slot.stream.check(&rule.policy, payload, now_ms) {
            // `check` never strips (the packet cannot be rewritten): what would be cut is
            // refused, as under `enforce`.
            Verdict::Pass | Verdict::Strip { .. } | Verdict::StrippedAway(_) => Ok(()),
            Verdict::Drop(v) => {
                route.stats.media.count(v);
                self.totals.channels[route.channel.index()].count(v);
                log_violation(route, rule, v, payload, now_ms);
                if rule.enforce {
                    Err(v)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Checks one packet like [`Validators::check`] and, when the rule strips
    /// ([`crate::media::Policy::strip`]), rewrites it in place ([`Stream::check_mut`]):
    /// `Ok(len)` is the length to forward (the packet's own unless something was cut),
    /// `Err` a packet refused or stripped away ([`Refused`]). What was cut is counted per
    /// route and channel (`media_stripped`).
    #[inline]
    pub fn check_mut(
        &mut self,
        route: &StreamRoute,
        rule: &Rule,
        payload: &mut [u8],
        now_ms: u64,
    ) -> Result<usize, Refused> {
        if !rule.policy.strip {
            return self
                .check(route, rule, payload, now_ms)
                .map(|()| payload.len())
                .map_err(Refused::Invalid);
        }
        let i = self.slot(route, rule, now_ms);
        let slot = &mut self.slots[i];
        slot.last_ms = now_ms;
        let len = payload.len();
        match slot.stream.check_mut(&rule.policy, payload, now_ms) {
            Verdict::Pass => Ok(len),
            Verdict::Strip { len: n, reason } => {
                self.stripped(route, reason, len - n);
                Ok(n)
            }
            Verdict::StrippedAway(reason) => {
                self.stripped(route, reason, len);
                Err(Refused::StrippedAway(reason))
            }
            Verdict::Drop(v) => {
                route.stats.media.count(v);
                self.totals.channels[route.channel.index()].count(v);
                log_violation(route, rule, v, payload, now_ms);
                Err(Refused::Invalid(v))
            }
        }
    }

    #[cold]
    fn stripped(&self, route: &StreamRoute, v: Violation, bytes: usize) {
        route.stats.media.count_stripped(v, bytes);
        self.totals.channels[route.channel.index()].count_stripped(v, bytes);
    }

    /// The slot of `route`, taken (and its stream started) if it has none.
    #[inline]
    fn slot(&mut self, route: &StreamRoute, rule: &Rule, now_ms: u64) -> usize {
        let id = route.id;
        let home = (id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize;
        let mut victim = home & self.mask;
        for k in 0..PROBE {
            let i = (home + k) & self.mask;
            let s = &self.slots[i];
            if s.route == id {
                return i;
            }
            let v = &self.slots[victim];
            if v.route != 0 && (s.route == 0 || s.last_ms < v.last_ms) {
                victim = i;
            }
        }
        self.take(victim, id, rule, now_ms)
    }

    #[cold]
    fn take(&mut self, i: usize, id: u64, rule: &Rule, now_ms: u64) -> usize {
        let s = &mut self.slots[i];
        if s.route != 0 {
            self.totals.evictions.fetch_add(1, Relaxed);
        }
        s.route = id;
        s.last_ms = now_ms;
        s.stream = Stream::new(rule.spec);
        i
    }

    /// Streams held (for tests and reports; walks the table).
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.route != 0).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The refusals the capture takes: about a packet's content or origin (see
/// [`crate::routes::capture`]).
fn captured_reason(r: DropReason) -> bool {
    matches!(
        r,
        DropReason::MediaInvalid
            | DropReason::MediaStripped
            | DropReason::NotRtp
            | DropReason::SourceMismatch
    )
}

#[cold]
fn log_violation(route: &StreamRoute, rule: &Rule, v: Violation, payload: &[u8], now_ms: u64) {
    if let Some(suppressed) = VIOLATION_LOG.check(now_ms) {
        let head = &payload[..payload.len().min(16)];
        let mut hex = String::with_capacity(head.len() * 2);
        for b in head {
            hex.push_str(&format!("{b:02x}"));
        }
        tracing::warn!(
            route = %route.label,
            channel = %route.channel,
            port = route.port,
            reason = v.name(),
            action = if rule.enforce { "dropped" } else { "counted" },
            strip = rule.policy.strip,
            len = payload.len(),
            head = %hex,
            suppressed,
            "media validation refused a packet"
        );
    }
}
