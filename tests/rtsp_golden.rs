//! Golden RTSP exchanges through the proxy logic: `tests/golden/rtsp/*.txt` (see its README)
//! are fed message by message to an [`Exchange`] with a fake port allocator; what vgate sends
//! each way, and the stream routes it installs, must match the transcript byte for byte.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::sync::Arc;

use vgate::config::{DomainId, SourcePolicy};
use vgate::routes::{RouteError, RouteSpec};
use vgate::signaling::proxy::rtsp::logic::{
    BridgeSettings, Exchange, LegSpec, MediaPorts, Output, Settings, TcpSide,
};
use vgate::signaling::rtsp::auth::{Credentials, DigestVerifier};
use vgate::signaling::rtsp::transport::TransportPolicy;
use vgate::signaling::rtsp::{Authority, Limits, Route, UrlMap};

/// Hands out pairs from fixed bases and records routes.
#[derive(Default)]
struct FakeMedia {
    next: [u16; 2],
    allocated: Vec<(DomainId, u16)>,
    /// Ports given back by per-track TEARDOWNs.
    freed: Vec<(DomainId, u16)>,
    routes: Vec<RouteSpec>,
    /// Every route ever added (what release takes away stays here).
    history: Vec<RouteSpec>,
    released: usize,
    /// Bridge legs opened, and those closed one by one.
    legs: Vec<LegSpec>,
    closed_legs: Vec<(TcpSide, (u8, u8))>,
    /// Routes ending in a leg: (ingress, port) → its `$` channel.
    leg_routes: BTreeMap<(DomainId, u16), u8>,
}

impl MediaPorts for FakeMedia {
    fn alloc_pair(&mut self, domain: DomainId) -> Result<u16, RouteError> {
        let base = [20000u16, 30000][domain.index()];
        let p = base + self.next[domain.index()];
        self.next[domain.index()] += 2;
        self.allocated.push((domain, p));
        Ok(p)
    }
    fn add_route(&mut self, spec: RouteSpec) -> Result<(), RouteError> {
        self.history.push(spec.clone());
        self.routes.push(spec);
        Ok(())
    }
    fn release_track(&mut self, routes: &[(DomainId, u16)], ports: &[(DomainId, u16)]) {
        self.routes
            .retain(|r| !routes.contains(&(r.ingress, r.port)));
        self.freed.extend_from_slice(ports);
    }
    fn release(&mut self) {
        self.routes.clear();
        self.leg_routes.clear();
        self.released += 1;
    }
    fn open_leg(&mut self, leg: LegSpec) -> std::io::Result<()> {
        self.legs.push(leg);
        Ok(())
    }
    fn add_leg_route(
        &mut self,
        spec: RouteSpec,
        side: TcpSide,
        channels: (u8, u8),
        index: usize,
    ) -> Result<(), RouteError> {
        assert!(
            self.legs
                .iter()
                .any(|l| l.side == side && l.channels == channels),
            "a route into a leg that was never opened"
        );
        let ch = if index == 0 { channels.0 } else { channels.1 };
        self.leg_routes.insert((spec.ingress, spec.port), ch);
        self.add_route(spec)
    }
    fn close_leg(&mut self, side: TcpSide, channels: (u8, u8)) {
        self.closed_legs.push((side, channels));
    }
}

fn settings() -> Settings {
    let camera = Authority::new("10.0.0.5", 8554).unwrap();
    Settings {
        name: "cam".into(),
        map: UrlMap::new(
            Authority::new("192.168.1.1", 554).unwrap(),
            vec![Route::new("/cam1", camera, "/test")],
        ),
        upstreams: vec!["10.0.0.5:8554".parse().unwrap()],
        credentials: vec![None],
        verifier: None,
        client_domain: DomainId::B,
        gateway: [Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(192, 168, 1, 1)],
        policy: SourcePolicy::Strict,
        rtp_only: false,
        media_validate: vgate::config::MediaMode::Off,
        media_policy: Default::default(),
        limits: Limits::default(),
        transports: TransportPolicy::default(),
        bridge: None,
        session_timeout: 30,
        request_timeout: 10,
        stats: Arc::new(vgate::signaling::proxy::SignalingStats::new(
            vgate::config::SignalingKind::Rtsp,
        )),
        events: Arc::new(Default::default()),
        trace: None,
    }
}

fn exchange(s: Settings) -> Exchange<FakeMedia> {
    Exchange::new(
        Arc::new(s),
        FakeMedia::default(),
        Ipv4Addr::new(192, 168, 1, 20),
        7,
    )
}

/// A transcript section as wire bytes: CRLF, Content-Length fixed to the body.
fn wire(text: &str) -> Vec<u8> {
    let text = text.trim_end_matches('\n');
    let (head, body) = match text.split_once("\n\n") {
        Some((h, b)) => (h.to_string(), format!("{}\n", b).replace('\n', "\r\n")),
        None => (text.to_string(), String::new()),
    };
    let mut lines: Vec<String> = head.lines().map(str::to_owned).collect();
    for l in lines.iter_mut() {
        if l.to_ascii_lowercase().starts_with("content-length:") {
            *l = format!("Content-Length: {}", body.len());
        }
    }
    let mut out = lines.join("\r\n");
    out.push_str("\r\n\r\n");
    out.push_str(&body);
    out.into_bytes()
}

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).replace("\r\n", "\n")
}

/// Port names (`A_RTP0`...) → numbers, in allocation order.
fn port_names(media: &FakeMedia) -> BTreeMap<String, u16> {
    let mut names = BTreeMap::new();
    let mut count = [0usize; 2];
    for (d, p) in &media.allocated {
        let side = if *d == DomainId::A { "A" } else { "B" };
        let k = count[d.index()];
        count[d.index()] += 1;
        names.insert(format!("{side}_RTP{k}"), *p);
        names.insert(format!("{side}_RTCP{k}"), *p + 1);
    }
    names
}

