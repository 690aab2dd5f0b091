//! demo: what `cargo xtask run --demo` boots (not a test; run on request). The guest's agent
//! sends to the collector on the host (10.0.2.2 through QEMU's user network) while two
//! Slurm-like jobs make soft-RoCE traffic — `ib_write_bw` in job 101, `rping` in job 102, each
//! in its own `job_<id>/step_0` cgroup — the link under rxe0 flaps now and then (three times
//! in the first minute, so the collector's flapping rule fires, then every 45 s), and the
//! NVML stand-in replays an 8-GPU node (it is no GPU: docs/nvml-standin.md) whose GPUs 0-3 run
//! job 101's process and 4-7 job 102's (a `sleep` in each job's cgroup, as a training
//! process would be), with a throttled GPU, an XID now and then, and GPU 7 falling off the
//! bus 90 s in (`gpu_lost`). Runs until QEMU is stopped, or for `railscope.demo_seconds`.

use std::{
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use serde_json::{Value, json};

use crate::guest::{self, ADDR_A, ADDR_B};

/// Where `cargo xtask run --demo` puts the NVML stand-in; its script is written next to it.
const STANDIN_DIR: &str = "/usr/lib/railscope";

/// The two jobs: their cgroups (as slurmstepd lays them out) and what they run.
const PERFTEST_JOB: &str = "/system.slice/slurmstepd.scope/job_101/step_0";
const RPING_JOB: &str = "/system.slice/slurmstepd.scope/job_102/step_0";

/// The sweep (a second each) at which GPU 7 falls off the bus.
const GPU_LOST_AT_STEP: usize = 90;

/// Steps of the stand-in's script (one per agent sweep, a second each): 30 minutes before it
/// holds its last step.
const STEPS: usize = 1800;

pub(super) fn run() -> anyhow::Result<()> {
    let cmdline = std::fs::read_to_string("/proc/cmdline")?;
    let collector = guest::cmdline_value(&cmdline, "railscope.collector")
        .context("no railscope.collector= on the kernel command line (cargo xtask run --demo)")?;
    let seconds: Option<u64> =
        guest::cmdline_value(&cmdline, "railscope.demo_seconds").and_then(|s| s.parse().ok());
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    super::host_collector::user_net_up()?;
    guest::write_wire_key()?;
    for job in [PERFTEST_JOB, RPING_JOB] {
        std::fs::create_dir_all(format!("/sys/fs/cgroup{job}"))?;
    }
    // Each job's "training process" on its GPUs: the agent finds the job of a GPU through its
    // processes' cgroups, as on a real node.
    let mut job_processes = Vec::new();
    for job in [PERFTEST_JOB, RPING_JOB] {
        let child = guest::in_cgroup(job, "/bin/sleep", &["infinity"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting the GPU process of {job}"))?;
        job_processes.push(child);
    }
    write_standin_script(job_processes[0].id(), job_processes[1].id())?;
    let standin = format!("{STANDIN_DIR}/libnvidia-ml.so.1");
    let mut agent = guest::Agent::start_with(
        &[
            "--collector",
            &collector,
            "--key",
            guest::WIRE_KEY,
            "--node",
            "demo-guest",
            "--nvml-lib",
            &standin,
            "--interval",
            "1",
            "--flush",
            "1",
        ],
        false,
    )?;
    agent.wait_for_log("ib_uverbs_post_send attached", Duration::from_secs(30))?;
    println!("RAILSCOPE-DEMO the agent sends to {collector}: jobs, traffic and flaps start");

    let stop = Arc::new(AtomicBool::new(false));
    let _workers = [
        spawn_loop("perftest (job 101)", stop.clone(), perftest_round),
        spawn_loop("rping (job 102)", stop.clone(), rping_round),
        spawn_loop("flaps", stop.clone(), flapper()),
    ];
    let started = Instant::now();
    loop {
        thread::sleep(Duration::from_secs(1));
        if !agent.is_running() {
            anyhow::bail!("the agent exited");
        }
        if seconds.is_some_and(|s| started.elapsed() >= Duration::from_secs(s)) {
            break;
        }
    }
    // The loops are left to the power-off (a round or a flap may be under way).
    stop.store(true, Ordering::Relaxed);
    agent.stop()?;
    for mut process in job_processes {
        let _ = process.kill();
        let _ = process.wait();
    }
    Ok(())
}

/// Runs `round` until `stop`; a failed round (a flap cut the connection) is logged and
/// retried.
fn spawn_loop(
    what: &'static str,
    stop: Arc<AtomicBool>,
    mut round: impl FnMut() -> anyhow::Result<()> + Send + 'static,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if let Err(e) = round() {
                println!("demo: {what}: {e:#} (again in 2 s)");
                thread::sleep(Duration::from_secs(2));
            }
        }
    })
}

/// 10 s of `ib_write_bw` between rxe0 and rxe1, both ends in job 101. A server whose client
/// failed (a flap cut the connection) would wait for ever: it is killed.
fn perftest_round() -> anyhow::Result<()> {
    let gid = guest::ipv4_gid_index("rxe0")?.to_string();
    let [server_args, client_args] = guest::perftest_pair_args(&["-x", &gid, "-F", "-D", "10"]);
    let quiet = |mut cmd: Command| {
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        cmd
    };
    let mut server = quiet(guest::in_cgroup(
        PERFTEST_JOB,
        "/usr/bin/ib_write_bw",
        &server_args,
    ))
    .spawn()?;
    let client = guest::wait_for_perftest_server().and_then(|()| {
        Ok(quiet(guest::in_cgroup(
            PERFTEST_JOB,
            "/usr/bin/ib_write_bw",
            &client_args,
        ))
        .status()?)
    });
    finish_round(&mut server, client, "ib_write_bw")
}

