//! The PF_RING engines from the outside: `vgate run` with `--engine pfring` / `pfring-zc`.
//!
//! - Built without the `pfring` feature (the default): both engines exit non-zero saying
//!   vgate was built without PF_RING. Runs anywhere, no privileges.
//! - Built with it (`--features pfring`, libpfring.so on the loader's path): on the
//!   three-namespace bed's 4-queue veths, where `pf_ring.ko` is not loaded (it cannot be on
//!   these machines), `--mode tnapi` — with `--engine pfring` and without `--engine` — and
//!   `--mode zc --engine pfring-zc` fail with the errno-97 sentence naming the device
//!   (`IFACE@0`, `zc:IFACE@0`) and the engine that runs the mode without PF_RING. Needs root
//!   and `ip`; otherwise it says it did not run.

mod common;

use std::process::Command;

use common::vgate_bin;

/// `vgate run` with `args` (through `wrapper`, e.g. `ip netns exec NS`): exit success and
/// stderr.
fn run(wrapper: &[&str], args: &[&str]) -> (bool, String) {
    let bin = vgate_bin();
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(&bin);
            c
        }
        None => Command::new(&bin),
    };
    let out = cmd
        .arg("run")
        .args(args)
        .args(["--stats-interval", "0"])
        .output()
        .expect("run vgate");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[cfg(not(feature = "pfring"))]
#[test]
fn without_pfring_the_engines_say_so() {
    for args in [
        ["--mode", "tnapi", "--engine", "pfring"],
        ["--mode", "zc", "--engine", "pfring-zc"],
    ] {
        let (ok, err) = run(&[], &args);
        assert!(!ok, "{args:?} must fail: {err}");
        assert!(err.contains("built without PF_RING"), "{args:?}: {err}");
        assert!(err.contains(args[3]), "{args:?} names the engine: {err}");
    }
}

#[cfg(feature = "pfring")]
#[test]
fn without_the_module_open_fails_with_errno_97() {
    use common::{prerequisites, Bed};
    use std::io::Write;

    const TEST: &str = "without_the_module_open_fails_with_errno_97";
    require!(TEST, true, &[("ip", "iproute2")]);
    if std::path::Path::new("/proc/net/pf_ring").exists() {
        eprintln!("{TEST}: pf_ring.ko is loaded here: this test DID NOT RUN");
        return;
    }
    let (_, probe) = run(&[], &["--mode", "tnapi", "--engine", "pfring"]);
    if probe.contains("libpfring.so not found") {
        common::test_did_not_run(
            TEST,
            &format!("libpfring.so is not on the loader's path: {probe}"),
        );
        return;
    }
    let bed = Bed::up(4);
    let config = bed.config(common::BedConfig {
        mode: "tnapi",
        policy: "",
        control: "127.0.0.1:9941",
        ..Default::default()
    });
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(config.as_bytes()).unwrap();
    let path = file.path().to_str().unwrap().to_owned();
    let ns = format!("{}g", bed.name);
    let wrapper = ["ip", "netns", "exec", ns.as_str()];
    let ga_if = bed.get("GA_IF");
    for (args, device, alternative) in [
        (
            vec!["--config", &path, "--engine", "pfring"],
            format!("{ga_if}@0"),
            "--engine afpacket",
        ),
        // No --engine: a PF_RING build prefers PF_RING, and says what runs without it.
        (
            vec!["--config", &path],
            format!("{ga_if}@0"),
            "--engine afpacket",
        ),
        (
            vec!["--config", &path, "--mode", "zc", "--engine", "pfring-zc"],
            format!("zc:{ga_if}@0"),
            "--engine afxdp",
        ),
    ] {
        let (ok, err) = run(&wrapper, &args);
        assert!(!ok, "{args:?} must fail without pf_ring.ko: {err}");
        assert!(
            err.contains(&format!(
                "cannot open PF_RING device {device}: pf_ring.ko is not loaded (modprobe pf_ring)"
            )),
            "{args:?}: {err}"
        );
        assert!(err.contains("errno 97"), "{args:?}: {err}");
        assert!(err.contains(alternative), "{args:?}: {err}");
    }
}
