//! The compiler's messages when a layer is given what it cannot use (H4): they name the trait
//! that is missing and say how to fix it. Compile-fail tests (trybuild) against the messages in
//! `tests/ui/*.stderr`.
//!
//! The messages are the compiler's words, which change between its releases: they are pinned
//! to the toolchain named in `tests/ui/TOOLCHAIN`, and checked only on it (on another, the test
//! says so and passes). `TRYBUILD=overwrite cargo test -p persevere-tower --all-features --test
//! diagnostics` writes them anew; then update `TOOLCHAIN`.

use std::process::Command;

/// The `rustc` release the messages were written with, if it is the one that runs.
fn pinned_toolchain() -> Result<(), String> {
    let pinned = include_str!("ui/TOOLCHAIN").trim();
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let output = Command::new(rustc).arg("--version").output().map_err(|e| e.to_string())?;
    let running = String::from_utf8_lossy(&output.stdout);
    match running.split_whitespace().nth(1) {
        Some(version) if version == pinned => Ok(()),
        other => Err(format!("the messages are pinned to rustc {pinned}, and rustc {other:?} runs")),
    }
}

#[test]
fn h4_a_missing_replay_body_or_classifier_is_named_with_its_fix() {
    if let Err(why) = pinned_toolchain() {
        eprintln!("not checked: {why}");
        return;
    }
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