fn fill(text: &str, names: &BTreeMap<String, u16>) -> String {
    let mut s = text.to_string();
    // Longest names first so A_RTP1 never eats part of A_RTP10.
    let mut keys: Vec<_> = names.keys().collect();
    keys.sort_by_key(|k| std::cmp::Reverse(k.len()));
    for k in keys {
        s = s.replace(k.as_str(), &names[k].to_string());
    }
    s
}

fn route_line(r: &RouteSpec, media: &FakeMedia) -> String {
    let leg = media
        .leg_routes
        .get(&(r.ingress, r.port))
        .map(|ch| format!(" into leg ${ch}"))
        .unwrap_or_default();
    format!(
        "{} {} -> {} from {} expect {} {}{leg}",
        r.ingress,
        r.port,
        r.dest,
        r.egress_port,
        r.expected.map(|e| e.to_string()).unwrap_or_default(),
        r.label
    )
}

fn run_transcript(path: &Path, mut ex: Exchange<FakeMedia>) -> Exchange<FakeMedia> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if line.starts_with(">> ") || line.starts_with("<< ") {
            sections.push((line.to_string(), String::new()));
        } else if let Some((_, body)) = sections.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    let name = path.file_name().unwrap().to_string_lossy().to_string();
    let mut outputs: std::collections::VecDeque<Output> = Default::default();
    for (i, (marker, body)) in sections.iter().enumerate() {
        let at = format!("{name}: section {} ({marker})", i + 1);
        match marker.as_str() {
            ">> client" => {
                assert!(
                    outputs.is_empty(),
                    "{at}: unexpected outputs left: {outputs:?}"
                );
                outputs.extend(ex.client_message(&wire(&fill(body, &port_names(ex.media()))), 0));
            }
            ">> upstream" => {
                assert!(
                    outputs.is_empty(),
                    "{at}: unexpected outputs left: {outputs:?}"
                );
                outputs.extend(ex.upstream_message(&wire(&fill(body, &port_names(ex.media())))));
            }
            "<< routes" => {
                let names = port_names(ex.media());
                let want: Vec<String> = body
                    .lines()
                    .filter(|l| !l.is_empty())
                    .map(|l| fill(l, &names))
                    .collect();
                let got: Vec<String> = ex
                    .media()
                    .routes
                    .iter()
                    .map(|r| route_line(r, ex.media()))
                    .collect();
                assert_eq!(got, want, "{at}");
            }
            m => {
                let o = outputs
                    .pop_front()
                    .unwrap_or_else(|| panic!("{at}: vgate sent nothing"));
                let names = port_names(ex.media());
                match (m, o) {
                    ("<< upstream", Output::Upstream(b)) | ("<< client", Output::Client(b)) => {
                        let want = show(&wire(&fill(body, &names)));
                        assert_eq!(show(&b), want, "{at}");
                    }
                    ("<< session-ended", Output::SessionEnded)
                    | ("<< track-ended", Output::TrackEnded)
                    | ("<< release-client-legs", Output::ReleaseClientLegs(_))
                    | ("<< close", Output::Close) => {}
                    (m, Output::Connect(a)) if m.starts_with("<< connect ") => {
                        assert_eq!(a.to_string(), m.trim_start_matches("<< connect "), "{at}");
                    }
                    (m, o) => panic!("{at}: expected {m}, vgate did {o:?}"),
                }
            }
        }
    }
    assert!(
        outputs.is_empty(),
        "{name}: outputs left at the end: {outputs:?}"
    );
    ex
}

/// [`run_transcript`] of `tests/golden/rtsp/<file>` on an exchange with `s`.
fn transcript(file: &str, s: Settings) -> Exchange<FakeMedia> {
    run_transcript(&golden(file), exchange(s))
}

/// The leg a bridged track asks for.
fn leg(domain: DomainId, side: TcpSide, channels: (u8, u8), inject: [u16; 2]) -> LegSpec {
    LegSpec {
        domain,
        side,
        channels,
        inject,
    }
}

fn golden(file: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/rtsp")
        .join(file)
}

#[test]
fn udp_two_tracks_relative_controls() {
    let ex = transcript("udp_two_tracks_relative.txt", settings());
    assert_eq!(ex.media().released, 1, "TEARDOWN gives the session back");
}

#[test]
fn each_tracks_rtp_validates_what_describe_offered_for_it() {
    use vgate::media::Codec;
    let mut s = settings();
    s.media_validate = vgate::config::MediaMode::Enforce;
    let ex = transcript("udp_two_tracks_relative.txt", s);
    let rtp: Vec<_> = ex
        .media()
        .history
        .iter()
        .filter(|r| r.label.ends_with(":rtp"))
        .collect();
    assert_eq!(rtp.len(), 2);
    assert!(ex
        .media()
        .history
        .iter()
        .filter(|r| !r.label.ends_with(":rtp"))
        .all(|r| r.media.is_some_and(|m| m.spec.rtcp)));
    let codecs: Vec<_> = rtp
        .iter()
        .map(|r| {
            let rule = r.media.expect("RTP is validated");
            assert!(rule.enforce);
            let f = rule.spec.formats();
            assert_eq!(f.len(), 1, "{:?}", r.label);
            (f[0].pt, f[0].codec, f[0].clock_rate)
        })
        .collect();
    assert_eq!(
        codecs,
        [(26, Codec::Jpeg, 90000), (0, Codec::Pcmu, 8000)],
        "stream=0 is the JPEG track, stream=1 the G.711 one"
    );
}

#[test]
fn enforce_refuses_the_setup_of_a_track_no_format_of_which_may_cross_with_415() {
    use std::sync::atomic::Ordering::Relaxed;
    let mut s = settings();
    s.media_validate = vgate::config::MediaMode::Enforce;
    let events = Arc::clone(&s.events);
    let ex = transcript("media_refused_setup.txt", s);
    assert_eq!(events.media_refused.load(Relaxed), 1);
    let rtp = ex
        .media()
        .history
        .iter()
        .find(|r| r.label.ends_with(":rtp"));
    let rule = rtp
        .and_then(|r| r.media)
        .expect("the audio track is validated");
    assert_eq!(rule.spec.formats().len(), 1);
    assert_eq!(rule.spec.formats()[0].codec, vgate::media::Codec::Pcmu);
}

