use super::*;

fn one(s: &str) -> TransportSpec<'_> {
    let mut v = parse_transport(s).unwrap();
    assert_eq!(v.len(), 1);
    v.remove(0)
}

const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 168, 1, 20));

#[test]
fn parses_common_forms() {
    let t = one("RTP/AVP;unicast;client_port=5000-5001");
    assert_eq!(
        (t.protocol, t.profile, t.lower),
        ("RTP", "AVP", LowerTransport::Udp)
    );
    assert_eq!(t.cast(), Cast::Unicast);
    assert_eq!(
        t.client_port(),
        Some(PortRange {
            first: 5000,
            last: 5001
        })
    );
    assert_eq!(t.client_port().unwrap().rtcp(), Some(5001));

    let t = one("RTP/AVP/TCP;unicast;interleaved=0-1;mode=\"PLAY\"");
    assert_eq!(t.lower, LowerTransport::Tcp);
    assert_eq!(t.interleaved(), Some(ChannelRange { first: 0, last: 1 }));
    assert_eq!(t.mode(), Some("PLAY"));

    let t = one("RTP/AVP/UDP;unicast;client_port=5000-5001;server_port=6970-6971;ssrc=1F2E3D4C;source=10.0.0.5;mode=record");
    assert_eq!(
        t.server_port(),
        Some(PortRange {
            first: 6970,
            last: 6971
        })
    );
    assert_eq!(t.ssrc(), Some("1F2E3D4C"));
    assert_eq!(t.source(), Some("10.0.0.5"));
    assert_eq!(t.mode(), Some("record"));

    let t = one("RTP/SAVP;multicast;destination=224.2.0.1;port=3456-3457;ttl=16");
    assert_eq!(t.cast(), Cast::Multicast);
    assert_eq!(t.ttl(), Some(16));
    assert_eq!(t.destination(), Some(Some("224.2.0.1")));

    let t = one("RTP/AVP;client_port=5000");
    assert_eq!(t.client_port().unwrap().rtcp(), None);
    assert_eq!(t.cast(), Cast::Unspecified);
}

#[test]
fn alternatives_and_quoted_commas() {
    let v = parse_transport(
            "RTP/AVP/TCP;interleaved=0-1, RTP/AVP;unicast;client_port=5000-5001;mode=\"PLAY,RECORD\";x-vendor=\"a,b;c\"",
        )
        .unwrap();
    assert_eq!(v.len(), 2);
    assert_eq!(v[1].mode(), Some("PLAY,RECORD"));
    assert_eq!(v[1].other("X-Vendor"), Some(Some("\"a,b;c\"")));
}

#[test]
fn round_trips_and_preserves_unknown_params() {
    let s = "RTP/AVP;unicast;client_port=5000-5001;x-dynamic-rate=1;mode=\"PLAY\";Append";
    assert_eq!(format_transport(&parse_transport(s).unwrap()), s);
    let s = "RTP/AVP/TCP;interleaved=0-1,RTP/AVP;unicast;client_port=5000-5001";
    assert_eq!(format_transport(&parse_transport(s).unwrap()), s);
}

