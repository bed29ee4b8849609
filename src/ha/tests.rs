use std::sync::Arc;

use super::record::{snapshot, Replicas};
use super::*;
use crate::config::{self, DomainId, SourcePolicy};
use crate::routes::{Channel, NoHooks, RouteSpec, Routes, SessionKind};

fn cfg(extra: &str) -> crate::config::Config {
    let text = format!(
        r#"
[domains.a]
interface = "lo"
address = "127.0.0.1"
media_ports = "20000-20009"
[domains.b]
interface = "lo"
address = "127.0.0.2"
media_ports = "30000-30009"
{extra}"#
    );
    config::parse(&text, "t").unwrap()
}

fn admin_route(routes: &Routes, name: &str, port: u16, egress: u16) {
    let s = routes.open_session(SessionKind::Admin, name);
    routes.reserve_port(s, DomainId::A, port).unwrap();
    routes.reserve_port(s, DomainId::B, egress).unwrap();
    routes
        .add_route(
            s,
            RouteSpec {
                ingress: DomainId::A,
                port,
                dest: "127.0.0.2:40000".parse().unwrap(),
                egress_port: egress,
                policy: SourcePolicy::Latch,
                expected: None,
                rtp_only: false,
                label: name.into(),
                media: None,
            },
        )
        .unwrap();
}

fn desired(routes: &Routes) -> BTreeMap<String, SessionRecord> {
    snapshot(routes)
        .into_iter()
        .map(|(k, (_, r))| (k, r))
        .collect()
}

#[test]
fn without_ha_the_tables_forward_and_with_ha_they_start_as_standby() {
    assert!(!Routes::new(&cfg(""), Arc::new(NoHooks)).is_standby());
    assert!(Routes::new(&cfg("[ha]\nnode = \"n1\""), Arc::new(NoHooks)).is_standby());
}

#[test]
fn a_standby_drops_with_standby_and_the_active_forwards() {
    let routes = Routes::new(&cfg("[ha]"), Arc::new(NoHooks));
    admin_route(&routes, "r", 20000, 30000);
    let r = routes.lookup(Channel::Forward, 20000).unwrap();
    let mut pkt = [0u8; 20];
    crate::wire::rtp::write_header(&mut pkt, 96, 1, 0, 1).unwrap();
    let src = "127.0.0.1:5000".parse().unwrap();
    let mut v = crate::channel::Validators::new(16, Default::default());
    assert_eq!(
        crate::channel::inspect(&r, src, &pkt, false, 1500, 1, &mut v),
        Err(crate::stats::DropReason::Standby)
    );
    routes.set_standby(false);
    assert!(crate::channel::inspect(&r, src, &pkt, false, 1500, 1, &mut v).is_ok());
}

#[test]
fn the_standby_copies_installs_updates_latches_and_removes() {
    let active = Routes::new(&cfg(""), Arc::new(NoHooks));
    let standby = Routes::new(&cfg("[ha]"), Arc::new(NoHooks));
    admin_route(&active, "cam1", 20000, 30000);
    admin_route(&active, "cam2", 20002, 30002);
    // A static route of the config is on both nodes already: never copied.
    let mut copies = Replicas::default();
    let d = desired(&active);
    assert_eq!(d.len(), 2);
    let done = copies.apply(&standby, &d);
    assert_eq!((done.installed, done.removed), (2, 0), "{done:?}");
    let r = standby.lookup(Channel::Forward, 20000).unwrap();
    assert_eq!(r.egress_port, 30000);
    assert_eq!(standby.ports(DomainId::A).0, 2);
    // Nothing changed: nothing done.
    assert_eq!(copies.apply(&standby, &d), Default::default());
    // The active latches a source: the copy follows, in place.
    let src = "10.1.0.7:5000".parse().unwrap();
    active
        .lookup(Channel::Forward, 20000)
        .unwrap()
        .set_latched(Some(src));
    let done = copies.apply(&standby, &desired(&active));
    assert_eq!(done.relatched, 1);
    assert_eq!(
        standby.lookup(Channel::Forward, 20000).unwrap().latched(),
        Some(src)
    );
    assert!(Arc::ptr_eq(
        &r,
        &standby.lookup(Channel::Forward, 20000).unwrap()
    ));
    // One route removed on the active: removed on the standby, its ports freed.
    let id = active
        .sessions()
        .into_iter()
        .find(|s| s.label == "cam2")
        .unwrap()
        .id;
    active.close_session(id).unwrap();
    let done = copies.apply(&standby, &desired(&active));
    assert_eq!(done.removed, 1);
    assert!(standby.lookup(Channel::Forward, 20002).is_none());
    assert_eq!(standby.ports(DomainId::A).0, 1);
    // The copy is an admin session there too (an operator can remove it after a takeover).
    assert!(standby
        .sessions()
        .iter()
        .all(|s| s.kind == SessionKind::Admin));
}