#[test]
fn enforce_refuses_an_announce_of_only_refused_tracks_with_415() {
    use std::sync::atomic::Ordering::Relaxed;
    let mut s = settings();
    s.media_validate = vgate::config::MediaMode::Enforce;
    let events = Arc::clone(&s.events);
    let ex = transcript("media_refused_announce.txt", s);
    assert_eq!(events.media_refused.load(Relaxed), 2);
    assert!(ex.media().allocated.is_empty(), "no ports taken");
}

#[test]
fn count_sets_up_the_same_tracks_and_refuses_nothing() {
    use std::sync::atomic::Ordering::Relaxed;
    for mode in [
        vgate::config::MediaMode::Count,
        vgate::config::MediaMode::Off,
    ] {
        let mut s = settings();
        s.media_validate = mode;
        let events = Arc::clone(&s.events);
        let ex = transcript("media_unknown_codec_counted.txt", s);
        assert_eq!(events.media_refused.load(Relaxed), 0);
        let validated = ex
            .media()
            .history
            .iter()
            .filter(|r| r.label.ends_with(":rtp") && r.media.is_some())
            .count();
        assert_eq!(
            validated,
            if mode == vgate::config::MediaMode::Off {
                0
            } else {
                2
            }
        );
    }
}

#[test]
fn interleaved_absolute_controls_pipelined() {
    let ex = transcript("interleaved_absolute_pipelined.txt", settings());
    for ch in 0..=3 {
        assert!(ex.channel_allowed(ch), "channel {ch} negotiated");
    }
    assert!(!ex.channel_allowed(4));
    assert!(
        ex.media().allocated.is_empty(),
        "interleaved needs no ports"
    );
    assert!(ex.state().playing);
}

#[test]
fn udp_refusals_and_port_reuse() {
    let ex = transcript("udp_refusals.txt", settings());
    assert_eq!(
        ex.media().allocated.len(),
        2,
        "one pair per side: the failed SETUP's pair was reused"
    );
}

#[test]
fn record_announce_udp_on_the_reverse_channel() {
    let ex = transcript("record_announce_udp.txt", settings());
    assert_eq!(ex.media().released, 1, "TEARDOWN gives the session back");
    assert!(!ex.state().playing);
}

#[test]
fn transport_mismatch_is_refused_promptly_both_ways() {
    let ex = transcript("transport_mismatch.txt", settings());
    assert!(!ex.channel_allowed(0) && !ex.channel_allowed(1));
    assert_eq!(ex.pending(), 0, "nothing left waiting");
    assert_eq!(
        ex.media().allocated.len(),
        1,
        "no client-side pair for a refused SETUP"
    );
}

#[test]
fn per_track_teardown_frees_only_that_track() {
    let ex = transcript("per_track_teardown.txt", settings());
    let m = ex.media();
    // Allocation order: A0 (SETUP out), B0 (its reply), A1, B1.
    let (a1, b1) = (m.allocated[2].1, m.allocated[3].1);
    assert_eq!(
        m.freed,
        vec![
            (DomainId::A, a1),
            (DomainId::A, a1 + 1),
            (DomainId::B, b1),
            (DomainId::B, b1 + 1)
        ],
        "the second track's four ports, and only those"
    );
    assert_eq!(m.released, 1, "the aggregate TEARDOWN ends the rest");
    assert_eq!(ex.state().tracks, 0);
}

#[test]
fn server_requests_reach_the_client_rewritten() {
    let s = settings();
    let events = Arc::clone(&s.events);
    transcript("server_requests.txt", s);
    let ev: BTreeMap<_, _> = events.list().into_iter().collect();
    assert_eq!(ev["server_requests_forwarded"], 3);
    assert_eq!(ev["server_requests_answered"], 1);
    assert_eq!(ev["client_replies_forwarded"], 3);
}

fn bridging() -> Settings {
    Settings {
        bridge: Some(BridgeSettings {
            max_payload: 1500,
            udp_upstream: false,
        }),
        ..settings()
    }
}

#[test]
fn bridge_interleaved_client_to_a_udp_only_server() {
    let ex = transcript("bridge_tcp_client_udp_server.txt", bridging());
    let m = ex.media();
    assert_eq!(
        m.legs,
        [leg(DomainId::B, TcpSide::Client, (0, 1), [30000, 30001])]
    );
    assert!(!ex.bridged(TcpSide::Client, 0), "the session ended");
    assert_eq!(
        m.released, 1,
        "TEARDOWN gives the session (and its leg) back"
    );
}

#[test]
fn bridge_udp_client_to_an_interleaved_only_server() {
    let ex = transcript("bridge_udp_client_tcp_server.txt", bridging());
    let m = ex.media();
    assert_eq!(
        m.legs,
        [leg(DomainId::A, TcpSide::Upstream, (0, 1), [20000, 20001])]
    );
    assert!(ex.bridged(TcpSide::Upstream, 1));
    assert!(!ex.channel_allowed(0), "bridged channels are not relayed");
    assert_eq!(ex.pending(), 0);
}

#[test]
fn bridge_when_the_server_answers_the_other_transport() {
    let ex = transcript("bridge_other_transport_answered.txt", bridging());
    assert_eq!(ex.media().legs.len(), 1);
    assert!(ex.bridged(TcpSide::Upstream, 0));
}

#[test]
fn bridge_refused_both_ways_is_a_461_with_the_reason() {
    let ex = transcript("bridge_refused_both.txt", bridging());
    assert!(ex.media().legs.is_empty());
    assert_eq!(ex.media().allocated.len(), 1, "the retry's pair was reused");
    assert_eq!(ex.pending(), 1, "the second SETUP awaits its reply");
}

