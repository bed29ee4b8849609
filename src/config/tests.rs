use super::*;

const BASE: &str = r#"
[domains.a]
interface = "eth0"
address = "10.1.0.1"
networks = ["10.1.0.0/16"]
media_ports = "20000-20999"

[domains.b]
interface = "eth1"
address = "10.2.0.1"
networks = ["10.2.0.0/16"]
media_ports = "30000-30999"

[engine]
queues = 1
"#;

fn check(extra: &str) -> Result<Config, ConfigError> {
    parse(&format!("{BASE}{extra}"), "test.toml")
}

/// Asserts the error names `key`, sits on `line` (1-based in BASE+extra) and says `words`.
fn expect_err(extra: &str, key: &str, line: usize, words: &str) {
    let e = check(extra).expect_err("config should be rejected");
    assert_eq!(e.key, key, "{e}");
    assert_eq!(e.line, line, "{e}");
    assert!(
        e.message.contains(words),
        "message {:?} lacks {words:?}",
        e.message
    );
    assert!(e.to_string().starts_with("test.toml:"), "{e}");
}

fn base_lines() -> usize {
    BASE.lines().count()
}

#[test]
fn embedded_default_is_valid_and_on_loopback() {
    let cfg = Config::embedded_default();
    assert_eq!(cfg.domain(DomainId::A).address, Ipv4Addr::new(127, 0, 0, 1));
    assert_eq!(cfg.domain(DomainId::B).address, Ipv4Addr::new(127, 0, 0, 2));
    assert_eq!(cfg.engine.mode, Mode::Stack);
    assert!(cfg.control.listen.ip().is_loopback());
}

#[test]
fn minimal_config_gets_defaults() {
    let cfg = check("").unwrap();
    assert_eq!(cfg.engine.batch, 32);
    assert_eq!(cfg.security.source_validation, SourcePolicy::Strict);
    assert_eq!(cfg.engine.cpus.len(), 1);
    assert_eq!(
        cfg.domain_of("10.2.3.4".parse().unwrap()),
        Some(DomainId::B)
    );
    assert_eq!(cfg.domain_of("192.0.2.1".parse().unwrap()), None);
    assert_eq!(cfg.domain_of_port(30500), Some(DomainId::B));
}

#[test]
fn unknown_key_is_rejected_with_its_line() {
    let e = check("colour = \"blue\"\n").unwrap_err();
    assert_eq!(e.line, base_lines() + 1, "{e}");
    assert!(e.message.contains("unknown field"), "{e}");
}

#[test]
fn toml_syntax_error_has_a_place() {
    let e = check("[engine\n").unwrap_err();
    assert!(e.line > base_lines(), "{e}");
}

#[test]
fn overlapping_port_ranges() {
    let text = BASE.replace("30000-30999", "20500-21000");
    let e = parse(&text, "t.toml").unwrap_err();
    assert_eq!(e.key, "domains.b.media_ports");
    assert!(e.message.contains("overlaps"), "{e}");
    assert_eq!(e.line, 12, "the line of domains.b.media_ports");
}

#[test]
fn bad_port_range_and_address() {
    let e = parse(&BASE.replace("20000-20999", "20001-20999"), "t").unwrap_err();
    assert_eq!(e.key, "domains.a.media_ports");
    let e = parse(&BASE.replace("10.1.0.1\"", "10.1.0.300\""), "t").unwrap_err();
    assert_eq!(e.key, "domains.a.address");
    let e = parse(&BASE.replace("\"10.2.0.0/16\"", "\"10.0.0.0/8\""), "t").unwrap_err();
    assert_eq!(e.key, "domains.b.networks[0]");
}

#[test]
fn more_channels_than_cores() {
    let text = BASE.replace("queues = 1", "queues = 4096");
    let e = parse(&text, "t").unwrap_err();
    assert_eq!(e.key, "engine.queues");
    assert!(e.message.contains("CPUs"), "{e}");
}

#[test]
fn cpu_list_must_match_queues_and_exist() {
    let text = BASE.replace("queues = 1", "queues = 1\ncpus = [4096]");
    assert_eq!(parse(&text, "t").unwrap_err().key, "engine.cpus");
    let text = BASE.replace("queues = 1", "queues = 1\ncpus = [0, 0]");
    assert_eq!(parse(&text, "t").unwrap_err().key, "engine.cpus");
}

#[test]
fn auto_cpus_keep_cpu0_free_on_big_machines() {
    assert_eq!(validate::auto_cpus(2, &Cpus::first(8)), vec![1, 2]);
    assert_eq!(validate::auto_cpus(2, &Cpus::first(2)), vec![0, 1]);
    assert_eq!(validate::auto_cpus(1, &Cpus::first(2)), vec![0]);
    assert_eq!(validate::auto_cpus(4, &Cpus::first(4)), vec![0, 1, 2, 3]);
    // Under taskset -c 2-3 (CPUAffinity=2-3) on 4 CPUs: the allowed ones first.
    let restricted = Cpus {
        online: vec![0, 1, 2, 3],
        allowed: vec![2, 3],
    };
    assert_eq!(validate::auto_cpus(2, &restricted), vec![2, 3]);
    assert_eq!(validate::auto_cpus(3, &restricted), vec![2, 3, 0]);
}

#[test]
fn cpus_are_checked_against_the_online_list() {
    let machine = Cpus {
        online: vec![0, 1, 2, 3, 6],
        allowed: vec![2, 3],
    };
    let text = BASE.replace("queues = 1", "queues = 2\ncpus = [2, 3]");
    assert_eq!(
        parse_on(&text, "t", &machine).unwrap().engine.cpus,
        vec![2, 3]
    );
    let text = BASE.replace("queues = 1", "queues = 2\ncpus = [6, 0]");
    assert_eq!(
        parse_on(&text, "t", &machine).unwrap().engine.cpus,
        vec![6, 0]
    );
    let text = BASE.replace("queues = 1", "queues = 1\ncpus = [4]");
    let e = parse_on(&text, "t", &machine).unwrap_err();
    assert_eq!(e.key, "engine.cpus");
    assert!(e.message.contains("online CPUs: 0-3,6"), "{e}");
    assert_eq!(parse_cpu_list("0-3,6\n"), Some(vec![0, 1, 2, 3, 6]));
    assert_eq!(parse_cpu_list("3-1"), None);
}