#[test]
fn a_sip_session_becomes_a_replica_and_a_taken_port_is_reported() {
    let active = Routes::new(&cfg(""), Arc::new(NoHooks));
    let standby = Routes::new(&cfg("[ha]"), Arc::new(NoHooks));
    let s = active.open_session(SessionKind::Sip, "sip:gb:call-1");
    let a = active.alloc_pair(s, DomainId::A).unwrap();
    let b = active.alloc_pair(s, DomainId::B).unwrap();
    active
        .add_route(
            s,
            RouteSpec {
                ingress: DomainId::A,
                port: a,
                dest: "127.0.0.2:40000".parse().unwrap(),
                egress_port: b,
                policy: SourcePolicy::Latch,
                expected: None,
                rtp_only: true,
                label: "call-1 video".into(),
                media: Some(crate::media::Rule {
                    enforce: true,
                    spec: crate::media::StreamSpec::new(Some(0x0100_0001)).with(
                        96,
                        crate::media::Codec::Ps,
                        90000,
                    ),
                    policy: crate::media::Policy::default(),
                }),
            },
        )
        .unwrap();
    // The standby has a port of that session taken by something of its own.
    admin_route(&standby, "local", a + 1, 30009);
    let mut copies = Replicas::default();
    let done = copies.apply(&standby, &desired(&active));
    assert_eq!(done.failed.len(), 1, "{done:?}");
    assert!(standby.lookup(Channel::Forward, a).is_none());
    let id = standby.sessions()[0].id;
    standby.close_session(id).unwrap();
    let done = copies.apply(&standby, &desired(&active));
    assert_eq!(done.installed, 1, "{done:?}");
    let copy = standby
        .sessions()
        .into_iter()
        .find(|s| s.label == "sip:gb:call-1")
        .unwrap();
    assert_eq!(copy.kind, SessionKind::Replica);
    assert_eq!(copy.ports.len(), 4);
    // The copy validates its media exactly as the original.
    assert_eq!(
        standby.lookup(Channel::Forward, a).unwrap().media,
        active.lookup(Channel::Forward, a).unwrap().media
    );
    assert!(standby.lookup(Channel::Forward, a).unwrap().media.is_some());
    // The copy's own record says what it copies (a third node sees a `sip` session).
    let (_, rec) = snapshot(&standby).into_values().next().unwrap();
    assert_eq!(rec.kind, "sip");
}

#[test]
fn roles_parse_keepalived_words() {
    assert_eq!(Role::parse("MASTER"), Some(Role::Active));
    assert_eq!(Role::parse("backup\n"), Some(Role::Standby));
    assert_eq!(Role::parse("FAULT"), Some(Role::Fault));
    assert_eq!(Role::parse("STOP"), Some(Role::Fault));
    assert_eq!(Role::parse("101"), None);
}