/// A server that fixes the session's lower transport at its first SETUP, TCP only, and a UDP
/// client: every track after the first goes upstream interleaved at once, on its own pair.
#[test]
fn multi_track_udp_client_of_a_tcp_server_that_fixes_the_transport() {
    let s = bridging();
    let events = Arc::clone(&s.events);
    let ex = transcript("multi_track_udp_client_tcp_server.txt", s);
    let m = ex.media();
    let upstream = |channels, inject| leg(DomainId::A, TcpSide::Upstream, channels, inject);
    assert_eq!(
        m.legs,
        [
            upstream((0, 1), [20000, 20001]),
            upstream((2, 3), [20002, 20003])
        ]
    );
    assert_eq!(m.released, 1, "TEARDOWN gives the session back");
    assert!(!ex.bridged(TcpSide::Upstream, 2), "the session ended");
    assert_eq!(
        events
            .bridge_refused
            .load(std::sync::atomic::Ordering::Relaxed),
        0,
        "the server's refusal of track 2 is not a bridge's"
    );
}

/// The same server UDP only, an interleaved client with three tracks: tracks 1 and 2 go
/// upstream over UDP at once, each track's leg on its own client channel pair.
#[test]
fn multi_track_interleaved_client_of_a_udp_server_that_fixes_the_transport() {
    let ex = transcript("multi_track_tcp_client_udp_server.txt", bridging());
    let m = ex.media();
    let client = |channels, inject| leg(DomainId::B, TcpSide::Client, channels, inject);
    assert_eq!(
        m.legs,
        [
            client((0, 1), [30000, 30001]),
            client((2, 3), [30002, 30003]),
            client((4, 5), [30004, 30005])
        ]
    );
    assert_eq!(m.closed_legs, [(TcpSide::Client, (2, 3))], "track 1's leg");
    let mut freed = m.freed.clone();
    freed.sort();
    assert_eq!(
        freed,
        [
            (DomainId::A, 20002),
            (DomainId::A, 20003),
            (DomainId::B, 30002),
            (DomainId::B, 30003)
        ],
        "track 1's ports, both sides"
    );
    assert_eq!(m.released, 1);
}

/// A session's track limit counts every track, bridged or relayed, and SETUPs in flight:
/// the SETUP beyond `MAX_TRACKS` gets 453 and nothing goes upstream; TEARDOWN gives every
/// track back.
#[test]
fn track_limit_counts_every_track_of_a_session() {
    use vgate::signaling::proxy::rtsp::logic::MAX_TRACKS;
    let mut ex = exchange(bridging());
    let mut upstream_cseq = 0;
    for t in 0..=MAX_TRACKS {
        // Interleaved relayed tracks on even channel pairs, pipelined: none answered yet.
        let outs = one_message(
            &mut ex,
            &format!(
                "SETUP rtsp://192.168.1.1:554/cam1/stream={t} RTSP/1.0\nCSeq: {}\nTransport: RTP/AVP/TCP;unicast;interleaved={}-{}\n",
                t + 1,
                2 * t,
                2 * t + 1
            ),
            true,
        );
        let sent = outs.iter().any(|o| matches!(o, Output::Upstream(_)));
        if t < MAX_TRACKS {
            assert!(sent, "track {t}: {outs:?}");
            upstream_cseq += 1;
        } else {
            assert!(!sent, "track {t} beyond the limit went upstream");
            assert!(
                !outs.iter().any(|o| matches!(o, Output::Client(_))),
                "the 453 waits for the replies before it"
            );
        }
    }
    for c in 1..=upstream_cseq {
        let outs = one_message(
            &mut ex,
            &format!(
                "RTSP/1.0 200 OK\nCSeq: {c}\nTransport: RTP/AVP/TCP;unicast;interleaved={}-{}\nSession: 9\n",
                2 * c - 2,
                2 * c - 1
            ),
            false,
        );
        if c == upstream_cseq {
            let last = outs.iter().rev().find_map(|o| match o {
                Output::Client(b) => Some(show(b)),
                _ => None,
            });
            assert!(
                last.as_deref()
                    .is_some_and(|r| r.starts_with("RTSP/1.0 453 ")),
                "{last:?}"
            );
        }
    }
    assert_eq!(ex.pending(), 0);
    // Settled on interleaved; a UDP track beyond the limit is refused too, no port taken.
    let allocated = ex.media().allocated.len();
    let outs = one_message(
        &mut ex,
        "SETUP rtsp://192.168.1.1:554/cam1/stream=99 RTSP/1.0\nCSeq: 40\nTransport: RTP/AVP;unicast;client_port=5000-5001\nSession: 9\n",
        true,
    );
    assert!(matches!(&outs[..], [Output::Client(b)] if show(b).starts_with("RTSP/1.0 453 ")));
    assert_eq!(ex.media().allocated.len(), allocated);
    let outs = one_message(
        &mut ex,
        "TEARDOWN rtsp://192.168.1.1:554/cam1/ RTSP/1.0\nCSeq: 41\nSession: 9\n",
        true,
    );
    assert!(outs.contains(&Output::SessionEnded));
    assert_eq!(ex.media().released, 1);
    assert!(!ex.channel_allowed(0));
}

/// Pipelined SETUPs of a session settled on interleaved ask the server for distinct channel
/// pairs: one in flight reserves its pair.
#[test]
fn pipelined_setups_over_a_settled_tcp_session_ask_distinct_channels() {
    let mut ex = exchange(bridging());
    let setup = |t: usize, c: usize| {
        format!("SETUP rtsp://192.168.1.1:554/cam1/stream={t} RTSP/1.0\nCSeq: {c}\nTransport: RTP/AVP;unicast;client_port={}-{}\nSession: 9\n", 5000 + 2 * t, 5001 + 2 * t)
    };
    let sent = |outs: &[Output]| {
        outs.iter()
            .find_map(|o| match o {
                Output::Upstream(b) => Some(show(b)),
                _ => None,
            })
            .unwrap_or_default()
    };
    one_message(&mut ex, &setup(0, 1).replace("Session: 9\n", ""), true);
    let retry = one_message(
        &mut ex,
        "RTSP/1.0 461 Unsupported Transport\nCSeq: 1\n",
        false,
    );
    assert!(sent(&retry).contains("interleaved=0-1"), "{}", sent(&retry));
    one_message(
        &mut ex,
        "RTSP/1.0 200 OK\nCSeq: 2\nTransport: RTP/AVP/TCP;unicast;interleaved=0-1\nSession: 9\n",
        false,
    );
    let one = sent(&one_message(&mut ex, &setup(1, 2), true));
    let two = sent(&one_message(&mut ex, &setup(2, 3), true));
    assert!(
        one.contains("Transport: RTP/AVP/TCP;unicast;interleaved=2-3\n"),
        "{one}"
    );
    assert!(
        two.contains("Transport: RTP/AVP/TCP;unicast;interleaved=4-5\n"),
        "{two}"
    );
}

