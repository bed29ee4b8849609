//! The links' counters as a half shows them: [`SplitStats`] (both links, their FEC settings,
//! the interfaces' wrong-way figures) and how the outgoing link is sent ([`LinkFamily`]).

use super::*;

/// How the outgoing link is sent: the engine family of the mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum LinkFamily {
    /// A kernel UDP socket, `sendmmsg` (mode stack).
    Udp = 1,
    /// An AF_PACKET socket, whole Ethernet frames built in place, `sendmmsg`, qdisc
    /// bypassed (mode tnapi).
    Packet = 2,
    /// AF_XDP TX, one socket per worker (mode zc).
    Xdp = 3,
}

impl LinkFamily {
    pub fn name(self) -> &'static str {
        match self {
            LinkFamily::Udp => "udp",
            LinkFamily::Packet => "af_packet",
            LinkFamily::Xdp => "af_xdp",
        }
    }

    /// The family of an engine; `VGATE_LINK_TX=udp` in the environment forces the UDP
    /// socket (side-by-side benchmarks).
    pub fn of(kind: EngineKind) -> LinkFamily {
        if std::env::var("VGATE_LINK_TX").as_deref() == Ok("udp") {
            return LinkFamily::Udp;
        }
        match kind {
            EngineKind::Afpacket => LinkFamily::Packet,
            EngineKind::Afxdp => LinkFamily::Xdp,
            _ => LinkFamily::Udp,
        }
    }

    pub(super) fn from_u8(v: u8) -> Option<LinkFamily> {
        [LinkFamily::Udp, LinkFamily::Packet, LinkFamily::Xdp]
            .into_iter()
            .find(|f| *f as u8 == v)
    }
}

// The counters' names (crate::stats) follow the reorder window's own order.
const _: () = assert!(Release::ALL.len() == REORDER_RELEASES.len());
const _: () = assert!(WAIT_BOUNDS_MS.len() + 1 == REORDER_WAITS.len());

impl LinkCounters {
    /// Publishes the decoder's cumulative counts (single writer: the receive worker).
    pub(super) fn publish(&self, c: &DecoderCounts) {
        self.repair_packets.store(c.repair_frames, Relaxed);
        self.delivered.store(c.delivered, Relaxed);
        self.repaired.store(c.repaired, Relaxed);
        self.lost.store(c.lost, Relaxed);
        self.late.store(c.late, Relaxed);
        // The replay window's duplicates (every frame, FEC on or off) and the decoder's.
        let window = self.drops[LinkDrop::Duplicate as usize].load(Relaxed);
        self.duplicate.store(c.duplicate + window, Relaxed);
        self.restarts.store(c.restarts, Relaxed);
        self.reorder_held.store(c.reorder.held, Relaxed);
        self.reorder_expired.store(c.reorder.expired, Relaxed);
        self.reorder_overtaken.store(c.reorder.overtaken, Relaxed);
        self.reorder_waits.store(c.reorder.waits, Relaxed);
        for (a, &v) in self.reorder_released.iter().zip(&c.reorder.released) {
            a.store(v, Relaxed);
        }
        for (a, &v) in self.reorder_waited.iter().zip(&c.reorder.waited) {
            a.store(v, Relaxed);
        }
    }

    /// Publishes the reassembly's cumulative counts (single writer: the receive worker).
    pub(super) fn publish_join(&self, j: &JoinCounts) {
        self.fragments.store(j.fragments, Relaxed);
        self.joined.store(j.joined, Relaxed);
        self.drops[LinkDrop::FragmentLost as usize].store(j.lost, Relaxed);
        self.drops[LinkDrop::FragmentTimeout as usize].store(j.timeout, Relaxed);
        self.drops[LinkDrop::BadFragment as usize].store(j.bad, Relaxed);
    }
}

/// Both links of a half, for stats, the admin API and metrics.
#[derive(Debug)]
pub struct SplitStats {
    pub half: Half,
    pub out_fec: Option<Fec>,
    pub in_fec: Option<Fec>,
    /// Whether each link's frames are authenticated (a key configured).
    pub out_auth: bool,
    pub in_auth: bool,
    pub out_link: LinkCounters,
    pub in_link: LinkCounters,
    /// The outgoing link's [`LinkFamily`] once the links are open (0 before).
    pub(super) out_tx: AtomicU8,
    pub(super) out_if: String,
    pub(super) in_if: String,
    /// The interfaces' counters when this half started: wrong-direction figures are counted
    /// from then.
    pub(super) wrong_base: (Option<u64>, Option<u64>),
}

