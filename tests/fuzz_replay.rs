//! Replays every fuzz corpus entry and every crash the fuzzers ever found
//! (`fuzz/corpus/<target>/`, `fuzz/regressions/<target>/`) through the same entry points the
//! fuzz targets call, so the normal test run keeps them fixed.

use std::path::Path;

#[test]
fn fuzz_corpus_and_regressions_replay_without_panic() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut replayed = 0;
    for (name, target) in vgate::fuzzing::TARGETS {
        let mut seen_any = false;
        for dir in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(name)) else {
                continue;
            };
            for e in entries.flatten() {
                let data = std::fs::read(e.path()).unwrap();
                target(&data);
                replayed += 1;
                seen_any = true;
            }
        }
        assert!(
            seen_any,
            "fuzz target {name} has no corpus in fuzz/corpus/{name}"
        );
    }
    println!("replayed {replayed} inputs");
}
