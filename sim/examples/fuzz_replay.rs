//! Replays one fuzz input on stable and prints what it decodes to:
//! `cargo run -p sim --example fuzz_replay -- <target> <file>`
//! (targets: `sim::fuzzing::TARGETS`, the `*_state` ones included). A broken guarantee
//! panics with the rule's id, as in the fuzzer.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [target, file] = args.as_slice() else {
        eprintln!("usage: fuzz_replay <target> <file>; targets: {}", sim::fuzzing::TARGETS.join(", "));
        std::process::exit(2);
    };
    let data = std::fs::read(file).unwrap_or_else(|e| panic!("{file}: {e}"));
    let Some(decoded) = sim::fuzzing::describe(target, &data) else {
        eprintln!("unknown target {target}; targets: {}", sim::fuzzing::TARGETS.join(", "));
        std::process::exit(2);
    };
    println!("{decoded}");
    sim::fuzzing::run(target, &data);
    println!("{target}: every guarantee held");
}