/// 100 rping round trips over rdma_cm, both ends in job 102, then a pause. A server whose
/// client failed is killed.
fn rping_round() -> anyhow::Result<()> {
    let mut server = guest::in_cgroup(
        RPING_JOB,
        "/usr/bin/rping",
        &["-s", "-a", ADDR_B, "-C", "100", "-p", "7481"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()?;
    let listening = guest::wait_for(Duration::from_secs(10), "the rping server", || {
        rdma_cm_listening("7481")
    });
    let client = listening.and_then(|()| {
        Ok(guest::in_cgroup(
            RPING_JOB,
            "/usr/bin/rping",
            &["-c", "-I", ADDR_A, "-a", ADDR_B, "-C", "100", "-p", "7481"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?)
    });
    finish_round(&mut server, client, "rping")?;
    thread::sleep(Duration::from_secs(3));
    Ok(())
}

/// Whether an rdma_cm id listens on `port` (`rdma resource show cm_id`).
/// Waits up to 5 s for a round's server once its client ended; a server whose client failed,
/// or that outlives the wait, is killed. Both must have succeeded.
fn finish_round(
    server: &mut std::process::Child,
    client: anyhow::Result<std::process::ExitStatus>,
    tool: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let served = loop {
        if let Some(status) = server.try_wait()? {
            break Some(status);
        }
        if Instant::now() > deadline || !client.as_ref().is_ok_and(|s| s.success()) {
            let _ = server.kill();
            let _ = server.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(100));
    };
    anyhow::ensure!(
        client?.success() && served.is_some_and(|s| s.success()),
        "{tool} cut short"
    );
    Ok(())
}

fn rdma_cm_listening(port: &str) -> bool {
    Command::new("/usr/bin/rdma")
        .args(["resource", "show", "cm_id"])
        .output()
        .is_ok_and(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.contains("LISTEN") && l.contains(&format!(":{port} ")))
        })
}

/// vethA (under rxe0) down for 2 s: after 8 s, then every 15 s three times, then every 45 s.
fn flapper() -> impl FnMut() -> anyhow::Result<()> + Send + 'static {
    let mut flaps = 0u32;
    move || {
        let wait = match flaps {
            0 => 8,
            1..=2 => 13,
            _ => 43,
        };
        thread::sleep(Duration::from_secs(wait));
        guest::run("/usr/bin/ip", &["link", "set", "vethA", "down"])?;
        thread::sleep(Duration::from_secs(2));
        guest::run("/usr/bin/ip", &["link", "set", "vethA", "up"])?;
        flaps += 1;
        Ok(())
    }
}

/// The stand-in's script: 8 GPUs; 0-3 at the phases of a training step (~90 %) running
/// `job_101_pid`, 4-7 busy at ~70 % running `job_102_pid`, GPU 5 thermally throttled at
/// ~45 %, an XID 31 on GPU 6 every 2 minutes, GPU 7 lost at [`GPU_LOST_AT_STEP`].
fn write_standin_script(job_101_pid: u32, job_102_pid: u32) -> anyhow::Result<()> {
    let gpus: Vec<Value> = (0..8usize)
        .map(|g| {
            let mut energy = 4_000_000_000u64 + g as u64 * 1_000_000;
            let steps: Vec<Value> = (0..STEPS)
                .map(|s| {
                    let phase = ((s + g) % 8) as f64 / 8.0;
                    let wave = (phase * std::f64::consts::TAU).sin();
                    let (util, throttle): (f64, &[&str]) = match g {
                        0..=3 => (90.0 + 8.0 * wave, &[]),
                        5 => (45.0 + 5.0 * wave, &["hw_thermal_slowdown"]),
                        _ => (70.0 + 10.0 * wave, &[]),
                    };
                    let power = 200_000.0 + 5_000.0 * util;
                    energy += power as u64;
                    json!({
                        "gpu_util_pct": util.round() as u64,
                        "mem_util_pct": (util * 0.6).round() as u64,
                        "temperature_c": if g == 5 { 88 } else { 55 + (util / 10.0) as u64 },
                        "power_mw": power as u64,
                        "energy_mj": energy,
                        "throttle_reasons": throttle,
                        "gpm": {
                            "sm_util": util * 0.95,
                            "any_tensor_util": util * 0.7,
                            "dram_bw_util": util * 0.6,
                        },
                    })
                })
                .collect();
            let xids: Vec<Value> = if g == 6 {
                (40..STEPS)
                    .step_by(120)
                    .map(|s| json!({"step": s, "xid": 31}))
                    .collect()
            } else {
                Vec::new()
            };
            let pid = if g < 4 { job_101_pid } else { job_102_pid };
            let mut steps = steps;
            steps[0]["processes"] = json!([{"pid": pid, "memory_bytes": 40_000_000_000u64}]);
            json!({
                "name": "NVIDIA H100 80GB HBM3 (stand-in)",
                "uuid": format!("GPU-00000000-demo-0000-0000-00000000000{g}"),
                "gpm_supported": true,
                "lost_at_step": (g == 7).then_some(GPU_LOST_AT_STEP),
                "xids": xids,
                "steps": steps,
            })
        })
        .collect();
    let script = json!({
        "driver_version": "550.90.07",
        "defaults": {
            "memory_total_bytes": 85_520_809_984u64,
            "memory_used_bytes": 61_000_000_000u64,
            "sm_clock_mhz": 1980,
            "mem_clock_mhz": 2619,
        },
        "gpus": gpus,
    });
    std::fs::write(
        format!("{STANDIN_DIR}/nvml-standin.json"),
        serde_json::to_vec(&script)?,
    )?;
    Ok(())
}
