//! The bed of the media namespace tests (`media_validate_netns`, `media_strip_netns`): the
//! three-namespace bed with the real `vgate run` in one capture mode, two static routes from
//! A to B that validate their media — `cam` (`codec = "h264"`, fed by a real encoder,
//! [`encoder`]) and a second one of the caller's name (`codec = "ps"`, fed by
//! [`send_from_a`]) — and two sinks in B that keep every datagram they receive.
//!
//! A test starts it with [`start`], runs its senders, and ends it with [`Media::finish`]:
//! the datagrams each sink received, the metrics and vgate's totals at exit.

use std::net::{SocketAddrV4, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::admin::get_in;
use super::vgate::{Totals, Vgate};
use super::{enter_netns, in_netns, Bed, BedConfig};

/// The `cam` route's port (H.264 from the encoder).
pub const CAM_PORT: u16 = 20000;
/// The second route's port (PS).
pub const SECOND_PORT: u16 = 20010;
pub const SINK_CAM: u16 = 40000;
pub const SINK_SECOND: u16 = 40001;
/// The encoder's frames (4 s at 25 frames a second).
pub const ENCODER_FRAMES: u64 = 100;

/// What each sink in B received: the `cam` route's datagrams, the second route's.
pub type Received = (Vec<Vec<u8>>, Vec<Vec<u8>>);

/// The gateway's config: the bed in `mode` (with the `[engine]` lines `engine`),
/// `[media] validate = validate`, per-stream metrics, the `cam` route and the PS route named
/// `second`.
pub fn config(bed: &Bed, mode: &str, engine: &str, validate: &str, second: &str) -> String {
    let mut s = bed.config(BedConfig {
        mode,
        engine,
        ..Default::default()
    });
    s.push_str(&format!(
        "per_stream_metrics = true\n[media]\nvalidate = \"{validate}\"\n"
    ));
    for (name, port, sink, egress, media) in [
        (
            "cam",
            CAM_PORT,
            SINK_CAM,
            30000,
            "{ codec = \"h264\", payload_types = [96] }",
        ),
        (
            second,
            SECOND_PORT,
            SINK_SECOND,
            30010,
            "{ codec = \"ps\", payload_types = [96] }",
        ),
    ] {
        s.push_str(&format!(
            "[[stream_route]]\nname = \"{name}\"\ndomain = \"a\"\nport = {port}\ndestination = \"{}:{sink}\"\negress_port = {egress}\nexpect_source = \"{}:0\"\nmedia = {media}\n",
            bed.get("B_IP"),
            bed.get("A_IP"),
        ));
    }
    s
}

/// Keeps what arrives on the two sinks in B until `stop` and 500 ms of quiet.
fn sinks(bed: &Bed, stop: Arc<AtomicBool>) -> JoinHandle<Received> {
    let (ns, ip) = (bed.get("B_NS").to_owned(), bed.ip("B_IP"));
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        enter_netns(&ns).unwrap();
        let socks: Vec<UdpSocket> = [SINK_CAM, SINK_SECOND]
            .iter()
            .map(|p| {
                let s = UdpSocket::bind(SocketAddrV4::new(ip, *p)).unwrap();
                s.set_nonblocking(true).unwrap();
                s
            })
            .collect();
        tx.send(()).unwrap();
        let mut got: [Vec<Vec<u8>>; 2] = [Vec::new(), Vec::new()];
        let mut buf = [0u8; 2048];
        let mut quiet_since = Instant::now();
        loop {
            let mut any = false;
            for (i, s) in socks.iter().enumerate() {
                while let Ok(n) = s.recv(&mut buf) {
                    got[i].push(buf[..n].to_vec());
                    any = true;
                }
            }
            if any {
                quiet_since = Instant::now();
            } else if stop.load(Relaxed) && quiet_since.elapsed() > Duration::from_millis(500) {
                let [a, b] = got;
                return (a, b);
            } else {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("sinks bound");
    t
}

/// ffmpeg in A: [`ENCODER_FRAMES`] frames of a test pattern in real time, libx264 baseline,
/// ffmpeg's RTP muxer, to the `cam` route.
pub fn encoder(bed: &Bed) -> Child {
    let url = format!(
        "rtp://{}:{CAM_PORT}?localport=5004&pkt_size=1200",
        bed.get("GA_IP")
    );
    Command::new("ip")
        .args(["netns", "exec", bed.get("A_NS"), "ffmpeg"])
        .args(["-hide_banner", "-loglevel", "error", "-nostdin", "-re"])
        .args(["-f", "lavfi", "-i", "testsrc=size=320x240:rate=25"])
        .args(["-frames:v", &ENCODER_FRAMES.to_string()])
        .args(["-c:v", "libx264", "-profile:v", "baseline"])
        .args(["-preset", "veryfast", "-g", "25", "-pix_fmt", "yuv420p"])
        .args(["-f", "rtp", &url])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run ffmpeg")
}

/// Sends `pkts` from A (port 5010) to the second route, `gap` apart.
pub fn send_from_a(bed: &Bed, pkts: Vec<Vec<u8>>, gap: Duration) {
    let (a_ip, ga) = (bed.ip("A_IP"), bed.ip("GA_IP"));
    in_netns(bed.get("A_NS"), move || {
        let s = UdpSocket::bind(SocketAddrV4::new(a_ip, 5010)).unwrap();
        for p in &pkts {
            s.send_to(p, SocketAddrV4::new(ga, SECOND_PORT)).unwrap();
            std::thread::sleep(gap);
        }
    });
}

/// The modes take turns (one bed and one encoder at a time) on a shared machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A running bed: the gateway and the sinks.
pub struct Media {
    pub bed: Bed,
    pub mode: String,
    g_ns: String,
    vg: Vgate,
    stop: Arc<AtomicBool>,
    sinks: JoinHandle<Received>,
    _turn: MutexGuard<'static, ()>,
}

/// What a run ended with.
pub struct Outcome {
    pub received: Received,
    /// The gateway's `/metrics` just before it stopped.
    pub metrics: String,
    pub totals: Totals,
}

/// Brings the bed up with the gateway in `mode` (see [`config`]) and the sinks listening.
pub fn start(mode: &str, engine: &str, validate: &str, second: &str) -> Media {
    let turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let bed = Bed::up(1);
    let g_ns = bed.get("G_NS").to_owned();
    let vg = Vgate::start_with(
        &["ip", "netns", "exec", &g_ns],
        &config(&bed, mode, engine, validate, second),
        &[],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let sinks = sinks(&bed, Arc::clone(&stop));
    Media {
        bed,
        mode: mode.to_owned(),
        g_ns,
        vg,
        stop,
        sinks,
        _turn: turn,
    }
}

impl Media {
    /// Waits for the encoder `enc` to end (it must succeed), then for the sinks to fall
    /// quiet; reads the metrics and stops the gateway.
    pub fn finish(self, enc: Child) -> Outcome {
        let out = enc.wait_with_output().expect("ffmpeg ran");
        assert!(
            out.status.success(),
            "ffmpeg failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.stop.store(true, Relaxed);
        let received = self.sinks.join().unwrap();
        let metrics = get_in(&self.g_ns, "127.0.0.1:9940", "/metrics");
        let totals = self.vg.stop();
        Outcome {
            received,
            metrics,
            totals,
        }
    }
}
