//! The hot-standby tests' scaffolding: `ip` and shell commands in namespaces, logged child
//! processes, the admin interface at `127.0.0.1:9940` inside a node's namespace, waiting
//! with the run's logs on failure, and keepalived's config for a pair ([`Keepalived`]).
//! (tests/ha_netns.rs still has its own copies of some of these.)

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::proc::Proc;

/// Where every HA test's vgate listens for its admin interface, inside its namespace.
pub const ADMIN: &str = "127.0.0.1:9940";

/// `ip ARGS`, which must succeed.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `sh -c CMD` in namespace `ns`: its stdout and stderr.
pub fn sh(ns: &str, cmd: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", cmd])
        .output()
        .expect("ip netns exec");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `ARGS` in namespace `ns`, stdout and stderr into file `log`.
pub fn spawn_logged(ns: &str, args: &[&str], log: &str) -> Proc {
    let f = std::fs::File::create(log).expect("log file");
    Proc::spawn(
        Command::new("ip")
            .args(["netns", "exec", ns])
            .args(args)
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f),
    )
}

/// `GET path` of the vgate in `ns` as JSON; `None` if it does not answer (yet).
pub fn admin_json(ns: &str, path: &str) -> Option<serde_json::Value> {
    let (ns, path) = (ns.to_owned(), path.to_owned());
    super::in_netns(&ns, move || {
        super::admin::try_get(ADMIN, &path)
            .ok()
            .and_then(|b| serde_json::from_str(&b).ok())
    })
}

/// The role in force of the vgate in `ns` (`active`, `standby`, `fault`).
pub fn role(ns: &str) -> Option<String> {
    admin_json(ns, "/api/v1/ha").and_then(|v| v["role"].as_str().map(str::to_owned))
}

/// The sum of `family`'s samples with `labels` in the `/metrics` of the vgate in `ns`.
pub fn metric(ns: &str, family: &str, labels: &[&str]) -> u64 {
    let text = super::admin::get_in(ns, ADMIN, "/metrics");
    super::admin::metric(&text, family, labels)
}

/// Waits for `f`, at most `within`; fails with `what` and `log()` (the run's logs).
pub fn wait_for(
    what: &str,
    within: Duration,
    mut f: impl FnMut() -> bool,
    log: impl Fn() -> String,
) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "{what} within {within:?}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last `n` lines of every `*.log` in `dir`, each under its name.
pub fn logs_in(dir: &std::path::Path, n: usize) -> String {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    files.sort();
    let mut out = String::new();
    for f in files {
        let t = std::fs::read_to_string(&f).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        out.push_str(&format!(
            "--- {}\n{}\n",
            f.display(),
            lines[lines.len().saturating_sub(n)..].join("\n")
        ));
    }
    out
}

/// keepalived's config for one node of a pair: VRRPv3 with 100 ms adverts on `interface`,
/// `nopreempt`, the virtual addresses `vips` (`"ADDR/LEN dev IF"`), `vgate health` as
/// track script and `track_file` (written by `vgate health --track-file`), and the notify
/// hooks: `notify(ROLE)` is the command keepalived runs.
pub struct Keepalived<'a> {
    pub node: &'a str,
    pub priority: u32,
    pub interface: &'a str,
    pub router_id: u8,
    pub vips: &'a [String],
    pub track_file: &'a str,
    pub notify: &'a dyn Fn(&str) -> String,
}

impl Keepalived<'_> {
    pub fn config(&self) -> String {
        let vgate = super::vgate_bin().display().to_string();
        let vips: String = self.vips.iter().map(|v| format!("        {v}\n")).collect();
        let n = |role: &str| (self.notify)(role);
        format!(
            r#"
global_defs {{
    router_id {node}
    script_user root
    enable_script_security
    vrrp_version 3
}}
vrrp_script vgate_health {{
    script "{vgate} health --admin {ADMIN}"
    interval 1
    timeout 1
    fall 1
    rise 1
}}
track_file vgate_alive {{
    file "{track_file}"
    weight 0
}}
vrrp_instance gw {{
    state BACKUP
    nopreempt
    interface {interface}
    virtual_router_id {router_id}
    priority {priority}
    advert_int 0.1
    virtual_ipaddress {{
{vips}    }}
    track_script {{
        vgate_health
    }}
    track_file {{
        vgate_alive weight 0
    }}
    notify_master "{master}"
    notify_backup "{backup}"
    notify_fault "{fault}"
    notify_stop "{stop}"
}}
"#,
            node = self.node,
            track_file = self.track_file,
            interface = self.interface,
            router_id = self.router_id,
            priority = self.priority,
            master = n("MASTER"),
            backup = n("BACKUP"),
            fault = n("FAULT"),
            stop = n("STOP"),
        )
    }

    /// Writes the config to `conf` and starts keepalived in `ns` (VRRP only, in the
    /// foreground, its pid files beside the config), logging to `log`.
    pub fn start(&self, ns: &str, conf: &str, log: &str) -> Proc {
        std::fs::write(conf, self.config()).unwrap();
        let (pid, vrrp_pid) = (format!("{conf}.pid"), format!("{conf}.vrrp.pid"));
        spawn_logged(
            ns,
            &[
                "keepalived",
                "-n",
                "-l",
                "-D",
                "--vrrp",
                "-f",
                conf,
                "-p",
                &pid,
                "-r",
                &vrrp_pid,
            ],
            log,
        )
    }
}

/// `vgate health --track-file FILE --every-ms 50` in `ns` (what `vgate-ha-health.service`
/// runs), once it wrote its first word (0: healthy).
pub fn start_watcher(ns: &str, file: &str, log: &str) -> Proc {
    let bin = super::vgate_bin().display().to_string();
    let p = spawn_logged(
        ns,
        &[
            &bin,
            "health",
            "--admin",
            ADMIN,
            "--track-file",
            file,
            "--every-ms",
            "50",
        ],
        log,
    );
    wait_for(
        "the health watcher's first word",
        Duration::from_secs(5),
        || std::fs::read_to_string(file).is_ok_and(|t| t.trim() == "0"),
        || std::fs::read_to_string(log).unwrap_or_default(),
    );
    p
}
