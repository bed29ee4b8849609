//! `engine.cpus` against the machine's online CPUs, not this process's affinity: under
//! `taskset -c 1` (or systemd's `CPUAffinity=`) a config with `cpus = [1]` is accepted, and
//! each worker reports the CPU it really runs on.

mod common;

use std::io::Write;
use std::process::Command;

use common::{admin, on_path, test_did_not_run, vgate::Vgate};

fn config(cpus: &str) -> String {
    common::vgate::loopback_with(77, 9940, 100, &[], &[])
        + &format!("[engine]\nqueues = 1\ncpus = {cpus}\n")
}

fn online() -> Vec<usize> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut v = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => v.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => v.push(part.parse().unwrap()),
        }
    }
    v
}

/// Needs taskset and two online CPUs.
fn can_run(test: &str) -> bool {
    let mut missing = Vec::new();
    if !on_path("taskset") {
        missing.push("the taskset command (apt-get install util-linux)".to_string());
    }
    if online().len() < 2 {
        missing.push("a second online CPU".to_string());
    }
    if missing.is_empty() {
        return true;
    }
    test_did_not_run(test, &format!("missing {}", missing.join(", ")));
    false
}

fn check_config(affinity: &str, cfg: &str) -> (bool, String) {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(cfg.as_bytes()).unwrap();
    let out = Command::new("taskset")
        .args(["-c", affinity])
        .arg(common::vgate_bin())
        .arg("check-config")
        .arg(f.path())
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn cpus_are_checked_against_the_online_cpus() {
    if !can_run("cpus_are_checked_against_the_online_cpus") {
        return;
    }
    let last = *online().last().unwrap();
    // The affinity gives one CPU; the config names it (taskset -c N, cpus = [N]).
    let (ok, out) = check_config(&last.to_string(), &config(&format!("[{last}]")));
    assert!(ok, "cpus = [{last}] under taskset -c {last} refused: {out}");
    // Another online CPU outside the affinity (isolated CPUs, CPUAffinity=) is accepted too.
    let (ok, out) = check_config("0", &config(&format!("[{last}]")));
    assert!(ok, "cpus = [{last}] under taskset -c 0 refused: {out}");
    // A CPU that is not online is refused, naming the online ones.
    let (ok, out) = check_config("0", &config("[4095]"));
    assert!(!ok, "a CPU that does not exist was accepted: {out}");
    assert!(
        out.contains("engine.cpus") && out.contains("online"),
        "{out}"
    );
}

fn stats() -> serde_json::Value {
    admin::get_json("127.0.77.1:9940", "/api/v1/stats")
}

#[test]
fn workers_report_the_cpu_they_run_on() {
    if !can_run("workers_report_the_cpu_they_run_on") {
        return;
    }
    let last = *online().last().unwrap();
    let gw = Vgate::start_with(
        &["taskset", "-c", &last.to_string()],
        &config(&format!("[{last}]")),
        &[],
    );
    let st = stats();
    let w = &st["workers"][0];
    assert_eq!(w["cpu"], last, "worker 0 does not run on CPU {last}: {st}");
    assert_eq!(w["pinned"], true, "{st}");
    assert_eq!(w["configured_cpu"], last, "{st}");
    gw.stop();
}
