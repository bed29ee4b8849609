//! Media the gateway terminates itself at a domain's edge: stream legs that turn a byte
//! stream (GB/T 28181 RTP over TCP, RFC 4571; RTSP interleaved) into RTP datagrams on the
//! one-way channels and back.
//!
//! The channels between the domains carry datagrams only. When a peer in one domain speaks
//! RTP over TCP, the gateway ends that TCP connection at its own address in that domain — a
//! **leg** ([`leg::Leg`], one thread each) — and the media still crosses only through the
//! route tables and the engines:
//!
//! - **UDP → TCP** ([`crate::sink::EdgeSink`]): a route whose receiver is a leg carries the leg's sink
//!   ([`crate::routes::StreamRoute::edge`]). Every engine, where it would hand an admitted
//!   packet to its egress socket, offers it to the sink instead (preallocated buffer pools, a
//!   2 KiB one and, for legs whose maximum is longer, a small one of that maximum; only the
//!   payload's bytes are copied; no free buffer → the packet is dropped and counted as
//!   `leg_stall`). The leg's thread drains
//!   the sink, frames each packet ([`crate::wire::framing`]) into a bounded write buffer and writes it
//!   non-blocking: a peer that stops reading costs drops, never memory.
//! - **TCP → UDP** ([`Injector`]): the leg's thread de-frames what its peer sends (bad input
//!   counted, never trusted) and puts each packet into the route keyed by the leg's gateway
//!   port, exactly as if it had arrived there as a datagram: [`crate::channel::inspect`]
//!   decides and counts, then the packet leaves from the gateway's egress port in the other
//!   domain (that port's socket in mode stack, the domain's shared raw socket in the ring
//!   modes, which hold no socket per port: [`crate::engine::ports`]) — or, when the far side is a
//!   leg too, straight into that leg's sink. In a split half, when the other domain is the
//!   link face, the packet goes down the outgoing link instead, on the legs' own lane
//!   ([`crate::engine::link::EdgeLink`], one lock per read): a face address has nothing
//!   behind it.
//!
//! A leg's framing is pluggable ([`crate::wire::framing::Framing`]): RFC 4571 here, `$`-interleaved for
//! RTSP. A leg that closes (peer gone, connect refused until its deadline) tells its owner
//! through a callback (the SIP proxy asks [`crate::routes::Routes::request_end`]: BYE both
//! ways). Legs register in [`crate::routes::legs::LegTable`] so the admin interface and the metrics show their
//! counters. This module owns TCP sockets and threads; it never touches the engines' rings.

pub mod leg;

use std::net::{SocketAddrV4, UdpSocket};
use std::sync::{Arc, Weak};

use crate::channel::{inspect, Admitted, Validators, LEG_SLOTS};
use crate::config::DomainId;
use crate::engine::ports::{PortRegistry, PortTx};
use crate::routes::{Channel, Routes, StreamRoute};
use crate::stats::{DropReason, Tally};

use crate::routes::legs::{Inject, LegHandle, Legs};
pub use crate::routes::legs::{LegError as EdgeError, LegSpec, Role};
pub use leg::Leg;

/// Datagrams per `sendmmsg` of an [`Injector`].
const BATCH: usize = 32;

/// The TCP → UDP direction of a leg: puts de-framed packets into the route keyed by the
/// leg's gateway port, as the engines do with datagrams that arrive there.
pub struct Injector {
    routes: Arc<Routes>,
    /// The engine's ports (how to send from a gateway port) and, in a split half, the
    /// outgoing link's lane for legs; `None`: no engine (tests, tools): nothing is sent.
    ports: Option<Arc<PortRegistry>>,
    channel: Channel,
    port: u16,
    max_payload: usize,
    /// The egress socket of the last route seen, by its egress port. Weak: the registry
    /// owns it, and closing the port waits until no one else holds it (`close_port`), so a
    /// strong copy kept here between reads would make the thread that tears the session
    /// down (an RTSP reader handling TEARDOWN) wait on itself and leave the port bound.
    egress: Option<(u16, HeldTx)>,
    /// Whether a packet of the current batch passed every check.
    admitted: bool,
    /// Send headers for one read's packets.
    batch: crate::engine::sys::mmsg::SliceBatch,
    /// The media validator's state of this leg's stream(s): a leg's packets are checked
    /// after de-framing, as a datagram's would be.
    media: Validators,
}

