//! sipp (Debian's sip-tester) as a test peer: the scenarios of `tests/sipp/`, one sipp
//! run inside a network namespace bounded by `timeout 120`, its message logs read back, and
//! the RTP pcap the device scenarios play.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use super::proc::Proc;

/// The GB/T 28181 Call-ID of the scenarios (`…@<platform domain>`).
pub const GB_CID: &str = "%u-%p@3402000000";

/// The folder of the scenario files and helpers (`tests/sipp`).
pub fn dir() -> String {
    format!("{}/tests/sipp", env!("CARGO_MANIFEST_DIR"))
}

/// The scenario file `name` of `tests/sipp`.
pub fn scenario(name: &str) -> String {
    format!("{}/{name}", dir())
}

/// One sipp run: `ip netns exec NS timeout 120 sipp -sf SCENARIO -i IP -p PORT … -nostdin`
/// in folder `cwd` (where sipp writes its logs), stdin and stdout closed, stderr appended to
/// `sipp_PORT_stderr.log` there (a fatal error says why only there).
pub struct Sipp {
    ns: String,
    cwd: PathBuf,
    port: u16,
    args: Vec<String>,
    /// Seconds before `timeout` ends it: 120, or 30 more than a longer [`Sipp::timeout`].
    limit: u32,
}

impl Sipp {
    /// Scenario `sf` (a path) in namespace `ns`, bound to `ip:port`.
    pub fn new(ns: &str, cwd: &Path, sf: &str, ip: &str, port: u16) -> Sipp {
        Sipp {
            ns: ns.to_owned(),
            cwd: cwd.to_owned(),
            port,
            args: Vec::new(),
            limit: 120,
        }
        .args(&["-sf", sf, "-i", ip, "-p", &port.to_string()])
    }

    /// More arguments (a remote host, `-t t1`, `-mp 16000`, `-trace_msg`, ...).
    pub fn args(mut self, args: &[&str]) -> Sipp {
        self.args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// `-m calls -r rate -l limit` (calls in all, per second, at once).
    pub fn calls(self, calls: u32, rate: u32, limit: u32) -> Sipp {
        let (m, r, l) = (calls.to_string(), rate.to_string(), limit.to_string());
        self.args(&["-m", &m, "-r", &r, "-l", &l])
    }

    /// `-timeout secs -timeout_error`: a run that takes longer fails.
    pub fn timeout(mut self, secs: u32) -> Sipp {
        self.limit = self.limit.max(secs + 30);
        let t = secs.to_string();
        self.args(&["-timeout", &t, "-timeout_error"])
    }

    fn command(&self) -> Command {
        let stderr = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.cwd.join(format!("sipp_{}_stderr.log", self.port)))
            .map_or_else(|_| Stdio::null(), Stdio::from);
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &self.ns,
            "timeout",
            &self.limit.to_string(),
            "sipp",
        ])
        .args(&self.args)
        .arg("-nostdin")
        .current_dir(&self.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
        cmd
    }

    /// Starts it in the background (a UAS, or a UAC the test waits for later).
    pub fn spawn(self) -> Proc {
        Proc::spawn(&mut self.command())
    }

    /// Runs it to the end: sipp exits with success when every call passed every check.
    pub fn status(self) -> ExitStatus {
        self.command().status().expect("run sipp")
    }

    /// Runs it to the end: `Err` with its exit status, screen and errors when it failed.
    pub fn run(self) -> Result<(), String> {
        let out = self
            .command()
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .expect("run sipp");
        if out.status.success() {
            return Ok(());
        }
        Err(format!(
            "{}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// What a failed run needs shown, since its folder goes with the test (and a guest's with
/// the guest): the last 4000 bytes of each sipp error log (`-trace_err`), end-of-run screen
/// (`-trace_screen`) and standard error in `dir`, headed by `side`.
pub fn failure_logs(side: &str, dir: &Path) -> String {
    let mut all = String::new();
    for suffix in ["_errors.log", "_screen.log", "_stderr.log"] {
        let text = read_logs(dir, suffix);
        let text = text.trim();
        if !text.is_empty() {
            let from = text.len().saturating_sub(4000);
            let from = (from..text.len())
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(text.len());
            all.push_str(&format!("\n--- {side}: sipp *{suffix}:\n{}", &text[from..]));
        }
    }
    all
}

/// Everything sipp wrote in files of `dir` whose names end in `suffix` (`_messages.log`).
pub fn read_logs(dir: &Path, suffix: &str) -> String {
    let mut all = String::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.file_name().to_string_lossy().ends_with(suffix) {
            let _ = std::fs::File::open(e.path()).and_then(|mut f| f.read_to_string(&mut all));
        }
    }
    all
}

/// What the sipp namespace tests need besides root: the bed's tools, sipp and `timeout`.
pub const NEEDS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("nft", "nftables"),
    ("sipp", "sip-tester"),
    ("timeout", "coreutils"),
];

/// A temporary folder with a sipp folder per domain, `a` and `b` (A's with the RTP pcap of
/// `rtp` packets the device plays, when asked): (folder, A's, B's).
pub fn side_dirs(rtp: Option<u32>) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(&b_dir).unwrap();
    if let Some(n) = rtp {
        make_rtp_pcap(&a_dir.join("rtp.pcap"), n);
    }
    (dir, a_dir, b_dir)
}

/// Writes the RTP pcap of `packets` packets the device scenarios play (`make_rtp_pcap.py`).
pub fn make_rtp_pcap(path: &Path, packets: u32) {
    let st = Command::new("python3")
        .arg(scenario("make_rtp_pcap.py"))
        .arg(path)
        .arg(packets.to_string())
        .status()
        .expect("run python3");
    assert!(st.success(), "make_rtp_pcap.py failed");
}

/// The GB/T 28181 signaling route `b2a` of the three-namespace bed, over UDP: a platform
/// in B (only `B_IP`, only the `3402000000` domain) calls the device at `A_IP:5060` through
/// the gateway's B address, port 5060; the upstream face is port 5061. `extra` lines are
/// added to the route.
pub fn gb_b2a_route(bed: &super::Bed, extra: &str) -> String {
    let upstream = format!("{}:5060", bed.get("A_IP"));
    format!(
        "\n{}upstream_port = 5061\nallow_peers = [\"{}/32\"]\nallow_ids = [\"3402000000\"]\n{extra}",
        super::signaling_route("b2a", "sip", "udp", ("b", 5060), &upstream),
        bed.get("B_IP"),
    )
}
