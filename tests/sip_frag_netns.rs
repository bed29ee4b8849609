//! A SIP MESSAGE the network fragments, through the gateway in every capture mode (issue 25):
//! a GB/T 28181 Catalog of about 9.3 KB sent over UDP by a device in domain A (sipp), so
//! the sender's veth (MTU 1500 unless the bed says otherwise) cuts it into seven IPv4
//! fragments, reaches the platform in domain B (sipp) whole and is answered 200.
//!
//! Why it is a test of its own: in modes tnapi, zc and xdp an nftables rule keeps the kernel
//! from answering the captured media (`udp dport <media range> drop`, `engine::nft`). Nothing
//! reassembles fragments before that hook when conntrack is not loaded, so a rule that reads
//! `udp dport` in a non-first fragment reads the middle of the SIP text as a port. The
//! Catalog here is built so that every non-first fragment's bytes 2–3 read as a port of
//! domain A's media range (device names padded with `P`, 0x5050 = 20560): under the old rule
//! every one of them is dropped and the MESSAGE never arrives (checked first, on the bytes
//! sipp really sends, so the test cannot quietly stop testing that).
//!
//! - `fragmented_message_single_host_<mode>`: the three-namespace bed, modes stack, tnapi,
//!   zc, xdp;
//! - `fragmented_message_split_<mode>`: the split bed, device → half A → signaling link →
//!   half B → platform, modes stack, tnapi, zc (the fragments reach half A's domain side).
//!   A zc half holds its media ports with sockets and installs no nft table, so there the
//!   test checks delivery only; the tnapi half has the table and failed under the old rule.
//! - `media_drop_rules_spare_later_fragments_ipv4_and_ipv6`: the table itself on two
//!   namespaces, IPv4 and IPv6: a small datagram to a media port dropped and counted, a
//!   fragmented one to port 5060 whose later fragments read as media ports delivered.
//!
//! Measured against the old rule (`udp dport` without `ip frag-off & 0x1fff == 0`): single
//! host tnapi, zc and xdp and split tnapi got no 200; stack and split zc delivered.
//!
//! Needs root, iproute2, nftables and sipp (sip-tester); prints DID NOT RUN without them
//! (fails under CI=true).

mod common;

use std::net::UdpSocket;
use std::ops::RangeInclusive;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::sipp::{read_logs, Sipp};
use common::split::{start_halves, SplitBed, FACE_B};
use common::vgate::Vgate;
use common::{in_netns, Bed, BedConfig};

fn ready(test: &str) -> bool {
    common::prerequisites(test, true, common::sipp::NEEDS)
}

/// Domain A's media ports on both beds (`BedConfig { ports: 10000 }`, the split halves').
const A_MEDIA: RangeInclusive<u16> = 20000..=29999;
/// The device's SIP port in domain A.
const DEVICE_PORT: u16 = 5062;
/// The Call-ID (`-cid_str`, no pid in it: the message's length must not vary).
const CALL_ID: &str = "fragcatalog@3402000000";
/// About how long the SIP message is.
const TARGET_LEN: usize = 9300;

