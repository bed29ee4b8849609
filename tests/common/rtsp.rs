//! The RTSP client side shared by the RTSP tests (`rtsp_netns`, `rtsp_tracks_netns`, the
//! hostile peers): the text of a request and the session a reply names; and the namespace
//! tests' rig: the bed with GStreamer's RTSP server (`tests/rtsp/server.py`) in domain A and
//! `vgate run` in the gateway namespace, ffmpeg runs in domain B (play and push), and the
//! route's metrics and events.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::proc::Proc;
use super::vgate::Vgate;
use super::{admin, have_gst_rtsp_server, in_netns, prerequisites, Bed, BedConfig, PY};

/// Request `method url` with CSeq `cseq`, the `Session` header when a session is known, then
/// the `extra` header lines (each ending in CRLF) and the blank line.
pub fn request(method: &str, url: &str, cseq: u32, session: Option<&str>, extra: &str) -> String {
    let session = session
        .map(|s| format!("Session: {s}\r\n"))
        .unwrap_or_default();
    format!("{method} {url} RTSP/1.0\r\nCSeq: {cseq}\r\n{session}{extra}\r\n")
}

/// One bed at a time: GStreamer and ffmpeg on two cores are enough load.
pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn can_run(test: &str) -> bool {
    prerequisites(
        test,
        true,
        &[
            ("ip", "iproute2"),
            ("ffmpeg", "ffmpeg"),
            ("ffprobe", "ffmpeg"),
        ],
    ) && have_gst_rtsp_server(test)
}

/// Bed + GStreamer server in A + vgate in the gateway namespace.
pub struct Rig {
    pub bed: Bed,
    pub server: Option<Proc>,
    /// What the server printed after READY (`FRAMES n` lines of a RECORD server).
    pub server_out: Arc<Mutex<String>>,
    pub vgate: Option<Vgate>,
    pub dir: tempfile::TempDir,
}

impl Rig {
    /// `routes` is appended to the config: `A_IP` is replaced by the server's address.
    pub fn up(server_args: &[&str], routes: &str) -> Rig {
        Rig::up_with(Some(server_args), routes)
    }

    /// As [`Rig::up`]; `None`: no GStreamer server (the test brings its own peer in A).
    pub fn up_with(server_args: Option<&[&str]>, routes: &str) -> Rig {
        let bed = Bed::up(1);
        let dir = tempfile::tempdir().unwrap();
        let config = format!("{}{routes}", bed.config(BedConfig::default()))
            .replace("A_IP", bed.get("A_IP"));
        let mut rig = Rig {
            bed,
            server: None,
            server_out: Arc::new(Mutex::new(String::new())),
            vgate: None,
            dir,
        };
        if let Some(args) = server_args {
            rig.start_server(args);
        }
        rig.vgate = Some(Vgate::start_in(rig.bed.get("G_NS"), &config, &[]));
        rig.wait_log("RTSP proxy listening", 1, Duration::from_secs(10));
        rig
    }

    pub fn start_server(&mut self, args: &[&str]) {
        let script = format!("{}/tests/rtsp/server.py", env!("CARGO_MANIFEST_DIR"));
        let mut child = Command::new("ip")
            .args([
                "netns",
                "exec",
                self.bed.get("A_NS"),
                PY,
                &script,
                "--port",
                "8554",
            ])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the GStreamer RTSP server");
        let mut line = String::new();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let _ = out.read_line(&mut line);
        assert!(
            line.starts_with("READY"),
            "RTSP server did not start: {line:?}"
        );
        // Keep reading: a closed pipe would kill a server that prints more.
        let sink = Arc::clone(&self.server_out);
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        self.server = Some(Proc::new(child));
    }

    /// Frames the RECORD server decoded so far (its last `FRAMES n` line).
    pub fn server_frames(&self) -> u64 {
        self.server_count("FRAMES ")
    }

    /// The last count the server printed after `prefix` (`FRAMES `, `AUDIO `).
    pub fn server_count(&self, prefix: &str) -> u64 {
        self.server_out
            .lock()
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .filter_map(|n| n.trim().parse().ok())
            .next_back()
            .unwrap_or(0)
    }

