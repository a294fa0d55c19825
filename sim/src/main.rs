//! `cargo run -p sim --release`: the seeded suite, its report, and the contention experiment.
//!
//! - `cargo run -p sim --release` — every scenario family, `SIM_RUNS` scenarios each (default
//!   20 000), with core events per second and the checks per guarantee, then the contention
//!   table, the outage experiment's and the overload experiment's (L5); the plots go to
//!   `target/sim/contention.svg`, `contention-time.svg`, `outage.svg` and `overload.svg`.
//! - `cargo run -p sim --release -- overload` — the overload experiment only.
//! - `cargo run -p sim --release -- sweep <family> <count> [first seed]` — one family only.
//! - `cargo run -p sim --release -- replay <family> <seed>` — one scenario, with its trace hash,
//!   or its violation with the recent trace.

use std::process::ExitCode;
use std::time::Instant as WallClock;

use sim::contention::{self, Strategy};
use sim::plot::{Series, line_chart};
use sim::world::{RULES, rule_name};
use sim::{Machine, suite};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("replay") => replay(&args[1..]),
        Some("sweep") => sweep(&args[1..]),
        None | Some("report") => report(),
        Some("overload") => {
            overload_report();
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("unknown command {other:?}; use `replay <family> <seed>`, `sweep`, `overload` or no argument");
            ExitCode::FAILURE
        }
    }
}

fn replay(args: &[String]) -> ExitCode {
    let (Some(machine), Some(seed)) =
        (args.first().and_then(|m| Machine::from_name(m)), args.get(1).and_then(|s| s.parse::<u64>().ok()))
    else {
        let names: Vec<_> = Machine::ALL.iter().map(|m| m.name()).collect();
        eprintln!("usage: replay <family> <seed>, with family one of {names:?}");
        return ExitCode::FAILURE;
    };
    match machine.run(seed) {
        Ok(summary) => {
            println!(
                "{} seed {seed}: ok — {} steps, {} checks, {} events, trace hash {:016x}",
                machine.name(),
                summary.steps,
                summary.checks,
                summary.events,
                summary.trace_hash
            );
            ExitCode::SUCCESS
        }
        Err(violation) => {
            eprintln!("{violation}");
            ExitCode::FAILURE
        }
    }
}

fn sweep(args: &[String]) -> ExitCode {
    let (Some(machine), Some(count)) =
        (args.first().and_then(|m| Machine::from_name(m)), args.get(1).and_then(|s| s.parse::<u64>().ok()))
    else {
        let names: Vec<_> = Machine::ALL.iter().map(|m| m.name()).collect();
        eprintln!("usage: sweep <family> <count> [first seed], with family one of {names:?}");
        return ExitCode::FAILURE;
    };
    let first = args.get(2).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    let started = WallClock::now();
    match suite(machine, first, count) {
        Ok(t) => {
            let secs = started.elapsed().as_secs_f64();
            println!(
                "{}: {} scenarios, {} steps, {} checks, {} events, {:.0} events/s",
                machine.name(),
                t.scenarios,
                t.steps,
                t.checks,
                t.events,
                t.events as f64 / secs
            );
            print_rules(&t.by_rule);
            ExitCode::SUCCESS
        }
        Err(violation) => {
            eprintln!("{violation}");
            ExitCode::FAILURE
        }
    }
}

fn print_rules(by_rule: &[u64; RULES]) {
    let cells: Vec<String> =
        (0..RULES).filter(|&i| by_rule[i] > 0).map(|i| format!("{} {}", rule_name(i), by_rule[i])).collect();
    println!("  checks per rule: {}", cells.join(", "));
}

