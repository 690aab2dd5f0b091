//! host-collector: the agent in the guest sends to a collector on the host. The guest has a
//! QEMU user-network NIC for this scenario (the host is 10.0.2.2 from the guest); the host
//! runs `railscope collector run` with remote-write to VictoriaMetrics and, after the guest
//! powered off, compares what VictoriaMetrics holds with the collector's archive sample by
//! sample (xtask/src/vm_test/host_collector.rs). Here: the NIC up, and the agent sending
//! while `ib_write_bw` moves the rxe counters and a link flaps. The host's collector has
//! per-node keys: the guest's agent seals with its own key, derived on the host from the
//! collector's fleet secret and handed over as `railscope.node_key=` (a throwaway secret).

use std::{thread, time::Duration};

use anyhow::{Context as _, ensure};

use crate::guest;

/// The guest's own key file, written from the kernel command line.
const NODE_KEY: &str = "/tmp/node.key";

/// The guest's address on QEMU's user network (its DHCP would give the same).
const GUEST_ADDR: &str = "10.0.2.15/24";

pub(super) fn run() -> anyhow::Result<()> {
    let (mut agent, collector) = agent_to_host(&["--interval", "0.5", "--flush", "1"], true)?;
    agent.wait_for_log("ib_uverbs_post_send attached", Duration::from_secs(20))?;
    guest::write_bw_then_flap(1000)?;
    thread::sleep(Duration::from_secs(3));
    ensure!(agent.is_running(), "the agent died");
    agent.stop()?;
    // The host compares the TSDB with the archive once the guest is off.
    println!("the agent sent to {collector} and stopped");
    Ok(())
}

/// An address the host put on the kernel command line as `key=` (cargo xtask vm-test).
pub(super) fn host_address(key: &str) -> anyhow::Result<String> {
    let cmdline = std::fs::read_to_string("/proc/cmdline")?;
    guest::cmdline_value(&cmdline, key).with_context(|| {
        format!(
            "no {key}= on the kernel command line: the host starts the collector (cargo xtask vm-test)"
        )
    })
}

/// The soft-RoCE pair and the user-network NIC up, and the agent sending to the host's
/// collector with its own key and `extra` options, echoing or not; the collector's address.
pub(super) fn agent_to_host(extra: &[&str], echo: bool) -> anyhow::Result<(guest::Agent, String)> {
    let collector = host_address("railscope.collector")?;
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    let nic = user_net_up()?;
    println!("{nic} up as {GUEST_ADDR}; the collector is at {collector}");
    std::fs::write(
        NODE_KEY,
        format!("{}\n", host_address("railscope.node_key")?),
    )?;
    std::fs::set_permissions(
        NODE_KEY,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )?;
    let agent = guest::agent_sealing_with(&collector, NODE_KEY, extra, echo)?;
    Ok((agent, collector))
}

/// Brings the QEMU user-network NIC up as [`GUEST_ADDR`] (the host is 10.0.2.2); its name.
pub(super) fn user_net_up() -> anyhow::Result<String> {
    // The NIC's transport and driver (modules on 6.1; virtio_pci built in on 6.12).
    for module in ["virtio_pci", "virtio_net"] {
        if !std::path::Path::new("/sys/module").join(module).exists() {
            guest::run("/bin/modprobe", &[module])?;
        }
    }
    guest::wait_for(Duration::from_secs(5), "the virtio NIC", || {
        std::fs::read_dir("/sys/class/net").is_ok_and(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .any(|n| n.starts_with("eth") || n.starts_with("en"))
        })
    })?;
    let nic = std::fs::read_dir("/sys/class/net")?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find(|n| n.starts_with("eth") || n.starts_with("en"))
        .context("no NIC: the guest was booted without QEMU's user network")?;
    guest::run("/usr/bin/ip", &["link", "set", &nic, "up"])?;
    // An earlier scenario of this boot may have given it the address.
    let (addr, _) = GUEST_ADDR
        .split_once('/')
        .expect("an address with a prefix");
    let has = guest::run("/usr/bin/ip", &["-4", "-o", "addr", "show", "dev", &nic])?;
    if !has
        .split_whitespace()
        .any(|w| w.split('/').next() == Some(addr))
    {
        guest::run("/usr/bin/ip", &["addr", "add", GUEST_ADDR, "dev", &nic])?;
    }
    Ok(nic)
}
