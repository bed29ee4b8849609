//! Cascade: a lower platform in domain A answers a Catalog query with 1 000 channels in ONE
//! SIP MESSAGE over TCP (~336 KB, beyond sipp's 64 KiB, so a small peer of our own sends and
//! receives it, `common::sip_tcp`). Through a real `vgate run` on loopback the platform in B
//! gets it whole (1 000 items, the last one intact, GB 18030 names byte for byte, no domain-A
//! address), its `200 OK` comes back, and vgate's memory stays bounded. A message above the
//! TCP limit is answered `513`, counted (`too_large`), and its connection closed cleanly.

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::sip_tcp::{self, connect_from, read_message};
use common::vgate::Vgate;

const NET: u8 = 53;
/// 摄像机 ("camera") in GB 18030.
const GB_NAME: &[u8] = b"\xc9\xe3\xcf\xf1\xbb\xfa";

fn config(extra: &str) -> String {
    common::vgate::loopback_config(NET, &[3], &[4])
        + &common::signaling_route(
            "casc",
            "sip",
            "tcp",
            ("a", 5060),
            &format!("127.0.{NET}.4:5070"),
        )
        + extra
}

/// A Catalog response body with `n` realistic items (≈339 bytes each), addresses of the
/// lower platform at `127.0.NET.3`.
fn catalog(n: usize) -> Vec<u8> {
    let mut b = format!(
        "<?xml version=\"1.0\" encoding=\"GB2312\"?>\r\n<Response>\r\n<CmdType>Catalog</CmdType>\r\n<SN>17</SN>\r\n<DeviceID>34020000002000000001</DeviceID>\r\n<SumNum>{n}</SumNum>\r\n<DeviceList Num=\"{n}\">\r\n"
    )
    .into_bytes();
    for i in 0..n {
        b.extend_from_slice(
            format!("<Item><DeviceID>3402000000132{i:07}</DeviceID><Name>").as_bytes(),
        );
        b.extend_from_slice(GB_NAME);
        b.extend_from_slice(
            format!(
                "{i:04}</Name><Manufacturer>HIK</Manufacturer><Model>IPC</Model><CivilCode>340200</CivilCode><Address>127.0.{NET}.3</Address><Parental>0</Parental><ParentID>34020000002000000001</ParentID><Secrecy>0</Secrecy><IPAddress>127.0.{NET}.3</IPAddress><Port>5060</Port><Status>ON</Status></Item>\r\n"
            )
            .as_bytes(),
        );
    }
    b.extend_from_slice(b"</DeviceList>\r\n</Response>\r\n");
    b
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

fn event(route: &str, name: &str) -> u64 {
    let series = vgate::control::metrics::event_series(route, "sip", name);
    let text = common::admin::get(&format!("127.0.{NET}.1:9941"), "/metrics");
    common::admin::sample(&text, &series).unwrap_or_else(|| panic!("no {series}")) as u64
}

#[test]
fn a_1000_item_catalog_crosses_as_one_tcp_message() {
    let platform = TcpListener::bind(format!("127.0.{NET}.4:5070")).unwrap();
    let vgate = Vgate::start(&config(""));
    let (seen_tx, seen) = mpsc::channel();
    let plat =
        std::thread::spawn(move || sip_tcp::answer_all(platform, Duration::from_secs(20), seen_tx));

    let gw = format!("127.0.{NET}.1:5060");
    let mut dev = connect_from(&format!("127.0.{NET}.3"), &gw);
    dev.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let via = dev.local_addr().unwrap().to_string();
    let body = catalog(1000);
    assert!(
        (330_000..345_000).contains(&body.len()),
        "a realistic 1 000-item catalog is ~336 KB, this one {}",
        body.len()
    );
    let uri = format!("sip:34020000002000000002@127.0.{NET}.1:5060");
    let mut rbuf = Vec::new();
    let mut rss = Vec::new();
    // 1 + 10 catalogs on one connection: each arrives whole, each 200 comes back.
    for cseq in 1..=11u32 {
        let started = Instant::now();
        dev.write_all(&sip_tcp::request("MESSAGE", &uri, &via, "cat", cseq, &body))
            .unwrap();
        let got = seen
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| {
                panic!("catalog {cseq} did not reach the platform; {}", vgate.log())
            });
        assert!(
            got.first_line().starts_with("MESSAGE "),
            "{}",
            got.first_line()
        );
        let items = got.body.windows(6).filter(|w| w == b"<Item>").count();
        assert_eq!(items, 1000, "every item arrives");
        let text = String::from_utf8_lossy(&got.body);
        assert!(
            text.contains("<DeviceID>34020000001320000999</DeviceID>"),
            "the last item arrives"
        );
        assert!(
            got.body
                .windows(GB_NAME.len() + 4)
                .any(|w| w == [GB_NAME, b"0999"].concat()),
            "GB 18030 names kept byte for byte"
        );
        let a_addr = format!("127.0.{NET}.3");
        assert!(
            !text.contains(&a_addr)
                && !got.head.contains(&a_addr)
                && !got.head.contains(&format!("127.0.{NET}.1")),
            "no domain-A address reaches domain B"
        );
        assert_eq!(
            text.matches(&format!("<IPAddress>127.0.{NET}.2</IPAddress>"))
                .count(),
            1000,
            "every item's address is the gateway's in B"
        );
        let answer = read_message(&mut dev, &mut rbuf)
            .unwrap_or_else(|| panic!("no answer to catalog {cseq}; {}", vgate.log()));
        assert_eq!(answer.first_line(), "SIP/2.0 200 OK");
        assert_eq!(
            answer.header("CSeq"),
            Some(format!("{cseq} MESSAGE").as_str())
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "catalog {cseq} took {:?}",
            started.elapsed()
        );
        if cseq == 1 || cseq == 11 {
            eprintln!("catalog {cseq}: 200 back after {:?}", started.elapsed());
            rss.push(rss_kib(vgate.pid()));
        }
    }
    let grew = rss[1].saturating_sub(rss[0]);
    eprintln!(
        "vgate RSS after 1 catalog {} KiB, after 11 {} KiB",
        rss[0], rss[1]
    );
    assert!(grew < 2 * 1024, "RSS grew {grew} KiB over 10 catalogs");

    // Above the TCP limit (default 1 MiB): 513 with a Warning, counted, connection closed.
    let mut big = connect_from(&format!("127.0.{NET}.3"), &gw);
    big.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let via2 = big.local_addr().unwrap().to_string();
    let huge = catalog(3200);
    assert!(huge.len() > 1 << 20);
    let _ = big.write_all(&sip_tcp::request("MESSAGE", &uri, &via2, "huge", 1, &huge));
    let mut b2 = Vec::new();
    let refused = read_message(&mut big, &mut b2).expect("an answer to the oversized message");
    assert_eq!(refused.first_line(), "SIP/2.0 513 Message Too Large");
    assert!(
        refused
            .header("Warning")
            .is_some_and(|w| w.contains("1048576-byte limit")),
        "{}",
        refused.head
    );
    assert!(
        read_message(&mut big, &mut b2).is_none(),
        "then the connection is closed"
    );
    std::thread::sleep(Duration::from_millis(1300)); // counters reach the metrics each second
    assert_eq!(event("casc", "too_large"), 1);
    assert!(
        seen.try_recv().is_err(),
        "nothing of the oversized message crossed"
    );
    let after = rss_kib(vgate.pid());
    eprintln!("vgate RSS after the refusal {after} KiB");
    assert!(
        after.saturating_sub(rss[1]) < 2 * 1024,
        "RSS after the refusal: {after} KiB"
    );

    // The first connection still works after the refusal on another one.
    dev.write_all(&sip_tcp::request("MESSAGE", &uri, &via, "cat", 12, &body))
        .unwrap();
    assert!(seen.recv_timeout(Duration::from_secs(10)).is_ok());
    let answer = read_message(&mut dev, &mut rbuf).expect("answer after the refusal");
    assert_eq!(answer.first_line(), "SIP/2.0 200 OK");
    drop(dev);
    drop(big);
    vgate.stop();
    plat.join().unwrap();
}