/// A split half whose upstream is the link face: an interleaved client's SETUP goes
/// upstream over UDP at once (never interleaved over the signaling link), and the reply
/// opens the bridge leg on the client's side.
#[test]
fn toward_the_split_link_face_an_interleaved_setup_goes_upstream_over_udp() {
    let mut s = bridging();
    s.bridge = Some(BridgeSettings {
        max_payload: 1444,
        udp_upstream: true,
    });
    let mut ex = exchange(s);
    let outs = one_message(
        &mut ex,
        "SETUP rtsp://192.168.1.1:554/cam1/stream=0 RTSP/1.0\nCSeq: 1\nTransport: RTP/AVP/TCP;unicast;interleaved=0-1\n",
        true,
    );
    let Some(Output::Upstream(sent)) = outs.iter().find(|o| matches!(o, Output::Upstream(_)))
    else {
        panic!("{outs:?}")
    };
    let sent = show(sent);
    let pair = ex.media().allocated[0].1;
    assert!(
        sent.contains(&format!(
            "Transport: RTP/AVP;unicast;client_port={pair}-{}\n",
            pair + 1
        )),
        "{sent}"
    );
    assert!(!sent.contains("interleaved"), "{sent}");
    let outs = one_message(
        &mut ex,
        &format!("RTSP/1.0 200 OK\nCSeq: 1\nTransport: RTP/AVP;unicast;client_port={pair}-{};server_port=7000-7001\nSession: 1234;timeout=60\n", pair + 1),
        false,
    );
    let Some(Output::Client(reply)) = outs.iter().find(|o| matches!(o, Output::Client(_))) else {
        panic!("{outs:?}")
    };
    let reply = show(reply);
    assert!(reply.starts_with("RTSP/1.0 200 OK"), "{reply}");
    assert!(
        reply.contains("Transport: RTP/AVP/TCP;unicast;interleaved=0-1"),
        "{reply}"
    );
    assert_eq!(ex.media().legs.len(), 1, "the client's side is bridged");
    assert_eq!(ex.media().legs[0].side, TcpSide::Client);
}

/// The kinds of `outs`, for order checks: `C` a reply to the client, `U` a request
/// upstream, `R` the release of the client's legs, `-` anything else.
fn kinds(outs: &[Output]) -> String {
    outs.iter()
        .map(|o| match o {
            Output::Client(_) => 'C',
            Output::Upstream(_) => 'U',
            Output::ReleaseClientLegs(_) => 'R',
            _ => '-',
        })
        .collect()
}