#[test]
fn rejects_malformed_without_panicking() {
    let cases: &[(&str, RtspError)] = &[
        ("RTP/AVP;mode=\"", RtspError::UnterminatedQuote),
        ("RTP/AVP;mode=\"PLAY", RtspError::UnterminatedQuote),
        ("", RtspError::EmptyTransport),
        ("RTP/AVP,", RtspError::EmptyTransport),
        (";unicast", RtspError::EmptyTransport),
        (
            "RTP/AVP;;unicast",
            RtspError::BadTransportParam { param: "(empty)" },
        ),
        ("RTP", RtspError::BadTransportProtocol),
        ("RTP/AVP/UDP/X", RtspError::BadTransportProtocol),
        ("RTP/AVP/SCTP", RtspError::UnsupportedLowerTransport),
        (
            "RTP/AVP;client_port=0-1",
            RtspError::BadPort {
                param: "client_port",
            },
        ),
        (
            "RTP/AVP;client_port=65536",
            RtspError::BadPort {
                param: "client_port",
            },
        ),
        (
            "RTP/AVP;client_port=-1",
            RtspError::BadPort {
                param: "client_port",
            },
        ),
        (
            "RTP/AVP;client_port=",
            RtspError::BadPort {
                param: "client_port",
            },
        ),
        (
            "RTP/AVP;client_port=+5",
            RtspError::BadPort {
                param: "client_port",
            },
        ),
        (
            "RTP/AVP;client_port=5001-5000",
            RtspError::ReversedRange {
                param: "client_port",
            },
        ),
        (
            "RTP/AVP/TCP;interleaved=1-0",
            RtspError::ReversedRange {
                param: "interleaved",
            },
        ),
        (
            "RTP/AVP/TCP;interleaved=256",
            RtspError::BadTransportParam {
                param: "interleaved",
            },
        ),
        (
            "RTP/AVP;ttl=300",
            RtspError::BadTransportParam { param: "ttl" },
        ),
        (
            "RTP/AVP;unicast=1",
            RtspError::BadTransportParam { param: "unicast" },
        ),
        (
            "RTP/AVP;client_port",
            RtspError::BadTransportParam {
                param: "client_port",
            },
        ),
        (
            "RTP/AVP;ssrc=123456789",
            RtspError::BadTransportParam { param: "ssrc" },
        ),
        (
            "RTP/AVP;mode=\"\"",
            RtspError::BadTransportParam { param: "mode" },
        ),
        (
            "RTP/AVP;source=a b",
            RtspError::BadTransportParam { param: "source" },
        ),
        (
            "RTP/AVP;unicast;multicast",
            RtspError::DuplicateTransportParam {
                param: "unicast/multicast",
            },
        ),
        (
            "RTP/AVP;client_port=1;client_port=2",
            RtspError::DuplicateTransportParam {
                param: "client_port",
            },
        ),
        (
            "RTP/AVP;x=",
            RtspError::BadTransportParam {
                param: "(extension)",
            },
        ),
    ];
    for (input, want) in cases {
        assert_eq!(parse_transport(input).unwrap_err(), *want, "{input:?}");
    }
    let huge = "RTP/AVP;".repeat(1000);
    assert!(matches!(
        parse_transport(&huge),
        Err(RtspError::TransportTooLong { .. })
    ));
    let many = "RTP/AVP,".repeat(20);
    assert!(matches!(
        parse_transport(&many),
        Err(RtspError::TransportTooLong { .. })
    ));
    let params = format!("RTP/AVP{}", ";a".repeat(40));
    assert!(matches!(
        parse_transport(&params),
        Err(RtspError::TransportTooLong { .. })
    ));
    // A trailing ';' is tolerated.
    assert!(parse_transport("RTP/AVP;unicast;client_port=1-2;").is_ok());
}

#[test]
fn policy() {
    assert_eq!(
        one("RTP/AVP;multicast").require_unicast(),
        Err(RtspError::MulticastRefused)
    );
    assert_eq!(
        one("RTP/AVP;destination=239.1.1.1;client_port=1-2").require_unicast(),
        Err(RtspError::MulticastRefused)
    );
    assert_eq!(
        one("RTP/AVP;unicast;destination=10.9.9.9;client_port=1-2").check_destination(CLIENT),
        Err(RtspError::ForeignDestination)
    );
    assert_eq!(
        one("RTP/AVP;unicast;destination=victim.example;client_port=1-2").check_destination(CLIENT),
        Err(RtspError::ForeignDestination)
    );
    assert_eq!(
        one("RTP/AVP;unicast;dest_addr=\"10.9.9.9:5000\"").check_destination(CLIENT),
        Err(RtspError::ForeignDestination)
    );
    assert!(one("RTP/AVP;unicast;dest_addr=\":5000\"")
        .check_destination(CLIENT)
        .is_ok());
    assert!(
        one("RTP/AVP;unicast;destination=192.168.1.20;client_port=1-2")
            .check_destination(CLIENT)
            .is_ok()
    );
    assert!(one("RTP/AVP;unicast;destination")
        .check_destination(CLIENT)
        .is_ok());
}

