//! hook-trace (on request): the kernel's own kprobe tracing (tracefs `kprobe_events`) on the
//! destroy functions and resource-tracker hooks during one `ibv_rc_pingpong`, printed with
//! their arguments — an independent view to compare the agent's counters with.

use std::{thread, time::Duration};

use crate::guest::{self, ADDR_B};

const PROBES: &[&str] = &[
    "p:rs/dealloc_pd ib_dealloc_pd_user pd=%di:x64 udata=%si:x64 dev=+8(%di):x64",
    "p:rs/dereg_mr ib_dereg_mr_user mr=%di:x64 udata=%si:x64",
    "p:rs/destroy_cq ib_destroy_cq_user cq=%di:x64 udata=%si:x64",
    "p:rs/destroy_qp ib_destroy_qp_user qp=%di:x64 udata=%si:x64",
    "p:rs/restrack_add rdma_restrack_add res=%di:x64",
    "p:rs/restrack_del rdma_restrack_del res=%di:x64",
];

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    let events = "/sys/kernel/tracing/kprobe_events";
    for p in PROBES {
        // Appending: opening kprobe_events with O_TRUNC would remove every kprobe event.
        let mut file = std::fs::OpenOptions::new().append(true).open(events)?;
        std::io::Write::write_all(&mut file, format!("{p}\n").as_bytes())?;
    }
    std::fs::write("/sys/kernel/tracing/events/rs/enable", "1")?;
    let gid = guest::ipv4_gid_index("rxe0")?.to_string();
    let server = guest::spawn_output(guest::in_cgroup(
        "",
        "/usr/bin/ibv_rc_pingpong",
        &["-d", "rxe1", "-g", &gid, "-n", "10"],
    ))?;
    thread::sleep(Duration::from_secs(1));
    let client = guest::spawn_output(guest::in_cgroup(
        "",
        "/usr/bin/ibv_rc_pingpong",
        &["-d", "rxe0", "-g", &gid, "-n", "10", ADDR_B],
    ))?;
    let _ = guest::check_output("client", client.join().expect("no panic"));
    let _ = guest::check_output("server", server.join().expect("no panic"));
    // SAFETY: the guest init is single-threaded here.
    unsafe { std::env::set_var("RAILSCOPE_LOG", "monitor_user=debug") };
    let mut agent = guest::Agent::start(&["--json"])?;
    agent.wait_for_log("ib_dealloc_pd_user attached", Duration::from_secs(20))?;
    let _ = guest::run("/usr/bin/bpftool", &["perf", "list"]);

    agent.stop()?;
    let trace = std::fs::read_to_string("/sys/kernel/tracing/trace")?;
    for line in trace.lines().filter(|l| !l.starts_with('#')) {
        println!("trace {line}");
    }
    Ok(())
}