const SIP_ROUTE: &str = r#"
[[signaling_route]]
name = "gb"
type = "sip"
transport = "udp"
listen_domain = "b"
listen_port = 5060
upstream = "10.1.0.9:5060"
"#;

#[test]
fn signaling_route_ok() {
    let cfg = check(SIP_ROUTE).unwrap();
    assert_eq!(cfg.signaling[0].listen_domain, DomainId::B);
    assert_eq!(cfg.signaling[0].kind, SignalingKind::Sip);
}

#[test]
fn signaling_policy_defaults_and_values() {
    let cfg = check(SIP_ROUTE).unwrap();
    assert_eq!(
        cfg.signaling[0].policy,
        SignalingPolicy {
            upstream_port: 5060,
            ..SignalingPolicy::default()
        }
    );
    assert_eq!(
        cfg.signaling[0].policy.media_timeout,
        std::time::Duration::from_secs(60)
    );
    let extra = format!(
        "{SIP_ROUTE}allow_peers = [\"10.2.5.0/24\"]\nallow_ids = [\"3402000000\"]\nmax_message = 8000\ninvite_timeout = 10\nmedia_timeout = 5\nrate_limit = 0\nmax_connections_per_source = 2\n"
    );
    let p = check(&extra).unwrap().signaling[0].policy.clone();
    assert_eq!(p.allow_peers, vec!["10.2.5.0/24".parse().unwrap()]);
    assert_eq!(p.allow_ids, vec!["3402000000".to_string()]);
    assert_eq!(p.max_message, 8000);
    assert_eq!(p.invite_timeout, std::time::Duration::from_secs(10));
    assert_eq!(p.media_timeout, std::time::Duration::from_secs(5));
    assert_eq!(p.rate_limit, 0);
    assert_eq!(p.max_connections_per_source, 2);
}

/// TCP routes take messages up to `max_tcp_message` (default 1 MiB: a cascade's one-MESSAGE
/// Catalog); an older config's `max_message` alone keeps capping TCP as it did; UDP stays
/// at the datagram.
#[test]
fn max_tcp_message_on_tcp_routes() {
    let tcp = SIP_ROUTE.replace("transport = \"udp\"", "transport = \"tcp\"");
    let p = check(&tcp).unwrap().signaling[0].policy.clone();
    assert_eq!((p.max_message, p.max_tcp_message), (65_535, 1 << 20));
    let old = check(&format!("{tcp}max_message = 8192\n")).unwrap();
    let p = &old.signaling[0].policy;
    assert_eq!((p.max_message, p.max_tcp_message), (8192, 8192));
    let both = check(&format!(
        "{tcp}max_message = 8192\nmax_tcp_message = 2000000\n"
    ))
    .unwrap();
    let p = &both.signaling[0].policy;
    assert_eq!((p.max_message, p.max_tcp_message), (8192, 2_000_000));
    expect_err(
        &format!("{tcp}max_tcp_message = 5000000\n"),
        "signaling_route[0].max_tcp_message",
        base_lines() + 9,
        "1024 to 4194304",
    );
    expect_err(
        &format!("{SIP_ROUTE}max_tcp_message = 500000\n"),
        "signaling_route[0].max_tcp_message",
        base_lines() + 9,
        "use max_message (up to 65535)",
    );
    expect_err(
        &format!("{RTSP_ROUTE}max_tcp_message = 500000\n"),
        "signaling_route[0].max_tcp_message",
        base_lines() + 12,
        "is a SIP setting",
    );
}

#[test]
fn signaling_policy_errors() {
    let peer = format!("{SIP_ROUTE}allow_peers = [\"10.1.0.0/24\"]\n");
    expect_err(
        &peer,
        "signaling_route[0].allow_peers[0]",
        base_lines() + 9,
        "not in domain b",
    );
    let id = format!("{SIP_ROUTE}allow_ids = [\"34x\"]\n");
    expect_err(
        &id,
        "signaling_route[0].allow_ids[0]",
        base_lines() + 9,
        "1 to 20 digits",
    );
    let big = format!("{SIP_ROUTE}max_message = 100000\n");
    expect_err(
        &big,
        "signaling_route[0].max_message",
        base_lines() + 9,
        "1024 to 65535",
    );
    let unknown = format!("{SIP_ROUTE}allow_everyone = true\n");
    assert!(check(&unknown).is_err());
    let cap = format!("{SIP_ROUTE}max_bindings_per_source = 0\n");
    expect_err(
        &cap,
        "signaling_route[0].max_bindings_per_source",
        base_lines() + 9,
        "1 to 65536",
    );
    let how = format!("{SIP_ROUTE}manscdp_addresses = \"hide\"\n");
    expect_err(
        &how,
        "signaling_route[0].manscdp_addresses",
        base_lines() + 9,
        "\"blank\"",
    );
    let cmd = format!("{SIP_ROUTE}manscdp_deny = [\"Device Control\"]\n");
    expect_err(
        &cmd,
        "signaling_route[0].manscdp_deny[0]",
        base_lines() + 9,
        "a MANSCDP command",
    );
    let port = format!("{SIP_ROUTE}upstream_port = 20000\n");
    expect_err(
        &port,
        "signaling_route[0].upstream_port",
        base_lines() + 9,
        "media ports",
    );
}

