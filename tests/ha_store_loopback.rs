//! The hot standby's state store with real redis-server on loopback, no root and no
//! keepalived (the roles are given with `vgate ha-notify`, as keepalived's hooks do):
//!
//! - a Redis flushed under the active without its connection dropping is noticed (the
//!   generation in `meta` is gone) and rewritten whole at once; the standby keeps its copies
//!   meanwhile;
//! - Redis replication as `systemd/` sets it up: each node's vgate on its own node's Redis,
//!   the standby's a replica (`replicaof`) of the active's. The active's Redis killed: the
//!   active forwards on and warns, the standby reads a replica cut from its master and says
//!   it is stale; the active's Redis back (empty): the whole is rewritten, the replica syncs,
//!   the standby holds what changed meanwhile. Then the takeover as keepalived's notify does
//!   it: the replica promoted (`REPLICAOF NO ONE`), `ha-notify MASTER`, and the new active
//!   forwards the copied route and writes to its own Redis.
//!
//! Needs redis-server and redis-cli (Debian `redis-server`, `redis-tools`).

mod common;

use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::proc::Proc;
use common::vgate::Vgate;
use common::wait_until;

const NEEDS: &[(&str, &str)] = &[
    ("redis-server", "redis-server"),
    ("redis-cli", "redis-tools"),
];

/// The sender (domain A, `.1`) and the receiver (domain B, `.2`) on net `shared` that both
/// nodes of a pair serve: the records carry destinations and latched sources, the same for
/// either node.
fn peers(shared: u8) -> (String, String) {
    (format!("127.0.{shared}.1"), format!("127.0.{shared}.2"))
}

/// A node's loopback net, admin address and config (its own Redis `redis`).
fn node(net: u8, shared: u8, name: &str, redis: &str, prefix: &str) -> (String, String) {
    let (sender, receiver) = peers(shared);
    let admin = format!("127.0.{net}.1:9971");
    let cfg =
        common::vgate::loopback_with(
            net,
            9971,
            100,
            &[&format!("{sender}/32")],
            &[&format!("{receiver}/32")],
        ) + &format!("[ha]\nnode = \"{name}\"\nredis = \"{redis}\"\nkey_prefix = \"{prefix}\"\n");
    (admin, cfg)
}

