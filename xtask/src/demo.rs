//! `cargo xtask run --demo`: railscope on a machine without RDMA devices or GPUs. The test
//! bed's guest (Debian 6.1 in QEMU) runs the `demo` scenario (tests/testbed-guest/src/scenarios/demo.rs):
//! two Slurm-like jobs making soft-RoCE traffic (perftest, rping), a link that flaps now and
//! then, and the NVML stand-in replaying an 8-GPU node; its agent sends over QEMU's user
//! network to a collector started here on 127.0.0.1 (UDP 7670, HTTP 7671), whose dashboard
//! URL is printed once the guest's first frames are in. Ctrl-C stops QEMU (the guest lives
//! in an initramfs: nothing to save) and then the collector, which writes its archive out.

use std::{
    net::SocketAddr,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{
    cargo,
    http::{http_get, wait_http},
    setup::{self, Tools},
    testbed::{self, GuestFile, ImageSpec, KernelLine},
    vm_test,
};

/// The guest's key (tests/testbed-guest/src/guest.rs, `WIRE_KEY_HEX`): the demo's collector uses it.
const GUEST_KEY_HEX: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";

/// The node name the guest's agent sends as.
const NODE: &str = "demo-guest";

/// How long the guest may take from QEMU's start to its first frame at the collector.
const FIRST_FRAME_WITHIN: Duration = Duration::from_secs(300);

/// Runs the demo until Ctrl-C, or for `seconds` (then checks what a new user would look
/// at: live data, both jobs, a flapping-port finding). `udp`/`http`: the collector's
/// loopback addresses; `data`: its data directory (the demo's own, not the real one).
pub(crate) fn run(
    tools: &Tools,
    railscope: &Path,
    udp: &str,
    http: &str,
    data: &Path,
    seconds: Option<u64>,
) -> anyhow::Result<()> {
    let init = vm_test::build_guest_init(tools)?;
    let standin = crate::bench::build_standin(tools)?;
    let work_dir = cargo::workspace_root().join("target/demo");
    std::fs::create_dir_all(&work_dir)?;
    setup::step("building the demo's guest image (Debian 6.1, soft-RoCE, the NVML stand-in)");
    let image = testbed::build_image(
        &tools.cache_dir.join("testbed"),
        &work_dir,
        &ImageSpec {
            kernel: KernelLine::Bookworm,
            init,
            files: vec![
                GuestFile {
                    host: railscope.to_owned(),
                    guest: "/usr/bin/railscope".into(),
                    with_libs: true,
                },
                GuestFile {
                    host: standin,
                    guest: "/usr/lib/railscope/libnvidia-ml.so.1".into(),
                    with_libs: true,
                },
            ],
        },
    )?;

    // Each demo starts afresh: no archive or findings of an earlier run.
    if data.exists() {
        std::fs::remove_dir_all(data)
            .with_context(|| format!("cannot remove the last demo's data {}", data.display()))?;
    }
    std::fs::create_dir_all(data)
        .with_context(|| format!("cannot create the data directory {}", data.display()))?;
    let key = data.join("wire.key");
    std::fs::write(&key, GUEST_KEY_HEX)?;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
    setup::step(&format!(
        "starting the collector: UDP {udp}, HTTP {http}, data under {}",
        data.display()
    ));
    let http_addr: SocketAddr = http.parse().expect("a socket address");
    let mut collector = Command::new(railscope)
        .args(["collector", "run", "--listen", udp, "--http", http])
        .arg("--key")
        .arg(&key)
        .arg("--data")
        .arg(data.join("archive"))
        .spawn()
        .context("cannot start the collector")?;
    if let Err(e) = wait_http(http_addr, Duration::from_secs(10)) {
        stop(&mut collector);
        return Err(e);
    }

    let udp_port = udp.rsplit(':').next().unwrap_or("7670");
    let mut cmdline = format!("railscope.scenarios=demo railscope.collector=10.0.2.2:{udp_port}");
    if let Some(s) = seconds {
        cmdline.push_str(&format!(" railscope.demo_seconds={s}"));
    }
    let options = testbed::BootOptions {
        mem: "1G".into(),
        smp: 2,
        // Until Ctrl-C (a week), or the demo's time and the boot's.
        timeout: Duration::from_secs(seconds.map_or(7 * 86_400, |s| s + 600)),
        cmdline_extra: cmdline,
        serial_log: work_dir.join("guest.log"),
        user_net: true,
        pcie_numa: false,
    };
    setup::step(&format!(
        "booting the guest (its console: {})",
        options.serial_log.display()
    ));
    // Ctrl-C reaches QEMU and the collector (same process group); this process waits for
    // them. SAFETY: ignoring SIGINT in this process only, after the children started.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    let guest = thread::spawn(move || testbed::boot(&image, &options));

    let waited = wait_for_node(http_addr, &guest);
    match &waited {
        Ok(after) => println!(
            "\nThe demo is running ({NODE}'s first frames arrived {after:.0?} after the boot \
             began):\n\
             \x20 dashboard           http://{http}/\n\
             \x20 findings            {rs} findings --collector http://{http}\n\
             \x20 nodes (live)        curl http://{http}/api/v1/live/nodes\n\
             \x20 queries             {rs} query --collector http://{http} --help\n\
             \x20 the guest's console {}\n\
             Ctrl-C stops the guest and the collector.\n",
            work_dir.join("guest.log").display(),
            rs = railscope.display(),
        ),
        Err(e) => eprintln!("demo: {e:#}"),
    }
    let checked = if waited.is_ok() && seconds.is_some() {
        Some(check(http_addr, seconds.unwrap_or(0)))
    } else {
        None
    };
    let booted = guest
        .join()
        .map_err(|_| anyhow::anyhow!("the boot thread panicked"))?;
    stop(&mut collector);
    let outcome = booted?;
    waited?;
    if let Some(checked) = checked {
        checked?;
    } else if outcome.timed_out {
        bail!("the guest did not stop in time");
    }
    Ok(())
}

/// Waits until the collector has frames of the guest; how long that took.
fn wait_for_node(
    http: SocketAddr,
    guest: &thread::JoinHandle<anyhow::Result<testbed::BootOutcome>>,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        if let Ok((200, body)) = http_get(http, "/api/v1/live/nodes")
            && body.contains(NODE)
        {
            return Ok(started.elapsed());
        }
        if guest.is_finished() {
            bail!("the guest stopped before its agent sent anything (see its console)");
        }
        if started.elapsed() > FIRST_FRAME_WITHIN {
            bail!(
                "no frame of {NODE} at the collector {:.0?} after the boot began (see the guest's console)",
                FIRST_FRAME_WITHIN
            );
        }
        thread::sleep(Duration::from_millis(500));
    }
}