    /// Waits until the RECORD server has decoded at least `n` frames; its count.
    pub fn wait_frames(&self, n: u64, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.server_frames() >= n {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.server_frames()
    }

    pub fn server_pid(&self) -> u32 {
        self.server.as_ref().unwrap().pid()
    }

    pub fn vgate(&self) -> &Vgate {
        self.vgate.as_ref().expect("vgate runs")
    }

    pub fn log(&self) -> String {
        self.vgate().log()
    }

    /// Waits until vgate's log holds `needle` at least `count` times.
    pub fn wait_log(&self, needle: &str, count: usize, within: Duration) {
        self.vgate().wait_log(needle, count, within)
    }

    pub fn url(&self, port: u16, path: &str) -> String {
        format!("rtsp://{}:{port}{path}", self.bed.get("GB_IP"))
    }

    pub fn vgate_cpu_seconds(&self) -> f64 {
        let pid = self.vgate().pid();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, r)| r.split_whitespace().collect())
            .unwrap_or_default();
        let ticks: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
            + fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
        ticks as f64 / 100.0
    }

    /// SIGTERM; vgate's stdout (totals and `route` lines).
    pub fn stop_vgate(&mut self) -> String {
        self.vgate.take().expect("vgate runs").stop().raw
    }

    /// SIGTERM; no `route` line left in vgate's totals.
    pub fn stop_with_no_route_left(&mut self) {
        let totals = self.stop_vgate();
        assert!(!totals.lines().any(|l| l.starts_with("route ")), "{totals}");
    }

    /// Waits (`secs` at most) until vgate logged `rtsp <what>; <ZERO>` `count` times: a
    /// session or connection that ended and left no session, route or port.
    pub fn wait_ended(&self, what: &str, count: usize, secs: u64) {
        self.wait_log(
            &format!("rtsp {what}; {ZERO}"),
            count,
            Duration::from_secs(secs),
        )
    }

    /// ffmpeg in namespace `ns` decodes `frames` video frames of `/cam1` through vgate.
    pub fn play(&self, ns: &str, transport: &str, frames: usize, tag: &str) -> Play {
        ffmpeg(
            ns,
            &self.url(8554, "/cam1"),
            transport,
            frames,
            self.dir.path(),
            tag,
        )
    }

    /// ffmpeg in namespace `ns` pushes 4 s (40 frames) to `/cam1` over `transport`; it
    /// succeeds and the RECORD server decodes at least 30 more frames (the last second may
    /// still be on its way).
    pub fn push(&self, ns: &str, transport: &str, what: &str) {
        let before = self.server_frames();
        let (ok, err) = ffmpeg_push(ns, &self.url(8554, "/cam1"), transport, 4);
        assert!(ok, "{what}: ffmpeg push failed: {err}");
        let after = self.wait_frames(before + 30, Duration::from_secs(5));
        assert!(
            after >= before + 30,
            "{what}: the server decoded only {} of 40 pushed frames",
            after - before
        );
    }
}

/// Runs `scenario` on the rig of [`Rig::up`], one bed at a time ([`SERIAL`]).
pub fn with_rig(scenario: fn(Rig), server_args: &[&str], routes: &str) {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    scenario(Rig::up(server_args, routes));
}

/// What one ffmpeg run saw.
pub struct Play {
    pub ok: bool,
    pub video_frames: usize,
    /// Decoded frames by stream index (video 0, then the audio tracks).
    pub frames: [usize; 4],
    pub errors: Vec<String>,
    /// Everything ffmpeg logged at trace level: every RTSP byte it received.
    pub trace: String,
    pub first_frame: Option<Duration>,
}

/// ffmpeg in namespace `ns` decodes `frames` video frames of `url`.
pub fn ffmpeg(
    ns: &str,
    url: &str,
    transport: &str,
    frames: usize,
    dir: &std::path::Path,
    tag: &str,
) -> Play {
    let trace_path: PathBuf = dir.join(format!("ffmpeg-{tag}.log"));
    let start = Instant::now();
    let mut child = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "timeout",
            "40",
            "ffmpeg",
            "-nostdin",
            "-hide_banner",
        ])
        .args([
            "-loglevel",
            "repeat+level+trace",
            "-rtsp_transport",
            transport,
            "-i",
            url,
        ])
        .args([
            "-map",
            "0",
            "-frames:v",
            &frames.to_string(),
            "-f",
            "framemd5",
            "-",
        ])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&trace_path).unwrap())
        .spawn()
        .expect("run ffmpeg");
    let mut first_frame = None;
    let mut video_frames = 0;
    let mut frames = [0; 4];
    for line in BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        if let Some(n) = line
            .split_once(',')
            .and_then(|(i, _)| i.trim().parse::<usize>().ok())
            .and_then(|i| frames.get_mut(i))
        {
            *n += 1;
        }
        if line.starts_with("0,") {
            video_frames += 1;
            first_frame.get_or_insert_with(|| start.elapsed());
        }
    }
    let ok = child.wait().unwrap().success();
    let trace = std::fs::read_to_string(&trace_path).unwrap_or_default();
    let errors = trace
        .lines()
        .filter(|l| l.contains("[error]") || l.contains("[fatal]"))
        .map(str::to_owned)
        .collect();
    Play {
        ok,
        video_frames,
        frames,
        errors,
        trace,
        first_frame,
    }
}