/// An interleaved client bridged to a UDP-only server (the split half's way: UDP upstream
/// at once): the leg on the client's connection is released only right after a 200 to PLAY
/// or RECORD (or to a SETUP while playing) is written to the client; a failed PLAY, a
/// pipelined PLAY whose reply waits behind another, and a UDP-only session release nothing
/// early.
#[test]
fn client_legs_are_released_right_after_the_reply_that_starts_the_media() {
    let mut s = bridging();
    s.bridge = Some(BridgeSettings {
        max_payload: 1444,
        udp_upstream: true,
    });
    let mut ex = exchange(s);
    let setup = |ex: &mut Exchange<FakeMedia>, cseq: u32, track: u32, channels: &str| {
        let outs = one_message(
            ex,
            &format!("SETUP rtsp://192.168.1.1:554/cam1/stream={track} RTSP/1.0\nCSeq: {cseq}\nSession: 1234\nTransport: RTP/AVP/TCP;unicast;interleaved={channels}\n"),
            true,
        );
        assert!(kinds(&outs).ends_with('U'), "{outs:?}");
        let pair = ex.media().allocated.last().unwrap().1;
        one_message(
            ex,
            &format!("RTSP/1.0 200 OK\nCSeq: {}\nTransport: RTP/AVP;unicast;client_port={pair}-{};server_port=7000-7001\nSession: 1234;timeout=60\n", cseq, pair + 1),
            false,
        )
    };
    let play = |ex: &mut Exchange<FakeMedia>, method: &str, cseq: u32| {
        one_message(
            ex,
            &format!(
                "{method} rtsp://192.168.1.1:554/cam1 RTSP/1.0\nCSeq: {cseq}\nSession: 1234\n"
            ),
            true,
        )
    };
    let answer = |ex: &mut Exchange<FakeMedia>, status: &str, cseq: u32| {
        one_message(
            ex,
            &format!("RTSP/1.0 {status}\nCSeq: {cseq}\nSession: 1234\n"),
            false,
        )
    };
    // The SETUP reply opens the leg (held): nothing releases it.
    assert_eq!(kinds(&setup(&mut ex, 1, 0, "0-1")), "C");
    assert_eq!(ex.media().legs.len(), 1);
    // A failed PLAY: its reply, no release.
    assert_eq!(kinds(&play(&mut ex, "PLAY", 2)), "U");
    assert_eq!(kinds(&answer(&mut ex, "454 Session Not Found", 2)), "C");
    assert!(!ex.state().playing);
    // PLAY pipelined behind a GET_PARAMETER: the server answers the PLAY first, but its
    // reply (and the release after it) waits for the earlier reply to go out.
    assert_eq!(kinds(&play(&mut ex, "GET_PARAMETER", 3)), "U");
    assert_eq!(kinds(&play(&mut ex, "PLAY", 4)), "U");
    assert_eq!(
        kinds(&answer(&mut ex, "200 OK", 4)),
        "",
        "held behind CSeq 3"
    );
    let outs = answer(&mut ex, "200 OK", 3);
    assert_eq!(kinds(&outs), "CCR", "{outs:?}");
    let Output::Client(reply) = &outs[1] else {
        unreachable!()
    };
    assert!(
        show(reply).contains("CSeq: 4\n"),
        "the PLAY's reply, then the release"
    );
    // A second bridged track set up while playing: released right after its SETUP reply.
    assert_eq!(kinds(&setup(&mut ex, 5, 1, "2-3")), "CR");
    assert_eq!(ex.media().legs.len(), 2);
    // Other replies while playing release nothing more.
    assert_eq!(kinds(&play(&mut ex, "GET_PARAMETER", 6)), "U");
    assert_eq!(kinds(&answer(&mut ex, "200 OK", 6)), "C");
    // PAUSE, then PLAY again: released again (idempotent on the legs).
    assert_eq!(kinds(&play(&mut ex, "PAUSE", 7)), "U");
    assert_eq!(kinds(&answer(&mut ex, "200 OK", 7)), "C");
    assert_eq!(kinds(&play(&mut ex, "PLAY", 8)), "U");
    assert_eq!(kinds(&answer(&mut ex, "200 OK", 8)), "CR");
    // Replies out of order: a PLAY's reply waits behind a GET_PARAMETER while a SETUP sent
    // after the PLAY is answered and opens its leg. The PLAY's release names only the legs
    // that existed at its reply; the new leg is released after its own SETUP reply.
    assert_eq!(kinds(&play(&mut ex, "GET_PARAMETER", 9)), "U");
    assert_eq!(kinds(&play(&mut ex, "PLAY", 10)), "U");
    let outs = one_message(
        &mut ex,
        "SETUP rtsp://192.168.1.1:554/cam1/stream=2 RTSP/1.0\nCSeq: 11\nSession: 1234\nTransport: RTP/AVP/TCP;unicast;interleaved=4-5\n",
        true,
    );
    assert!(kinds(&outs).ends_with('U'), "{outs:?}");
    assert_eq!(
        kinds(&answer(&mut ex, "200 OK", 10)),
        "",
        "held behind CSeq 9"
    );
    let pair = ex.media().allocated.last().unwrap().1;
    let outs = one_message(
        &mut ex,
        &format!("RTSP/1.0 200 OK\nCSeq: 11\nTransport: RTP/AVP;unicast;client_port={pair}-{};server_port=7000-7001\nSession: 1234;timeout=60\n", pair + 1),
        false,
    );
    assert_eq!(kinds(&outs), "", "held behind CSeq 9");
    assert_eq!(ex.media().legs.len(), 3, "the SETUP opened its leg");
    let outs = answer(&mut ex, "200 OK", 9);
    assert_eq!(kinds(&outs), "CCRCR", "{outs:?}");
    let released: Vec<_> = outs
        .iter()
        .filter_map(|o| match o {
            Output::ReleaseClientLegs(c) => Some(c.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        released,
        [vec![(0, 1), (2, 3)], vec![(0, 1), (2, 3), (4, 5)]],
        "the PLAY's release leaves out the leg opened after its reply"
    );

    // A UDP client (no leg on its connection) is never told to release anything.
    let mut ex = exchange(bridging());
    let outs = one_message(
        &mut ex,
        "SETUP rtsp://192.168.1.1:554/cam1/stream=0 RTSP/1.0\nCSeq: 1\nTransport: RTP/AVP;unicast;client_port=41000-41001\n",
        true,
    );
    assert_eq!(kinds(&outs), "-U", "connect, SETUP");
    let pair = ex.media().allocated.last().unwrap().1;
    let outs = answer_setup_udp(&mut ex, pair);
    assert_eq!(kinds(&outs), "C");
    assert_eq!(kinds(&play(&mut ex, "PLAY", 2)), "U");
    assert_eq!(kinds(&answer(&mut ex, "200 OK", 2)), "C");
    assert!(ex.state().playing);

    // RECORD releases like PLAY.
    let mut s = bridging();
    s.bridge = Some(BridgeSettings {
        max_payload: 1444,
        udp_upstream: true,
    });
    let mut ex = exchange(s);
    assert_eq!(kinds(&setup(&mut ex, 1, 0, "0-1")), "C");
    assert_eq!(kinds(&play(&mut ex, "RECORD", 2)), "U");
    assert_eq!(kinds(&answer(&mut ex, "200 OK", 2)), "CR");
    assert!(ex.state().recording);
}

fn answer_setup_udp(ex: &mut Exchange<FakeMedia>, pair: u16) -> Vec<Output> {
    one_message(
        ex,
        &format!("RTSP/1.0 200 OK\nCSeq: 1\nTransport: RTP/AVP;unicast;client_port={pair}-{};server_port=7000-7001\nSession: 1234;timeout=60\n", pair + 1),
        false,
    )
}

#[test]
fn bridge_refuses_channels_another_track_answered_on_the_server_connection() {
    let s = bridging();
    let events = Arc::clone(&s.events);
    let ex = transcript("bridge_channels_taken_server.txt", s);
    let m = ex.media();
    assert_eq!(
        m.legs.len(),
        1,
        "no second leg on the first track's channels"
    );
    assert_eq!(m.legs[0].channels, (0, 1));
    assert!(ex.bridged(TcpSide::Upstream, 0));
    assert!(
        !ex.bridged(TcpSide::Upstream, 2),
        "the asked channels are not taken"
    );
    assert_eq!(ex.pending(), 0);
    let ev: BTreeMap<_, _> = events.list().into_iter().collect();
    assert_eq!(ev["channels_taken"], 1);
    assert_eq!(ev["bridge_refused"], 0);
}

#[test]
fn bridge_refuses_client_channels_another_track_takes() {
    let s = bridging();
    let events = Arc::clone(&s.events);
    let ex = transcript("bridge_channels_taken_client.txt", s);
    let m = ex.media();
    assert_eq!(m.legs.len(), 1);
    assert!(ex.bridged(TcpSide::Client, 1));
    assert_eq!(ex.pending(), 0, "nothing was sent for the refused SETUP");
    let ev: BTreeMap<_, _> = events.list().into_iter().collect();
    assert_eq!(ev["channels_taken"], 1);
}

/// Every golden file is run by a test above.
#[test]
fn every_transcript_is_tested() {
    let mut files: Vec<String> = std::fs::read_dir(golden(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".txt"))
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "bridge_channels_taken_client.txt",
            "bridge_channels_taken_server.txt",
            "bridge_other_transport_answered.txt",
            "bridge_refused_both.txt",
            "bridge_tcp_client_udp_server.txt",
            "bridge_udp_client_tcp_server.txt",
            "interleaved_absolute_pipelined.txt",
            "media_refused_announce.txt",
            "media_refused_setup.txt",
            "media_unknown_codec_counted.txt",
            "multi_track_tcp_client_udp_server.txt",
            "multi_track_udp_client_tcp_server.txt",
            "per_track_teardown.txt",
            "record_announce_udp.txt",
            "server_requests.txt",
            "transport_mismatch.txt",
            "udp_refusals.txt",
            "udp_two_tracks_relative.txt"
        ]
    );
}