/// With `--demo-seconds`: after that long, what a new user would check through the API —
/// live GPU and IB data, the verbs of both jobs' cgroups, both jobs on the Jobs page (its
/// `/api/v1/stragglers`), a flapping-port finding and, from 2 minutes on, GPU 7's `gpu_lost`.
fn check(http: SocketAddr, seconds: u64) -> anyhow::Result<()> {
    thread::sleep(Duration::from_secs(seconds.saturating_sub(5)));
    let get = |path: &str| -> anyhow::Result<String> {
        match http_get(http, path)? {
            (200, body) => Ok(body),
            (status, body) => bail!("GET {path}: {status} {body}"),
        }
    };
    let mut missing = Vec::new();
    for metric in [
        "railscope_gpu_sm_util_ratio",
        // rxe has no port counters/, only hw_counters.
        "railscope_ib_sent_pkts_total",
    ] {
        let body = get(&format!(
            "/api/v1/series?metric={metric}&match=node%3D{NODE}&start=-2m"
        ))?;
        if !body.contains("\"points\":[{") {
            missing.push(format!("no {metric} of the last 2 minutes"));
        }
    }
    let verbs = get(&format!(
        "/api/v1/series?metric=railscope_rdma_verbs_total&match=node%3D{NODE}&start=-5m"
    ))?;
    for job in ["job_101", "job_102"] {
        if !verbs.contains(job) {
            missing.push(format!("no verb counters of {job}'s cgroup"));
        }
    }
    let jobs = get("/api/v1/stragglers")?;
    for job in ["slurm:101", "slurm:102"] {
        if !jobs.contains(&format!("\"job_id\":\"{job}\"")) {
            missing.push(format!("{job} is not on the Jobs page"));
        }
    }
    let findings = get("/api/v1/findings?start=-10m")?;
    if !findings.contains("ib_link_flapping") {
        missing.push("no ib_link_flapping finding".into());
    }
    if seconds >= 120 && !findings.contains("\"rule\":\"gpu_lost\"") {
        missing.push("no gpu_lost finding for GPU 7".into());
    }
    if missing.is_empty() {
        setup::step(&format!(
            "demo checked after {seconds} s: live GPU and IB data, both jobs (verbs and Jobs page), a flapping port{}",
            if seconds >= 120 { ", a lost GPU" } else { "" }
        ));
        Ok(())
    } else {
        bail!("the demo after {seconds} s: {}", missing.join("; "))
    }
}

fn stop(child: &mut Child) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let _ = child.wait();
}

/// The demo's data directory, inside the real one but apart from its data (and removed at
/// each demo's start).
pub(crate) fn data_dir(real: &Path) -> PathBuf {
    real.join("demo")
}