#[test]
fn sip_only_keys_and_upstream_port() {
    let extra = format!(
        "{SIP_ROUTE}upstream_port = 5062\nmax_bindings_per_source = 8\nmanscdp_addresses = \"blank\"\nmanscdp_allow = [\"Catalog\", \"DeviceInfo\"]\nmanscdp_deny = [\"TeleBoot\"]\n"
    );
    let p = check(&extra).unwrap().signaling[0].policy.clone();
    assert_eq!(p.upstream_port, 5062);
    assert_eq!(p.max_bindings_per_source, 8);
    assert_eq!(p.manscdp_addresses, super::ManscdpAddresses::Blank);
    assert_eq!(p.manscdp_allow, vec!["Catalog", "DeviceInfo"]);
    assert_eq!(p.manscdp_deny, vec!["TeleBoot"]);
    assert_eq!(
        p.manscdp_deny_from_b,
        ["DeviceUpgrade", "FormatSDCard"],
        "the destructive 2022 controls are refused from B by default"
    );
    // The GB/T 28181-2022 command names are accepted in every list; an empty
    // manscdp_deny_from_b lets the destructive controls through.
    let names = "[\"HomePositionQuery\", \"CruiseTrackListQuery\", \"CruiseTrackQuery\", \"PTZPosition\", \"SDCardStatus\", \"UploadSnapShotFinished\", \"DeviceUpgradeResult\", \"PTZPreciseCtrl\", \"DeviceUpgrade\", \"FormatSDCard\", \"TargetTrack\", \"SnapShotConfig\"]";
    let gb2022 = format!(
        "{SIP_ROUTE}manscdp_allow = {names}\nmanscdp_deny = {names}\nmanscdp_deny_from_b = []\n"
    );
    let p = check(&gb2022).unwrap().signaling[0].policy.clone();
    assert_eq!(p.manscdp_allow.len(), 12);
    assert_eq!(p.manscdp_deny.len(), 12);
    assert!(p.manscdp_deny_from_b.is_empty());
    let only = format!("{SIP_ROUTE}manscdp_deny_from_b = [\"TeleBoot\"]\n");
    let p = check(&only).unwrap().signaling[0].policy.clone();
    assert_eq!(p.manscdp_deny_from_b, ["TeleBoot"]);
    expect_err(
        &format!("{SIP_ROUTE}manscdp_deny_from_b = [\"Format SD\"]\n"),
        "signaling_route[0].manscdp_deny_from_b[0]",
        base_lines() + 9,
        "a MANSCDP command",
    );
    // GB/T 28181 Annex D reconnects: 10 s unless set, 2 s to 600 s.
    assert_eq!(p.tcp_media_reconnect, std::time::Duration::from_secs(10));
    let window = check(&format!("{SIP_ROUTE}tcp_media_reconnect = 30\n")).unwrap();
    assert_eq!(
        window.signaling[0].policy.tcp_media_reconnect,
        std::time::Duration::from_secs(30)
    );
    expect_err(
        &format!("{SIP_ROUTE}tcp_media_reconnect = 1\n"),
        "signaling_route[0].tcp_media_reconnect",
        base_lines() + 9,
        "2 to 600",
    );
    // The upstream face of a route listening in b is in a: default port 5060 there.
    let pair = format!(
        "{SIP_ROUTE}{}",
        SIP_ROUTE
            .replace("name = \"gb\"", "name = \"up\"")
            .replace("listen_domain = \"b\"", "listen_domain = \"a\"")
            .replace("10.1.0.9", "10.2.0.9")
    );
    // Yesterday's pair: both listen on 5060, no upstream_port. Each route's upstream face
    // is the other's listen socket; they share it (one SIP endpoint per side on 5060).
    let cfg = check(&pair).unwrap();
    assert_eq!(cfg.signaling[0].policy.upstream_port, 5060);
    assert_eq!(cfg.signaling[1].policy.upstream_port, 5060);
    // Fixed upstream ports of their own still work.
    let fixed = pair
        .replace(
            "upstream = \"10.1.0.9:5060\"\n",
            "upstream = \"10.1.0.9:5060\"\nupstream_port = 5061\n",
        )
        .replace(
            "upstream = \"10.2.0.9:5060\"\n",
            "upstream = \"10.2.0.9:5060\"\nupstream_port = 5061\n",
        );
    let cfg = check(&fixed).unwrap();
    assert_eq!(cfg.signaling[0].policy.upstream_port, 5061);
    assert_eq!(cfg.signaling[1].policy.upstream_port, 5061);
    // A real conflict: two listen faces on one socket (nothing tells a new request apart).
    let twice = format!(
        "{SIP_ROUTE}{}",
        SIP_ROUTE.replace("name = \"gb\"", "name = \"gb2\"")
    );
    expect_err(
        &twice,
        "signaling_route[1].listen_port",
        base_lines() + 15,
        "cannot be told apart",
    );
    // A SIP face cannot share an RTSP listener's socket.
    let rtsp = format!(
        "{}upstream_port = 8554\n{}",
        SIP_ROUTE.replace("\"udp\"", "\"tcp\""),
        RTSP_ROUTE
            .replace("listen_domain = \"b\"", "listen_domain = \"a\"")
            .replace("10.1.0.9", "10.2.0.9")
    );
    expect_err(
        &rtsp,
        "signaling_route[0].upstream_port",
        base_lines() + 9,
        "where RTSP route \"cams\" listens",
    );
}

#[test]
fn upstream_in_the_same_domain() {
    let extra = SIP_ROUTE.replace("10.1.0.9", "10.2.0.9");
    expect_err(
        &extra,
        "signaling_route[0].upstream",
        base_lines() + 8,
        "same domain",
    );
}

#[test]
fn upstream_in_no_domain() {
    let extra = SIP_ROUTE.replace("10.1.0.9", "192.0.2.9");
    expect_err(
        &extra,
        "signaling_route[0].upstream",
        base_lines() + 8,
        "neither domain",
    );
}

#[test]
fn signaling_port_inside_media_range() {
    let extra = SIP_ROUTE.replace("5060\n", "30010\n");
    expect_err(
        &extra,
        "signaling_route[0].listen_port",
        base_lines() + 7,
        "media ports",
    );
}

#[test]
fn duplicate_signaling_listener() {
    let extra = format!("{SIP_ROUTE}{}", SIP_ROUTE.replace("\"gb\"", "\"gb2\""));
    let e = check(&extra).unwrap_err();
    assert_eq!(e.key, "signaling_route[1].listen_port");
}

const STREAM: &str = r#"
[[stream_route]]
name = "cam1"
domain = "a"
port = 20000
destination = "10.2.0.50:40000"
egress_port = 30000
expect_source = "10.1.0.7:5000"
"#;

#[test]
fn stream_route_ok() {
    let cfg = check(STREAM).unwrap();
    let s = &cfg.streams[0];
    assert_eq!(s.domain, DomainId::A);
    assert_eq!(s.egress_port, Some(30000));
    assert_eq!(s.policy, SourcePolicy::Strict);
}

#[test]
fn stream_port_outside_its_range() {
    let extra = STREAM.replace("port = 20000", "port = 25000");
    expect_err(&extra, "stream_route[0].port", base_lines() + 5, "outside");
}