/// An operator's tighter `max_tcp_message` holds: a message over it is refused `513`.
#[test]
fn max_tcp_message_limits_tcp_messages() {
    let platform = TcpListener::bind(format!("127.0.{NET}.4:5071")).unwrap();
    drop(platform);
    let cfg = config("max_tcp_message = 200000\n")
        .replace("9941", "9942")
        .replace(
            &format!("127.0.{NET}.4:5070"),
            &format!("127.0.{NET}.4:5071"),
        )
        .replace("listen_port = 5060", "listen_port = 5062");
    let vgate = Vgate::start(&cfg);
    let mut dev = connect_from(&format!("127.0.{NET}.3"), &format!("127.0.{NET}.1:5062"));
    dev.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let via = dev.local_addr().unwrap().to_string();
    let uri = format!("sip:34020000002000000002@127.0.{NET}.1:5062");
    let _ = dev.write_all(&sip_tcp::request(
        "MESSAGE",
        &uri,
        &via,
        "t",
        1,
        &catalog(1000),
    ));
    let mut b = Vec::new();
    let refused = read_message(&mut dev, &mut b).expect("an answer");
    assert_eq!(refused.first_line(), "SIP/2.0 513 Message Too Large");
    assert!(refused
        .header("Warning")
        .is_some_and(|w| w.contains("200000-byte limit")));
    vgate.stop();
}

/// `check-config` explains the new key to an operator whose TCP route sets only
/// `max_message` (it keeps capping TCP, as before); a default route gets no note.
#[test]
fn check_config_explains_max_tcp_message() {
    let old = config("max_message = 8192\n");
    let out = common::vgate::check_config(&old, &[]);
    common::vgate::assert_success(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("note: route casc: max_message = 8192 also caps SIP over TCP")
            && err.contains("set max_tcp_message (default 1048576)"),
        "{err}"
    );
    let out = common::vgate::check_config(&config(""), &[]);
    common::vgate::assert_success(&out);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("max_tcp_message"));
}
