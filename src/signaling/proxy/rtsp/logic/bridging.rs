//! Bridges between lower transports: a SETUP refused (or answered with the other lower
//! transport) is retried with the other one, and its reply installs the track with a leg on
//! the interleaved side.

use std::net::Ipv4Addr;
use std::sync::atomic::Ordering::Relaxed;

use super::requests::{with_header, LOG_LEG};
use super::{
    Exchange, InFlight, LegSpec, MediaPorts, SetupKind, Slot, TcpSide, Track, UdpSetup,
    BAD_GATEWAY, CHANNELS_TAKEN, MAX_TRACKS, NO_BRIDGE, UNBRIDGEABLE,
};
use crate::signaling::rtsp::{Editor, Message, Status};

impl<M: MediaPorts> Exchange<M> {
    /// A SETUP refused for lack of a bridge: `461` with the reason, counted.
    pub(super) fn unbridgeable(&self) -> Status {
        self.settings.events.bridge_refused.fetch_add(1, Relaxed);
        if self.settings.bridge.is_some() {
            UNBRIDGEABLE
        } else {
            NO_BRIDGE
        }
    }

    /// Whether one of `channels` carries another track on `side`'s connection (relayed
    /// or bridged there).
    pub(super) fn channels_taken(&self, side: TcpSide, channels: (u8, u8)) -> bool {
        [channels.0, channels.1]
            .into_iter()
            .any(|c| self.channels[usize::from(c)] || self.bridged(side, c))
    }

    /// A SETUP refused because its interleaved channels are taken: `461` with the reason,
    /// counted.
    pub(super) fn taken(&self) -> Status {
        self.settings.events.channels_taken.fetch_add(1, Relaxed);
        CHANNELS_TAKEN
    }

    /// The lowest pair of `$` channels free on `side`'s connection (neither relayed nor
    /// bridged there, nor asked of the upstream by a SETUP still awaiting its reply).
    pub(super) fn free_channels(&self, side: TcpSide) -> Option<(u8, u8)> {
        let asked = |c: u8| {
            side == TcpSide::Upstream
                && self.slots.iter().any(|s| {
                    matches!(s, Slot::Waiting(InFlight { setup: Some(SetupKind::UdpToTcp { channels, .. }), .. })
                        if channels.0 == c || channels.1 == c)
                })
        };
        (0u8..=254).step_by(2).find_map(|n| {
            let free =
                |c: u8| !self.channels[usize::from(c)] && !self.bridged(side, c) && !asked(c);
            (free(n) && free(n + 1)).then_some((n, n + 1))
        })
    }

    pub(super) fn mark_bridged(&mut self, side: TcpSide, channels: (u8, u8), on: bool) {
        let table = match side {
            TcpSide::Client => &mut self.client_bridged,
            TcpSide::Upstream => &mut self.upstream_bridged,
        };
        for c in [channels.0, channels.1] {
            table[usize::from(c)] = on;
        }
    }

    /// The upstream refused the lower transport of a SETUP (or answered the other one): the
    /// same SETUP again with the other one, renumbered, for a bridge.
    pub(super) fn retry_setup(
        &mut self,
        msg: &Message<'_>,
        flight: &mut InFlight,
        kind: SetupKind,
        route: usize,
    ) -> Result<Vec<u8>, Status> {
        let mode = if kind.record() { ";mode=record" } else { "" };
        let (next, transport) = match kind {
            SetupKind::Udp(setup) => {
                let Some(channels) = self.free_channels(TcpSide::Upstream) else {
                    return Err(self.unbridgeable());
                };
                (
                    SetupKind::UdpToTcp { setup, channels },
                    format!(
                        "{}/TCP;unicast;interleaved={}-{}{mode}",
                        flight.profile, channels.0, channels.1
                    ),
                )
            }
            SetupKind::Interleaved { channels, record } => {
                let pair = self.upstream_pair()?;
                (
                    SetupKind::TcpToUdp {
                        channels,
                        upstream_pair: pair,
                        record,
                    },
                    format!(
                        "{};unicast;client_port={}-{}{mode}",
                        flight.profile,
                        pair,
                        pair + 1
                    ),
                )
            }
            SetupKind::TcpToUdp { .. } | SetupKind::UdpToTcp { .. } => {
                return Err(self.unbridgeable())
            }
        };
        // From here a failure gives the new kind's pair back (give_back).
        flight.setup = Some(next);
        flight.retried = true;
        let limits = self.settings.limits;
        let fail = |_| Status::INTERNAL_SERVER_ERROR;
        let mut bytes =
            with_header(&flight.sent, &limits, "Transport", &transport).map_err(fail)?;
        let had_session = Message::parse(&flight.sent, &limits)
            .ok()
            .is_some_and(|m| m.header("Session").is_some());
        if let (Ok(Some(session)), false) = (msg.session(), had_session) {
            bytes = with_header(&bytes, &limits, "Session", session.id).map_err(fail)?;
        }
        if let Some(auth) = self.authorization_for(route, "SETUP", &flight.upstream_uri) {
            bytes = with_header(&bytes, &limits, "Authorization", &auth).map_err(fail)?;
        }
        let cseq = self.next_cseq;
        self.next_cseq = self.next_cseq.wrapping_add(1).max(1);
        bytes = with_header(&bytes, &limits, "CSeq", &cseq.to_string()).map_err(fail)?;
        flight.cseq = cseq;
        flight.sent = bytes.clone();
        Ok(bytes)
    }

