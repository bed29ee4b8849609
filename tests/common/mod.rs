//! The shared scaffolding of the integration tests, written once; each test file keeps
//! only its scenario.
//!
//! - here: prerequisites ([`prerequisites`], [`test_did_not_run`]: the one rule — a missing
//!   prerequisite prints "DID NOT RUN", and fails under `CI=true`), the three-namespace bed
//!   of `scripts/testbed.sh` ([`Bed`], unique names per run, down on drop even in a panic),
//!   running code inside a namespace ([`in_netns`]), the `vgate` binary;
//! - [`proc`]: the guard of a child process (stopped and reaped on drop);
//! - [`vgate`]: the one `vgate run` launcher (in a namespace or not, ready, stop, totals);
//! - [`admin`]: the admin interface client (`GET`, `POST`, JSON, metrics samples);
//! - [`capture`]: `vgate capture-refused` runs, covert packets, the pcap file read back;
//! - [`ha`]: the hot-standby pair of the namespace tests and what every HA bed shares (commands
//!   in namespaces, admin look-ups, keepalived, the health watcher);
//! - [`split`]: the split appliance's four-namespace bed, its halves and numbered traffic;
//! - [`relay`]: numbered RTP senders and checking sinks of the engine tests;
//! - [`udp`]: plain UDP peers (a counting sink);
//! - [`media_bed`]: the media namespace tests' bed (an H.264 and a PS route that validate,
//!   a real encoder, sinks that keep what they receive);
//! - [`sipp`], [`gb_sipp`], [`rfc4571`], [`sip_tcp`]: SIP peers (sipp runs, GB/T 28181
//!   scenarios, RTP over TCP peers, a SIP/TCP peer for messages over sipp's 64 KiB);
//! - [`rtsp`]: the RTSP client side (a request's text) and the RTSP namespace tests' rig
//!   (GStreamer's server, vgate, ffmpeg runs).
//!
//! Every test binary includes all of it (`mod common;`) and uses a part, hence the one
//! `allow(dead_code)` below: a helper unused by one binary is used by another.
#![allow(dead_code)]

pub mod admin;
pub mod capture;
pub mod gb_sipp;
pub mod ha;
pub mod media_bed;
pub mod proc;
pub mod relay;
pub mod rfc4571;
pub mod rtsp;
pub mod sip_tcp;
pub mod sipp;
pub mod split;
pub mod udp;
pub mod vgate;

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A config that is only parsed (in-process tests, no socket): domain A on `eth0` at
/// 10.1.0.1 (10.1.0.0/16, media 20000-20099), domain B on `eth1` at 10.2.0.1 (10.2.0.0/16,
/// 30000-30099), one queue; then `$rest` (a string literal, so the result is one too and
/// can be a `const` or a `format!` string).
#[macro_export]
macro_rules! offline_config {
    ($rest:literal) => {
        concat!(
            "\n[domains.a]\ninterface = \"eth0\"\naddress = \"10.1.0.1\"\nnetworks = [\"10.1.0.0/16\"]\nmedia_ports = \"20000-20099\"\n",
            "\n[domains.b]\ninterface = \"eth1\"\naddress = \"10.2.0.1\"\nnetworks = [\"10.2.0.0/16\"]\nmedia_ports = \"30000-30099\"\n",
            "\n[engine]\nqueues = 1\n",
            $rest
        )
    };
}

/// The head of a `[[signaling_route]]` section: route `name` of `kind` (`sip`, `rtsp`) over
/// `transport`, listening in domain `listen.0` on port `listen.1`, to `upstream`. The route's
/// further keys go right after it.
pub fn signaling_route(
    name: &str,
    kind: &str,
    transport: &str,
    (domain, port): (&str, u16),
    upstream: &str,
) -> String {
    format!(
        "[[signaling_route]]\nname = \"{name}\"\ntype = \"{kind}\"\ntransport = \"{transport}\"\nlisten_domain = \"{domain}\"\nlisten_port = {port}\nupstream = \"{upstream}\"\n"
    )
}

