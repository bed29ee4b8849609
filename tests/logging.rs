//! Logs an operator can filter: under journald (`JOURNAL_STREAM` naming stderr) every line
//! starts with its syslog priority (`<3>` error ... `<7>` debug) and carries no timestamp;
//! `--log-format json` writes one JSON object per line; the level changes at run time
//! through the admin API (`vgate log-level`).

mod common;

use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn config(net: u8) -> String {
    common::vgate::loopback_config(net, &[], &[])
}

/// `vgate run` with stderr into a file (journald's `JOURNAL_STREAM` names that file, which
/// the pipe of [`common::vgate::Vgate`] could not be); stopped on drop.
struct Run {
    _child: common::proc::Proc,
    log: tempfile::NamedTempFile,
    config: tempfile::NamedTempFile,
}

impl Run {
    fn start(net: u8, args: &[&str], journal: bool) -> Run {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), config(net)).unwrap();
        let log = tempfile::NamedTempFile::new().unwrap();
        let meta = log.as_file().metadata().unwrap();
        let mut cmd = Command::new(common::vgate_bin());
        cmd.args(args)
            .args(["run", "--stats-interval", "0", "--config"])
            .arg(file.path())
            .env_remove("JOURNAL_STREAM")
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap());
        if journal {
            cmd.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()));
        }
        let run = Run {
            _child: common::proc::Proc::spawn(&mut cmd),
            log,
            config: file,
        };
        run.wait_for("admin interface");
        run
    }

    fn text(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap()
    }

    fn wait_for(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let t = self.text();
            if let Some(l) = t.lines().find(|l| l.contains(needle)) {
                return l.to_string();
            }
            assert!(Instant::now() < deadline, "no {needle:?} in:\n{t}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(common::vgate_bin())
            .args(args)
            .arg("--config")
            .arg(self.config.path())
            .output()
            .unwrap()
    }
}

#[test]
fn journald_lines_carry_priorities_and_the_level_changes_at_run_time() {
    let run = Run::start(33, &[], true);
    let info = run.wait_for("vgate running");
    assert!(info.starts_with("<6>"), "{info}");
    assert!(
        !info.contains("Z "),
        "no timestamp under journald (it adds its own): {info}"
    );

    // An error: a reload of a config that does not validate.
    std::fs::write(run.config.path(), config(33) + "bogus_key = 1\n").unwrap();
    let out = run.cli(&["reload"]);
    assert!(!out.status.success(), "{out:?}");
    let err = run.wait_for("reload rejected");
    assert!(err.starts_with("<3>"), "{err}");
    std::fs::write(run.config.path(), config(33)).unwrap();

    // The level at run time.
    let out = run.cli(&["log-level"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "info");
    let out = run.cli(&["log-level", "debug"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "debug");
    let changed = run.wait_for("log level set to debug");
    assert!(changed.starts_with("<6>"), "{changed}");
    let out = run.cli(&["log-level", "vgate=loud"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot parse the log filter"),
        "{out:?}"
    );
    // At warn, the info line of a successful reload is not written.
    let out = run.cli(&["log-level", "warn"]);
    assert!(out.status.success(), "{out:?}");
    let before = run.text().lines().count();
    let out = run.cli(&["reload"]);
    assert!(out.status.success(), "{out:?}");
    let t = run.text();
    let after: Vec<&str> = t.lines().skip(before).collect();
    assert!(
        after
            .iter()
            .all(|l| l.starts_with("<3>") || l.starts_with("<4>")),
        "only warnings and errors at level warn: {after:?}"
    );
    for l in t.lines() {
        assert!(
            ["<3>", "<4>", "<6>", "<7>"]
                .iter()
                .any(|p| l.starts_with(p)),
            "every line has a priority: {l}"
        );
    }
}

#[test]
fn json_lines_for_log_shippers() {
    let run = Run::start(34, &["--log-format", "json"], false);
    run.wait_for("vgate running");
    let t = run.text();
    let mut n = 0;
    for l in t.lines() {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{l}");
        assert!(v["fields"]["message"].is_string(), "{l}");
        n += 1;
    }
    assert!(n >= 2, "{t}");
}