    /// The upstream's answer to a bridged SETUP: the leg, the track's routes (the leg's
    /// sockets stand for the interleaved side's peer) and the client's Transport.
    pub(super) fn bridge_reply(
        &mut self,
        spec: &crate::signaling::rtsp::transport::TransportSpec<'_>,
        kind: SetupKind,
        flight: &InFlight,
        route: usize,
        editor: &mut Editor<'_, '_>,
    ) -> Result<(), Status> {
        let cd = self.settings.client_domain;
        let ud = cd.other();
        let gateway = self.settings.gateway;
        let upstream = *self.settings.upstreams.get(route).ok_or(BAD_GATEWAY)?;
        let server_ip = match spec.source().map(str::parse::<Ipv4Addr>) {
            Some(Ok(ip)) => ip,
            _ => *upstream.ip(),
        };
        let ssrc = spec
            .ssrc()
            .map(|s| format!(";ssrc={s}"))
            .unwrap_or_default();
        let mode = if kind.record() { ";mode=record" } else { "" };
        if self.state.tracks >= MAX_TRACKS {
            return Err(Status::NOT_ENOUGH_BANDWIDTH);
        }
        let (setup, leg, transport) = match kind {
            SetupKind::TcpToUdp {
                channels,
                upstream_pair,
                record,
            } => {
                let channels = match channels.or_else(|| self.free_channels(TcpSide::Client)) {
                    Some(c) if self.channels_taken(TcpSide::Client, c) => return Err(self.taken()),
                    Some(c) => c,
                    None => return Err(self.unbridgeable()),
                };
                let setup = UdpSetup {
                    client_rtp: 0,
                    client_rtcp: 0,
                    upstream_pair,
                    record,
                };
                let transport = format!(
                    "{}/TCP;unicast;interleaved={}-{}{ssrc}{mode}",
                    flight.profile, channels.0, channels.1
                );
                (setup, (TcpSide::Client, channels), transport)
            }
            SetupKind::UdpToTcp { setup, channels } => {
                let channels = spec
                    .interleaved()
                    .map_or(channels, |c| (c.first, c.last.max(c.first)));
                if self.channels_taken(TcpSide::Upstream, channels) {
                    return Err(self.taken());
                }
                (setup, (TcpSide::Upstream, channels), String::new())
            }
            SetupKind::Udp(_) | SetupKind::Interleaved { .. } => return Err(BAD_GATEWAY),
        };
        let pair = self
            .media
            .alloc_pair(cd)
            .map_err(|_| Status::NOT_ENOUGH_BANDWIDTH)?;
        let (side, channels) = leg;
        let leg = LegSpec {
            domain: match side {
                TcpSide::Client => cd,
                TcpSide::Upstream => ud,
            },
            side,
            channels,
            inject: match side {
                TcpSide::Client => [pair, pair + 1],
                TcpSide::Upstream => [setup.upstream_pair, setup.upstream_pair + 1],
            },
        };
        match self.media.open_leg(leg) {
            Ok(()) => {}
            Err(e) => {
                self.media.release_track(&[], &[(cd, pair), (cd, pair + 1)]);
                if let Some(suppressed) = LOG_LEG.check(crate::clock::now_ms()) {
                    tracing::warn!(route = %self.settings.name, suppressed, "cannot open a bridge leg ({e}); the client gets 461");
                }
                return Err(self.unbridgeable());
            }
        };
        // The interleaved side's peer has no ports: its frames come from its TCP connection
        // (any port of its address), its packets go to the leg's sinks.
        let (setup, server_ip, server_rtp, server_rtcp, transport) = match side {
            TcpSide::Client => {
                let server_port = spec.server_port();
                (
                    UdpSetup {
                        client_rtp: 0,
                        client_rtcp: 0,
                        ..setup
                    },
                    server_ip,
                    server_port.map(|p| p.rtp()),
                    server_port.map(|p| p.rtcp().unwrap_or(p.rtp().saturating_add(1))),
                    transport,
                )
            }
            TcpSide::Upstream => (
                setup,
                *upstream.ip(),
                Some(0),
                Some(0),
                format!(
                    "{};unicast;client_port={}-{};server_port={}-{};source={}{ssrc}{mode}",
                    flight.profile,
                    setup.client_rtp,
                    setup.client_rtcp,
                    pair,
                    pair + 1,
                    gateway[cd.index()]
                ),
            ),
        };
        self.state.tracks += 1;
        self.track_seq += 1;
        let up = setup.upstream_pair;
        let mut track = Track {
            url: flight.upstream_uri.clone(),
            routes: Vec::new(),
            ports: vec![(ud, up), (ud, up + 1), (cd, pair), (cd, pair + 1)],
            channels: None,
            leg: Some((side, channels)),
        };
        let client = self.client;
        if let Err(status) = self.install(
            setup,
            pair,
            client,
            server_ip,
            server_rtp,
            server_rtcp,
            &mut track,
            Some((side, channels)),
        ) {
            self.media
                .release_track(&track.routes, track.ports.get(2..).unwrap_or_default());
            self.media.close_leg(side, channels);
            self.state.routes = self.state.routes.saturating_sub(track.routes.len());
            self.state.tracks -= 1;
            return Err(status);
        }
        self.mark_bridged(side, channels, true);
        self.tracks.push(track);
        editor
            .set_header("Transport", &transport)
            .map_err(|_| BAD_GATEWAY)?;
        Ok(())
    }

    // ---- server → client requests ------------------------------------------------------
}
