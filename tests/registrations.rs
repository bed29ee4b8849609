//! `GET /api/v1/registrations` and `vgate registrations`: a GB/T 28181 device in domain A
//! registers through a SIP route with a platform in domain B (both played by this test on
//! loopback); once the platform answers 200 the device is listed with its ID, contact,
//! the address vgate reaches it at and the expiry. The route has `trace = true`: with the
//! trace target at debug (set at run time) both faces of the REGISTER are logged, the digest
//! response redacted.

mod common;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::udp::bound;
use common::vgate::Vgate;

const NET: u8 = 35;
const DEVICE: &str = "34020000001320000001";

fn config() -> String {
    common::vgate::loopback_config(NET, &[3], &[4])
        + &common::signaling_route(
            "gb",
            "sip",
            "udp",
            ("a", 5060),
            &format!("127.0.{NET}.4:5070"),
        )
        + "trace = true\n"
}

fn register(dev: &UdpSocket, expires: u32, cseq: u32) -> Vec<u8> {
    let port = dev.local_addr().unwrap().port();
    format!(
        "REGISTER sip:34020000002000000001@3402000000 SIP/2.0\r\n\
Via: SIP/2.0/UDP 127.0.{NET}.3:{port};rport;branch=z9hG4bKreg{cseq}\r\n\
From: <sip:{DEVICE}@3402000000>;tag=dev1\r\n\
To: <sip:{DEVICE}@3402000000>\r\n\
Call-ID: reg-{DEVICE}@127.0.{NET}.3\r\n\
CSeq: {cseq} REGISTER\r\n\
Contact: <sip:{DEVICE}@127.0.{NET}.3:{port}>\r\n\
Max-Forwards: 70\r\n\
Expires: {expires}\r\n\
Authorization: Digest username=\"{DEVICE}\", realm=\"3402000000\", nonce=\"n1\", uri=\"sip:34020000002000000001@3402000000\", response=\"9f8e7d6c5b4a39281706f5e4d3c2b1a0\", algorithm=MD5\r\n\
User-Agent: test-device\r\n\
Content-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// The platform: answers the REGISTER it receives with 200, echoing Via, From, To (with a
/// tag), Call-ID, CSeq, Contact and Expires.
fn answer_ok(platform: &UdpSocket) {
    let mut buf = [0u8; 4096];
    let (n, from) = platform.recv_from(&mut buf).expect("the REGISTER crosses");
    let req = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(req.starts_with("REGISTER "), "{req}");
    let mut resp = String::from("SIP/2.0 200 OK\r\n");
    for l in req.lines() {
        let name = l.split(':').next().unwrap_or("").to_ascii_lowercase();
        match name.as_str() {
            "via" | "from" | "call-id" | "cseq" | "contact" | "expires" => {
                resp.push_str(l);
                resp.push_str("\r\n");
            }
            "to" => {
                resp.push_str(l);
                resp.push_str(";tag=plat1\r\n");
            }
            _ => {}
        }
    }
    resp.push_str("Content-Length: 0\r\n\r\n");
    platform.send_to(resp.as_bytes(), from).unwrap();
}

fn listing() -> serde_json::Value {
    let mut r = ureq::get(&format!("http://127.0.{NET}.1:9941/api/v1/registrations"))
        .call()
        .unwrap();
    serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap()
}

fn wait_listing(pred: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = listing();
        if pred(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "registrations never became so: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn registered_devices_are_listed_with_id_binding_and_expiry() {
    let vg = Vgate::start(&config());
    let dev = bound(&format!("127.0.{NET}.3:0"), Duration::from_secs(5));
    let platform = bound(&format!("127.0.{NET}.4:5070"), Duration::from_secs(5));
    assert_eq!(listing()["registrations"].as_array().unwrap().len(), 0);
    let admin = format!("127.0.{NET}.1:9941");
    let out = std::process::Command::new(common::vgate_bin())
        .args(["log-level", "--admin", &admin, "info,vgate::trace=debug"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    dev.send_to(&register(&dev, 3600, 1), format!("127.0.{NET}.1:5060"))
        .unwrap();
    answer_ok(&platform);
    let mut buf = [0u8; 4096];
    let (n, _) = dev.recv_from(&mut buf).expect("the 200 comes back");
    assert!(buf[..n].starts_with(b"SIP/2.0 200"));

    // Traced: as it came in on the listen face and as it left on the upstream face.
    let inbound = vg.wait_for("dir=\"in\"", Duration::from_secs(10));
    assert!(inbound.contains("face=\"listen\""), "{inbound}");
    assert!(inbound.contains("REGISTER sip:"), "{inbound}");
    let outbound = vg.wait_for("dir=\"out\"", Duration::from_secs(10));
    assert!(outbound.contains("face=\"upstream\""), "{outbound}");
    assert!(
        outbound.contains(&format!("127.0.{NET}.4:5070")),
        "{outbound}"
    );
    for line in [&inbound, &outbound] {
        assert!(line.contains("response=\\\"<redacted>\\\""), "{line}");
        assert!(
            !line.contains("9f8e7d6c5b4a"),
            "the digest response leaked: {line}"
        );
    }

    let v = wait_listing(|v| !v["registrations"].as_array().unwrap().is_empty());
    let r = &v["registrations"][0];
    let port = dev.local_addr().unwrap().port();
    assert_eq!(r["route"], "gb", "{v}");
    assert_eq!(r["id"], DEVICE, "{v}");
    assert_eq!(r["domain"], "a", "{v}");
    assert_eq!(
        r["contact"],
        format!("sip:{DEVICE}@127.0.{NET}.3:{port}"),
        "{v}"
    );
    assert_eq!(r["peer"], format!("127.0.{NET}.3:{port}"), "{v}");
    assert!(!r["binding"].as_str().unwrap().is_empty(), "{v}");
    let expires = r["expires_in_seconds"].as_u64().unwrap();
    assert!((3500..=3700).contains(&expires), "{v}");

    // The CLI shows it as a table row.
    let out = std::process::Command::new(common::vgate_bin())
        .args(["registrations", "--admin", &admin])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("ROUTE"), "{table}");
    let row = table
        .lines()
        .find(|l| l.contains(DEVICE))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.starts_with("gb "), "{row}");
    drop(vg);
}