/// Whether `cmd` is on PATH (or in /usr/sbin, /sbin, where root's tools live).
pub fn on_path(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
        || Path::new("/usr/sbin").join(cmd).is_file()
        || Path::new("/sbin").join(cmd).is_file()
}

pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// `true` if the test can run. Otherwise: under `CI=true` panic naming what is missing;
/// elsewhere say plainly that the test did not run and return `false`.
pub fn prerequisites(test: &str, root: bool, commands: &[(&str, &str)]) -> bool {
    let mut missing = Vec::new();
    if root && !nix::unistd::geteuid().is_root() {
        missing.push("root (network namespaces need CAP_SYS_ADMIN)".to_string());
    }
    for (cmd, package) in commands {
        if !on_path(cmd) {
            missing.push(format!("the {cmd} command (apt-get install {package})"));
        }
    }
    if missing.is_empty() {
        return true;
    }
    test_did_not_run(test, &format!("missing {}", missing.join(", ")));
    false
}

/// `return`s from the test unless [`prerequisites`]`(test, root, commands)` holds (which
/// said why it did not run, or failed under `CI=true`). Without `test`, the name is the
/// enclosing function's ([`fn_name!`]).
#[macro_export]
macro_rules! require {
    ($test:expr, $root:expr, $commands:expr $(,)?) => {
        if !$crate::common::prerequisites($test, $root, $commands) {
            return;
        }
    };
    ($root:expr, $commands:expr $(,)?) => {
        $crate::require!($crate::fn_name!(), $root, $commands)
    };
}

