//! An egress that takes no redirects: kept off the fast path at start (its xdp-features lack
//! `ndo_xdp_xmit`) or taken off it while running (the redirect-failure counter says the
//! kernel drops what the program sends there), its routes then on the AF_XDP path; and the
//! way back once it takes them again. What the control side sees of it: [`XdpStatus`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use super::*;

/// Redirect failures in one window that take an egress off the fast path, when they are at
/// least half of the frames the program redirected to it in that window.
pub(super) const FALL_MIN: u64 = 8;
/// A window ends after this many frames redirected to the egress, or [`WINDOW_MS`]; then a
/// window with fewer than [`FALL_MIN`] failures still takes the egress off if at least one
/// failed and they are half of its frames (a slow stream into a black hole).
pub(super) const WINDOW_FRAMES: u64 = 1024;
pub(super) const WINDOW_MS: u64 = 10_000;
/// While off the fast path, xdp-features are asked this often (one generic netlink
/// exchange on worker 0 per egress off the fast path).
pub(super) const CHECK_MS: u64 = 1_000;
/// Off the fast path although its xdp-features say it takes redirects (a driver whose
/// features say more than it does, an egress that was down, a kernel that cannot say): the
/// fast path is tried again after this wait, doubled after each try that fails again, up to
/// [`BACKOFF_MAX_MS`]; a try that lasts a whole window without failing resets it.
pub(super) const BACKOFF_MS: u64 = 10_000;
pub(super) const BACKOFF_MAX_MS: u64 = 640_000;

/// One egress interface of the fast path as the control side sees it (metrics
/// `vgate_xdp_egress_*`, `xdp` in `/api/v1/stats`, `vgate health` warnings).
#[derive(Debug)]
pub struct EgressStatus {
    /// Its interface name.
    pub interface: String,
    /// The domain it faces (its routes: those leaving into it).
    pub domain: DomainId,
    /// Times it was taken off the fast path (at start or while running).
    pub fallbacks: AtomicU64,
    on_fast: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl EgressStatus {
    fn new(interface: String, domain: DomainId) -> EgressStatus {
        EgressStatus {
            interface,
            domain,
            fallbacks: AtomicU64::new(0),
            on_fast: AtomicBool::new(true),
            reason: Mutex::new(None),
        }
    }

    /// Whether the fast path sends its routes' packets (else they take the AF_XDP path).
    pub fn on_fast_path(&self) -> bool {
        self.on_fast.load(Relaxed)
    }

    /// Why it is off the fast path (`None` while on it).
    pub fn off_reason(&self) -> Option<String> {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(super) fn set(&self, reason: Option<String>) {
        self.on_fast.store(reason.is_none(), Relaxed);
        *self.reason.lock().unwrap_or_else(|e| e.into_inner()) = reason;
    }
}

/// The fast path's egress interfaces (one per domain at most, indexed by the domain).
#[derive(Debug, Default)]
pub struct XdpStatus {
    pub egress: [Option<EgressStatus>; 2],
}

impl XdpStatus {
    pub(super) fn new(names: [Option<String>; 2]) -> XdpStatus {
        let [a, b] = names;
        XdpStatus {
            egress: [
                a.map(|n| EgressStatus::new(n, DomainId::A)),
                b.map(|n| EgressStatus::new(n, DomainId::B)),
            ],
        }
    }

    /// Egress interfaces off the fast path, each with its reason (for `vgate health`).
    pub fn warnings(&self) -> Vec<String> {
        self.egress
            .iter()
            .flatten()
            .filter_map(|e| e.off_reason())
            .collect()
    }
}

/// Per egress domain: the failures judged and, once off the fast path, when to look again.
/// Worker 0's poll only (under the fast path's lock).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Judge {
    /// This window's redirect failures and frames redirected, and when it began.
    failed: u64,
    sent: u64,
    since: u64,
    /// Off the fast path: the next xdp-features check and the next try on a device that
    /// says it takes redirects.
    pub(super) next_check: u64,
    retry_at: u64,
    /// Its xdp-features said "no `ndo_xdp_xmit`" since it went off: a "yes" is a change,
    /// tried at once.
    said_no: bool,
    /// The wait before the next try (0: [`BACKOFF_MS`]).
    pub(super) backoff: u64,
}

/// What [`Judge::observe`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Keep,
    /// Off the fast path: (failed, redirected) of the window that decided it.
    Fall(u64, u64),
}