#[test]
fn egress_port_outside_far_range() {
    let extra = STREAM.replace("egress_port = 30000", "egress_port = 20002");
    expect_err(
        &extra,
        "stream_route[0].egress_port",
        base_lines() + 7,
        "far side",
    );
}

#[test]
fn destination_in_the_same_domain() {
    let extra = STREAM.replace("10.2.0.50", "10.1.0.50");
    expect_err(
        &extra,
        "stream_route[0].destination",
        base_lines() + 6,
        "same domain",
    );
}

#[test]
fn expect_source_from_the_wrong_domain() {
    let extra = STREAM.replace("10.1.0.7", "10.2.0.7");
    expect_err(
        &extra,
        "stream_route[0].expect_source",
        base_lines() + 8,
        "not in domain a",
    );
}

#[test]
fn strict_needs_an_expected_source() {
    let extra = STREAM.replace("expect_source = \"10.1.0.7:5000\"\n", "");
    let e = check(&extra).unwrap_err();
    assert_eq!(e.key, "stream_route[0].expect_source");
    assert!(e.message.contains("latch"), "{e}");
    let latch = extra.replace("egress_port", "source_validation = \"latch\"\negress_port");
    assert_eq!(
        check(&latch).unwrap().streams[0].policy,
        SourcePolicy::Latch
    );
}

#[test]
fn duplicate_stream_ports_and_names() {
    let two = format!(
        "{STREAM}{}",
        STREAM.replace("cam1", "cam2").replace("30000", "30002")
    );
    assert_eq!(check(&two).unwrap_err().key, "stream_route[1].port");
    let two = format!("{STREAM}{}", STREAM.replace("20000", "20002"));
    assert_eq!(check(&two).unwrap_err().key, "stream_route[1].name");
    let two = format!(
        "{STREAM}{}",
        STREAM.replace("cam1", "cam2").replace("20000", "20002")
    );
    assert_eq!(check(&two).unwrap_err().key, "stream_route[1].egress_port");
}

#[test]
fn bad_mode_is_named() {
    let e = check("").and(parse(&BASE.replace("queues = 1", "mode = \"turbo\""), "t"));
    let e = e.unwrap_err();
    assert!(
        e.message.contains("turbo") || e.message.contains("unknown variant"),
        "{e}"
    );
    assert!(e.line > 0);
}

#[test]
fn admin_off_loopback_needs_a_token() {
    let e = check("[control]\nlisten = \"10.1.0.1:9940\"\n").unwrap_err();
    assert_eq!(e.key, "control.listen");
    assert!(e.message.contains("token"), "{e}");
    let e = check("[control]\nlisten = \"10.1.0.1:9940\"\ntoken = \"short\"\n").unwrap_err();
    assert_eq!(e.key, "control.token");
    let ok =
        check("[control]\nlisten = \"10.1.0.1:9940\"\ntoken = \"0123456789abcdef0123\"\n").unwrap();
    assert_eq!(ok.control.token.as_deref(), Some("0123456789abcdef0123"));
}

#[test]
fn missing_file_says_so() {
    let e = Config::load(Path::new("/nonexistent/vgate.toml")).unwrap_err();
    assert!(e.message.contains("cannot read"), "{e}");
}

const RTSP_ROUTE: &str = r#"
[[signaling_route]]
name = "cams"
type = "rtsp"
transport = "tcp"
listen_domain = "b"
listen_port = 8554
upstream = "10.1.0.9:554"
upstream_username = "admin"
upstream_password = "hunter2-secret"
session_timeout = 30
"#;

#[test]
fn rtsp_route_defaults_to_one_path() {
    let cfg = check(RTSP_ROUTE).unwrap();
    let r = cfg.signaling[0].rtsp.as_ref().expect("rtsp options");
    assert_eq!(r.paths.len(), 1);
    assert_eq!(r.paths[0].prefix, "/");
    assert_eq!(r.paths[0].upstream_path, "/");
    assert_eq!(r.paths[0].upstream, "10.1.0.9:554".parse().unwrap());
    let c = r.paths[0].credentials.as_ref().unwrap();
    assert_eq!(c.username, "admin");
    assert_eq!(c.password.expose(), "hunter2-secret");
    assert_eq!(r.session_timeout, 30);
    assert!(r.client_users.is_empty());
    assert!(check(SIP_ROUTE).unwrap().signaling[0].rtsp.is_none());
}

#[test]
fn rtsp_paths_and_client_users() {
    let extra = format!(
        "{RTSP_ROUTE}client_realm = \"gw\"\n\
[[signaling_route.paths]]\nprefix = \"/cam1\"\nupstream = \"10.1.0.7:8554\"\nupstream_path = \"/test\"\n\
[[signaling_route.paths]]\nprefix = \"/cam2\"\nupstream_username = \"other\"\nupstream_password = \"pw2\"\n\
[[signaling_route.client_users]]\nusername = \"viewer\"\npassword = \"v-pw\"\n"
    );
    let cfg = check(&extra).unwrap();
    let r = cfg.signaling[0].rtsp.as_ref().unwrap();
    assert_eq!(r.paths.len(), 2);
    assert_eq!(r.paths[0].upstream, "10.1.0.7:8554".parse().unwrap());
    assert_eq!(r.paths[0].credentials.as_ref().unwrap().username, "admin");
    assert_eq!(r.paths[1].upstream, "10.1.0.9:554".parse().unwrap());
    assert_eq!(r.paths[1].upstream_path, "/");
    assert_eq!(r.paths[1].credentials.as_ref().unwrap().username, "other");
    assert_eq!(r.client_users[0].username, "viewer");
    assert_eq!(r.client_realm, "gw");
}

#[test]
fn rtsp_secrets_never_in_debug_or_errors() {
    let cfg = check(RTSP_ROUTE).unwrap();
    let dbg = format!("{cfg:?}");
    assert!(dbg.contains("admin"));
    assert!(!dbg.contains("hunter2-secret"), "{dbg}");
    let bad = RTSP_ROUTE.replace("upstream_username = \"admin\"\n", "");
    let e = check(&bad).unwrap_err();
    assert_eq!(e.key, "signaling_route[0].upstream_username");
    assert!(!e.to_string().contains("hunter2-secret"), "{e}");
}