/// One test per line, each running `run(args…)` (a scenario, once per mode) once its
/// prerequisites hold: `require!(root, needs)`, or `if ready` (a `fn(test) -> bool` that
/// said why not). Lines are `name => (args…)`, doc comments and attributes allowed first.
#[macro_export]
macro_rules! tests_of {
    ($run:ident, if $ready:ident; $($(#[$m:meta])* $name:ident => ($($arg:expr),*)),+ $(,)?) => {
        $(
            $(#[$m])*
            #[test]
            fn $name() {
                if !$ready($crate::fn_name!()) {
                    return;
                }
                $run($($arg),*);
            }
        )+
    };
    ($run:ident, $root:expr, $needs:expr; $($(#[$m:meta])* $name:ident => ($($arg:expr),*)),+ $(,)?) => {
        $(
            $(#[$m])*
            #[test]
            fn $name() {
                $crate::require!($root, $needs);
                $run($($arg),*);
            }
        )+
    };
}

/// The name of the enclosing function (a test's name), as a `&'static str`.
#[macro_export]
macro_rules! fn_name {
    () => {{
        fn f() {}
        fn name_of<T>(_: T) -> &'static str {
            std::any::type_name::<T>()
        }
        let path = name_of(f);
        let path = path.strip_suffix("::f").unwrap_or(path);
        path.rsplit("::").next().unwrap_or(path)
    }};
}

/// The one rule for a test that cannot run here (`why`: what is missing): under `CI=true`
/// it fails; elsewhere it says plainly that the test DID NOT RUN (and the caller returns).
pub fn test_did_not_run(test: &str, why: &str) {
    let msg = format!("{test}: {why}");
    if under_ci() {
        panic!("{msg}: CI must provide it (scripts/test.sh installs it)");
    }
    // Straight to the stderr handle: the harness captures eprintln! of passing tests.
    let _ = writeln!(io::stderr(), "{msg}: this test DID NOT RUN");
}

/// Debian's python3, which the Python peers (`tests/rtsp/server.py`, `tests/hostile/`) run on.
pub const PY: &str = "/usr/bin/python3";

/// `true` if GStreamer's RTSP server is there for [`PY`] (the RTSP peer in domain A);
/// otherwise [`test_did_not_run`].
pub fn have_gst_rtsp_server(test: &str) -> bool {
    let ok = Command::new(PY)
        .args([
            "-c",
            "import gi; gi.require_version('GstRtspServer','1.0'); gi.require_version('GstRtsp','1.0'); from gi.repository import GstRtspServer",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        test_did_not_run(test, &format!("missing GStreamer's RTSP server for {PY} (apt-get install python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base gstreamer1.0-plugins-good)"));
    }
    ok
}

/// Says plainly that one part of `test` did not run (`why`), and fails under `CI=true`: a
/// check that cannot run here never passes quietly.
pub fn part_did_not_run(test: &str, why: &str) {
    let msg = format!("{test}: {why}: this part of the test DID NOT RUN");
    if under_ci() {
        panic!("{msg}; CI must provide what it needs");
    }
    let _ = writeln!(io::stderr(), "{msg}");
}

/// The `vgate` binary built for these tests, or `VGATE_BIN` when set (`scripts/soak.sh` runs
/// a copy so a rebuild in the tree cannot swap the binary under a long run).
/// Runs the vgate binary with `args` to its end (a subcommand: check-config, health, ...).
pub fn run_vgate(args: &[&str]) -> std::process::Output {
    std::process::Command::new(vgate_bin())
        .args(args)
        .output()
        .unwrap()
}

/// Polls `f` every 20 ms until it holds; fails the test naming `what` after `within`.
pub fn wait_until(what: &str, within: std::time::Duration, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

pub fn vgate_bin() -> PathBuf {
    std::env::var_os("VGATE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_vgate")))
}

/// A bed from `scripts/testbed.sh` (namespaces `<name>a`, `<name>g`, `<name>b`); `down` on
/// drop, also during a panic.
pub struct Bed {
    pub name: String,
    pub env: HashMap<String, String>,
}

static BED_SEQ: AtomicU32 = AtomicU32::new(0);

/// `bash SCRIPT --name NAME --queues Q up` (`scripts/testbed.sh`, `scripts/split-bed.sh`):
/// the `KEY=value` lines it printed. Panics with its stderr if it failed.
pub fn bed_script_up(script: &str, name: &str, queues: usize) -> HashMap<String, String> {
    let out = proc::run_ok(
        Command::new("bash").args([
            script,
            "--name",
            name,
            "--queues",
            &queues.to_string(),
            "up",
        ]),
        &format!("{script} up"),
    );
    key_values(&out)
}

/// The `KEY=value` lines of a text.
pub fn key_values(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The nftables tables in namespace `ns` whose line contains `needle` (`vgate_`): what a
/// stopped vgate must not leave behind.
pub fn nft_tables(ns: &str, needle: &str) -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "list", "tables"])
        .output()
        .expect("nft list tables");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// Loads the nftables `rules` (an `nft -f` text) in namespace `ns`; panics if nft refuses.
pub fn nft_apply(ns: &str, rules: &str) {
    let mut nft = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("nft");
    nft.stdin
        .take()
        .unwrap()
        .write_all(rules.as_bytes())
        .unwrap();
    assert!(nft.wait().unwrap().success(), "nft -f in {ns}:\n{rules}");
}

pub fn testbed_script() -> String {
    format!("{}/scripts/testbed.sh", env!("CARGO_MANIFEST_DIR"))
}

impl Bed {
    pub fn up(queues: u32) -> Bed {
        let name = format!(
            "vgt{}x{}",
            std::process::id(),
            BED_SEQ.fetch_add(1, Ordering::Relaxed)
        );
        // The guard exists before the script runs, so a half-made bed is removed too.
        let mut bed = Bed {
            name,
            env: HashMap::new(),
        };
        bed.env = bed_script_up(&testbed_script(), &bed.name, queues as usize);
        bed
    }

    /// [`Bed::up`], and the gateway's namespace (`G_NS`).
    pub fn up_with_g_ns(queues: u32) -> (Bed, String) {
        let bed = Bed::up(queues);
        let g_ns = bed.get("G_NS").to_owned();
        (bed, g_ns)
    }

    pub fn get(&self, key: &str) -> &str {
        self.env
            .get(key)
            .unwrap_or_else(|| panic!("testbed.sh printed no {key}"))
    }

    /// The namespaces of domain A, domain B and the gateway.
    pub fn namespaces(&self) -> (String, String, String) {
        (
            self.get("A_NS").to_owned(),
            self.get("B_NS").to_owned(),
            self.get("G_NS").to_owned(),
        )
    }

    pub fn ip(&self, key: &str) -> Ipv4Addr {
        self.get(key).parse().expect("an IPv4 address")
    }

    /// The peers' and the gateway's addresses, as text: `[A_IP, B_IP, GA_IP, GB_IP]`.
    pub fn addresses(&self) -> [String; 4] {
        ["A_IP", "B_IP", "GA_IP", "GB_IP"].map(|k| self.get(k).to_owned())
    }

    /// The start of a config for the gateway on this bed (see [`BedConfig`]); the sections a
    /// test adds go after it (a key first lands in `[control]`).
    pub fn config(&self, c: BedConfig) -> String {
        let security = if c.policy.is_empty() {
            String::new()
        } else {
            format!("[security]\nsource_validation = \"{}\"\n", c.policy)
        };
        format!(
            r#"
[domains.a]
interface = "{ga_if}"
address = "{ga_ip}"
networks = ["10.201.1.0/24"]
media_ports = "20000-{a_last}"
[domains.b]
interface = "{gb_if}"
address = "{gb_ip}"
networks = ["10.201.2.0/24"]
media_ports = "30000-{b_last}"
[engine]
mode = "{mode}"
queues = {queues}
{engine}{security}[control]
listen = "{control}"
"#,
            ga_if = self.get("GA_IF"),
            ga_ip = self.get("GA_IP"),
            gb_if = self.get("GB_IF"),
            gb_ip = self.get("GB_IP"),
            a_last = 20000 + c.ports - 1,
            b_last = 30000 + c.ports - 1,
            mode = c.mode,
            queues = c.queues,
            engine = c.engine,
            control = c.control,
        )
    }
}

/// What [`Bed::config`] writes: the gateway's domains on the bed's interfaces and addresses
/// (networks `10.201.1.0/24` and `10.201.2.0/24`), `ports` media ports from 20000 (A) and
/// 30000 (B); `[engine]` with `mode`, `queues` and the `engine` lines; `source_validation =
/// policy` (none written when empty); the admin interface on `control`.
#[derive(Clone, Copy, Debug)]
pub struct BedConfig<'a> {
    pub mode: &'a str,
    pub queues: usize,
    pub ports: u16,
    pub policy: &'a str,
    pub control: &'a str,
    pub engine: &'a str,
}

impl Default for BedConfig<'_> {
    fn default() -> Self {
        BedConfig {
            mode: "stack",
            queues: 1,
            ports: 1000,
            policy: "strict",
            control: "127.0.0.1:9940",
            engine: "",
        }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .args([&testbed_script(), "--name", &self.name, "down"])
            .status();
    }
}

/// Every `.rs` file below `dir`, appended to `out` (the source readers: `docs`, `layering`).
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Moves the calling thread into network namespace `name` (an `ip netns` name). Only this
/// thread moves; the rest of the process stays where it is.
pub fn enter_netns(name: &str) -> io::Result<()> {
    let f = File::open(format!("/var/run/netns/{name}"))?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)
}

/// Runs `f` on a dedicated thread inside network namespace `ns`; re-raises its panic.
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = ns.to_owned();
    std::thread::spawn(move || {
        enter_netns(&ns).unwrap_or_else(|e| panic!("setns into {ns}: {e}"));
        f()
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p))
}