/// What [`Judge::look_again`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Retry {
    /// Stay off; `true` when the xdp-features said no just now (for the first time).
    Wait(bool),
    /// Back on the fast path; `true` when its xdp-features changed to yes.
    Try(bool),
}

impl Judge {
    /// The egress is on the fast path: one poll's failures and frames redirected to it.
    pub(super) fn observe(&mut self, sent: u64, failed: u64, now: u64) -> Verdict {
        if self.failed == 0 && self.sent == 0 {
            self.since = now;
        }
        self.failed += failed;
        self.sent += sent;
        let half = self.failed * 2 >= self.sent;
        let ended = self.sent >= WINDOW_FRAMES || now.saturating_sub(self.since) >= WINDOW_MS;
        if half && (self.failed >= FALL_MIN || (ended && self.failed > 0)) {
            let v = Verdict::Fall(self.failed, self.sent);
            self.failed = 0;
            self.sent = 0;
            return v;
        }
        if ended {
            // A window without a verdict: a try that lasted it has worked.
            if self.failed * 4 < self.sent.max(1) {
                self.backoff = 0;
            }
            self.failed = 0;
            self.sent = 0;
        }
        Verdict::Keep
    }

    /// The egress went off the fast path at `now` (`said_no`: its xdp-features say it takes
    /// no redirects); the next look is at the next poll.
    pub(super) fn fell(&mut self, now: u64, said_no: bool) {
        let wait = if self.backoff == 0 {
            BACKOFF_MS
        } else {
            self.backoff
        };
        self.retry_at = now + wait;
        self.backoff = (wait * 2).min(BACKOFF_MAX_MS);
        self.next_check = now;
        self.said_no = said_no;
        self.failed = 0;
        self.sent = 0;
    }

    /// The egress is off the fast path: whether to try it again, asking `features` (its
    /// xdp-features) at most every [`CHECK_MS`].
    pub(super) fn look_again(
        &mut self,
        now: u64,
        features: impl FnOnce() -> io::Result<u64>,
    ) -> Retry {
        if now < self.next_check {
            return Retry::Wait(false);
        }
        self.next_check = now + CHECK_MS;
        let takes = match features() {
            Ok(f) => f & bpf::XDP_ACT_NDO_XMIT != 0,
            // The kernel cannot say: only the timed tries.
            Err(_) => {
                self.next_check = self.retry_at.max(now + CHECK_MS);
                true
            }
        };
        if !takes {
            let first = !self.said_no;
            self.said_no = true;
            return Retry::Wait(first);
        }
        if self.said_no || now >= self.retry_at {
            let changed = self.said_no;
            self.said_no = false;
            self.failed = 0;
            self.sent = 0;
            return Retry::Try(changed);
        }
        Retry::Wait(false)
    }
}

static FALLBACK_LOG: crate::logging::RateLimit = crate::logging::RateLimit::new(10_000);

