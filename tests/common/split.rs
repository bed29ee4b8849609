//! The split appliance's namespace bed (`scripts/split-bed.sh`) for tests and benches:
//! four namespaces (domain A, half A, half B, domain B), a signaling veth, two one-way link
//! veths whose wrong direction nftables drops and counts, and loss injection.
//!
//! - [`SplitBed::up`] makes a bed with a unique name (removed on drop, also on a panic);
//!   [`SplitBed::get`] reads its addresses (`DA_IP`, `GA_IP`, `FB_IP`, `HA_NS`, ... as printed
//!   by the script); [`SplitBed::counters`] the wrong-direction and loss counters;
//!   [`SplitBed::loss`] sets loss on a link.
//! - [`half_config`] writes a half's config for the bed (links, faces, signaling link) with
//!   the caller's extra sections (stream or signaling routes) appended; [`start_half`] runs
//!   `vgate run` inside the half's namespace.
//! - [`send_numbered`] / [`receive_numbered`] move numbered datagrams between namespaces
//!   and report what arrived, from where, how often.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::enter_netns;
use super::vgate::Vgate;

/// Face addresses of the halves (loopback, inside each half's namespace).
pub const FACE_A: &str = "127.77.0.1";
pub const FACE_B: &str = "127.77.0.2";
pub const FWD_PORT: u16 = 7001;
pub const REV_PORT: u16 = 7002;
/// The signaling key both halves' configs carry.
pub const KEY: &str = "5ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2";

static SEQ: AtomicU32 = AtomicU32::new(0);

pub fn script() -> String {
    format!("{}/scripts/split-bed.sh", env!("CARGO_MANIFEST_DIR"))
}

/// A bed from `scripts/split-bed.sh`; `down` on drop.
pub struct SplitBed {
    pub name: String,
    pub env: HashMap<String, String>,
}

use super::key_values as kv;

impl SplitBed {
    pub fn up() -> SplitBed {
        SplitBed::up_with_queues(1)
    }

    /// [`SplitBed::up`] with `queues` RX/TX queues on the domain and link veths (for halves
    /// with `engine.queues = queues`).
    pub fn up_with_queues(queues: usize) -> SplitBed {
        let name = format!(
            "vs{}x{}",
            std::process::id() % 100_000,
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        // The guard exists before the script runs, so a half-made bed is removed too.
        let mut bed = SplitBed {
            name,
            env: HashMap::new(),
        };
        bed.env = super::bed_script_up(&script(), &bed.name, queues);
        bed
    }

    pub fn get(&self, key: &str) -> &str {
        self.env
            .get(key)
            .unwrap_or_else(|| panic!("split-bed.sh printed no {key}"))
    }

    pub fn ip(&self, key: &str) -> Ipv4Addr {
        self.get(key).parse().expect("an IPv4 address")
    }

    fn run(&self, args: &[&str]) -> String {
        super::proc::run_ok(
            Command::new("bash")
                .arg(script())
                .args(["--name", &self.name])
                .args(args),
            &format!("split-bed.sh {args:?}"),
        )
    }

    /// `FWD_WRONG`, `REV_WRONG` (packets that travelled a one-way link the wrong way),
    /// `A_LEAK`, `B_LEAK` (what a half's host tried to send on its receive-only interface,
    /// dropped by the bed's hardening) and `FWD_LOSS`, `REV_LOSS` (injected drops).
    pub fn counters(&self) -> HashMap<String, u64> {
        kv(&self.run(&["counters"]))
            .into_iter()
            .map(|(k, v)| (k, v.trim().parse().unwrap_or(u64::MAX)))
            .collect()
    }

    /// The receive-only interfaces' egress drop (on after `up`); off only to prove the
    /// wrong-direction counters count.
    pub fn guard(&self, on: bool) {
        self.run(&["guard", if on { "on" } else { "off" }]);
    }

    /// Every interface's packet and drop counters in the bed's four namespaces (`ip -s
    /// link`) and the host's per-CPU backlog drops (`/proc/net/softnet_stat`, second column):
    /// where datagrams went when a test misses some.
    pub fn interface_stats(&self) -> String {
        let mut out = String::new();
        for key in ["DA_NS", "HA_NS", "HB_NS", "DB_NS"] {
            let ns = self.get(key);
            let o = Command::new("ip")
                .args(["-n", ns, "-s", "link", "show"])
                .output();
            out += &format!("== {key} {ns}: ip -s link\n");
            match o {
                Ok(o) => out += &String::from_utf8_lossy(&o.stdout),
                Err(e) => out += &format!("({e})\n"),
            }
        }
        out += "== /proc/net/softnet_stat (processed dropped squeezed ...; one line per CPU)\n";
        out += &std::fs::read_to_string("/proc/net/softnet_stat").unwrap_or_default();
        out
    }

    /// Drops `permille`/1000 of what arrives on `link` ("forward" or "reverse"); 0 removes.
    pub fn loss(&self, link: &str, permille: u32) {
        self.run(&["loss", link, &permille.to_string()]);
    }

    /// Drops `len` consecutive frames of every `period` that arrive on `link` (bursts);
    /// [`SplitBed::loss`] 0 removes.
    pub fn burst(&self, link: &str, len: u32, period: u32) {
        self.run(&["burst", link, &len.to_string(), &period.to_string()]);
    }
}

impl Drop for SplitBed {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .args([&script(), "--name", &self.name, "down"])
            .status();
    }
}