fn redis(addr: &str, replica_of: Option<&str>, dir: &std::path::Path) -> Proc {
    let (host, port) = addr.split_once(':').unwrap();
    let mut c = Command::new("redis-server");
    c.args([
        "--bind",
        host,
        "--port",
        port,
        "--save",
        "",
        "--appendonly",
        "no",
    ])
    .args(["--protected-mode", "no", "--dir"])
    .arg(dir)
    // A replica notices a master gone at once (its connection closed); a master that
    // stops answering, within the repl-timeout.
    .args(["--repl-timeout", "5"]);
    if let Some(m) = replica_of {
        let (mh, mp) = m.split_once(':').unwrap();
        c.args(["--replicaof", mh, mp]);
    }
    let p = Proc::spawn(
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    wait_until("redis-server answers", Duration::from_secs(10), || {
        cli(addr, &["PING"]).trim() == "PONG"
    });
    p
}

fn cli(addr: &str, args: &[&str]) -> String {
    let (host, port) = addr.split_once(':').unwrap();
    let out = Command::new("redis-cli")
        .args(["-h", host, "-p", port])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ha(admin: &str) -> serde_json::Value {
    common::admin::get_json(admin, "/api/v1/ha")
}

fn health(admin: &str) -> serde_json::Value {
    common::admin::get_json(admin, "/api/v1/health")
}

/// Waits until the node has read the state store and is healthy (as keepalived would).
fn wait_healthy(admin: &str) {
    wait_until(
        "the node healthy (state store read)",
        Duration::from_secs(15),
        || {
            common::admin::try_get(admin, "/api/v1/health")
                .ok()
                .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
                .is_some_and(|h| h["healthy"] == true)
        },
    );
}

fn notify(admin: &str, role: &str) {
    let out = common::run_vgate(&["ha-notify", "--admin", admin, role]);
    assert!(
        out.status.success(),
        "ha-notify {role}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn holds_route(admin: &str, port: u16) -> bool {
    common::admin::get_json(admin, "/api/v1/routes")["routes"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| r["port"] == port)
}

fn add_route(admin: &str, shared: u8, name: &str, port: u16, egress: u16, rx_port: u16) {
    let receiver = peers(shared).1;
    let resp = common::admin::post(
        admin,
        "/api/v1/routes",
        &format!(
            r#"{{"name":"{name}","domain":"a","port":{port},"destination":"{receiver}:{rx_port}","egress_port":{egress},"source_validation":"latch"}}"#
        ),
    );
    assert!(resp.contains(" 201 "), "route not added: {resp}");
}

/// Sends `n` RTP packets from the sender (one source port: the route latches it) to node
/// `net`'s gateway `port` and counts what the receiver got.
fn forwarded(net: u8, shared: u8, port: u16, rx: &UdpSocket, n: u16) -> usize {
    let tx = UdpSocket::bind(format!("{}:{}", peers(shared).0, port - 15000)).unwrap();
    for i in 0..n {
        let mut p = [0u8; 172];
        p[0] = 0x80;
        p[1] = 96;
        p[2..4].copy_from_slice(&i.to_be_bytes());
        tx.send_to(&p, format!("127.0.{net}.1:{port}")).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut got = 0;
    let mut buf = [0u8; 2048];
    while rx.recv(&mut buf).is_ok() {
        got += 1;
    }
    got
}

fn receiver(shared: u8, port: u16) -> UdpSocket {
    let rx = UdpSocket::bind(format!("{}:{port}", peers(shared).1)).unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    rx
}

fn metric(admin: &str, family: &str, labels: &[&str]) -> u64 {
    common::admin::metric(&common::admin::get(admin, "/metrics"), family, labels)
}

#[test]
fn a_flushed_store_is_noticed_and_rewritten_and_the_standby_keeps_its_copies() {
    require!(false, NEEDS);
    let dir = tempfile::tempdir().unwrap();
    let store = "127.0.71.1:6381";
    let _redis = redis(store, None, dir.path());
    let (a1, c1) = node(71, 75, "lo-1", store, "flush");
    let (a2, c2) = node(72, 75, "lo-2", store, "flush");
    let _v1 = Vgate::start(&c1);
    let _v2 = Vgate::start(&c2);
    wait_healthy(&a1);
    wait_healthy(&a2);
    notify(&a1, "MASTER");
    add_route(&a1, 75, "cam", 20010, 30010, 40010);
    wait_until("the standby's copy", Duration::from_secs(10), || {
        holds_route(&a2, 20010)
    });
    let lost0 = ha(&a1)["state_store_lost"].as_u64().unwrap();
    let resyncs0 = ha(&a1)["state_store_resyncs"].as_u64().unwrap();
    let epoch = ha(&a1)["lease_epoch"].as_u64().unwrap();
    assert!(epoch > 0, "the active holds the lease");
    let lease = format!("{epoch} lo-1");
    assert_eq!(cli(store, &["GET", "flush:lease"]).trim(), lease);
    // Flushed behind vgate's back: its connection stays up. (The active may rewrite within a
    // tick, before a look at the sessions: a key vgate never writes shows the flush.)
    assert_eq!(cli(store, &["SET", "flush:marker", "1"]).trim(), "OK");
    assert_eq!(cli(store, &["FLUSHALL"]).trim(), "OK");
    assert_eq!(cli(store, &["EXISTS", "flush:marker"]).trim(), "0");
    wait_until(
        "the active to rewrite the flushed store",
        Duration::from_secs(5),
        || cli(store, &["HEXISTS", "flush:sessions", "a:20010"]).trim() == "1",
    );
    let v = ha(&a1);
    assert!(v["state_store_lost"].as_u64().unwrap() > lost0, "{v}");
    assert!(v["state_store_resyncs"].as_u64().unwrap() > resyncs0, "{v}");
    assert!(metric(&a1, "vgate_ha_state_store_lost_total", &[]) > lost0);
    // The flush took the lease and the epoch counter too: the holder's batch took its lease
    // again with its own epoch (not fenced), and the counter is back at it.
    assert_eq!(cli(store, &["GET", "flush:lease"]).trim(), lease);
    assert_eq!(
        cli(store, &["GET", "flush:epoch"]).trim(),
        epoch.to_string()
    );
    assert_eq!(v["role"], "active", "{v}");
    assert_eq!(v["fenced"], false, "{v}");
    assert_eq!(v["lease_epoch"].as_u64(), Some(epoch), "{v}");
    // The standby never gave its copy up (an unwritten store changes nothing there).
    let s = ha(&a2);
    assert_eq!(s["replicas"], 1, "{s}");
    assert!(holds_route(&a2, 20010));
    // An ordinary change afterwards is a batch, not a loss.
    let lost1 = ha(&a1)["state_store_lost"].as_u64().unwrap();
    add_route(&a1, 75, "cam2", 20020, 30020, 40020);
    wait_until(
        "the standby's copy of cam2",
        Duration::from_secs(10),
        || holds_route(&a2, 20020),
    );
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(ha(&a1)["state_store_lost"].as_u64().unwrap(), lost1);
}

#[test]
fn replicated_redis_the_active_s_killed_standby_stale_then_caught_up_then_takeover() {
    require!(false, NEEDS);
    let dir1 = tempfile::tempdir().unwrap();
    let dir2 = tempfile::tempdir().unwrap();
    let (r1, r2) = ("127.0.73.1:6382", "127.0.74.1:6383");
    let mut redis1 = Some(redis(r1, None, dir1.path()));
    let _redis2 = redis(r2, Some(r1), dir2.path());
    let (a1, c1) = node(73, 76, "lo-1", r1, "repl");
    let (a2, c2) = node(74, 76, "lo-2", r2, "repl");
    let _v1 = Vgate::start(&c1);
    let v2 = Vgate::start(&c2);
    wait_healthy(&a1);
    wait_healthy(&a2);
    notify(&a1, "MASTER");
    add_route(&a1, 76, "cam", 20010, 30010, 40010);
    wait_until(
        "the standby's copy through the replica",
        Duration::from_secs(10),
        || holds_route(&a2, 20010),
    );
    assert_eq!(health(&a2)["healthy"], true);
    let rx1 = receiver(76, 40010);
    assert_eq!(
        forwarded(73, 76, 20010, &rx1, 50),
        50,
        "the active forwards"
    );

    // The active's Redis killed.
    if let Some(mut r) = redis1.take() {
        let _ = r.stop();
    }
    wait_until(
        "the standby to say its replica is cut from the active's Redis",
        Duration::from_secs(15),
        || {
            let h = health(&a2);
            h["healthy"] == false && h["problems"].to_string().contains("is a replica of")
        },
    );
    let h = health(&a2);
    assert!(
        h["problems"].to_string().contains("standby state stale"),
        "{h}"
    );
    // Forwarding unchanged, the active healthy with a warning; a route added meanwhile waits.
    assert_eq!(forwarded(73, 76, 20010, &rx1, 50), 50, "forwarding goes on");
    let h1 = health(&a1);
    assert_eq!(h1["healthy"], true, "{h1}");
    add_route(&a1, 76, "cam2", 20020, 30020, 40020);
    wait_until(
        "the change counted as pending",
        Duration::from_secs(5),
        || ha(&a1)["state_store_pending"].as_u64() >= Some(1),
    );
    assert!(!holds_route(&a2, 20020));

    // Back (empty): the active rewrites the whole, the replica syncs, the standby catches up.
    let resyncs0 = metric(
        &a1,
        "vgate_ha_state_store_writes_total",
        &["kind=\"resync\""],
    );
    let _redis1 = redis(r1, None, dir1.path());
    wait_until(
        "the standby's copy of the route added while Redis was away",
        Duration::from_secs(15),
        || holds_route(&a2, 20020),
    );
    assert!(
        metric(
            &a1,
            "vgate_ha_state_store_writes_total",
            &["kind=\"resync\""]
        ) > resyncs0
    );
    wait_until("the standby healthy again", Duration::from_secs(10), || {
        health(&a2)["healthy"] == true
    });
    assert_eq!(ha(&a1)["state_store_pending"], 0);

    // The takeover as keepalived's notify_master does it (systemd/vgate-ha-notify-redis): the
    // local replica promoted first, then vgate.
    notify(&a1, "BACKUP");
    assert_eq!(cli(r2, &["REPLICAOF", "NO", "ONE"]).trim(), "OK");
    notify(&a2, "MASTER");
    wait_until("a2 active", Duration::from_secs(5), || {
        ha(&a2)["role"] == "active"
    });
    assert_eq!(
        forwarded(74, 76, 20010, &rx1, 50),
        50,
        "the new active forwards the copied route\n{}",
        v2.log()
    );
    // It writes to its own (promoted) Redis.
    add_route(&a2, 76, "cam3", 20030, 30030, 40030);
    wait_until(
        "the new active's write in its Redis",
        Duration::from_secs(5),
        || cli(r2, &["HEXISTS", "repl:sessions", "a:20030"]).trim() == "1",
    );
    let v = ha(&a2);
    assert_eq!(v["state_store_up"], true, "{v}");
}

/// `ha.store_loss = "stop-after-lease"`: Redis killed under the active. The active forwards
/// on until its lease ran out (`ha.lease_ms` since its last renewal, its own clock), then it
/// is fenced: it forwards nothing (counted `standby`), says why, stays healthy for
/// keepalived with the reason as a warning, counts the episode once. Meanwhile the standby
/// is stale and a takeover is refused, so nobody forwards: the price of this mode, against
/// two forwarders in a double partition (docs/ha.md). Redis back (empty): the fenced node
/// takes the free lease (a new epoch), rewrites the whole and forwards on the same gateway
/// port again; the standby copies it and is healthy again.
#[test]
fn stop_after_lease_the_active_that_lost_redis_stops_once_its_lease_ran_out_and_resumes() {
    require!(false, NEEDS);
    let dir = tempfile::tempdir().unwrap();
    let store = "127.0.79.1:6384";
    let mut redis_p = Some(redis(store, None, dir.path()));
    let stop = "store_loss = \"stop-after-lease\"\nlease_ms = 1000\n";
    let (a1, c1) = node(79, 81, "lo-1", store, "sal");
    let (a2, c2) = node(80, 81, "lo-2", store, "sal");
    let v1 = Vgate::start(&(c1 + stop));
    let _v2 = Vgate::start(&(c2 + stop));
    wait_healthy(&a1);
    wait_healthy(&a2);
    notify(&a1, "MASTER");
    assert_eq!(ha(&a1)["store_loss"], "stop-after-lease");
    add_route(&a1, 81, "cam", 20010, 30010, 40010);
    wait_until("the standby's copy", Duration::from_secs(10), || {
        holds_route(&a2, 20010)
    });
    let rx = receiver(81, 40010);
    assert_eq!(forwarded(79, 81, 20010, &rx, 50), 50, "the active forwards");
    assert!(ha(&a1)["lease_epoch"].as_u64() > Some(0));

    // Redis killed: no answer, no renewal.
    if let Some(mut r) = redis_p.take() {
        r.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = r.wait_exit(Duration::from_secs(5));
    }
    let killed = std::time::Instant::now();
    wait_until(
        "the active fenced once its lease ran out",
        Duration::from_secs(15),
        || ha(&a1)["fenced"] == true,
    );
    let fenced_after = killed.elapsed();
    let v = ha(&a1);
    // Why, logged once per episode (the reason shown then says what it waits for: a
    // lease it cannot take while Redis is away).
    assert!(
        v1.log()
            .contains("while the state store 127.0.79.1:6384 was unreachable"),
        "{}",
        v1.log()
    );
    assert!(v1.log().contains("stop-after-lease"), "{}", v1.log());
    assert!(
        v["fenced_reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("fenced: ")),
        "{v}"
    );
    assert_eq!(v["role"], "standby", "the gate is closed: {v}");
    assert_eq!(
        v["requested_role"], "active",
        "still keepalived's MASTER: {v}"
    );
    assert_eq!(v["lease_epoch"], 0, "{v}");
    assert_eq!(v["fenced_total"], 1, "{v}");
    assert_eq!(metric(&a1, "vgate_ha_fenced", &[]), 1);
    let h = health(&a1);
    assert!(h["warnings"].to_string().contains("fenced: "), "{h}");
    // Nothing forwarded now: every packet dropped as `standby`, counted.
    let standby_drops = |a: &str| metric(a, "vgate_channel_drops_total", &["reason=\"standby\""]);
    let drops0 = standby_drops(&a1);
    assert_eq!(
        forwarded(79, 81, 20010, &rx, 50),
        0,
        "a fenced node forwards nothing\n{}",
        v1.log()
    );
    wait_until("the drops counted", Duration::from_secs(5), || {
        standby_drops(&a1) >= drops0 + 50
    });
    // Still fenced after many more ticks: counted once per episode.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(ha(&a1)["fenced_total"], 1);
    // The standby cannot read either: stale, and it would refuse to take over.
    wait_until("the standby stale", Duration::from_secs(10), || {
        health(&a2)["problems"]
            .to_string()
            .contains("standby state stale")
    });

    // Redis back (empty): the fenced node takes the free lease and forwards again.
    let resyncs0 = metric(
        &a1,
        "vgate_ha_state_store_writes_total",
        &["kind=\"resync\""],
    );
    let _redis = redis(store, None, dir.path());
    wait_until(
        "the old active forwarding again with a lease",
        Duration::from_secs(15),
        || {
            let v = ha(&a1);
            v["role"] == "active" && v["fenced"] == false && v["lease_epoch"].as_u64() > Some(0)
        },
    );
    assert_eq!(
        forwarded(79, 81, 20010, &rx, 50),
        50,
        "forwarding again on the same gateway port\n{}",
        v1.log()
    );
    assert!(
        metric(
            &a1,
            "vgate_ha_state_store_writes_total",
            &["kind=\"resync\""]
        ) > resyncs0,
        "the whole rewritten"
    );
    assert_eq!(ha(&a1)["fenced_total"], 1);
    assert_eq!(metric(&a1, "vgate_ha_fenced", &[]), 0);
    wait_until("the standby healthy again", Duration::from_secs(10), || {
        health(&a2)["healthy"] == true
    });
    assert!(holds_route(&a2, 20010));
    eprintln!(
        "FIGURE ha stop-after-lease: fenced {:.0} ms after Redis was killed (ha.lease_ms 1000)",
        fenced_after.as_secs_f64() * 1e3
    );
}