/// How an [`Injector`] keeps the way out of its route's egress port between reads.
enum HeldTx {
    /// The port's socket, weakly (see `Injector::egress`).
    Socket(Weak<UdpSocket>),
    /// A raw socket shared by the domain's legs (ports hold no socket): nothing waits for it.
    Raw(PortTx),
}

impl HeldTx {
    fn of(tx: &PortTx) -> HeldTx {
        match tx {
            PortTx::Socket(s) => HeldTx::Socket(Arc::downgrade(s)),
            raw => HeldTx::Raw(raw.clone()),
        }
    }

    fn get(&self) -> Option<PortTx> {
        match self {
            HeldTx::Socket(w) => w.upgrade().map(PortTx::Socket),
            HeldTx::Raw(tx) => Some(tx.clone()),
        }
    }
}

/// Sends what `scope` holds to the route's receiver and counts it.
fn send(
    scope: &mut crate::engine::sys::mmsg::SliceScope<'_, '_>,
    tx: &PortTx,
    route: &StreamRoute,
    t: &mut Tally,
) {
    let out = tx.egress().send(scope, route.dest);
    crate::engine::frames::account(t, &out, Some(route));
}

impl Injector {
    /// Packets from a leg in `domain` whose gateway port is `port`.
    pub fn new(
        routes: Arc<Routes>,
        ports: Option<Arc<PortRegistry>>,
        domain: DomainId,
        port: u16,
        max_payload: usize,
    ) -> Injector {
        Injector {
            media: Validators::for_routes(LEG_SLOTS, &routes),
            routes,
            ports,
            channel: Channel::from_ingress(domain),
            port,
            max_payload,
            egress: None,
            admitted: false,
            batch: crate::engine::sys::mmsg::SliceBatch::new(BATCH),
        }
    }

    /// The route for the next batch of frames (one lookup per read, not per frame).
    pub fn route(&self) -> Option<Arc<StreamRoute>> {
        self.routes.lookup(self.channel, self.port)
    }

    /// One de-framed packet from `from`, for `route` (from [`Injector::route`]); prefer
    /// [`Injector::forward_batch`] for the frames of one read.
    pub fn forward(
        &mut self,
        route: Option<&StreamRoute>,
        from: SocketAddrV4,
        payload: &[u8],
        now: u64,
        t: &mut Tally,
    ) {
        self.forward_batch(route, from, std::iter::once(payload), now, t);
    }