/// A half's config on `bed` in mode stack: `half` is "a" or "b"; `fec_out`/`fec_in` the
/// links' FEC ("off", "8+2", ...); `extra` is appended (stream routes, signaling routes).
pub fn half_config(bed: &SplitBed, half: &str, fec_out: &str, fec_in: &str, extra: &str) -> String {
    half_config_mode(bed, half, "stack", fec_out, fec_in, extra)
}

/// [`half_config`] in capture mode `mode`.
pub fn half_config_mode(
    bed: &SplitBed,
    half: &str,
    mode: &str,
    fec_out: &str,
    fec_in: &str,
    extra: &str,
) -> String {
    let (face, peer_face) = if half == "a" {
        (FACE_A, FACE_B)
    } else {
        (FACE_B, FACE_A)
    };
    let (dom_a, dom_b) = if half == "a" {
        (
            format!(
                "interface = \"ga\"\naddress = \"{}\"\nnetworks = [\"10.211.1.0/24\"]",
                bed.get("GA_IP")
            ),
            format!("interface = \"lo\"\naddress = \"{face}\"\nnetworks = [\"{peer_face}/32\"]"),
        )
    } else {
        (
            format!("interface = \"lo\"\naddress = \"{face}\"\nnetworks = [\"{peer_face}/32\"]"),
            format!(
                "interface = \"gb\"\naddress = \"{}\"\nnetworks = [\"10.211.2.0/24\"]",
                bed.get("GB_IP")
            ),
        )
    };
    // Half A sends on fa (forward) and receives on ra (reverse); half B the mirror. Each
    // link's interface is its letter and the half's (`fa`), its addresses `<L><HALF>_IP`.
    let (me, peer, out, inl) = if half == "a" {
        ("A", "B", ("F", FWD_PORT), ("R", REV_PORT))
    } else {
        ("B", "A", ("R", REV_PORT), ("F", FWD_PORT))
    };
    let iface = |l: &str| format!("{l}{me}").to_lowercase();
    let addr =
        |l: &str, side: &str, port: u16| format!("{}:{port}", bed.get(&format!("{l}{side}_IP")));
    let (out_if, out_local, out_peer) = (
        iface(out.0),
        addr(out.0, me, out.1),
        addr(out.0, peer, out.1),
    );
    let out_mac = bed.get(&format!("{}{peer}_MAC", out.0));
    let (in_if, in_local, in_peer) = (
        iface(inl.0),
        addr(inl.0, me, inl.1),
        addr(inl.0, peer, inl.1),
    );
    let (sig_if, sig_local, sig_peer) = (iface("S"), addr("S", me, 7400), addr("S", peer, 7400));
    format!(
        r#"
[domains.a]
{dom_a}
media_ports = "20000-29999"
[domains.b]
{dom_b}
media_ports = "30000-39999"
[engine]
mode = "{mode}"
queues = 1
[security]
source_validation = "strict"
[control]
listen = "127.0.0.1:9940"
per_stream_metrics = true
[split]
half = "{half}"
peer_face = "{peer_face}"
[split.out_link]
interface = "{out_if}"
local = "{out_local}"
peer = "{out_peer}"
peer_mac = "{out_mac}"
fec = "{fec_out}"
[split.in_link]
interface = "{in_if}"
local = "{in_local}"
peer = "{in_peer}"
fec = "{fec_in}"
[split.signal]
interface = "{sig_if}"
local = "{sig_local}"
peer = "{sig_peer}"
key = "{KEY}"
{extra}
"#
    )
}

