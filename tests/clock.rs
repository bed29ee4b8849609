//! The timers' clock: monotonic (an NTP step must neither end calls nor feed the watchdog of a
//! dead worker), and in a leaf module, so signaling and control do not import the data path.

use std::path::Path;

fn monotonic_ms() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000
}

#[test]
fn timers_run_on_the_monotonic_clock() {
    let before = monotonic_ms();
    let ours = vgate::clock::now_ms();
    let after = monotonic_ms();
    assert!(
        (before..=after).contains(&ours),
        "the timers' clock reads {ours}, CLOCK_MONOTONIC {before}..{after}: not the monotonic clock"
    );
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn signaling_and_control_do_not_import_the_data_path_for_time() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&root.join("signaling"), &mut files);
    rust_files(&root.join("control"), &mut files);
    files.push(root.join("cli.rs"));
    let mut offenders = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        // Reading `clock::wall_ms()` is the point; defining a wall clock of one's own is not.
        if text.contains("channel::now_ms") || text.contains("fn wall_ms(") {
            offenders.push(f.display().to_string());
        }
    }
    assert!(
        offenders.is_empty(),
        "timers outside the leaf clock module (use vgate::clock): {offenders:?}"
    );
}