impl FastPath {
    /// Worker 0's poll, per egress domain `d`: judges its failures while it is on the fast
    /// path (taking it off when the kernel drops what is sent there), or looks again whether
    /// it takes redirects while it is off.
    pub(super) fn judge_egress(
        &self,
        st: &mut FastState,
        d: usize,
        sent: u64,
        failed: u64,
        now: u64,
    ) {
        let (Some(s), Some(eg)) = (&self.status.egress[d], self.egress[d]) else {
            return;
        };
        if s.on_fast_path() {
            if let Verdict::Fall(f, n) = st.judges[d].observe(sent, failed, now) {
                let why = format!(
                    "egress {} refused {f} of {n} XDP redirects while running (counted redirect_failed): its routes use the AF_XDP path",
                    s.interface
                );
                self.fall_back(st, d, why);
                st.judges[d].fell(now, false);
            }
            return;
        }
        match st.judges[d].look_again(now, || bpf::xdp_features(eg.ifindex)) {
            Retry::Wait(true) => {
                let why = s.off_reason().unwrap_or_default();
                if !why.contains("xdp-features") {
                    s.set(Some(format!(
                        "{why}; its xdp-features now lack ndo_xdp_xmit (checked every {} s)",
                        CHECK_MS / 1000
                    )));
                }
            }
            Retry::Wait(false) => {}
            Retry::Try(changed) => {
                tracing::info!(
                    interface = %s.interface,
                    "egress takes XDP redirects again ({}): its routes go back on the fast path",
                    if changed {
                        "its xdp-features now have ndo_xdp_xmit"
                    } else {
                        "trying again after a wait"
                    }
                );
                s.set(None);
            }
        }
    }

    /// Takes egress `d` off the fast path: every active entry leaving by it is cleared (the
    /// program then hands its packets to the AF_XDP sockets; the slot stays, so the poll
    /// still counts what the program forwarded before), with a warning.
    pub(super) fn fall_back(&self, st: &mut FastState, d: usize, why: String) {
        let Some(s) = &self.status.egress[d] else {
            return;
        };
        s.set(Some(why.clone()));
        s.fallbacks.fetch_add(1, Relaxed);
        for e in st.entries.values_mut() {
            if e.route.channel.egress().index() == d && e.value.take().is_some() {
                self.write(e.route.channel, e.route.port, &[0u8; VALUE]);
            }
        }
        if let Some(suppressed) = FALLBACK_LOG.check(crate::clock::now_ms()) {
            tracing::warn!(
                suppressed,
                "{why}; the fast path is tried again when it takes redirects (xdp-features checked every {} s, else after a wait from {} s doubling to {} s)",
                CHECK_MS / 1000,
                BACKOFF_MS / 1000,
                BACKOFF_MAX_MS / 1000
            );
        }
    }
}

/// `vgate check-config` on the host, mode xdp: per egress interface of the fast path (one
/// facing a single domain), whether it takes XDP redirects now (its xdp-features, as the
/// start reads them) and what vgate does with its routes. A line each; none when the two
/// domains share an interface (no fast path then) or in a split half.
pub fn egress_report(cfg: &crate::config::Config) -> Vec<String> {
    if cfg.split.is_some() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for d in &cfg.domains {
        let faces_one = cfg
            .domains
            .iter()
            .filter(|o| o.interface == d.interface)
            .count()
            == 1;
        if !faces_one {
            continue;
        }
        let name = &d.interface;
        let into = format!("routes into domain {}", d.id.name());
        let ifindex = std::ffi::CString::new(name.as_str())
            .ok()
            .and_then(|c| super::super::sys::afxdp::if_nametoindex(&c).ok());
        let Some(ifindex) = ifindex else {
            out.push(format!(
                "xdp egress {name} ({into}): no such interface on this host"
            ));
            continue;
        };
        out.push(match bpf::xdp_features(ifindex) {
            Ok(f) if f & bpf::XDP_ACT_NDO_XMIT != 0 => format!(
                "xdp egress {name} ({into}): takes XDP redirects (xdp-features have ndo_xdp_xmit): the in-kernel fast path sends them; should the kernel refuse them while running, vgate moves them to the AF_XDP path"
            ),
            Ok(_) => format!(
                "xdp egress {name} ({into}): takes NO XDP redirects (xdp-features lack ndo_xdp_xmit; on veth the peer needs GRO on or an XDP program): vgate sends them by the AF_XDP path (as mode zc) until it does"
            ),
            Err(e) => format!(
                "xdp egress {name} ({into}): cannot tell whether it takes XDP redirects ({e}; kernels before 6.3 lack the netdev family): the fast path uses it and moves its routes to the AF_XDP path if the kernel refuses its redirects"
            ),
        });
    }
    out
}