#[test]
fn rtsp_settings_are_checked() {
    let at = base_lines() + 1;
    let udp = RTSP_ROUTE.replace("transport = \"tcp\"", "transport = \"udp\"");
    expect_err(&udp, "signaling_route[0].transport", at + 2, "over TCP");
    let on_sip = format!("{SIP_ROUTE}session_timeout = 5\n");
    expect_err(
        &on_sip,
        "signaling_route[0].session_timeout",
        at + 8,
        "RTSP setting",
    );
    let timeout = RTSP_ROUTE.replace("session_timeout = 30", "session_timeout = 0");
    expect_err(
        &timeout,
        "signaling_route[0].session_timeout",
        at + 10,
        "between 1 and 3600",
    );
    let path = format!("{RTSP_ROUTE}[[signaling_route.paths]]\nprefix = \"/a/../b\"\n");
    expect_err(
        &path,
        "signaling_route[0].paths[0].prefix",
        at + 12,
        "dot segments",
    );
    let far = format!(
        "{RTSP_ROUTE}[[signaling_route.paths]]\nprefix = \"/a\"\nupstream = \"10.2.0.9:554\"\n"
    );
    expect_err(
        &far,
        "signaling_route[0].paths[0].upstream",
        at + 13,
        "same domain",
    );
    let twice = format!(
        "{RTSP_ROUTE}[[signaling_route.paths]]\nprefix = \"/a\"\n[[signaling_route.paths]]\nprefix = \"/a/\"\n"
    );
    expect_err(
        &twice,
        "signaling_route[0].paths[1].prefix",
        at + 14,
        "listed twice",
    );
    let unknown = format!("{RTSP_ROUTE}[[signaling_route.paths]]\nprefix = \"/a\"\nhost = \"x\"\n");
    assert!(check(&unknown).is_err(), "unknown keys stay rejected");
}

#[test]
fn relatch_after_ms_defaults_and_bounds() {
    assert_eq!(check("").unwrap().security.relatch_after_ms, 2000);
    let set = "[security]\nsource_validation = \"latch\"\nrelatch_after_ms = 500\n";
    assert_eq!(check(set).unwrap().security.relatch_after_ms, 500);
    let never = "[security]\nrelatch_after_ms = 0\n";
    assert_eq!(check(never).unwrap().security.relatch_after_ms, 0);
    expect_err(
        "[security]\nrelatch_after_ms = 5\n",
        "security.relatch_after_ms",
        base_lines() + 2,
        "100 to 3600000",
    );
}

#[test]
fn rtsp_request_timeout_and_sip_only_keys() {
    let cfg = check(RTSP_ROUTE).unwrap();
    assert_eq!(cfg.signaling[0].rtsp.as_ref().unwrap().request_timeout, 10);
    assert_eq!(cfg.signaling[0].policy.max_connections_per_source, 64);
    let set = format!("{RTSP_ROUTE}request_timeout = 4\n");
    let cfg = check(&set).unwrap();
    assert_eq!(cfg.signaling[0].rtsp.as_ref().unwrap().request_timeout, 4);
    let bad = format!("{RTSP_ROUTE}request_timeout = 0\n");
    expect_err(
        &bad,
        "signaling_route[0].request_timeout",
        base_lines() + 12,
        "1 to 600",
    );
    // RTSP-only on SIP, SIP-only on RTSP: refused, not ignored.
    let sip = format!("{SIP_ROUTE}request_timeout = 4\n");
    expect_err(
        &sip,
        "signaling_route[0].request_timeout",
        base_lines() + 9,
        "is an RTSP setting",
    );
    for (k, v) in [
        ("allow_ids", "[\"3402000000\"]"),
        ("invite_timeout", "5"),
        ("upstream_port", "5062"),
        ("max_bindings_per_source", "4"),
        ("tcp_media_reconnect", "10"),
        ("manscdp_addresses", "\"blank\""),
        ("manscdp_deny", "[\"TeleBoot\"]"),
        ("manscdp_deny_from_b", "[\"FormatSDCard\"]"),
    ] {
        let t = format!("{RTSP_ROUTE}{k} = {v}\n");
        expect_err(
            &t,
            &format!("signaling_route[0].{k}"),
            base_lines() + 12,
            "does nothing on an RTSP route",
        );
    }
    // The connection limits are enforced on RTSP routes, so they are accepted.
    let limits = format!(
        "{RTSP_ROUTE}allow_peers = [\"10.2.5.0/24\"]\nrate_limit = 5\nmax_connections_per_source = 3\nmax_message = 4096\n"
    );
    let p = check(&limits).unwrap().signaling[0].policy.clone();
    assert_eq!(p.max_connections_per_source, 3);
    assert_eq!(p.rate_limit, 5);
}

#[test]
fn rtsp_max_sessions_per_source() {
    let cfg = check(RTSP_ROUTE).unwrap();
    let sessions = |c: &crate::config::Config| {
        c.signaling[0]
            .rtsp
            .as_ref()
            .unwrap()
            .max_sessions_per_source
    };
    assert_eq!(sessions(&cfg), crate::config::RTSP_SESSIONS_PER_SOURCE);
    let cfg = check(&format!(
        "{RTSP_ROUTE}max_sessions_per_source = 300
"
    ))
    .unwrap();
    assert_eq!(sessions(&cfg), 300);
    expect_err(
        &format!(
            "{RTSP_ROUTE}max_sessions_per_source = 0
"
        ),
        "signaling_route[0].max_sessions_per_source",
        base_lines() + 12,
        "1 to 10000",
    );
    expect_err(
        &format!(
            "{SIP_ROUTE}max_sessions_per_source = 10
"
        ),
        "signaling_route[0].max_sessions_per_source",
        base_lines() + 9,
        "is an RTSP setting",
    );
}

mod split {
    use super::super::parse_for;

    const HALF_A: &str = include_str!("../../systemd/vgate-half-a.toml");
    const HALF_B: &str = include_str!("../../systemd/vgate-half-b.toml");

    fn err(text: &str) -> String {
        parse_for(text, "h.toml", 2)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_else(|| "accepted".into())
    }