#[test]
fn leaving_the_active_role_closes_the_gate_at_once() {
    let c = cfg("[ha]\nredis = \"127.0.0.1:1\"");
    let routes = Arc::new(Routes::new(&c, Arc::new(NoHooks)));
    let ha = Ha::start(c.ha.clone().unwrap(), Arc::clone(&routes)).unwrap();
    assert!(routes.is_standby());
    // The store never answered: the standby's state is stale, it refuses to take over.
    ha.status.request(Role::Active);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while ha.status.refusal().is_none() {
        assert!(std::time::Instant::now() < deadline, "never refused");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(routes.is_standby(), "a stale standby does not forward");
    assert_eq!(ha.status.role(), Role::Standby);
    assert_eq!(ha.status.takeovers_refused.load(Relaxed), 1, "counted once");
    assert!(ha
        .status
        .refusal()
        .is_some_and(|r| r.contains("standby state stale") && r.contains("--force")));
    let (problems, _) = ha.status.health(now_ms());
    assert!(problems[0].contains("standby state stale"), "{problems:?}");
    // Told to (`vgate ha-notify --force MASTER`): it takes over, and its stale state warns.
    ha.status.allow_stale_takeover();
    let (problems, warnings) = ha.status.health(now_ms());
    assert!(problems.is_empty(), "{problems:?}");
    assert!(warnings[0].contains("allowed"), "{warnings:?}");
    ha.status.request(Role::Active);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while routes.is_standby() {
        assert!(std::time::Instant::now() < deadline, "never became active");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(ha.status.role(), Role::Active);
    // The store is unreachable: the active warns, it is not unhealthy.
    std::thread::sleep(Duration::from_millis(300));
    let (problems, warnings) = ha.status.health(now_ms());
    assert!(problems.is_empty(), "{problems:?}");
    assert!(warnings[0].contains("unreachable"), "{warnings:?}");
    assert!(ha.status.refusal().is_none());
    ha.status.request(Role::Fault);
    assert!(routes.is_standby(), "the gate closes within the call");
    // The override lasts until the store answers: still a warning.
    let (problems, _) = ha.status.health(now_ms());
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn takeover_when_stale_lets_a_stale_standby_take_over() {
    let c = cfg("[ha]\nredis = \"127.0.0.1:1\"\ntakeover_when_stale = true");
    let routes = Arc::new(Routes::new(&c, Arc::new(NoHooks)));
    let ha = Ha::start(c.ha.clone().unwrap(), Arc::clone(&routes)).unwrap();
    let (problems, warnings) = ha.status.health(now_ms());
    assert!(problems.is_empty(), "{problems:?}");
    assert!(warnings[0].contains("standby state stale"), "{warnings:?}");
    ha.status.request(Role::Active);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while routes.is_standby() {
        assert!(std::time::Instant::now() < deadline, "never became active");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(ha.status.takeovers_refused.load(Relaxed), 0);
}

#[test]
fn ha_section_rejects_unknown_keys_and_mode_xdp() {
    let text = |extra: &str| {
        format!(
            "[domains.a]\ninterface = \"lo\"\naddress = \"127.0.0.1\"\nmedia_ports = \"20000-20009\"\n[domains.b]\ninterface = \"lo\"\naddress = \"127.0.0.2\"\nmedia_ports = \"30000-30009\"\n{extra}"
        )
    };
    let e = config::parse(&text("[ha]\nrole = \"master\""), "t").unwrap_err();
    assert!(e.to_string().contains("unknown field"), "{e}");
    let e = config::parse(&text("[engine]\nmode = \"xdp\"\n[ha]\n"), "t").unwrap_err();
    assert!(e.to_string().contains("cannot use mode xdp"), "{e}");
    let e = config::parse(&text("[ha]\nredis = \"nowhere\""), "t").unwrap_err();
    assert!(e.to_string().contains("ha.redis"), "{e}");
    let c = config::parse(
        &text("[ha]\nrole_file = \"/run/vgate/ha-role\"\nredis = \"10.9.0.100:6379\""),
        "t",
    )
    .unwrap();
    let h = c.ha.unwrap();
    assert_eq!(h.node, "vgate");
    assert_eq!(h.stale_after_ms, crate::config::ha::DEFAULT_STALE_AFTER_MS);
    assert!(config::parse(&text(""), "t").unwrap().ha.is_none());
    // The fencing lease: defaults (a config of the earlier release is accepted as it was),
    // bounds, the store-loss choice.
    assert_eq!(h.lease_ms, crate::config::ha::DEFAULT_LEASE_MS);
    assert_eq!(h.store_loss, StoreLoss::KeepForwarding);
    let e = config::parse(&text("[ha]\nlease_ms = 100"), "t").unwrap_err();
    assert!(e.to_string().contains("ha.lease_ms"), "{e}");
    let e = config::parse(&text("[ha]\nstore_loss = \"stop\""), "t").unwrap_err();
    assert!(e.to_string().contains("stop-after-lease"), "{e}");
    let c = config::parse(
        &text("[ha]\nlease_ms = 2500\nstore_loss = \"stop-after-lease\""),
        "t",
    )
    .unwrap();
    let h = c.ha.unwrap();
    assert_eq!(
        (h.lease_ms, h.store_loss),
        (2500, StoreLoss::StopAfterLease)
    );
}

#[test]
fn a_master_that_cannot_reach_the_store_for_the_lease_is_fenced_unless_forced() {
    // Redis never answers: the standby is stale (refused) first; forced, it takes over
    // without the lease (it is taken when the store answers).
    let c = cfg("[ha]\nredis = \"127.0.0.1:1\"");
    let routes = Arc::new(Routes::new(&c, Arc::new(NoHooks)));
    let ha = Ha::start(c.ha.clone().unwrap(), Arc::clone(&routes)).unwrap();
    ha.status.request(Role::Active);
    std::thread::sleep(Duration::from_millis(300));
    assert!(routes.is_standby());
    assert!(ha.status.refusal().is_some());
    ha.status.allow_stale_takeover();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while routes.is_standby() {
        assert!(std::time::Instant::now() < deadline, "never became active");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        ha.status.lease_epoch.load(Relaxed),
        0,
        "no lease without the store"
    );
    assert!(ha.status.fenced().is_none());
    // Back to standby: the fence and the takeover permission of the request go.
    ha.status.request(Role::Standby);
    assert!(routes.is_standby());
    assert!(ha.status.fenced().is_none());
}

#[test]
fn the_role_file_sets_the_role() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("role");
    std::fs::write(&f, "MASTER\n").unwrap();
    let c = cfg(&format!("[ha]\nrole_file = \"{}\"", f.display()));
    let routes = Arc::new(Routes::new(&c, Arc::new(NoHooks)));
    let ha = Ha::start(c.ha.clone().unwrap(), Arc::clone(&routes)).unwrap();
    let wait = |standby: bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while routes.is_standby() != standby {
            assert!(
                std::time::Instant::now() < deadline,
                "role file not followed"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    wait(false);
    std::fs::write(&f, "BACKUP\n").unwrap();
    wait(true);
    assert_eq!(ha.status.role(), Role::Standby);
}

#[test]
fn a_quick_back_and_forth_ends_in_the_role_asked_last() {
    let c = cfg("[ha]");
    let routes = Arc::new(Routes::new(&c, Arc::new(NoHooks)));
    let ha = Ha::start(c.ha.clone().unwrap(), Arc::clone(&routes)).unwrap();
    let settle = |want_standby: bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            std::thread::sleep(Duration::from_millis(300));
            if routes.is_standby() == want_standby {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "did not settle");
        }
    };
    for _ in 0..20 {
        ha.status.request(Role::Active);
        ha.status.request(Role::Standby);
    }
    settle(true);
    assert_eq!(ha.status.role(), Role::Standby);
    ha.status.request(Role::Active);
    ha.status.request(Role::Fault);
    ha.status.request(Role::Active);
    settle(false);
    assert_eq!(ha.status.role(), Role::Active);
    ha.status.request(Role::Fault);
    settle(true);
    assert_eq!(ha.status.role(), Role::Fault);
}