fn one_message(ex: &mut Exchange<FakeMedia>, raw: &str, from_client: bool) -> Vec<Output> {
    let bytes = wire(raw);
    if from_client {
        ex.client_message(&bytes, 1_000)
    } else {
        ex.upstream_message(&bytes)
    }
}

/// vgate answers the upstream's Digest challenge itself; the client never sees the 401
/// and the password never appears in what vgate sends.
#[test]
fn upstream_digest_challenge_is_answered_by_vgate() {
    let mut s = settings();
    s.credentials = vec![Some(Credentials::new("admin", "s3cret-pw"))];
    let mut ex = exchange(s);
    let outs = one_message(
        &mut ex,
        "DESCRIBE rtsp://192.168.1.1:554/cam1 RTSP/1.0\nCSeq: 2\nAuthorization: Basic Y2xpZW50OnB3\n",
        true,
    );
    let Output::Upstream(first) = &outs[1] else {
        panic!("{outs:?}")
    };
    assert!(
        !show(first).contains("Authorization"),
        "client credentials never cross"
    );
    let outs = one_message(
        &mut ex,
        "RTSP/1.0 401 Unauthorized\nCSeq: 1\nWWW-Authenticate: Digest realm=\"cam\", nonce=\"abc123\"\n",
        false,
    );
    assert_eq!(outs.len(), 1, "{outs:?}");
    let Output::Upstream(retry) = &outs[0] else {
        panic!("{outs:?}")
    };
    let retry = show(retry);
    assert!(
        retry.starts_with("DESCRIBE rtsp://10.0.0.5:8554/test RTSP/1.0\n"),
        "{retry}"
    );
    assert!(retry.contains("CSeq: 2\n"), "{retry}");
    assert!(retry.contains("Authorization: Digest username=\"admin\", realm=\"cam\", nonce=\"abc123\", uri=\"rtsp://10.0.0.5:8554/test\", response=\""), "{retry}");
    assert!(!retry.contains("s3cret-pw"));
    // The answer is the one RFC 2617 gives without qop.
    let ha1 = md5_hex("admin:cam:s3cret-pw");
    let ha2 = md5_hex("DESCRIBE:rtsp://10.0.0.5:8554/test");
    assert!(
        retry.contains(&md5_hex(&format!("{ha1}:abc123:{ha2}"))),
        "{retry}"
    );
    let outs = one_message(&mut ex, "RTSP/1.0 200 OK\nCSeq: 2\n", false);
    assert_eq!(
        outs,
        vec![Output::Client(wire("RTSP/1.0 200 OK\nCSeq: 2\n"))]
    );
    // Later requests carry credentials from the start.
    let outs = one_message(
        &mut ex,
        "OPTIONS rtsp://192.168.1.1:554/cam1 RTSP/1.0\nCSeq: 3\n",
        true,
    );
    let Output::Upstream(next) = &outs[0] else {
        panic!("{outs:?}")
    };
    assert!(
        show(next).contains("Authorization: Digest "),
        "{}",
        show(next)
    );
    // Refused credentials are vgate's problem, not the client's: 502, no challenge.
    let outs = one_message(
        &mut ex,
        "RTSP/1.0 401 Unauthorized\nCSeq: 3\nWWW-Authenticate: Digest realm=\"cam\", nonce=\"zzz\"\n",
        false,
    );
    let Output::Upstream(_) = &outs[0] else {
        panic!("{outs:?}")
    };
    let outs = one_message(
        &mut ex,
        "RTSP/1.0 401 Unauthorized\nCSeq: 4\nWWW-Authenticate: Digest realm=\"cam\", nonce=\"zzz\"\n",
        false,
    );
    assert_eq!(
        outs,
        vec![Output::Client(wire("RTSP/1.0 502 Bad Gateway\nCSeq: 3\n"))]
    );
}