/// A static stream route section.
pub fn route(name: &str, domain: &str, port: u16, dest: &str, egress: u16, expect: &str) -> String {
    format!(
        "[[stream_route]]\nname = \"{name}\"\ndomain = \"{domain}\"\nport = {port}\ndestination = \"{dest}\"\negress_port = {egress}\nexpect_source = \"{expect}\"\n"
    )
}

/// `vgate run` in the half's namespace (`HA_NS` or `HB_NS`).
/// Both halves in `mode` ([`half_config_mode`] and [`start_half`]): half A with FEC
/// `fec_a.0` out and `fec_a.1` in and `routes_a`, half B mirrored (its out is A's in).
pub fn start_halves(
    bed: &SplitBed,
    mode: &str,
    fec_a: (&str, &str),
    (routes_a, routes_b): (&str, &str),
) -> (Vgate, Vgate) {
    let (out, inl) = fec_a;
    let a = half_config_mode(bed, "a", mode, out, inl, routes_a);
    let b = half_config_mode(bed, "b", mode, inl, out, routes_b);
    (start_half(bed, "a", &a), start_half(bed, "b", &b))
}

pub fn start_half(bed: &SplitBed, half: &str, config: &str) -> Vgate {
    let ns = bed
        .get(if half == "a" { "HA_NS" } else { "HB_NS" })
        .to_owned();
    Vgate::start_with(&["ip", "netns", "exec", &ns], config, &[])
}

/// A numbered datagram: 8 bytes of id, padded to `len` (RTP-looking header first).
pub fn numbered(id: u32, len: usize) -> Vec<u8> {
    let mut p = vec![0u8; len.max(16)];
    p[0] = 0x80;
    p[1] = 96;
    p[2..4].copy_from_slice(&(id as u16).to_be_bytes());
    p[8..12].copy_from_slice(&0x5eedu32.to_be_bytes());
    p[12..16].copy_from_slice(&id.to_be_bytes());
    for (i, b) in p.iter_mut().enumerate().skip(16) {
        *b = (id as usize + i) as u8;
    }
    p
}

/// Sends ids `0..count` from `from` (bound in namespace `ns`) to `to`, about `pps` per
/// second (paced in bursts of 10), payloads of `len` bytes.
pub fn send_numbered(
    ns: &str,
    from: SocketAddrV4,
    to: SocketAddrV4,
    count: u32,
    len: usize,
    pps: u32,
) -> JoinHandle<u32> {
    send_numbered_from(ns, from, to, 0, count, len, pps)
}

/// [`send_numbered`] of ids `first..first + count`.
pub fn send_numbered_from(
    ns: &str,
    from: SocketAddrV4,
    to: SocketAddrV4,
    first: u32,
    count: u32,
    len: usize,
    pps: u32,
) -> JoinHandle<u32> {
    let ns = ns.to_owned();
    std::thread::spawn(move || {
        enter_netns(&ns).unwrap_or_else(|e| panic!("setns {ns}: {e}"));
        let s = UdpSocket::bind(from).expect("bind sender");
        let start = Instant::now();
        for i in 0..count {
            s.send_to(&numbered(first + i, len), to).expect("send");
            if i % 10 == 9 {
                let due = start + Duration::from_secs_f64(f64::from(i + 1) / f64::from(pps));
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
            }
        }
        count
    })
}