    /// The de-framed packets of one read, from `from`, for `route` (from
    /// [`Injector::route`]): each checked as a datagram would be, the admitted ones handed to
    /// the far leg's sink or sent from the route's egress socket, one `sendmmsg` per batch.
    pub fn forward_batch<'p>(
        &mut self,
        route: Option<&StreamRoute>,
        from: SocketAddrV4,
        frames: impl Iterator<Item = &'p [u8]>,
        now: u64,
        t: &mut Tally,
    ) {
        let Some(route) = route else {
            for p in frames {
                t.rx_packets += 1;
                t.rx_bytes += p.len() as u64;
                t.drop(DropReason::NoRoute);
            }
            return;
        };
        // In a split half, a route toward the link face goes down the link (one lock per
        // read).
        let mut link = match route.edge {
            Some(_) => None,
            None => self
                .ports
                .as_ref()
                .and_then(|p| p.edge_link.toward(self.channel.egress()))
                .map(|m| m.lock().unwrap_or_else(|e| e.into_inner())),
        };
        let ts_us = if link.is_some() {
            crate::clock::wall_us()
        } else {
            0
        };
        // Held for this batch only (see `egress`).
        let cached = match (&route.edge, &self.egress) {
            (None, Some((p, s))) if link.is_none() && *p == route.egress_port => s.get(),
            _ => None,
        };
        let sock = match (&route.edge, cached) {
            (Some(_), _) => None,
            (None, _) if link.is_some() => None,
            (None, Some(s)) => Some(s),
            (None, None) => {
                let s = self
                    .ports
                    .as_ref()
                    .and_then(|p| p.port_tx(self.channel.egress(), route.egress_port));
                self.egress = s.as_ref().map(|s| (route.egress_port, HeldTx::of(s)));
                s
            }
        };
        let mut scope = self.batch.scope();
        for p in frames {
            t.rx_packets += 1;
            t.rx_bytes += p.len() as u64;
            match inspect(
                route,
                from,
                p,
                false,
                self.max_payload,
                now,
                &mut self.media,
            ) {
                Ok(admitted) => {
                    self.admitted = true;
                    t.relatches += u64::from(admitted == Admitted::Relatched);
                }
                Err(reason) => {
                    t.drop(reason);
                    continue;
                }
            }
            if let Some(sink) = &route.edge {
                crate::engine::frames::offer_to_leg(sink, p, t);
                continue;
            }
            if let Some(tx) = link.as_deref_mut() {
                tx.forward(route, p, now, ts_us, t);
                continue;
            }
            let Some(sock) = &sock else {
                // Only while the route's session is being torn down.
                t.drop(DropReason::SendError);
                continue;
            };
            if scope.is_full() {
                send(&mut scope, sock, route, t);
            }
            scope.push(p);
        }
        if let Some(sock) = &sock {
            send(&mut scope, sock, route, t);
        }
        if let Some(tx) = link.as_deref_mut() {
            tx.flush();
            tx.idle(now);
            // A block left open is closed on time by the incoming link's worker.
            if let Some(p) = &self.ports {
                p.edge_link.sent(tx);
            }
        }
    }

    /// Ends a batch: the route's counters once, and the route kept alive if anything passed.
    pub fn finish(&mut self, route: Option<&StreamRoute>, t: &Tally, now: u64) {
        if let Some(route) = route {
            if std::mem::take(&mut self.admitted) {
                route.touch(now);
            }
            route.stats.packets.add(t);
        }
    }
}

impl Inject for Injector {
    fn route(&self) -> Option<Arc<StreamRoute>> {
        Injector::route(self)
    }

    fn forward_batch(
        &mut self,
        route: Option<&StreamRoute>,
        from: SocketAddrV4,
        buf: &[u8],
        frames: &[std::ops::Range<usize>],
        now: u64,
        t: &mut Tally,
    ) {
        let frames = frames
            .iter()
            .map(|r| buf.get(r.clone()).unwrap_or_default());
        Injector::forward_batch(self, route, from, frames, now, t);
    }

    fn finish(&mut self, route: Option<&StreamRoute>, t: &Tally, now: u64) {
        Injector::finish(self, route, t, now);
    }
}

/// The stream legs of one gateway: the [`Legs`] the signaling proxies are given, over the
/// route tables and the engine's ports.
pub struct EdgeLegs {
    routes: Arc<Routes>,
    ports: Option<Arc<PortRegistry>>,
}

impl EdgeLegs {
    /// `ports`: the engine's (`None`: no engine, as in pure tests: legs run, nothing they
    /// inject is sent).
    pub fn new(routes: Arc<Routes>, ports: Option<Arc<PortRegistry>>) -> EdgeLegs {
        EdgeLegs { routes, ports }
    }
}

impl Legs for EdgeLegs {
    fn start(&self, spec: LegSpec) -> Result<Box<dyn LegHandle>, EdgeError> {
        let leg = Leg::start(spec, Arc::clone(&self.routes), self.ports.clone())?;
        Ok(Box::new(leg))
    }

    fn injector(&self, domain: DomainId, port: u16, max_payload: usize) -> Box<dyn Inject> {
        Box::new(Injector::new(
            Arc::clone(&self.routes),
            self.ports.clone(),
            domain,
            port,
            max_payload,
        ))
    }
}

#[cfg(test)]
pub(crate) mod tests;