fn md5_hex(s: &str) -> String {
    use md5::Digest;
    md5::Md5::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// With client users configured, vgate challenges the client and only forwards once the
/// client's Digest answer checks out.
#[test]
fn client_must_authenticate_to_vgate() {
    let mut s = settings();
    s.verifier = Some(DigestVerifier::new(
        "vgate",
        [9; 32],
        vec![Credentials::new("viewer", "pw")],
    ));
    let mut ex = exchange(s);
    let outs = one_message(
        &mut ex,
        "OPTIONS rtsp://192.168.1.1:554/cam1 RTSP/1.0\nCSeq: 1\n",
        true,
    );
    let [Output::Client(b)] = outs.as_slice() else {
        panic!("{outs:?}")
    };
    let text = show(b);
    assert!(
        text.starts_with("RTSP/1.0 401 Unauthorized\nCSeq: 1\n"),
        "{text}"
    );
    let nonce = text
        .split("nonce=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap()
        .to_string();
    let uri = "rtsp://192.168.1.1:554/cam1";
    let ha1 = md5_hex("viewer:vgate:pw");
    let ha2 = md5_hex(&format!("OPTIONS:{uri}"));
    let response = md5_hex(&format!("{ha1}:{nonce}:00000001:c0ffee:auth:{ha2}"));
    let auth = format!("Digest username=\"viewer\", realm=\"vgate\", nonce=\"{nonce}\", uri=\"{uri}\", algorithm=MD5, response=\"{response}\", qop=auth, nc=00000001, cnonce=\"c0ffee\"");
    let outs = one_message(
        &mut ex,
        &format!("OPTIONS {uri} RTSP/1.0\nCSeq: 2\nAuthorization: {auth}\n"),
        true,
    );
    assert!(matches!(outs.first(), Some(Output::Connect(_))), "{outs:?}");
    let Some(Output::Upstream(up)) = outs.get(1) else {
        panic!("{outs:?}")
    };
    assert!(
        !show(up).contains("Authorization"),
        "the client's answer is for vgate only"
    );
}

/// No input makes the logic panic, and garbage gets a 400.
#[test]
fn malformed_input_gets_400_never_a_panic() {
    let cases: [&[u8]; 6] = [
        b"SETUP rtsp://192.168.1.1:554/cam1 RTSP/1.0\r\nCSeq: 1\r\nTransport: RTP/AVP;mode=\"\r\n\r\n",
        b"PLAY rtsp://192.168.1.1:554/cam1 RTSP/1.0\r\n\r\n",
        b"\xff\xfe\r\n\r\n",
        b"DESCRIBE rtsp://[::1:554/cam1 RTSP/1.0\r\nCSeq: 1\r\n\r\n",
        b"DESCRIBE rtsp://192.168.1.1:554/cam1 RTSP/2.0\r\nCSeq: 1\r\n\r\n",
        b"SETUP rtsp://192.168.1.1:554/cam1 RTSP/1.0\r\nCSeq: 1\r\nTransport: RTP/AVP;unicast;client_port=0-1\r\n\r\n",
    ];
    let want = ["400", "400", "400", "400", "505", "461"];
    for (raw, code) in cases.iter().zip(want) {
        let mut ex = exchange(settings());
        let outs = ex.client_message(raw, 0);
        let text = outs
            .iter()
            .find_map(|o| match o {
                Output::Client(b) => Some(show(b)),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no answer to {:?}: {outs:?}", show(raw)));
        assert!(text.starts_with(&format!("RTSP/1.0 {code} ")), "{text}");
    }
    // Replies that make no sense are dropped or turned into 502, never a panic.
    let mut ex = exchange(settings());
    let _ = ex.client_message(&wire("SETUP rtsp://192.168.1.1:554/cam1/s0 RTSP/1.0\nCSeq: 1\nTransport: RTP/AVP;unicast;client_port=5000-5001\n"), 0);
    for reply in [
        "RTSP/1.0 200 OK\nCSeq: 99\n",
        "RTSP/1.0 200 OK\nCSeq: 1\nTransport: RTP/AVP;mode=\"\n",
    ] {
        let _ = ex.upstream_message(&wire(reply));
    }
    let _ = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1);
}

/// The real route tables: a per-track release removes that track's routes and gives its
/// ports back while the session and its other track live on; the session's end frees the rest.
#[test]
fn per_track_release_on_the_real_route_tables() {
    use vgate::signaling::proxy::rtsp::conn::RoutesMedia;
    let cfg = vgate::config::parse(
        r#"
[domains.a]
interface = "lo"
address = "127.0.0.1"
media_ports = "20000-20009"
[domains.b]
interface = "lo"
address = "127.0.0.2"
media_ports = "30000-30009"
[security]
source_validation = "latch"
"#,
        "t",
    )
    .unwrap();
    let routes = Arc::new(vgate::routes::Routes::new(
        &cfg,
        Arc::new(vgate::routes::NoHooks),
    ));
    let mut media = RoutesMedia::new(Arc::clone(&routes), "rtsp:t".into());
    let spec = |port: u16, egress: u16| RouteSpec {
        ingress: DomainId::A,
        port,
        dest: "127.0.0.2:40000".parse().unwrap(),
        egress_port: egress,
        policy: SourcePolicy::Latch,
        expected: None,
        rtp_only: false,
        label: format!("r{port}"),
        media: None,
    };
    let mut tracks = Vec::new();
    for _ in 0..2 {
        let a = media.alloc_pair(DomainId::A).unwrap();
        let b = media.alloc_pair(DomainId::B).unwrap();
        media.add_route(spec(a, b)).unwrap();
        media.add_route(spec(a + 1, b + 1)).unwrap();
        tracks.push((a, b));
    }
    assert_eq!(routes.routes().len(), 4);
    assert_eq!(routes.ports(DomainId::A).0, 4);
    let (a, b) = tracks[1];
    media.release_track(
        &[(DomainId::A, a), (DomainId::A, a + 1)],
        &[
            (DomainId::A, a),
            (DomainId::A, a + 1),
            (DomainId::B, b),
            (DomainId::B, b + 1),
        ],
    );
    assert_eq!(routes.routes().len(), 2, "the first track's routes stay");
    assert_eq!(routes.ports(DomainId::A).0, 2);
    assert_eq!(routes.ports(DomainId::B).0, 2);
    assert_eq!(routes.sessions().len(), 1, "the session goes on");
    media.release();
    assert_eq!(routes.routes().len(), 0);
    assert_eq!(routes.ports(DomainId::A).0 + routes.ports(DomainId::B).0, 0);
    assert!(routes.sessions().is_empty());
}