/// What a receiver saw: how many times each id arrived, and anything wrong.
#[derive(Debug, Default)]
pub struct Arrivals {
    pub counts: HashMap<u32, u32>,
    pub wrong_source: u32,
    pub corrupt: u32,
}

impl Arrivals {
    /// Ids of `0..count` never received, and ids received more than once.
    pub fn missing_and_dups(&self, count: u32) -> (u32, u32) {
        let missing = (0..count).filter(|i| !self.counts.contains_key(i)).count() as u32;
        let dups = self.counts.values().filter(|&&n| n > 1).count() as u32;
        (missing, dups)
    }
}

/// Receives on `at` in namespace `ns` until `count` distinct ids arrived or nothing came for
/// `quiet` after the first datagram (or `first_within` with nothing at all); checks each
/// datagram's source is `from` and its bytes are intact.
pub fn receive_numbered(
    ns: &str,
    at: SocketAddrV4,
    from: SocketAddrV4,
    count: u32,
    len: usize,
    first_within: Duration,
    quiet: Duration,
) -> (JoinHandle<Arrivals>, std::sync::mpsc::Receiver<()>) {
    let ns = ns.to_owned();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        enter_netns(&ns).unwrap_or_else(|e| panic!("setns {ns}: {e}"));
        let s = UdpSocket::bind(at).expect("bind receiver");
        // Room for bursts while this thread waits for a CPU on a loaded machine (root may
        // exceed rmem_max).
        let _ =
            nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBufForce, &(8 << 20));
        let _ = ready_tx.send(());
        let mut a = Arrivals::default();
        let mut buf = [0u8; 2048];
        let mut last = Instant::now();
        let mut any = false;
        loop {
            let limit = if any { quiet } else { first_within };
            let left = limit.saturating_sub(last.elapsed());
            if left.is_zero() || a.counts.len() as u32 >= count {
                break;
            }
            s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            let Ok((n, src)) = s.recv_from(&mut buf) else {
                continue;
            };
            any = true;
            last = Instant::now();
            if src != std::net::SocketAddr::V4(from) {
                a.wrong_source += 1;
                continue;
            }
            let p = &buf[..n];
            let id = p
                .get(12..16)
                .map(|b| u32::from_be_bytes(b.try_into().unwrap()));
            match id {
                Some(id) if p == numbered(id, len).as_slice() => {
                    *a.counts.entry(id).or_default() += 1;
                }
                _ => a.corrupt += 1,
            }
        }
        // Late duplicates would show within a short extra wait.
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        while let Ok((n, src)) = s.recv_from(&mut buf) {
            if src == std::net::SocketAddr::V4(from) && n >= 16 {
                let id = u32::from_be_bytes(buf[12..16].try_into().unwrap());
                *a.counts.entry(id).or_default() += 1;
            } else {
                a.wrong_source += 1;
            }
        }
        a
    });
    (h, ready_rx)
}

/// The `link name=… k=v` lines of a half's shutdown totals.
pub fn link_totals(raw: &str, name: &str) -> HashMap<String, u64> {
    raw.lines()
        .find(|l| l.starts_with(&format!("link name={name} ")))
        .unwrap_or_else(|| panic!("no link {name} line in totals:\n{raw}"))
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .filter_map(|(k, v)| v.parse().ok().map(|v| (k.to_owned(), v)))
        .collect()
}

/// Panics unless each of the link counters `keys` (of [`link_totals`]) is 0; `what` names
/// the link in the message.
pub fn assert_zero(link: &HashMap<String, u64>, keys: &[&str], what: &str) {
    for k in keys {
        assert_eq!(link[*k], 0, "{what} {k}: {link:?}");
    }
}

/// `GET path` on a half's admin interface (127.0.0.1:9940 inside its namespace): the body.
pub fn admin_get(bed: &SplitBed, half: &str, path: &str) -> String {
    let ns = bed.get(if half == "a" { "HA_NS" } else { "HB_NS" });
    super::admin::get_in(ns, "127.0.0.1:9940", path)
}