/// The MTU of the interface of namespace `ns` that is not loopback (the beds give each
/// domain namespace one veth).
fn mtu_in(ns: &str) -> usize {
    let out = Command::new("ip")
        .args(["-n", ns, "-o", "link", "show"])
        .output()
        .expect("ip link show");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| !l.contains(" lo: "))
        .find_map(|l| {
            let mut w = l.split_whitespace();
            w.find(|t| *t == "mtu")?;
            w.next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no veth MTU in {ns}: {text}"))
}

/// The SIP offsets of the two bytes a rule reading `udp dport` takes from each non-first
/// IPv4 fragment of a UDP datagram of `sip_len` payload bytes on a link of `mtu` (20-byte IP
/// header): fragment k starts at IP payload offset k × f (f the largest multiple of 8 that
/// fits), where the UDP header (8 bytes) would be; its "port" is 2 bytes further. Only
/// fragments with at least 4 bytes are listed.
fn fake_port_offsets(sip_len: usize, mtu: usize) -> Vec<usize> {
    let f = (mtu - 20) / 8 * 8;
    (1..)
        .map(|k| k * f)
        .take_while(|&o| o + 4 <= 8 + sip_len)
        .map(|o| o + 2 - 8)
        .collect()
}

/// The Catalog MESSAGE from the device at `local` (exactly the bytes sipp sends: every line
/// ends in CRLF, the body's last one too), and its body. Each device's name is `Camera N `
/// and a run of `P`; a run is lengthened where the next fixed text would hold a fragment's
/// fake port, so that every such pair of bytes is `PP`.
fn catalog(local: &str, mtu: usize) -> (String, String) {
    const LEN_DIGITS: usize = 4;
    let head = |len: usize| {
        format!(
            "MESSAGE sip:34020000002000000001@3402000000 SIP/2.0\r\n\
Via: SIP/2.0/UDP {local};rport;branch=z9hG4bKfrag1\r\n\
From: <sip:34020000001320000001@3402000000>;tag=frag1\r\n\
To: <sip:34020000002000000001@3402000000>\r\n\
Call-ID: {CALL_ID}\r\n\
CSeq: 1 MESSAGE\r\n\
Max-Forwards: 70\r\n\
User-Agent: vgate-test-device\r\n\
Content-Type: Application/MANSCDP+xml\r\n\
Content-Length: {len}\r\n\r\n"
        )
    };
    let h = head(10usize.pow(LEN_DIGITS as u32 - 1)).len();
    let offsets = fake_port_offsets(TARGET_LEN + 400, mtu);
    let mut body = String::new();
    // Appends the fixed text `s` after a P run, first lengthening the run so that no fake
    // port falls on `s` or across its start.
    let put = |body: &mut String, s: &str| {
        let start = h + body.len();
        if let Some(&p) = offsets
            .iter()
            .find(|&&p| p + 1 >= start && p < start + s.len())
        {
            body.push_str(&"P".repeat(p + 2 - start));
        }
        body.push_str(s);
    };
    // The device count is written as `@@` and filled in at the end (two digits either way).
    body.push_str("<?xml version=\"1.0\" encoding=\"GB2312\"?>\r\n<Response>\r\n<CmdType>Catalog</CmdType>\r\n<SN>17</SN>\r\n<DeviceID>34020000001320000001</DeviceID>\r\n<SumNum>@@</SumNum>\r\n<DeviceList Num=\"@@\">\r\n");
    let prefix = |i: usize| {
        format!("<Item>\r\n<DeviceID>340200000013200{i:05}</DeviceID>\r\n<Name>Camera {i} ")
    };
    let suffix = |i: usize| {
        format!("</Name>\r\n<Manufacturer>Vendor</Manufacturer>\r\n<Model>IPC</Model>\r\n<Owner>Owner</Owner>\r\n<CivilCode>3402000000</CivilCode>\r\n<Address>Gate {i}</Address>\r\n<Parental>0</Parental>\r\n<SafetyWay>0</SafetyWay>\r\n<RegisterWay>1</RegisterWay>\r\n<Secrecy>0</Secrecy>\r\n<Status>ON</Status>\r\n</Item>\r\n")
    };
    let run = "P".repeat(16);
    body.push_str(&prefix(0));
    let mut n = 0;
    loop {
        body.push_str(&run);
        n += 1;
        if h + body.len() >= TARGET_LEN - 500 {
            put(
                &mut body,
                &(suffix(n - 1) + "</DeviceList>\r\n</Response>\r\n"),
            );
            break;
        }
        put(&mut body, &(suffix(n - 1) + &prefix(n)));
    }
    assert!((10..100).contains(&n), "{n} devices");
    let body = body.replace("@@", &n.to_string());
    assert_eq!(
        body.len().to_string().len(),
        LEN_DIGITS,
        "body length digits"
    );
    (head(body.len()) + &body, body)
}

/// The device's scenario: the MESSAGE (addresses and Content-Length written out, so sipp
/// sends exactly `message`), then a 200.
fn device_xml(message: &str) -> String {
    let lines: String = message.split("\r\n").map(|l| format!("{l}\n")).collect();
    let lines = lines.trim_end_matches('\n');
    format!(
        "<?xml version=\"1.0\" encoding=\"ISO-8859-1\" ?>\n<scenario name=\"vgate GB device: fragmented Catalog\">\n  <send retrans=\"500\">\n    <![CDATA[\n{lines}\n    ]]>\n  </send>\n  <recv response=\"200\"/>\n</scenario>\n"
    )
}

/// The platform's scenario: one MESSAGE whose Catalog holds all `n` devices and its end tag,
/// in which no address of domain A (`leak`, a regexp) appears; answered 200.
fn platform_xml(items: usize, leak: &str) -> String {
    let last = format!("340200000013200{:05}", items - 1);
    format!(
        r#"<?xml version="1.0" encoding="ISO-8859-1" ?>
<scenario name="vgate GB platform: fragmented Catalog">
  <recv request="MESSAGE">
    <action>
      <ereg regexp="SumNum>{items}&lt;" search_in="body" check_it="true" assign_to="sum"/>
      <ereg regexp="{last}&lt;/DeviceID&gt;" search_in="body" check_it="true" assign_to="last"/>
      <ereg regexp="&lt;/DeviceList&gt;\s*&lt;/Response&gt;" search_in="body" check_it="true" assign_to="end"/>
      <ereg regexp="{leak}" search_in="msg" check_it_inverse="true" assign_to="leak"/>
    </action>
  </recv>
{ok}
  <Reference variables="sum,last,end,leak"/>
</scenario>
"#,
        ok = common::gb_sipp::ok_reply(";tag=[pid]S[call_number]"),
    )
}

/// What sipp in namespace `ns` sends from `ip` with `scenario`, caught by a socket of the
/// same namespace (over loopback: one unfragmented datagram).
fn what_sipp_sends(ns: &str, ip: &str, dir: &Path, scenario: &Path) -> Vec<u8> {
    let (ns2, ip2) = (ns.to_owned(), ip.to_owned());
    let catcher = std::thread::spawn(move || {
        in_netns(&ns2, move || {
            let s = UdpSocket::bind((ip2.as_str(), 5999)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut buf = vec![0u8; 65536];
            let n = s.recv(&mut buf).unwrap_or(0);
            buf.truncate(n);
            buf
        })
    });
    std::thread::sleep(Duration::from_millis(300));
    let target = format!("{ip}:5999");
    let mut probe = Sipp::new(ns, dir, scenario.to_str().unwrap(), ip, DEVICE_PORT)
        .args(&["-cid_str", CALL_ID, &target, "-m", "1"])
        .timeout(3)
        .spawn();
    let sent = catcher.join().unwrap();
    let _ = probe.stop();
    sent
}

/// Writes both scenarios into `dir`, checks that sipp sends the message as built and that
/// every non-first fragment's fake port is in domain A's media range; returns the paths of
/// the device's and the platform's scenario and the body.
fn prepare(ns: &str, ip: &str, dir: &Path, leak: &str) -> (String, String, String) {
    let mtu = mtu_in(ns);
    let local = format!("{ip}:{DEVICE_PORT}");
    let (message, body) = catalog(&local, mtu);
    let items = body.matches("<Item>").count();
    let dev = dir.join("frag_device.xml");
    let plat = dir.join("frag_platform.xml");
    std::fs::write(&dev, device_xml(&message)).unwrap();
    std::fs::write(&plat, platform_xml(items, leak)).unwrap();
    let sent = what_sipp_sends(ns, ip, dir, &dev);
    assert_eq!(
        String::from_utf8_lossy(&sent),
        message,
        "sipp does not send the message as built"
    );
    let offsets = fake_port_offsets(sent.len(), mtu);
    assert!(
        offsets.len() >= 5,
        "a {}-byte message at MTU {mtu} makes {} non-first fragments",
        sent.len(),
        offsets.len()
    );
    for p in &offsets {
        let port = u16::from_be_bytes([sent[*p], sent[*p + 1]]);
        assert!(
            A_MEDIA.contains(&port),
            "the fragment whose fake port is at {p} reads {port}, not a media port: the test would not catch the old rule"
        );
    }
    eprintln!(
        "Catalog: {} bytes ({items} devices), MTU {mtu}: {} fragments, each later one's bytes 2-3 read as port {}",
        sent.len(),
        offsets.len() + 1,
        u16::from_be_bytes([sent[offsets[0]], sent[offsets[0] + 1]])
    );
    (
        dev.to_str().unwrap().to_owned(),
        plat.to_str().unwrap().to_owned(),
        body,
    )
}

/// The platform in `b_ns` at `b_ip:5070` takes one MESSAGE; the device in `a_ns` sends it to
/// `target` and must get the 200; the platform must have received the body whole.
#[allow(clippy::too_many_arguments)]
fn exchange(
    what: &str,
    (a_ns, a_ip): (&str, &str),
    (b_ns, b_ip): (&str, &str),
    target: &str,
    dir: &Path,
    dev: &str,
    plat: &str,
    body: &str,
) {
    let (a_dir, b_dir) = (dir.join("a"), dir.join("b"));
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(&b_dir).unwrap();
    let mut platform = Sipp::new(b_ns, &b_dir, plat, b_ip, 5070)
        .args(&["-m", "1", "-trace_msg", "-trace_err"])
        .timeout(30)
        .spawn();
    std::thread::sleep(Duration::from_millis(400));
    let device = Sipp::new(a_ns, &a_dir, dev, a_ip, DEVICE_PORT)
        .args(&["-cid_str", CALL_ID, target, "-m", "1", "-trace_msg"])
        .timeout(15)
        .run();
    let platform_ok = platform.wait_exit(Duration::from_secs(20));
    let b_log = read_logs(&b_dir, "_messages.log");
    if let Err(e) = device {
        panic!(
            "{what}: the device got no 200 for its fragmented Catalog ({e}); platform saw:\n{}",
            &b_log[..b_log.len().min(2000)]
        );
    }
    assert_eq!(
        platform_ok,
        Some(true),
        "{what}: the platform's checks failed; logs in {}",
        b_dir.display()
    );
    assert!(
        b_log.contains(body),
        "{what}: the Catalog body did not reach the platform byte for byte"
    );
}

fn single_host(mode: &str) {
    if !ready(&format!("sip_frag_netns single host {mode}")) {
        return;
    }
    let bed = Bed::up(1);
    let dir = tempfile::tempdir().unwrap();
    let (a_ns, g_ns, b_ns) = (bed.get("A_NS"), bed.get("G_NS"), bed.get("B_NS"));
    let (a_ip, b_ip, ga_ip) = (bed.get("A_IP"), bed.get("B_IP"), bed.get("GA_IP"));
    let (dev, plat, body) = prepare(a_ns, a_ip, dir.path(), r"10\.201\.1\.");
    let config = bed.config(BedConfig {
        mode,
        ports: 10000,
        ..Default::default()
    }) + &format!(
        r#"
[[signaling_route]]
name = "a2b"
type = "sip"
transport = "udp"
listen_domain = "a"
listen_port = 5060
upstream = "{b_ip}:5070"
upstream_port = 5061
allow_ids = ["3402000000"]
"#
    );
    let vgate = Vgate::start_in(g_ns, &config, &[]);
    exchange(
        &format!("single host, mode {mode}"),
        (a_ns, a_ip),
        (b_ns, b_ip),
        &format!("{ga_ip}:5060"),
        dir.path(),
        &dev,
        &plat,
        &body,
    );
    vgate.stop().assert_nothing_left("vgate");
}

#[test]
fn fragmented_message_single_host_stack() {
    single_host("stack");
}

#[test]
fn fragmented_message_single_host_tnapi() {
    single_host("tnapi");
}

#[test]
fn fragmented_message_single_host_zc() {
    single_host("zc");
}

#[test]
fn fragmented_message_single_host_xdp() {
    single_host("xdp");
}

/// Half A takes the device's MESSAGE on its domain side (the fragments arrive there) and
/// carries it over the signaling link to half B, which sends it to the platform.
fn split(mode: &str) {
    if !ready(&format!("sip_frag_netns split {mode}")) {
        return;
    }
    let bed = SplitBed::up();
    let dir = tempfile::tempdir().unwrap();
    let (da_ns, db_ns) = (bed.get("DA_NS"), bed.get("DB_NS"));
    let (da_ip, db_ip) = (bed.get("DA_IP"), bed.get("DB_IP"));
    let (dev, plat, body) = prepare(da_ns, da_ip, dir.path(), r"10\.211\.1\.");
    let route = |name: &str, upstream: String| {
        format!(
            "[[signaling_route]]\nname = \"{name}\"\ntype = \"sip\"\ntransport = \"udp\"\nlisten_domain = \"a\"\nlisten_port = 5060\nupstream_port = 5061\nupstream = \"{upstream}\"\nallow_ids = [\"3402000000\"]\n"
        )
    };
    let a_routes = route("a2link", format!("{FACE_B}:5060"));
    let b_routes = route("link2b", format!("{db_ip}:5070"));
    let (a, b) = start_halves(&bed, mode, ("off", "off"), (&a_routes, &b_routes));
    a.wait_for("peer authenticated, up", Duration::from_secs(30));
    b.wait_for("peer authenticated, up", Duration::from_secs(30));
    exchange(
        &format!("split, mode {mode}"),
        (da_ns, da_ip),
        (db_ns, db_ip),
        &format!("{}:5060", bed.get("GA_IP")),
        dir.path(),
        &dev,
        &plat,
        &body,
    );
    a.stop().assert_nothing_left("half a");
    b.stop().assert_nothing_left("half b");
}

#[test]
fn fragmented_message_split_stack() {
    split("stack");
}

#[test]
fn fragmented_message_split_tnapi() {
    split("tnapi");
}

#[test]
fn fragmented_message_split_zc() {
    split("zc");
}

#[cfg(test)]
mod offsets {
    use super::*;

    #[test]
    fn fake_ports_of_a_9k_datagram_at_mtu_1500() {
        // 9300 + 8 bytes: fragments at 1480, 2960, ... 8880; the "port" 2 bytes into each.
        assert_eq!(
            fake_port_offsets(9300, 1500),
            vec![1474, 2954, 4434, 5914, 7394, 8874]
        );
        let (m, body) = catalog("10.201.1.2:5062", 1500);
        assert!(m.ends_with(&body) && body.ends_with("</Response>\r\n"));
        for p in fake_port_offsets(m.len(), 1500) {
            assert_eq!(&m.as_bytes()[p..p + 2], b"PP", "at {p}");
        }
    }
}

/// Two namespaces joined by a veth (`s` sends, `g` holds the rules), both IPv4 and IPv6;
/// deleted on drop.
struct Pair(String);

impl Pair {
    fn up() -> Pair {
        let p = Pair(format!("vgf{}", std::process::id() % 100_000));
        let (s, g) = (p.ns("s"), p.ns("g"));
        let run = |args: &[&str]| {
            let st = Command::new("ip").args(args).status().expect("ip");
            assert!(st.success(), "ip {args:?}");
        };
        run(&["netns", "add", &s]);
        run(&["netns", "add", &g]);
        run(&[
            "link", "add", "fs", "netns", &s, "type", "veth", "peer", "name", "fg", "netns", &g,
        ]);
        for (ns, dev, v4, v6) in [
            (&s, "fs", "10.203.1.2/24", "fd00:203::2/64"),
            (&g, "fg", "10.203.1.1/24", "fd00:203::1/64"),
        ] {
            run(&["-n", ns, "addr", "add", v4, "dev", dev]);
            run(&["-n", ns, "addr", "add", v6, "dev", dev, "nodad"]);
            run(&["-n", ns, "link", "set", dev, "up"]);
            run(&["-n", ns, "link", "set", "lo", "up"]);
        }
        p
    }

    fn ns(&self, side: &str) -> String {
        format!("{}{side}", self.0)
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for side in ["s", "g"] {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(side)])
                .status();
        }
    }
}

