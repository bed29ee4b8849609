//! SIP over kept-open TCP connections, mirrored across the gateway: a GB/T 28181 platform
//! takes a device as offline when the device's TCP connection drops, but through vgate the
//! platform holds its own connection (to the gateway). So each device connection vgate
//! accepts gets a connection of its own toward the platform, and when either ends vgate
//! closes the other: the platform sees the device's drop, the device sees the platform's.
//!
//! Real `vgate run` on loopback, two devices (`127.0.57.3`, `.5`) in A connecting to the
//! gateway, a platform in B (`.4:5070`), all small blocking TCP SIP peers
//! (`common::sip_tcp`): each device's MESSAGE arrives on a platform connection of its own;
//! device 1 closes → its platform connection ends (device 2's does not); the platform closes
//! device 2's connection → device 2's connection to the gateway ends. Both counted
//! (`tcp_closes_mirrored`).

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::sip_tcp::{self, connect_from, read_message};
use common::vgate::Vgate;

const NET: u8 = 57;

fn config() -> String {
    common::vgate::loopback_config(NET, &[3, 5], &[4])
        + &common::signaling_route(
            "mirror",
            "sip",
            "tcp",
            ("a", 5060),
            &format!("127.0.{NET}.4:5070"),
        )
}

fn event(route: &str, name: &str) -> u64 {
    let series = vgate::control::metrics::event_series(route, "sip", name);
    let text = common::admin::get(&format!("127.0.{NET}.1:9941"), "/metrics");
    common::admin::sample(&text, &series).unwrap_or_else(|| panic!("no {series}")) as u64
}

/// The platform's next connection from the gateway, within 5 s.
fn accept(l: &TcpListener) -> Option<TcpStream> {
    l.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok((s, _)) = l.accept() {
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Whether the peer closes `s` within 5 s (what it still sends is read and dropped).
fn closed_by_peer(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// A device at `127.0.NET.<host>` connected to the gateway, and its MESSAGE (keepalive)
/// sender: sends one with `cseq` and reads vgate's forward of it on `plat`, answers it
/// there and reads the answer back.
struct Device {
    s: TcpStream,
    buf: Vec<u8>,
    via: String,
    call: String,
}

impl Device {
    fn connect(host: u8) -> Device {
        let s = connect_from(
            &format!("127.0.{NET}.{host}"),
            &format!("127.0.{NET}.1:5060"),
        );
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let via = s.local_addr().unwrap().to_string();
        Device {
            s,
            buf: Vec::new(),
            via,
            call: format!("ka{host}"),
        }
    }

    fn keepalive(&mut self, cseq: u32, plat: &mut TcpStream, pbuf: &mut Vec<u8>) {
        let body = format!("<?xml version=\"1.0\"?>\r\n<Notify>\r\n<CmdType>Keepalive</CmdType>\r\n<SN>{cseq}</SN>\r\n<DeviceID>34020000002000000001</DeviceID>\r\n<Status>OK</Status>\r\n</Notify>\r\n");
        let uri = format!("sip:34020000002000000002@127.0.{NET}.1:5060");
        self.s
            .write_all(&sip_tcp::request(
                "MESSAGE",
                &uri,
                &self.via,
                &self.call,
                cseq,
                body.as_bytes(),
            ))
            .unwrap();
        let got = read_message(plat, pbuf).expect("the MESSAGE on the platform's connection");
        assert!(got.first_line().starts_with("MESSAGE "), "{}", got.head);
        assert!(got.head.contains(&self.call), "{}", got.head);
        plat.write_all(&sip_tcp::ok_for(&got)).unwrap();
        let answer = read_message(&mut self.s, &mut self.buf).expect("the 200 back");
        assert_eq!(answer.first_line(), "SIP/2.0 200 OK");
    }
}

#[test]
fn a_dropped_tcp_connection_is_mirrored_on_the_other_side() {
    let platform = TcpListener::bind(format!("127.0.{NET}.4:5070")).unwrap();
    let vgate = Vgate::start(&config());
    let (mut b1, mut b2) = (Vec::new(), Vec::new());

    let mut dev1 = Device::connect(3);
    let mut dev2 = Device::connect(5);
    // Device 1's message opens the platform's first connection, device 2's its second:
    // one platform connection per device connection.
    let uri = format!("sip:34020000002000000002@127.0.{NET}.1:5060");
    let first = |d: &mut Device, b: &mut Vec<u8>, what: &str| {
        d.s.write_all(&sip_tcp::request(
            "MESSAGE",
            &uri,
            &d.via,
            &d.call,
            1,
            b"<Notify/>",
        ))
        .unwrap();
        let mut p = accept(&platform).unwrap_or_else(|| {
            panic!(
                "{what}'s message must come on a platform connection of its own; {}",
                vgate.log()
            )
        });
        let got = read_message(&mut p, b).unwrap();
        assert!(got.head.contains(&d.call), "{}", got.head);
        p.write_all(&sip_tcp::ok_for(&got)).unwrap();
        assert!(read_message(&mut d.s, &mut d.buf).is_some());
        p
    };
    let plat1 = first(&mut dev1, &mut b1, "device 1");
    let plat2 = first(&mut dev2, &mut b2, "device 2");
    let (mut plat1, mut plat2) = (plat1, plat2);
    // Each goes on using its own.
    dev1.keepalive(2, &mut plat1, &mut b1);
    dev2.keepalive(2, &mut plat2, &mut b2);

    // Device 1 drops its connection: the platform's connection for it ends; device 2's
    // stays and carries on.
    drop(dev1);
    assert!(
        closed_by_peer(&mut plat1),
        "the platform's connection for device 1 must end with device 1's; {}",
        vgate.log()
    );
    dev2.keepalive(3, &mut plat2, &mut b2);

    // The platform drops device 2's connection: the device's connection to the gateway
    // ends.
    drop(plat2);
    assert!(
        closed_by_peer(&mut dev2.s),
        "device 2's connection must end with the platform's; {}",
        vgate.log()
    );
    // Device 2 comes back: a new platform connection for the new device connection.
    let mut dev2 = Device::connect(5);
    dev2.call = "ka5b".into();
    let mut b3 = Vec::new();
    let mut plat3 = first(&mut dev2, &mut b3, "device 2 back");
    std::thread::sleep(Duration::from_millis(1300)); // counters reach the metrics each second
    assert_eq!(event("mirror", "tcp_closes_mirrored"), 2);
    drop(dev2);
    assert!(closed_by_peer(&mut plat3));
    vgate.stop();
}
