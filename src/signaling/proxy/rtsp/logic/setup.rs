//! SETUP: the ports on both sides, the Transport rewrites, and installing a track's routes
//! when the upstream accepts it (or giving them back when it does not).

use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};

use super::requests::transport_status;
use super::{
    Exchange, InFlight, MediaPorts, SetupKind, Slot, TcpSide, Track, UdpSetup, BAD_GATEWAY,
    MAX_TRACKS,
};
use crate::config::DomainId;
use crate::routes::RouteSpec;
use crate::signaling::rtsp::transport::{Delivery, LowerTransport};
use crate::signaling::rtsp::{parse_transport, select_transport, Editor, Message, Status};

impl<M: MediaPorts> Exchange<M> {
    /// A new track's RTP/RTCP pair on the upstream side (a spare one first).
    pub(super) fn upstream_pair(&mut self) -> Result<u16, Status> {
        if self.state.tracks >= MAX_TRACKS {
            return Err(Status::NOT_ENOUGH_BANDWIDTH);
        }
        match self.spare.pop() {
            Some(p) => Ok(p),
            None => self
                .media
                .alloc_pair(self.settings.client_domain.other())
                .map_err(|_| Status::NOT_ENOUGH_BANDWIDTH),
        }
    }
}

impl<M: MediaPorts> Exchange<M> {
    /// Polices the client's Transport and points the upstream at vgate. Also says whether
    /// the session's transport was settled (the SETUP is then never sent again with the
    /// other one).
    pub(super) fn setup_request(
        &mut self,
        msg: &Message<'_>,
        editor: &mut Editor<'_, '_>,
    ) -> Result<(SetupKind, String, bool), Status> {
        // Every track of the session counts (relayed, UDP or bridged), and so does each
        // SETUP still awaiting its reply.
        let in_flight = self
            .slots
            .iter()
            .filter(|s| matches!(s, Slot::Waiting(f) if f.setup.is_some()))
            .count();
        if self.tracks.len() + in_flight >= MAX_TRACKS {
            return Err(Status::NOT_ENOUGH_BANDWIDTH);
        }
        let value = msg.transport().ok_or(Status::UNSUPPORTED_TRANSPORT)?;
        let specs = parse_transport(value).map_err(transport_status)?;
        let (chosen, delivery) =
            select_transport(&specs, IpAddr::V4(self.client), &self.settings.transports)
                .map_err(transport_status)?;
        let record = chosen
            .mode()
            .is_some_and(|m| m.to_ascii_uppercase().contains("RECORD"))
            || self.announced;
        let profile = format!("{}/{}", chosen.protocol, chosen.profile);
        let spec = chosen.clone().with_unicast().without_destination();
        let mode = if record { ";mode=record" } else { "" };
        // Once the session's first track settled the upstream's lower transport, every
        // further track is asked with it (bridged when the client asked the other one).
        let settled = self.settings.bridge.as_ref().and(self.settled);
        let udp_upstream = settled == Some(LowerTransport::Udp)
            || self
                .settings
                .bridge
                .as_ref()
                .is_some_and(|b| b.udp_upstream);
        let kind = match delivery {
            Delivery::Udp { client_port } => {
                let pair = self.upstream_pair()?;
                let client_rtp = client_port.rtp();
                let setup = UdpSetup {
                    client_rtp,
                    client_rtcp: client_port
                        .rtcp()
                        .unwrap_or_else(|| client_rtp.saturating_add(1)),
                    upstream_pair: pair,
                    record,
                };
                if settled == Some(LowerTransport::Tcp) {
                    let Some(channels) = self.free_channels(TcpSide::Upstream) else {
                        self.spare.push(pair);
                        return Err(self.unbridgeable());
                    };
                    editor
                        .set_header(
                            "Transport",
                            &format!(
                                "{profile}/TCP;unicast;interleaved={}-{}{mode}",
                                channels.0, channels.1
                            ),
                        )
                        .map_err(|_| Status::BAD_REQUEST)?;
                    SetupKind::UdpToTcp { setup, channels }
                } else {
                    let spec = spec
                        .with_client_port(pair, Some(pair + 1))
                        .map_err(|_| Status::INTERNAL_SERVER_ERROR)?;
                    editor
                        .set_header("Transport", &spec.to_string())
                        .map_err(|_| Status::BAD_REQUEST)?;
                    SetupKind::Udp(setup)
                }
            }
            Delivery::Interleaved { channels } if udp_upstream => {
                // Bridged, the client's channels must be free on its connection.
                if channels.is_some_and(|c| {
                    self.channels_taken(TcpSide::Client, (c.first, c.last.max(c.first)))
                }) {
                    return Err(self.taken());
                }
                let pair = self.upstream_pair()?;
                editor
                    .set_header(
                        "Transport",
                        &format!("{profile};unicast;client_port={}-{}{mode}", pair, pair + 1),
                    )
                    .map_err(|_| Status::BAD_REQUEST)?;
                SetupKind::TcpToUdp {
                    channels: channels.map(|c| (c.first, c.last.max(c.first))),
                    upstream_pair: pair,
                    record,
                }
            }
            Delivery::Interleaved { channels } => {
                // Relayed frames keep their channel numbers: they must not be a bridge's
                // on either connection (bridged, the client's channels stay its own).
                if channels.is_some_and(|c| {
                    (c.first..=c.last).any(|c| {
                        self.bridged(TcpSide::Client, c) || self.bridged(TcpSide::Upstream, c)
                    })
                }) {
                    return Err(self.taken());
                }
                editor
                    .set_header("Transport", &spec.to_string())
                    .map_err(|_| Status::BAD_REQUEST)?;
                SetupKind::Interleaved {
                    channels: channels.map(|c| (c.first, c.last.max(c.first))),
                    record,
                }
            }
        };
        Ok((kind, profile, settled.is_some()))
    }
}