/// ffmpeg succeeded, decoded at least `frames` video frames and logged no error.
pub fn assert_played(p: &Play, what: &str, frames: usize) {
    assert!(p.ok, "{what}: ffmpeg failed; errors: {:?}", p.errors);
    assert!(
        p.video_frames >= frames,
        "{what}: only {} video frames",
        p.video_frames
    );
    assert!(p.errors.is_empty(), "{what}: ffmpeg errors: {:?}", p.errors);
}

/// No A-side address (the server's nor vgate's own) in anything B received.
pub fn assert_no_a_address(rig: &Rig, text: &str, what: &str) {
    let a_net = {
        let ip = rig.bed.get("A_IP");
        ip.rsplit_once('.').unwrap().0.to_string() + "."
    };
    if let Some(line) = text.lines().find(|l| l.contains(&a_net)) {
        panic!("{what}: an A-side address reached domain B: {line}");
    }
}

pub const ZERO: &str = "live rtsp_sessions=0 routes=0 ports_a=0 ports_b=0";

pub fn simple_route(extra: &str) -> String {
    format!(
        r#"
[[signaling_route]]
name = "cam"
type = "rtsp"
transport = "tcp"
listen_domain = "b"
listen_port = 8554
upstream = "A_IP:8554"
{extra}
[[signaling_route.paths]]
prefix = "/cam1"
upstream_path = "/test"
"#
    )
}

/// ffmpeg in namespace `ns` pushes `seconds` of a 320x240 MJPEG test pattern at 10 fps to
/// `url` (ANNOUNCE, SETUP mode=record, RECORD, TEARDOWN). RFC 2435 wants the standard Huffman
/// tables and a full-range 4:2:0 picture. Returns (exit ok, stderr).
pub fn ffmpeg_push(ns: &str, url: &str, transport: &str, seconds: u32) -> (bool, String) {
    ffmpeg_push_tracks(ns, url, transport, seconds, 0)
}

/// As [`ffmpeg_push`]; with `audio` a PCMU tone as a second track.
pub fn ffmpeg_push_tracks(
    ns: &str,
    url: &str,
    transport: &str,
    seconds: u32,
    audio_tracks: usize,
) -> (bool, String) {
    let t = seconds.to_string();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns, "timeout", "30", "ffmpeg", "-nostdin"])
        .args(["-hide_banner", "-loglevel", "error", "-re", "-f", "lavfi"])
        .args(["-i", "testsrc=size=320x240:rate=10", "-t", &t]);
    // Audio tracks after the video: PCMU, then PCMA (what server.py --record --tracks N takes).
    let codecs = ["pcm_mulaw", "pcm_alaw"];
    for i in 1..=audio_tracks.min(codecs.len()) {
        let freq = format!("sine=frequency={}:sample_rate=8000", 440 * i);
        cmd.args(["-re", "-f", "lavfi", "-i", &freq, "-t", &t]);
    }
    cmd.args(["-map", "0:v"]);
    for i in 1..=audio_tracks.min(codecs.len()) {
        cmd.args(["-map", &format!("{i}:a")]);
    }
    for (i, c) in codecs.iter().enumerate().take(audio_tracks) {
        cmd.args([&format!("-c:a:{i}"), *c, "-ar", "8000", "-ac", "1"]);
    }
    let out = cmd
        .args([
            "-c:v", "mjpeg", "-huffman", "default", "-pix_fmt", "yuvj420p",
        ])
        .args(["-f", "rtsp", "-rtsp_transport", transport, url])
        .output()
        .expect("run ffmpeg");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One metrics sample of the admin interface (in the gateway namespace, on its loopback).
pub fn metric(rig: &Rig, name_and_labels: &str) -> f64 {
    let g = rig.bed.get("G_NS").to_string();
    let text = in_netns(&g, || {
        admin::try_get("127.0.0.1:9940", "/metrics").unwrap_or_default()
    });
    admin::sample(&text, name_and_labels).unwrap_or(0.0)
}

/// The metric of event `e` of route `cam`.
pub fn cam_event(rig: &Rig, e: &str) -> f64 {
    metric(
        rig,
        &vgate::control::metrics::event_series("cam", "rtsp", e),
    )
}

/// Waits (bounded) until event `e` of route `cam` reaches `n`; its value.
pub fn wait_event(rig: &Rig, e: &str, n: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    while cam_event(rig, e) < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    cam_event(rig, e)
}