fn report() -> ExitCode {
    let runs: u64 = std::env::var("SIM_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let first: u64 = std::env::var("SIM_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    println!("persevere simulator — {runs} scenarios per family from seed {first}\n");
    println!(
        "{:<12} {:>10} {:>13} {:>14} {:>12} {:>15} {:>13} {:>8}",
        "family", "scenarios", "core events", "checks", "traced", "core events/s", "traced/s", "seconds"
    );
    let mut failed = false;
    let mut all = sim::Totals::default();
    let mut all_secs = 0.0;
    for machine in Machine::ALL {
        let started = WallClock::now();
        match suite(machine, first, runs) {
            Ok(t) => {
                let secs = started.elapsed().as_secs_f64();
                all_secs += secs;
                println!(
                    "{:<12} {:>10} {:>13} {:>14} {:>12} {:>15.0} {:>13.0} {:>8.2}",
                    machine.name(),
                    t.scenarios,
                    t.steps,
                    t.checks,
                    t.events,
                    t.steps as f64 / secs,
                    t.events as f64 / secs,
                    secs
                );
                all.scenarios += t.scenarios;
                all.steps += t.steps;
                all.checks += t.checks;
                all.events += t.events;
                for (total, n) in all.by_rule.iter_mut().zip(t.by_rule) {
                    *total += n;
                }
            }
            Err(violation) => {
                failed = true;
                eprintln!("\n{violation}\n");
            }
        }
    }
    println!(
        "{:<12} {:>10} {:>13} {:>14} {:>12} {:>15.0} {:>13.0} {:>8.2}",
        "all",
        all.scenarios,
        all.steps,
        all.checks,
        all.events,
        all.steps as f64 / all_secs,
        all.events as f64 / all_secs,
        all_secs
    );
    println!("(a core event is one input fed to a core machine or one output drained from it)");
    // G0: the first seeds of every family, run twice, give the same trace.
    let mut same = 0u64;
    for machine in Machine::ALL {
        for seed in first..first.saturating_add(runs.min(200)) {
            if let (Ok(a), Ok(b)) = (machine.run(seed), machine.run(seed)) {
                if a == b {
                    same += 1;
                } else {
                    failed = true;
                    eprintln!("G0 violated: {} seed {seed} gave two different traces", machine.name());
                }
            }
        }
    }
    all.by_rule[0] += same;
    println!("\nguarantees checked (all families):");
    print_rules(&all.by_rule);

    println!("\ncontention: clients competing for one resource (1 ms slots; base 5 ms, cap 10 s; mean of 20 runs)\n");
    let contenders = [10u32, 25, 50, 100, 200];
    print!("{:<20}", "strategy");
    for n in contenders {
        print!(" {:>15}", format!("{n} clients"));
    }
    println!();
    let (mut series, mut time_series) = (Vec::new(), Vec::new());
    for strategy in Strategy::ALL {
        print!("{:<20}", strategy.name());
        let (mut points, mut times) = (Vec::new(), Vec::new());
        for n in contenders {
            let c = contention::mean(strategy, n, 20, 1);
            print!(" {:>15}", format!("{} / {:.2}s", c.calls, c.finished.as_secs_f64()));
            points.push((f64::from(n), c.calls as f64));
            times.push((f64::from(n), c.finished.as_secs_f64() * 1e3));
        }
        println!();
        series.push(Series { name: strategy.name(), points });
        time_series.push(Series { name: strategy.name(), points: times });
    }
    println!("(each cell: total calls / time until the last client finished)");
    let plain = contention::mean(Strategy::Exponential, 100, 20, 1).calls;
    for strategy in [Strategy::Full, Strategy::Decorrelated] {
        let calls = contention::mean(strategy, 100, 20, 1).calls;
        println!(
            "at 100 contenders, {} makes {:.0}% of the calls of capped exponential without jitter",
            strategy.name(),
            100.0 * calls as f64 / plain as f64
        );
    }
    write_plot(
        "contention.svg",
        &line_chart("Total calls to finish, by retry strategy", "contenders", "total calls (log)", &series, true),
    );
    write_plot(
        "contention-time.svg",
        &line_chart(
            "Time until the last client finished, by retry strategy",
            "contenders",
            "milliseconds (log)",
            &time_series,
            true,
        ),
    );
    outage_report();
    overload_report();
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

/// The outage experiment's table and its timeline plot.
fn outage_report() {
    use sim::outage::{self, Protection};
    println!(
        "\noutage: {} clients, {} requests/s in all, each retried up to 3 times (exponential backoff from 20 ms, \
         full jitter); the dependency fails every call from {:?} to {:?}, and serves at most 1.5x the requests\n",
        outage::CLIENTS,
        outage::CLIENTS * 1_000 / outage::REQUEST_EVERY.as_millis() as u64,
        outage::OUTAGE_START,
        outage::OUTAGE_END
    );
    println!("{:<26} {:>14} {:>18} {:>12}", "protection", "amplification", "time to recover", "succeeded");
    let mut series = Vec::new();
    for protection in Protection::ALL {
        let run = outage::run(protection, 1);
        println!(
            "{:<26} {:>13.2}x {:>18} {:>11.1}%",
            protection.name(),
            run.amplification(),
            run.recovery.map_or("never".to_owned(), |d| format!("{} ms", d.as_millis())),
            100.0 * run.success_ratio()
        );
        let window = outage::WINDOW.as_secs_f64();
        let points = run.calls_per_window.iter().enumerate().map(|(w, &n)| (w as f64 * window, f64::from(n))).collect();
        series.push(Series { name: protection.name(), points });
    }
    println!(
        "(amplification: calls reaching the dependency per request sent during the outage; time to recover: \
         from the outage's end to the first 100 ms in which 99% of the requests sent succeed)"
    );
    write_plot(
        "outage.svg",
        &line_chart("Calls reaching the dependency during an outage", "seconds", "calls per 100 ms", &series, false),
    );
}

/// The overload experiment's table (L5) and its latency timeline at 5× overload.
fn overload_report() {
    use sim::overload::{self, Guard};
    println!(
        "\noverload: a server of capacity C = {:.0} requests/s ({} workers, {:?} ± 10% each: the no-load latency), \
         Poisson arrivals at 1x, 2x and 5x C for {:?}, clients giving up after {:?}; measured after the first {:?}\n",
        overload::capacity(),
        overload::WORKERS,
        overload::SERVICE,
        overload::DURATION,
        overload::CLIENT_TIMEOUT,
        overload::WARMUP
    );
    let loads = [1.0, 2.0, 5.0];
    print!("{:<18}", "limit");
    for load in loads {
        print!(" {:>26}", format!("{load}x: goodput p50 / p99"));
    }
    println!();
    let mut series = Vec::new();
    for guard in Guard::ALL {
        print!("{:<18}", guard.name());
        for load in loads {
            let run = overload::run(guard, load, overload::DURATION, 1);
            let cell = format!(
                "{:.0}% {:.1}x / {:.1}x",
                100.0 * run.goodput(overload::DURATION),
                run.latency(0.5),
                run.latency(0.99)
            );
            print!(" {cell:>26}");
            if load == 5.0 && !matches!(guard, Guard::AimdPreset | Guard::VegasPreset | Guard::Gradient2Preset) {
                // Windows with no measured answer (the warm-up's) are left out.
                let points = run
                    .p99_per_window
                    .iter()
                    .enumerate()
                    .filter(|&(_, &p99)| p99 > 0.0)
                    .map(|(w, &p99)| (w as f64 / 10.0, p99))
                    .collect();
                series.push(Series { name: guard.name(), points });
            }
        }
        println!();
    }
    println!(
        "(goodput: answers within the client's timeout per second, as a share of C; latency of the answered requests \
         as a multiple of the no-load latency; the presets are the published defaults unchanged)"
    );
    write_plot(
        "overload.svg",
        &line_chart("p99 latency at 5x overload, by arrival time", "seconds", "p99 latency, ms (log)", &series, true),
    );
}

/// Writes `svg` to `target/sim/<name>` in the workspace.
fn write_plot(name: &str, svg: &str) {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(std::path::Path::new("."));
    let path = workspace.join("target/sim").join(name);
    match std::fs::create_dir_all(path.parent().expect("a parent")).and_then(|()| std::fs::write(&path, svg)) {
        Ok(()) => println!("plot written to {}", path.display()),
        Err(e) => eprintln!("could not write the plot to {}: {e}", path.display()),
    }
}