impl<M: MediaPorts> Exchange<M> {
    /// A Transport in a reply other than a successful SETUP still must not name domain A.
    pub(super) fn rewrite_transport_source(
        &self,
        msg: &Message<'_>,
        editor: &mut Editor<'_, '_>,
    ) -> Result<(), Status> {
        if let Some(value) = msg.transport() {
            let specs = parse_transport(value).map_err(|_| BAD_GATEWAY)?;
            let ip = IpAddr::V4(self.settings.gateway[self.settings.client_domain.index()]);
            let specs: Vec<_> = specs
                .into_iter()
                .map(|s| {
                    let s = s.without_destination();
                    if s.source().is_some() {
                        s.with_source(ip)
                    } else {
                        s
                    }
                })
                .collect();
            let text = crate::signaling::rtsp::format_transport(&specs);
            editor
                .set_header("Transport", &text)
                .map_err(|_| BAD_GATEWAY)?;
        }
        Ok(())
    }
}

impl<M: MediaPorts> Exchange<M> {
    /// A `2xx` to a SETUP: the track installed as the upstream answered it. An answer with
    /// the other lower transport than asked is taken as it is where it can be bridged (UDP
    /// asked, interleaved answered: a leg on the upstream's channels), never asked again.
    /// The first track's answer settles the session's upstream transport.
    pub(super) fn setup_reply(
        &mut self,
        msg: &Message<'_>,
        kind: SetupKind,
        flight: &InFlight,
        editor: &mut Editor<'_, '_>,
    ) -> Result<(), Status> {
        let answered = super::requests::answered_lower(msg);
        let kind = match kind {
            SetupKind::Udp(setup)
                if answered == Some(LowerTransport::Tcp) && self.settings.bridge.is_some() =>
            {
                let channels = msg
                    .transport()
                    .and_then(|v| parse_transport(v).ok())
                    .and_then(|s| s.first().and_then(|s| s.interleaved()))
                    .map(|c| (c.first, c.last.max(c.first)))
                    .or_else(|| self.free_channels(TcpSide::Upstream))
                    .ok_or_else(|| self.unbridgeable())?;
                SetupKind::UdpToTcp { setup, channels }
            }
            k => k,
        };
        self.setup_reply_as(msg, kind, flight, editor)?;
        if self.settled.is_none() {
            self.settled = answered;
        }
        Ok(())
    }