/// The media drop table on a real kernel, IPv4 and IPv6 (a rule without an address covers
/// both): a small datagram to a media port is dropped and counted; a 9000-byte datagram to
/// port 5060, all `P` so every later fragment's bytes 2–3 read 20560 (a media port), arrives
/// whole. Measured: without the IPv6 rules the small IPv6 datagram arrived; with a plain
/// `udp dport` rule the IPv4 one of 9000 bytes was lost (on kernel 6.18 the IPv6 one was
/// not: nft reads no port in a non-first IPv6 fragment there, the explicit rules do not
/// depend on it).
#[test]
fn media_drop_rules_spare_later_fragments_ipv4_and_ipv6() {
    use std::net::SocketAddr;
    use vgate::engine::nft::{DropRule, MediaDropTable};
    if !ready("sip_frag_netns nft ipv4/ipv6") {
        return;
    }
    let pair = Pair::up();
    let (s_ns, g_ns) = (pair.ns("s"), pair.ns("g"));
    let (v4, v6) = ("10.203.1.1", "fd00:203::1");
    let received = in_netns(&g_ns, move || {
        let table = MediaDropTable::install(
            "fragchk",
            &[DropRule {
                iface: "fg".into(),
                addr: None,
                ports: A_MEDIA,
            }],
        )
        .expect("install the table");
        let bind = |ip: &str, port: u16| {
            let a: SocketAddr = match ip.contains(':') {
                true => format!("[{ip}]:{port}"),
                false => format!("{ip}:{port}"),
            }
            .parse()
            .unwrap();
            let s = UdpSocket::bind(a).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            s
        };
        let sockets = [
            ("IPv4 media", bind(v4, 20005)),
            ("IPv6 media", bind(v6, 20005)),
            ("IPv4 SIP", bind(v4, 5060)),
            ("IPv6 SIP", bind(v6, 5060)),
        ];
        in_netns(&s_ns, move || {
            let s4 = UdpSocket::bind("10.203.1.2:0").unwrap();
            let s6 = UdpSocket::bind("[fd00:203::2]:0").unwrap();
            s4.send_to(&[0x80; 100], (v4, 20005)).unwrap();
            s6.send_to(&[0x80; 100], (v6, 20005)).unwrap();
            s4.send_to(&[b'P'; 9000], (v4, 5060)).unwrap();
            s6.send_to(&[b'P'; 9000], (v6, 5060)).unwrap();
        });
        let mut buf = vec![0u8; 65536];
        let got: Vec<(&str, usize)> = sockets
            .iter()
            .map(|(what, s)| (*what, s.recv(&mut buf).unwrap_or(0)))
            .collect();
        let dropped = table.dropped().expect("read the counters");
        table.remove().expect("remove the table");
        (got, dropped)
    });
    let (got, (packets, _)) = received;
    assert_eq!(
        got,
        vec![
            ("IPv4 media", 0),
            ("IPv6 media", 0),
            ("IPv4 SIP", 9000),
            ("IPv6 SIP", 9000)
        ],
        "what arrived (bytes)"
    );
    assert_eq!(packets, 2, "the two small datagrams counted, no fragment");
}