    #[test]
    fn example_halves_are_accepted() {
        let a = parse_for(HALF_A, "a", 2).unwrap();
        let s = a.split.as_ref().unwrap();
        assert_eq!(s.half, crate::config::split::Half::A);
        assert_eq!(s.link_face(), super::super::DomainId::B);
        assert_eq!(a.engine.max_payload, 1472, "the domain side's default");
        assert_eq!(s.out_link.max_datagram, crate::wire::link::MAX_DATAGRAM);
        assert_eq!(a.leg_max_payload(), crate::wire::link::MAX_DATAGRAM);
        assert_eq!(s.out_link.fec.unwrap().to_string(), "8+2");
        assert_eq!(s.in_link.reorder_ms, 25);
        assert_eq!(
            s.out_link.reorder_ms,
            crate::config::split::DEFAULT_REORDER_MS,
            "default with FEC on"
        );
        // Without FEC the default is 0: a gap on a cable is a loss, not a reordering.
        let plain = HALF_A.replacen("reorder_ms = 25\n", "", 1).replacen(
            "fec = \"8+2\"\n# CPU",
            "fec = \"off\"\n# CPU",
            1,
        );
        assert!(!plain.contains("reorder_ms") && plain.contains("fec = \"off\""));
        let p = parse_for(&plain, "a", 2).unwrap();
        let s = p.split.unwrap();
        assert_eq!((s.in_link.fec, s.in_link.reorder_ms), (None, 0));
        let b = parse_for(HALF_B, "b", 2).unwrap();
        assert_eq!(b.split.unwrap().half, crate::config::split::Half::B);
        // A single-host config has no split.
        assert!(super::super::Config::embedded_default().split.is_none());
    }

    #[test]
    fn half_checks_name_the_key() {
        let cases: &[(&str, &str, &str)] = &[
            ("half = \"a\"", "half = \"c\"", "split.half"),
            (
                "interface = \"rev0\"\nlocal = \"10.99.2.1:7002\"",
                "interface = \"fwd0\"\nlocal = \"10.99.2.1:7002\"",
                "split.in_link.interface: the incoming and outgoing links must be different",
            ),
            (
                "interface = \"sig0\"",
                "interface = \"rev0\"",
                "split.signal.interface",
            ),
            (
                "interface = \"fwd0\"",
                "interface = \"ens1f0\"",
                "domain a's interface",
            ),
            (
                "peer = \"10.99.2.2:7002\"",
                "peer = \"10.1.0.9:7002\"",
                "split.in_link.peer: 10.1.0.9 lies in domain a",
            ),
            (
                "networks = [\"127.77.0.2/32\"]",
                "networks = [\"127.77.0.0/24\"]",
                "split.peer_face: in half a domain b is the link face",
            ),
            (
                "fec = \"8+2\"\n\n# Reverse",
                "fec = \"8+0\"\n\n# Reverse",
                "split.out_link.fec",
            ),
            (
                "peer_mac = \"02:00:00:99:01:02\"",
                "peer_mac = \"02:00:00:99:01\"",
                "split.out_link.peer_mac",
            ),
            (
                "peer_mac = \"02:00:00:99:01:02\"\n",
                "",
                "split.out_link.peer_mac: the outgoing link needs peer_mac",
            ),
            (
                "key = \"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"",
                "key = \"0011\"",
                "split.signal.key",
            ),
            (
                "peer_mac = \"02:00:00:99:01:02\"",
                "peer_mac = \"02:00:00:99:01:02\"\nmax_datagram = 1400",
                "engine.max_payload: a half sends datagrams of up to split.out_link.max_datagram = 1400",
            ),
            (
                "peer_mac = \"02:00:00:99:01:02\"",
                "peer_mac = \"02:00:00:99:01:02\"\nmax_datagram = 70000",
                "split.out_link.max_datagram: expected 64 to 65507",
            ),
            (
                "reorder_ms = 25",
                "reorder_ms = 25\nmax_datagram = 9000",
                "split.in_link.max_datagram: the incoming link joins",
            ),
            (
                "dead_after_ms = 3000",
                "dead_after_ms = 600",
                "split.signal.dead_after_ms",
            ),
            ("# cpu = 1", "cpu = 7", "split.in_link.cpu"),
            (
                "reorder_ms = 25",
                "reorder_ms = 900",
                "split.in_link.reorder_ms",
            ),
            (
                "reorder_ms = 25",
                "reorder_ms = -1",
                "split.in_link.reorder_ms",
            ),
            (
                "peer_mac = \"02:00:00:99:01:02\"",
                "peer_mac = \"02:00:00:99:01:02\"\nreorder_ms = 5",
                "split.out_link.reorder_ms: the outgoing link sends in order",
            ),
            (
                "mode = \"stack\"",
                "mode = \"xdp\"",
                "engine.mode: mode xdp",
            ),
        ];
        for (from, to, want) in cases {
            assert!(HALF_A.contains(from), "example lacks {from:?}");
            let text = HALF_A.replacen(from, to, 1);
            let e = err(&text);
            assert!(e.contains(want), "{from:?} -> {to:?}: {e}");
            assert!(e.starts_with("h.toml:"), "{e}");
        }
        // Unknown keys are refused in every split table.
        let e = err(&HALF_A.replace("[split.in_link]\n", "[split.in_link]\nretries = 3\n"));
        assert!(e.contains("unknown field"), "{e}");
    }