    fn setup_reply_as(
        &mut self,
        msg: &Message<'_>,
        kind: SetupKind,
        flight: &InFlight,
        editor: &mut Editor<'_, '_>,
    ) -> Result<(), Status> {
        let route = self.route.unwrap_or_default();
        let url = flight.upstream_uri.as_str();
        let value = msg.transport().ok_or(BAD_GATEWAY)?;
        let mut specs = parse_transport(value).map_err(|_| BAD_GATEWAY)?;
        if specs.is_empty() {
            return Err(BAD_GATEWAY);
        }
        let spec = specs.swap_remove(0).without_destination();
        let client_ip = IpAddr::V4(self.settings.gateway[self.settings.client_domain.index()]);
        match kind {
            SetupKind::TcpToUdp { .. } | SetupKind::UdpToTcp { .. } => {
                if spec.lower != kind.upstream_lower() {
                    return Err(self.unbridgeable());
                }
                self.bridge_reply(&spec, kind, flight, route, editor)
            }
            SetupKind::Interleaved { .. } => {
                // Asked again with UDP first when the route can bridge (see upstream_message).
                if spec.lower != LowerTransport::Tcp {
                    return Err(self.unbridgeable());
                }
                let mut track = Track {
                    url: url.to_owned(),
                    ..Track::default()
                };
                if let Some(ch) = spec.interleaved() {
                    // Relayed frames keep their numbers on both connections: none may be a
                    // bridge leg's on either.
                    if (ch.first..=ch.last).any(|c| {
                        self.bridged(TcpSide::Client, c) || self.bridged(TcpSide::Upstream, c)
                    }) {
                        return Err(self.taken());
                    }
                    for c in ch.first..=ch.last {
                        self.channels[usize::from(c)] = true;
                    }
                    track.channels = Some((ch.first, ch.last));
                }
                self.tracks.push(track);
                let spec = if spec.source().is_some() {
                    spec.with_source(client_ip)
                } else {
                    spec
                };
                editor
                    .set_header("Transport", &spec.to_string())
                    .map_err(|_| BAD_GATEWAY)?;
                Ok(())
            }
            SetupKind::Udp(setup) => {
                if spec.lower != LowerTransport::Udp {
                    return Err(self.unbridgeable());
                }
                let upstream = self
                    .settings
                    .upstreams
                    .get(route)
                    .copied()
                    .ok_or(BAD_GATEWAY)?;
                let server_ip = match spec.source().map(str::parse::<Ipv4Addr>) {
                    Some(Ok(ip)) => ip,
                    _ => *upstream.ip(),
                };
                let server_port = spec.server_port();
                let pair = self
                    .media
                    .alloc_pair(self.settings.client_domain)
                    .map_err(|_| Status::NOT_ENOUGH_BANDWIDTH)?;
                self.state.tracks += 1;
                self.track_seq += 1;
                let server_rtp = server_port.map(|p| p.rtp());
                let server_rtcp =
                    server_port.map(|p| p.rtcp().unwrap_or(p.rtp().saturating_add(1)));
                let cd = self.settings.client_domain;
                let ud = cd.other();
                let mut track = Track {
                    url: url.to_owned(),
                    routes: Vec::new(),
                    ports: vec![
                        (ud, setup.upstream_pair),
                        (ud, setup.upstream_pair + 1),
                        (cd, pair),
                        (cd, pair + 1),
                    ],
                    channels: None,
                    leg: None,
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
                    None,
                ) {
                    // What was installed goes back; the upstream-side pair is kept as a spare.
                    self.media
                        .release_track(&track.routes, track.ports.get(2..).unwrap_or_default());
                    self.state.routes = self.state.routes.saturating_sub(track.routes.len());
                    self.state.tracks -= 1;
                    return Err(status);
                }
                self.tracks.push(track);
                let spec = spec
                    .with_client_port(setup.client_rtp, Some(setup.client_rtcp))
                    .and_then(|s| s.with_server_port(pair, Some(pair + 1)))
                    .map_err(|_| BAD_GATEWAY)?
                    .with_source(client_ip);
                editor
                    .set_header("Transport", &spec.to_string())
                    .map_err(|_| BAD_GATEWAY)?;
                Ok(())
            }
        }
    }

