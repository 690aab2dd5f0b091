//! The agent on this host, as an operator would run it: the probes' programs pass this
//! kernel's verifier, `railscope probes` says what attaches and why not, and `railscope agent`
//! keeps running when a probe cannot attach. Needs root (loading eBPF programs).

use std::{
    io::Read as _,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::Duration,
};

const RAILSCOPE: &str = env!("CARGO_BIN_EXE_railscope");

/// What this kernel should say about the IB event probe (the start of its status).
fn expected_ib_status() -> &'static str {
    if !Path::new("/sys/module/ib_core").exists() {
        "unavailable: ib_core not loaded: IB event and verb probes inactive"
    } else if !Path::new("/sys/bus/event_source/devices/kprobe").exists() {
        "unavailable: kernel has no kprobe support"
    } else if !Path::new("/sys/kernel/btf/ib_core").exists() {
        // An ib_core built without BTF (MLNX_OFED's, or CONFIG_DEBUG_INFO_BTF_MODULES=n):
        // its layout cannot be read, so the probe cannot attach.
        "unavailable: "
    } else {
        "attached"
    }
}

#[test]
fn every_program_passes_this_kernels_verifier() {
    let verdicts = monitor_user::probes::verify_all().expect("the eBPF object loads");
    assert!(!verdicts.is_empty());
    for v in &verdicts {
        assert!(v.result.is_ok(), "{} rejected: {:?}", v.program, v.result);
    }
    let names: Vec<&str> = verdicts.iter().map(|v| v.program.as_str()).collect();
    for info in monitor_user::probes::CATALOGUE {
        assert!(
            names.contains(&info.program),
            "{} not in the object",
            info.program
        );
    }
}

#[test]
fn probes_command_prints_the_table_with_reasons() {
    let out = Command::new(RAILSCOPE)
        .args(["probes", "--verify"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = stdout.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with("PROBE") && header.contains("HOOK") && header.contains("STATUS"));
    let row = lines.next().unwrap();
    assert!(row.starts_with("ib_dispatch_event"), "{row}");
    assert!(row.contains("kprobe:ib_dispatch_event"), "{row}");
    assert!(row.contains(expected_ib_status()), "{row}");
    assert!(
        stdout.contains("verifier: ib_dispatch_event accepted"),
        "{stdout}"
    );
}

#[test]
fn probes_command_json_lists_status_and_reason() {
    let out = Command::new(RAILSCOPE)
        .args(["probes", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = &rows[0];
    assert_eq!(row["probe"], "ib_dispatch_event");
    assert_eq!(row["hook"], "kprobe:ib_dispatch_event");
    if expected_ib_status() == "attached" {
        assert_eq!(row["status"], "attached");
    } else {
        assert_eq!(row["status"], "unavailable");
        assert!(row["reason"].as_str().unwrap().len() > 10);
    }
}

#[test]
fn agent_keeps_running_without_ib_and_stops_on_sigint() {
    let mut child = Command::new(RAILSCOPE)
        .args(["agent", "--json"])
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    thread::sleep(Duration::from_secs(3));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the agent exited although only a probe was unavailable"
    );
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "exit {status}: {stderr}");
    assert!(stderr.contains("ib_dispatch_event"), "{stderr}");
    if expected_ib_status() != "attached" {
        // One warning per unavailable family, naming its probes and why, not one per rescan.
        let warnings: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("WARN") && l.contains("unavailable"))
            .collect();
        assert_eq!(warnings.len(), 3, "{stderr}");
        // The families attach in parallel: their warnings come in the order they finish.
        let ib_core: Vec<&&str> = warnings
            .iter()
            .filter(|w| w.contains("ib_dispatch_event"))
            .collect();
        assert_eq!(ib_core.len(), 1, "{stderr}");
        assert!(
            ib_core[0].contains("ib_core not loaded: IB event and verb probes inactive"),
            "{stderr}"
        );
    }
}
