//! `/init` of the test bed's guest (PID 1): mounts the kernel filesystems, runs the scenarios
//! named by `railscope.scenarios=a,b` on the kernel command line and powers off.
//!
//! Started by a scenario (so not as PID 1) with `cq-overflow ARGS`, it runs that verbs
//! program instead ([`testbed_guest::cq_overflow`]); with `iwarp-errors ARGS`, the iWARP one
//! ([`testbed_guest::iwarp_errors`]).

use std::time::Instant;

use testbed_guest::{cq_overflow, guest, iwarp_errors, scenarios};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if std::process::id() != 1 && args.first().map(String::as_str) == Some(cq_overflow::COMMAND) {
        if let Err(e) = cq_overflow::main(&args[1..]) {
            eprintln!("cq-overflow: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if std::process::id() != 1 && args.first().map(String::as_str) == Some(iwarp_errors::COMMAND) {
        if let Err(e) = iwarp_errors::main(&args[1..]) {
            eprintln!("iwarp-errors: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if let Err(e) = guest::init_system() {
        println!("guest-init: could not prepare the system: {e:#}");
    }
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let wanted = guest::cmdline_value(&cmdline, "railscope.scenarios").unwrap_or_default();
    for name in wanted.split(',').filter(|s| !s.is_empty()) {
        println!("RAILSCOPE-SCENARIO-BEGIN {name}");
        let started = Instant::now();
        // A scenario that panics (the testkit's helpers assert) fails alone: the init, which
        // is PID 1, goes on to the next one.
        let verdict = match std::panic::catch_unwind(|| scenarios::run(name)) {
            Ok(Ok(())) => "PASS".to_owned(),
            Ok(Err(e)) => format!("FAIL {}", format!("{e:#}").replace('\n', " | ")),
            Err(panic) => format!("FAIL panicked: {}", panic_message(&*panic)),
        };
        println!(
            "scenario {name} took {:.1} s",
            started.elapsed().as_secs_f64()
        );
        println!("RAILSCOPE-SCENARIO {name} {verdict}");
    }
    guest::power_off();
}

/// What a panic said (its `&str` or `String` payload).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
        .replace('\n', " | ")
}