    /// The stream routes of one UDP track. `pair` is vgate's client-side pair. With `leg`,
    /// one side is interleaved: the routes toward it end in the leg's sinks, the routes from
    /// it take the leg's frames (that side's ports are 0: any port of its address).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn install(
        &mut self,
        setup: UdpSetup,
        pair: u16,
        client: Ipv4Addr,
        server_ip: Ipv4Addr,
        server_rtp: Option<u16>,
        server_rtcp: Option<u16>,
        track: &mut Track,
        leg: Option<(TcpSide, (u8, u8))>,
    ) -> Result<(), Status> {
        let cd = self.settings.client_domain;
        let ud = cd.other();
        let up = setup.upstream_pair;
        let seq = self.track_seq;
        let name = self.settings.name.clone();
        let label = |what: &str| format!("rtsp:{name}:t{seq}:{what}");
        let server = |p: Option<u16>| SocketAddrV4::new(server_ip, p.unwrap_or(0));
        let mut specs = Vec::new();
        let policy = self.settings.policy;
        let rtp_only = self.settings.rtp_only;
        let rule = self.track_rule(&track.url);
        let route = |ingress: DomainId,
                     port: u16,
                     dest: SocketAddrV4,
                     egress_port: u16,
                     expected: SocketAddrV4,
                     rtp: bool,
                     what: &str| RouteSpec {
            ingress,
            port,
            dest,
            egress_port,
            policy,
            expected: Some(expected),
            rtp_only: rtp && rtp_only,
            label: label(what),
            // RTCP routes: the same mode and policy, RTCP compound packets only.
            media: if rtp {
                rule
            } else {
                rule.map(|r| crate::media::Rule {
                    spec: crate::media::StreamSpec::rtcp(),
                    ..r
                })
            },
        };
        let c_rtp = SocketAddrV4::new(client, setup.client_rtp);
        let c_rtcp = SocketAddrV4::new(client, setup.client_rtcp);
        if setup.record {
            if let (Some(_), Some(_)) = (server_rtp, server_rtcp) {
                specs.push(route(cd, pair, server(server_rtp), up, c_rtp, true, "rtp"));
                specs.push(route(
                    cd,
                    pair + 1,
                    server(server_rtcp),
                    up + 1,
                    c_rtcp,
                    false,
                    "rtcp",
                ));
            }
            specs.push(route(
                ud,
                up + 1,
                c_rtcp,
                pair + 1,
                server(server_rtcp),
                false,
                "rtcp-rr",
            ));
        } else {
            specs.push(route(ud, up, c_rtp, pair, server(server_rtp), true, "rtp"));
            specs.push(route(
                ud,
                up + 1,
                c_rtcp,
                pair + 1,
                server(server_rtcp),
                false,
                "rtcp",
            ));
            if server_rtcp.is_some() {
                specs.push(route(
                    cd,
                    pair + 1,
                    server(server_rtcp),
                    up + 1,
                    c_rtcp,
                    false,
                    "rtcp-rr",
                ));
            }
        }
        for spec in specs {
            let key = (spec.ingress, spec.port);
            // Routes toward the leg's side (egress in its domain) end in its sinks.
            let added = match leg {
                Some((side, channels)) => {
                    let leg_domain = match side {
                        TcpSide::Client => cd,
                        TcpSide::Upstream => ud,
                    };
                    if spec.ingress.other() == leg_domain {
                        let index = usize::from(!spec.label.ends_with(":rtp"));
                        self.media.add_leg_route(spec, side, channels, index)
                    } else {
                        self.media.add_route(spec)
                    }
                }
                None => self.media.add_route(spec),
            };
            added.map_err(|_| Status::NOT_ENOUGH_BANDWIDTH)?;
            track.routes.push(key);
            self.state.routes += 1;
        }
        Ok(())
    }

    /// A SETUP that did not succeed gives its upstream-side pair back for the next one.
    pub(super) fn give_back(&mut self, flight: &InFlight) {
        let pair = match flight.setup {
            Some(SetupKind::Udp(s)) | Some(SetupKind::UdpToTcp { setup: s, .. }) => s.upstream_pair,
            Some(SetupKind::TcpToUdp { upstream_pair, .. }) => upstream_pair,
            _ => return,
        };
        if !self.spare.contains(&pair) {
            self.spare.push(pair);
        }
    }
}