/// The static stream `cam` from domain A to domain B across the forward link, as each half
/// configures it: half A takes `DA_IP:5000` on port 20000 and sends it to half B's face at
/// 21000 (from 30000); half B takes it there from half A's face (30000) and sends it to
/// `DB_IP:6000` from 30000. (half A's routes, half B's routes)
pub fn cam_routes(bed: &SplitBed) -> (String, String) {
    let (da, db) = (bed.get("DA_IP"), bed.get("DB_IP"));
    (
        route(
            "cam",
            "a",
            20000,
            &format!("{FACE_B}:21000"),
            30000,
            &format!("{da}:5000"),
        ),
        route(
            "cam",
            "a",
            21000,
            &format!("{db}:6000"),
            30000,
            &format!("{FACE_A}:30000"),
        ),
    )
}

/// The media links' frame key the keyed configs carry ([`with_link_keys`]); both links,
/// both halves (each direction derives its own key from it).
pub const LINK_KEY: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f91";

/// `config` (of [`half_config`]) with `key = LINK_KEY` in both media links' sections.
pub fn with_link_keys(config: &str) -> String {
    config
        .replace(
            "[split.out_link]\n",
            &format!("[split.out_link]\nkey = \"{LINK_KEY}\"\n"),
        )
        .replace(
            "[split.in_link]\n",
            &format!("[split.in_link]\nkey = \"{LINK_KEY}\"\n"),
        )
}

/// Captures, in namespace `ns`, the UDP payloads of the IPv4 datagrams to `to` (a link's
/// frames, as the isolation device between the halves sees them) until `stop` is set: an
/// AF_PACKET socket (all interfaces, cooked: IP packets). Ready once the second value
/// receives.
pub fn capture_udp(
    ns: &str,
    to: SocketAddrV4,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (JoinHandle<Vec<Vec<u8>>>, std::sync::mpsc::Receiver<()>) {
    use nix::sys::socket::{
        self, sockopt, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType,
    };
    let ns = ns.to_owned();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        enter_netns(&ns).unwrap_or_else(|e| panic!("setns {ns}: {e}"));
        let fd = socket::socket(
            AddressFamily::Packet,
            SockType::Datagram,
            SockFlag::empty(),
            SockProtocol::EthAll,
        )
        .expect("AF_PACKET socket (root)");
        let _ = socket::setsockopt(&fd, sockopt::RcvBufForce, &(16 << 20));
        socket::setsockopt(
            &fd,
            sockopt::ReceiveTimeout,
            &nix::sys::time::TimeVal::new(0, 100_000),
        )
        .unwrap();
        let _ = ready_tx.send(());
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        while !stop.load(Ordering::Relaxed) {
            let Ok(n) = socket::recv(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                &mut buf,
                MsgFlags::empty(),
            ) else {
                continue;
            };
            let p = &buf[..n];
            if n < 28 || p[0] >> 4 != 4 || p[9] != 17 {
                continue;
            }
            let ihl = usize::from(p[0] & 15) * 4;
            if n < ihl + 8 || p[16..20] != to.ip().octets() {
                continue;
            }
            let udp = &p[ihl..];
            if u16::from_be_bytes([udp[2], udp[3]]) == to.port() {
                out.push(udp[8..].to_vec());
            }
        }
        out
    });
    (h, ready_rx)
}

/// Sends `frames` (each one UDP payload) from `from`, bound in namespace `ns`, to `to`,
/// about `pps` per second.
pub fn inject(ns: &str, from: SocketAddrV4, to: SocketAddrV4, frames: Vec<Vec<u8>>, pps: u32) {
    super::in_netns(ns, move || {
        let s = UdpSocket::bind(from).expect("bind injector");
        let start = Instant::now();
        for (i, f) in frames.iter().enumerate() {
            s.send_to(f, to).expect("inject");
            let due = start + Duration::from_secs_f64((i + 1) as f64 / f64::from(pps));
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
    });
}
