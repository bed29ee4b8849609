//! The .deb: `scripts/package.sh` builds it from the binary under test; `dpkg -i` installs
//! it; the installed config checks for the appliance (`--cpus 4`) and the installed units
//! verify; `dpkg -r` leaves only the conffiles and `dpkg -P` leaves nothing of the package
//! (the `vgate` system user stays, as Debian policy wants).

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn run(cmd: &str, args: &[&str]) -> Output {
    let out = Command::new(cmd)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn status() -> String {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${db:Status-Abbrev}", "vgate"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Purges the package if the test stops half-way.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        if !status().is_empty() {
            let _ = Command::new("dpkg").args(["-P", "vgate"]).output();
        }
    }
}

#[test]
fn deb_installs_checks_verifies_and_removes_cleanly() {
    require!(
        true,
        &[
            ("dpkg-deb", "dpkg"),
            ("systemd-analyze", "systemd"),
            ("strip", "binutils"),
        ]
    );
    let s = status();
    assert!(
        s.is_empty() || s.starts_with("un") || s.starts_with("pn"),
        "a vgate package is already installed here ({s}); this test installs and purges its own"
    );
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = tempfile::tempdir().unwrap();
    let bin = common::vgate_bin();
    let out = run(
        repo.join("scripts/package.sh").to_str().unwrap(),
        &[
            "--binary",
            bin.to_str().unwrap(),
            "--out",
            out_dir.path().to_str().unwrap(),
        ],
    );
    let deb = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(deb.ends_with(".deb") && Path::new(&deb).is_file(), "{deb}");
    let listing = String::from_utf8(run("dpkg-deb", &["-c", &deb]).stdout).unwrap();
    // Files (not directories) the package ships, as absolute paths.
    let files: Vec<String> = listing
        .lines()
        .filter(|l| !l.starts_with('d'))
        .filter_map(|l| l.split_whitespace().last())
        .map(|p| p.trim_start_matches('.').to_string())
        .collect();
    for want in [
        "/usr/bin/vgate",
        "/usr/lib/systemd/system/vgate.service",
        "/usr/lib/systemd/system/vgate-nic-setup.service",
        "/usr/lib/sysusers.d/vgate.conf",
        "/etc/vgate/vgate.toml",
        "/etc/vgate/nic.env",
        "/usr/share/man/man1/vgate.1.gz",
        "/usr/share/man/man1/vgate-run.1.gz",
        "/usr/share/bash-completion/completions/vgate",
        "/usr/share/zsh/vendor-completions/_vgate",
        "/usr/share/fish/vendor_completions.d/vgate.fish",
    ] {
        assert!(files.iter().any(|f| f == want), "{want} not in:\n{listing}");
    }
    let package = String::from_utf8(run("dpkg-deb", &["-f", &deb, "Package"]).stdout).unwrap();
    assert_eq!(package.trim(), "vgate");

    let _guard = Installed;
    run("dpkg", &["-i", &deb]);
    assert_eq!(status(), "ii");
    run("getent", &["passwd", "vgate"]);
    let check = run(
        "/usr/bin/vgate",
        &["check-config", "/etc/vgate/vgate.toml", "--cpus", "4"],
    );
    assert!(
        String::from_utf8_lossy(&check.stdout).contains(": ok:"),
        "{check:?}"
    );
    run(
        "systemd-analyze",
        &[
            "verify",
            "/usr/lib/systemd/system/vgate.service",
            "/usr/lib/systemd/system/vgate-nic-setup.service",
        ],
    );
    let conf =
        String::from_utf8(run("dpkg-query", &["-W", "-f=${Conffiles}", "vgate"]).stdout).unwrap();
    assert!(
        conf.contains("/etc/vgate/vgate.toml") && conf.contains("/etc/vgate/nic.env"),
        "{conf}"
    );

    // Remove: the program goes, the conffiles (the operator's config) stay.
    run("dpkg", &["-r", "vgate"]);
    assert_eq!(status(), "rc", "removed, config files kept");
    for f in &files {
        let kept = f == "/etc/vgate/vgate.toml" || f == "/etc/vgate/nic.env";
        assert_eq!(Path::new(f).exists(), kept, "{f} after dpkg -r");
    }

    // Purge: nothing of the package is left, not even its directories or unit state.
    run("dpkg", &["-P", "vgate"]);
    assert!(
        status().is_empty() || status().starts_with("un"),
        "{}",
        status()
    );
    for f in &files {
        assert!(!Path::new(f).exists(), "{f} after dpkg -P");
    }
    for dir in [
        "/etc/vgate",
        "/usr/lib/vgate",
        "/usr/share/vgate",
        "/usr/share/doc/vgate",
    ] {
        assert!(!Path::new(dir).exists(), "{dir} after dpkg -P");
    }
    let leftovers: Vec<_> = walk("/etc/systemd/system")
        .into_iter()
        .filter(|p| p.contains("vgate"))
        .collect();
    assert!(leftovers.is_empty(), "unit links left: {leftovers:?}");
}

fn walk(dir: &str) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        out.push(p.display().to_string());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk(&p.display().to_string()));
        }
    }
    out
}
