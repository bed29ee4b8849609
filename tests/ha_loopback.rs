//! Hot standby on loopback, no root and no keepalived: the real `vgate run` with `[ha]`
//! starts as the standby and drops what reaches it with `standby`; `vgate ha-notify`
//! (keepalived's words, as its notify hook passes them) makes it forward and stop again;
//! `vgate health` answers with its exit code. A gateway without `[ha]` is always active and
//! says so. (tests/ha_netns.rs has the pair with keepalived and Redis.)

mod common;

use common::{run_vgate as vgate, wait_until};

use std::net::UdpSocket;
use std::process::Output;
use std::time::Duration;

use common::vgate::Vgate;

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Sends `n` RTP packets to the route's gateway port and counts what reaches its receiver.
fn send_and_count(tx: &UdpSocket, to: &str, rx: &UdpSocket, n: u16, seq0: u16) -> usize {
    for i in 0..n {
        let mut p = [0u8; 172];
        p[0] = 0x80;
        p[1] = 96;
        p[2..4].copy_from_slice(&(seq0 + i).to_be_bytes());
        tx.send_to(&p, to).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut got = 0;
    let mut buf = [0u8; 2048];
    while rx.recv(&mut buf).is_ok() {
        got += 1;
    }
    got
}

fn standby_drops(admin: &str) -> u64 {
    let text = common::admin::get(admin, "/metrics");
    common::admin::metric(
        &text,
        "vgate_channel_drops_total",
        &["channel=\"forward\"", "reason=\"standby\""],
    )
}

#[test]
fn a_standby_drops_until_ha_notify_master_and_health_answers_by_exit_code() {
    let net = 63;
    let admin = format!("127.0.{net}.1:9963");
    let cfg = common::vgate::loopback_with(net, 9963, 100, &[], &[])
        + "[ha]\nnode = \"lo-1\"\n"
        + &format!(
            "[[stream_route]]\nname = \"cam\"\ndomain = \"a\"\nport = 20000\ndestination = \"127.0.{net}.2:40000\"\negress_port = 30000\nsource_validation = \"latch\"\n"
        );
    let vg = Vgate::start(&cfg);
    let health = vgate(&["health", "--admin", &admin]);
    assert!(health.status.success(), "{}", text(&health));
    assert!(text(&health).contains("role standby"), "{}", text(&health));

    let rx = UdpSocket::bind(format!("127.0.{net}.2:40000")).unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let tx = UdpSocket::bind(format!("127.0.{net}.1:0")).unwrap();
    let to = format!("127.0.{net}.1:20000");
    assert_eq!(
        send_and_count(&tx, &to, &rx, 20, 0),
        0,
        "a standby forwards nothing"
    );
    wait_until(
        "20 drops counted as standby",
        Duration::from_secs(5),
        || standby_drops(&admin) == 20,
    );

    // keepalived's generic notify passes TYPE NAME STATE PRIORITY.
    let out = vgate(&[
        "ha-notify",
        "--admin",
        &admin,
        "INSTANCE",
        "gw",
        "MASTER",
        "150",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    wait_until("the active role", Duration::from_secs(5), || {
        common::admin::get_json(&admin, "/api/v1/ha")["role"] == "active"
    });
    let got = send_and_count(&tx, &to, &rx, 20, 20);
    assert!(got >= 19, "the active forwards: {got} of 20");

    // BACKUP closes the gate within the call.
    let out = vgate(&["ha-notify", "--admin", &admin, "BACKUP"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(send_and_count(&tx, &to, &rx, 5, 40), 0);
    wait_until("5 more standby drops", Duration::from_secs(5), || {
        standby_drops(&admin) == 25
    });
    let ha = common::admin::get_json(&admin, "/api/v1/ha");
    assert_eq!(ha["node"], "lo-1", "{ha}");
    assert_eq!(ha["takeovers"], 1, "{ha}");

    let out = vgate(&["ha-notify", "--admin", &admin, "INSTANCE", "gw"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no role"), "{}", text(&out));
    drop(vg);

    let out = vgate(&["health", "--admin", &admin]);
    assert!(!out.status.success(), "nobody answers: unhealthy");
    assert!(text(&out).contains("no vgate is running"), "{}", text(&out));
}

#[test]
fn without_ha_a_gateway_is_active_and_refuses_a_role() {
    let net = 64;
    let admin = format!("127.0.{net}.1:9964");
    let vg = Vgate::start(&common::vgate::loopback_with(net, 9964, 10, &[], &[]));
    let health = vgate(&["health", "--admin", &admin]);
    assert!(health.status.success(), "{}", text(&health));
    assert!(text(&health).contains("role active"), "{}", text(&health));
    let out = vgate(&["ha-notify", "--admin", &admin, "BACKUP"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("no [ha] section"), "{}", text(&out));
    assert_eq!(
        common::admin::get_json(&admin, "/api/v1/ha")["enabled"],
        false
    );
    drop(vg);
}
