//! Replays the committed fuzz seed corpus (`fuzz/corpus/<target>/`) on stable, through the same
//! `sim::fuzzing` functions the cargo-fuzz targets call (see `fuzz/README.md`).
//!
//! `cargo run -p sim --example fuzz_replay -- <target> <file>` replays one input (a crash
//! artifact, say) and prints what it decodes to.

use std::path::{Path, PathBuf};

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target)
}

fn replay(target: &str) -> usize {
    let dir = corpus(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a readable corpus entry").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    for file in &files {
        let data = std::fs::read(file).expect("a readable corpus file");
        let result = std::panic::catch_unwind(|| sim::fuzzing::run(target, &data));
        match result {
            Ok(known) => assert!(known, "unknown target {target}"),
            Err(_) => panic!(
                "{target}: {} broke a guarantee; it decodes to\n{}",
                file.display(),
                sim::fuzzing::describe(target, &data).unwrap_or_default()
            ),
        }
    }
    files.len()
}

#[test]
fn every_target_has_a_seed_corpus_and_every_seed_passes() {
    for target in sim::fuzzing::TARGETS {
        let count = replay(target);
        assert!(count > 0, "fuzz/corpus/{target} is empty: the replay would pass vacuously");
    }
}