    /// `fec = "block"` and its keys: defaults, each key's range, the keys refused with
    /// another `fec`; the `K+M` strings of the previous release still load.
    #[test]
    fn block_fec_settings() {
        use crate::link::fec::Code;
        let block = |keys: &str| {
            HALF_A.replacen(
                "fec = \"8+2\"\n\n# Reverse",
                &format!("fec = \"block\"\n{keys}\n# Reverse"),
                1,
            )
        };
        let c = parse_for(&block(""), "a", 2).unwrap();
        let f = c.split.unwrap().out_link.fec.unwrap();
        assert_eq!((f.k, f.m, f.close_ms()), (116, 12, 2));
        let c = parse_for(
            &block("fec_overhead = 15\nfec_block_frames = 64\nfec_block_ms = 5\n"),
            "a",
            2,
        )
        .unwrap();
        let f = c.split.unwrap().out_link.fec.unwrap();
        assert_eq!(
            (f.k, f.m, f.code),
            (
                64,
                10,
                Code::Block {
                    overhead_pct: 15,
                    close_ms: 5
                }
            )
        );
        for (keys, want) in [
            ("fec_overhead = 0\n", "split.out_link.fec_overhead: fec_overhead must be 1 to 50"),
            ("fec_overhead = 300\n", "split.out_link.fec_overhead: fec_overhead out of range"),
            ("fec_block_ms = 0\n", "split.out_link.fec_block_ms: fec_block_ms must be 1 to 100"),
            (
                "fec_block_frames = 127\n",
                "split.out_link.fec_block_frames: fec_block_frames must be 2 to 116 at fec_overhead = 10",
            ),
            (
                "fec_overhead = 50\n",
                "split.out_link.fec: fec_block_frames must be 2 to 85 at fec_overhead = 50",
            ),
        ] {
            let e = err(&block(keys));
            assert!(e.contains(want), "{keys}: {e}");
        }
        let e = err(&HALF_A.replacen(
            "fec = \"8+2\"\n\n# Reverse",
            "fec = \"8+2\"\nfec_block_ms = 3\n\n# Reverse",
            1,
        ));
        assert!(
            e.contains(
                "split.out_link.fec_block_ms: fec_block_ms sizes the blocks of fec = \"block\""
            ),
            "{e}"
        );
        for old in ["off", "8+2", "16+4", "32+16", "1+1"] {
            let c = parse_for(
                &HALF_A.replacen(
                    "fec = \"8+2\"\n\n# Reverse",
                    &format!("fec = \"{old}\"\n\n# Reverse"),
                    1,
                ),
                "a",
                2,
            )
            .unwrap();
            let f = c.split.unwrap().out_link.fec;
            assert_eq!(f.map(|f| f.to_string()).unwrap_or("off".into()), old);
            assert!(f.is_none_or(|f| !f.block_code()));
        }
    }

    const LINK_KEY: &str =
        "key = \"8899aabbccddeeff00112233445566778899aabbccddeeff0011223344556677\"\n";

    /// The media links' keys: one per direction even from one key written for both links;
    /// half A's outgoing key is half B's incoming one; bad keys are refused with the link's
    /// key named; a config without them (every config before link keys) is accepted, with
    /// the warning.
    #[test]
    fn link_keys() {
        use crate::config::split::unauthenticated_warning;
        let a = parse_for(HALF_A, "a", 2).unwrap().split.unwrap();
        let b = parse_for(HALF_B, "b", 2).unwrap().split.unwrap();
        assert!(a.out_link.key.is_some() && a.in_link.key.is_some());
        assert_ne!(a.out_link.key, a.in_link.key);
        assert_eq!(a.out_link.key, b.in_link.key);
        assert_eq!(a.in_link.key, b.out_link.key);
        assert_eq!(unauthenticated_warning(&a), None);
        // Before link keys: accepted, with the warning naming the links.
        let old = HALF_A.replace(LINK_KEY, "");
        assert!(!old.contains(LINK_KEY));
        let s = parse_for(&old, "a", 2).unwrap().split.unwrap();
        assert!(s.out_link.key.is_none() && s.in_link.key.is_none());
        let w = unauthenticated_warning(&s).unwrap();
        assert!(
            w.starts_with("split.out_link and split.in_link without key"),
            "{w}"
        );
        let one = HALF_A.replacen(LINK_KEY, "", 1);
        let w = unauthenticated_warning(&parse_for(&one, "a", 2).unwrap().split.unwrap());
        assert!(w.unwrap().starts_with("split.out_link without key"));
        // A key file, as the signaling key's.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("link.key");
        std::fs::write(
            &path,
            "8899aabbccddeeff00112233445566778899aabbccddeeff0011223344556677\n",
        )
        .unwrap();
        let file = HALF_A.replacen(LINK_KEY, &format!("key_file = \"{}\"\n", path.display()), 1);
        let f = parse_for(&file, "a", 2).unwrap().split.unwrap();
        assert_eq!(f.out_link.key, a.out_link.key);
        for (to, want) in [
            ("key = \"0011\"\n", "split.out_link.key: the key is 2 bytes"),
            ("key = \"zz\"\n", "split.out_link.key: the key must be hex"),
            (
                &format!("{LINK_KEY}key_file = \"/x\"\n"),
                "split.out_link.key: give either key or key_file",
            ),
            (
                "key_file = \"rel.key\"\n",
                "split.out_link.key_file: give an absolute path",
            ),
            (
                "key_file = \"/nonexistent/l.key\"\n",
                "split.out_link.key_file: cannot read",
            ),
        ] {
            let e = err(&HALF_A.replacen(LINK_KEY, to, 1));
            assert!(e.contains(want), "{to:?}: {e}");
        }
        // The incoming link's key is checked too.
        let text = HALF_A.replacen(LINK_KEY, LINK_KEY.replace("88", "8").as_str(), 2);
        assert!(err(&text).contains("split.out_link.key"));
        let in_only = HALF_A
            .replacen(LINK_KEY, "", 1)
            .replacen(LINK_KEY, "key = \"00\"\n", 1);
        assert!(err(&in_only).contains("split.in_link.key"));
    }
}

#[test]
fn tnapi_ring_defaults_to_v2_and_is_checked() {
    assert_eq!(check("").unwrap().engine.tnapi_ring, TnapiRing::V2);
    let tnapi = |ring: &str| {
        let text = BASE.replace("queues = 1", "queues = 1\nmode = \"tnapi\"");
        parse(&format!("{text}[engine.tnapi]\n{ring}\n"), "test.toml")
    };
    assert_eq!(
        tnapi("ring = \"v3\"").unwrap().engine.tnapi_ring,
        TnapiRing::V3
    );
    assert_eq!(
        tnapi("ring = \"v2\"").unwrap().engine.tnapi_ring,
        TnapiRing::V2
    );
    assert_eq!(tnapi("").unwrap().engine.tnapi_ring, TnapiRing::V2);
    let e = tnapi("ring = \"v4\"").unwrap_err();
    assert!(e.message.contains("unknown variant"), "{e}");
    let e = tnapi("rings = \"v3\"").unwrap_err();
    assert!(e.message.contains("unknown field"), "{e}");
    // Another mode: the setting would be silently ignored, so it is refused.
    expect_err(
        "[engine.tnapi]\nring = \"v3\"\n",
        "engine.tnapi.ring",
        base_lines() + 2,
        "applies to mode tnapi only",
    );
}