#[test]
fn selection() {
    let v = parse_transport("RTP/AVP;multicast,RTP/AVP/TCP;unicast;interleaved=0-1,RTP/AVP;unicast;client_port=5000-5001").unwrap();
    let (spec, d) = select_transport(&v, CLIENT, &TransportPolicy::default()).unwrap();
    assert_eq!(
        d,
        Delivery::Interleaved {
            channels: Some(ChannelRange { first: 0, last: 1 })
        }
    );
    assert_eq!(spec.lower, LowerTransport::Tcp);
    let udp_only = TransportPolicy {
        allow_udp: true,
        allow_interleaved: false,
    };
    let (_, d) = select_transport(&v, CLIENT, &udp_only).unwrap();
    assert_eq!(
        d,
        Delivery::Udp {
            client_port: PortRange {
                first: 5000,
                last: 5001
            }
        }
    );

    let v = parse_transport("RTP/AVP;unicast").unwrap();
    assert_eq!(
        select_transport(&v, CLIENT, &udp_only).unwrap_err(),
        RtspError::MissingClientPort
    );
    let v = parse_transport("RTP/AVP;multicast,RTP/AVP;unicast").unwrap();
    assert_eq!(
        select_transport(&v, CLIENT, &udp_only).unwrap_err(),
        RtspError::NoAcceptableTransport
    );
    let v = parse_transport(
        "RTP/AVP;unicast;client_port=1-2;destination=1.2.3.4,RTP/AVP;unicast;client_port=1-2",
    )
    .unwrap();
    assert_eq!(
        select_transport(&v, CLIENT, &udp_only).unwrap_err(),
        RtspError::ForeignDestination
    );
    let v = parse_transport("MP2T/H2221/UDP;unicast;client_port=1-2").unwrap();
    assert_eq!(
        select_transport(&v, CLIENT, &udp_only).unwrap_err(),
        RtspError::BadTransportProtocol
    );
}

#[test]
fn rewrites_in_place() {
    let t = one("RTP/AVP;unicast;client_port=5000-5001;destination=192.168.1.20;x=1")
        .with_client_port(40000, Some(40001))
        .unwrap()
        .without_destination();
    assert_eq!(t.to_string(), "RTP/AVP;unicast;client_port=40000-40001;x=1");

    let t = one(
        "RTP/AVP;unicast;client_port=5000-5001;server_port=6970-6971;ssrc=ABCD;source=10.0.0.5",
    )
    .with_client_port(5000, Some(5001))
    .unwrap()
    .with_server_port(41000, Some(41001))
    .unwrap()
    .with_source("192.168.1.1".parse().unwrap());
    assert_eq!(
            t.to_string(),
            "RTP/AVP;unicast;client_port=5000-5001;server_port=41000-41001;ssrc=ABCD;source=192.168.1.1"
        );

    let t = one("RTP/AVP;client_port=5000-5001")
        .with_unicast()
        .with_source("::1".parse().unwrap());
    assert_eq!(
        t.to_string(),
        "RTP/AVP;unicast;client_port=5000-5001;source=::1"
    );

    assert_eq!(
        one("RTP/AVP")
            .with_client_port(5000, Some(5002))
            .unwrap_err(),
        RtspError::PortsNotAdjacent
    );
    assert_eq!(
        one("RTP/AVP").with_client_port(65535, Some(0)).unwrap_err(),
        RtspError::PortsNotAdjacent
    );
    assert_eq!(
        one("RTP/AVP").with_server_port(0, None).unwrap_err(),
        RtspError::BadPort {
            param: "server_port"
        }
    );
    assert_eq!(
        one("RTP/AVP")
            .with_server_port(7000, None)
            .unwrap()
            .to_string(),
        "RTP/AVP;server_port=7000"
    );
}