/// A counter of an interface from sysfs (`rx_packets`, `tx_packets`); `None` when unreadable.
pub(super) fn if_counter(ifname: &str, what: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/statistics/{what}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

impl SplitStats {
    pub fn new(cfg: &SplitConfig) -> SplitStats {
        let (out_if, in_if) = (
            cfg.out_link.interface.clone(),
            cfg.in_link.interface.clone(),
        );
        SplitStats {
            half: cfg.half,
            out_fec: cfg.out_link.fec,
            in_fec: cfg.in_link.fec,
            out_auth: cfg.out_link.key.is_some(),
            in_auth: cfg.in_link.key.is_some(),
            out_link: LinkCounters::default(),
            in_link: LinkCounters::default(),
            out_tx: AtomicU8::new(0),
            wrong_base: (
                if_counter(&out_if, "rx_packets"),
                if_counter(&in_if, "tx_packets"),
            ),
            out_if,
            in_if,
        }
    }

    /// How the outgoing link is sent (`None` until the links are open).
    pub fn out_tx(&self) -> Option<LinkFamily> {
        LinkFamily::from_u8(self.out_tx.load(Relaxed))
    }

    /// Packets that travelled a one-way link the wrong way since start, as the interfaces
    /// count them: received on the outgoing link's interface, and sent on the incoming
    /// link's interface (by anything on this host). Both must stay 0; `None` when the
    /// interface counters cannot be read. Read on the control side, never per packet.
    pub fn wrong_direction(&self) -> (Option<u64>, Option<u64>) {
        let since = |base: Option<u64>, now: Option<u64>| Some(now?.saturating_sub(base?));
        (
            since(self.wrong_base.0, if_counter(&self.out_if, "rx_packets")),
            since(self.wrong_base.1, if_counter(&self.in_if, "tx_packets")),
        )
    }

    /// One `link name=out|in key=value ...` line per link (the shutdown totals).
    pub fn report(&self) -> String {
        let mut s = String::new();
        for (name, c) in [("out", &self.out_link), ("in", &self.in_link)] {
            let v = c.snapshot();
            s.push_str(&format!(
                "link name={name} half={} packets={} bytes={} repair_packets={} send_errors={} delivered={} repaired={} lost={} late={} duplicate={} restarts={} reorder_held={} reorder_expired={} reorder_overtaken={} fragmented={} fragments={} joined={}",
                self.half, v.packets, v.bytes, v.repair_packets, v.send_errors, v.delivered, v.repaired, v.lost, v.late, v.duplicate, v.restarts, v.reorder_held, v.reorder_expired, v.reorder_overtaken, v.fragmented, v.fragments, v.joined
            ));
            s.push_str(&format!(" reorder_waits={}", v.reorder_waits));
            for (n, c) in REORDER_RELEASES.iter().zip(v.reorder_released) {
                s.push_str(&format!(" reorder_released_{n}={c}"));
            }
            for (n, c) in REORDER_WAITS.iter().zip(v.reorder_waited) {
                s.push_str(&format!(" reorder_wait_{n}={c}"));
            }
            for r in LinkDrop::ALL {
                s.push_str(&format!(" drop_{}={}", r.name(), v.drop_count(r)));
            }
            let wrong = if name == "out" {
                self.wrong_direction().0
            } else {
                self.wrong_direction().1
            };
            if let Some(w) = wrong {
                s.push_str(&format!(" wrong_direction={w}"));
            }
            if let (true, Some(tx)) = (name == "out", self.out_tx()) {
                s.push_str(&format!(" tx={}", tx.name()));
            }
            s.push('\n');
        }
        s
    }

    /// JSON for `/api/v1/stats` and `vgate stats`.
    pub fn to_json(&self) -> serde_json::Value {
        let fec = |f: Option<Fec>| f.map(|f| f.to_string()).unwrap_or_else(|| "off".into());
        let link = |c: &LinkCounters, f: Option<Fec>| {
            let s = c.snapshot();
            let mut drops = serde_json::Map::new();
            for r in LinkDrop::ALL {
                drops.insert(r.name().into(), s.drop_count(r).into());
            }
            let named = |names: &[&str], v: &[u64]| -> serde_json::Map<String, serde_json::Value> {
                names
                    .iter()
                    .zip(v)
                    .map(|(n, c)| ((*n).into(), (*c).into()))
                    .collect()
            };
            serde_json::json!({
                "fec": fec(f), "packets": s.packets, "bytes": s.bytes,
                "repair_packets": s.repair_packets, "send_errors": s.send_errors,
                "delivered": s.delivered, "repaired": s.repaired, "lost": s.lost,
                "late": s.late, "duplicate": s.duplicate, "restarts": s.restarts,
                "reorder_held": s.reorder_held, "reorder_expired": s.reorder_expired,
                "reorder_overtaken": s.reorder_overtaken,
                "reorder_waits": s.reorder_waits,
                "reorder_released": named(&REORDER_RELEASES, &s.reorder_released),
                "reorder_waited": named(&REORDER_WAITS, &s.reorder_waited),
                "fragmented": s.fragmented, "fragments": s.fragments, "joined": s.joined,
                "drops": drops,
            })
        };
        let (wrong_out, wrong_in) = self.wrong_direction();
        let mut out = link(&self.out_link, self.out_fec);
        out["authenticated"] = self.out_auth.into();
        out["wrong_direction"] = wrong_out.into();
        out["tx"] = self.out_tx().map(LinkFamily::name).into();
        let mut inl = link(&self.in_link, self.in_fec);
        inl["wrong_direction"] = wrong_in.into();
        inl["authenticated"] = self.in_auth.into();
        serde_json::json!({
            "half": self.half.name(),
            "out_link": out,
            "in_link": inl,
        })
    }
}