#[test]
fn media_defaults_to_count_and_leaves_static_routes_without_a_codec_alone() {
    let cfg = check(STREAM).unwrap();
    assert_eq!(cfg.media.validate, MediaMode::Count);
    assert_eq!(cfg.media.policy, crate::media::Policy::default());
    assert_eq!(cfg.streams[0].media, None, "nothing to check it against");
}

#[test]
fn static_route_media_rule() {
    use crate::media::Codec;
    let extra = format!(
        "{STREAM}media = {{ validate = \"enforce\", codec = \"H264\", payload_types = [96, 98], ssrc = 100000001, sei_user_data_max = 0 }}\n"
    );
    let cfg = check(&extra).unwrap();
    let rule = cfg.streams[0].media.unwrap();
    assert!(rule.enforce);
    let f: Vec<_> = rule
        .spec
        .formats()
        .iter()
        .map(|f| (f.pt, f.codec, f.clock_rate))
        .collect();
    assert_eq!(f, [(96, Codec::H264, 90000), (98, Codec::H264, 90000)]);
    assert_eq!(rule.spec.ssrc, Some(100000001));
    assert_eq!(rule.policy.sei_user_data_max, 0);
    // A static payload type needs none written; the global policy is the route's default.
    let extra = format!(
        "[media]\nvalidate = \"count\"\nallow_extension = true\n{STREAM}media = {{ codec = \"pcma\" }}\n"
    );
    let rule = check(&extra).unwrap().streams[0].media.unwrap();
    assert!(!rule.enforce);
    assert!(rule.policy.allow_extension);
    assert_eq!(rule.spec.formats()[0].pt, 8);
    assert_eq!(rule.spec.formats()[0].clock_rate, 8000);
    let off = format!("{STREAM}media = {{ validate = \"off\", codec = \"h264\" }}\n");
    assert_eq!(check(&off).unwrap().streams[0].media, None);
}

#[test]
fn media_keys_are_checked() {
    let line = base_lines() + STREAM.lines().count() + 1;
    let e = check("[media]\nvalidate = \"strict\"\n").unwrap_err();
    assert!(e.message.contains("unknown variant"), "{e}");
    let e = check("[media]\ncolour = 1\n").unwrap_err();
    assert!(e.message.contains("unknown field"), "{e}");
    let e = check(&format!(
        "{STREAM}media = {{ codec = \"h264\", colour = 1 }}\n"
    ))
    .unwrap_err();
    assert!(e.message.contains("unknown field"), "{e}");
    expect_err(
        &format!("{STREAM}media = {{ codec = \"vp8\", payload_types = [96] }}\n"),
        "stream_route[0].media.codec",
        line,
        "unknown codec \"vp8\"",
    );
    expect_err(
        &format!("{STREAM}media = {{ codec = \"h264\" }}\n"),
        "stream_route[0].media.payload_types",
        line,
        "no static payload type",
    );
    expect_err(
        &format!("{STREAM}media = {{ validate = \"enforce\" }}\n"),
        "stream_route[0].media.codec",
        line,
        "needs the codec",
    );
    expect_err(
        &format!("{STREAM}media = {{ codec = \"h264\", payload_types = [200] }}\n"),
        "stream_route[0].media.payload_types[0]",
        line,
        "0 to 127",
    );
    expect_err(
        &format!("{STREAM}media = {{ codec = \"aac\", payload_types = [97] }}\n"),
        "stream_route[0].media.clock_rate",
        line,
        "sample rate",
    );
    expect_err(
        &format!("[media]\nvalidate = \"enforce\"\n{STREAM}"),
        "stream_route[0].media",
        base_lines() + 5,
        "does not say what it carries",
    );
    expect_err(
        "[media]\nsei_user_data_max = 100000\n",
        "media.sei_user_data_max",
        base_lines() + 2,
        "0 to 16384",
    );
}

#[test]
fn signaling_route_media_validate() {
    let sip = "[[signaling_route]]\nname = \"gb\"\ntype = \"sip\"\ntransport = \"udp\"\nlisten_domain = \"b\"\nlisten_port = 5060\nupstream = \"10.1.0.9:5060\"\n";
    let cfg = check(sip).unwrap();
    assert_eq!(cfg.signaling[0].media_validate, MediaMode::Count);
    let cfg = check(&format!("[media]\nvalidate = \"enforce\"\n{sip}")).unwrap();
    assert_eq!(cfg.signaling[0].media_validate, MediaMode::Enforce);
    let cfg = check(&format!("{sip}media_validate = \"off\"\n")).unwrap();
    assert_eq!(cfg.signaling[0].media_validate, MediaMode::Off);
    let cfg = check(&format!("{sip}media_validate = \"strip\"\n")).unwrap();
    assert_eq!(cfg.signaling[0].media_validate, MediaMode::Strip);
}

#[test]
fn media_validate_strip() {
    // `strip` enforces, and the rule of a static route carries it in its policy.
    let cfg = check(&format!(
        "[media]\nvalidate = \"strip\"\n{STREAM}media = {{ codec = \"ps\", payload_types = [96] }}\n"
    ))
    .unwrap();
    assert_eq!(cfg.media.validate, MediaMode::Strip);
    let rule = cfg.streams[0].media.expect("validated");
    assert!(rule.enforce && rule.policy.strip);
    let cfg = check(&format!(
        "{STREAM}media = {{ validate = \"strip\", codec = \"h264\", payload_types = [96] }}\n"
    ))
    .unwrap();
    assert!(cfg.streams[0].media.expect("validated").policy.strip);
    let cfg = check(&format!(
        "{STREAM}media = {{ validate = \"enforce\", codec = \"h264\", payload_types = [96] }}\n"
    ))
    .unwrap();
    let rule = cfg.streams[0].media.expect("validated");
    assert!(rule.enforce && !rule.policy.strip);
    // Under strip as under enforce, a static route must say what it carries.
    let e = check(&format!("[media]\nvalidate = \"strip\"\n{STREAM}")).unwrap_err();
    assert!(e.to_string().contains("media.validate is \"strip\""), "{e}");
    // A value that is none of them names the four.
    let e = check("[media]\nvalidate = \"cut\"\n").unwrap_err();
    assert!(e.to_string().contains("strip"), "{e}");
}
