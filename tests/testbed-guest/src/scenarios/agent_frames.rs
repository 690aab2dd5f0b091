//! agent-frames: the node agent sending to a collector inside the guest. `railscope listen`
//! receives the frames of `railscope agent --collector` while `ib_write_bw` runs and a link
//! flaps: the real rxe hardware counters move in the frames (rxe0's sent packets equal
//! rxe1's received ones), the verb counters travel as `railscope_rdma_verbs_total`, port
//! events arrive as events, and the ethtool statistics of rxe's netdevs (vethA, vethB) arrive
//! as `railscope_ethtool_<stat>_total{device, port, netdev}` with the values `ethtool -S`
//! prints once the transfer is over.

use std::{collections::BTreeMap, thread, time::Duration};

use anyhow::{Context as _, ensure};
use serde_json::Value;

use crate::guest;

const PORT: &str = "17400";

pub(super) fn run() -> anyhow::Result<()> {
    super::ensure_rdma_modules()?;
    guest::ensure_rxe_pair()?;
    let (mut agent, listener) =
        guest::agent_and_listener(PORT, &["--interval", "0.5", "--flush", "1"], true)?;
    agent.wait_for_log("ib_uverbs_post_send attached", Duration::from_secs(20))?;

    guest::write_bw_then_flap(2000)?;
    thread::sleep(Duration::from_secs(3));
    let (_, frames) = guest::stop_and_decode(&mut agent, listener)?;
    println!("listener decoded {} frames", frames.len());
    ensure!(!frames.is_empty(), "no frame reached the collector");

    // The last value of each (series name, device) counter the collector received.
    let mut last: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    let mut first: BTreeMap<(String, String), u64> = BTreeMap::new();
    for frame in &frames {
        for s in frame["samples"].as_array().into_iter().flatten() {
            if s["kind"] != "counter" {
                continue;
            }
            let key = (
                s["name"].as_str().unwrap_or("?").to_owned(),
                s["labels"]["device"].as_str().unwrap_or("").to_owned(),
            );
            for p in s["points"].as_array().into_iter().flatten() {
                let (t, v) = (
                    p["unix_ns"].as_u64().unwrap_or(0),
                    p["value"].as_u64().unwrap_or(0),
                );
                first.entry(key.clone()).or_insert(v);
                if last.get(&key).is_none_or(|(lt, _)| t >= *lt) {
                    last.insert(key.clone(), (t, v));
                }
            }
        }
    }
    // Deltas over this scenario: packets a killed peer never took (an earlier scenario) stay
    // in rxe0's total but not in rxe1's.
    let delta = |name: &str, device: &str| -> anyhow::Result<u64> {
        let key = (name.to_owned(), device.to_owned());
        let end = last
            .get(&key)
            .map(|(_, v)| *v)
            .with_context(|| format!("{device} {name} never sent"))?;
        Ok(end - first[&key])
    };
    let sent = delta("railscope_ib_sent_pkts_total", "rxe0")?;
    let rcvd = delta("railscope_ib_rcvd_pkts_total", "rxe1")?;
    println!("during the transfer: rxe0 sent {sent} packets, rxe1 received {rcvd}");
    ensure!(sent > 0, "rxe0's sent packets did not move in the frames");
    ensure!(
        sent == rcvd,
        "rxe0 sent {sent} packets but rxe1 received {rcvd}"
    );
    ensure!(
        last.keys()
            .any(|(name, _)| name == "railscope_rdma_verbs_total"),
        "no verb counter reached the collector"
    );
    let port_events: Vec<&Value> = frames
        .iter()
        .flat_map(|f| f["events"].as_array().into_iter().flatten())
        .filter(|e| e["kind"] == "ib_port" && e["labels"]["device"] == "rxe0")
        .collect();
    ensure!(
        port_events.iter().any(|e| e["text"] == "PORT_ERR")
            && port_events.iter().any(|e| e["text"] == "PORT_ACTIVE"),
        "the link flap did not reach the collector as events: {port_events:?}"
    );
    ethtool_statistics_as_printed(&frames)
}

/// Each rxe device's netdev: every statistic `ethtool -S` prints for it was sent, its last
/// value the one printed now (the traffic is over, and a veth's statistics move only on its
/// XDP path, which nothing here uses), and nothing else was sent for it, under its rxe
/// device's labels.
fn ethtool_statistics_as_printed(frames: &[Value]) -> anyhow::Result<()> {
    // (netdev, series name) → (time, value) of the last point, with the device and port.
    let mut sent: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for frame in frames {
        for s in frame["samples"].as_array().into_iter().flatten() {
            let name = s["name"].as_str().unwrap_or("");
            if !name.starts_with("railscope_ethtool_") {
                continue;
            }
            let labels = &s["labels"];
            let netdev = labels["netdev"].as_str().unwrap_or("").to_owned();
            let expected_device = match netdev.as_str() {
                "vethA" => "rxe0",
                "vethB" => "rxe1",
                // Another RDMA device an earlier scenario left (siw on another netdev).
                _ => continue,
            };
            ensure!(
                labels["device"] == expected_device && labels["port"] == "1",
                "{name}: labels {labels}"
            );
            for p in s["points"].as_array().into_iter().flatten() {
                let (t, v) = (
                    p["unix_ns"].as_u64().unwrap_or(0),
                    p["value"].as_u64().unwrap_or(0),
                );
                let key = (netdev.clone(), name.to_owned());
                if sent.get(&key).is_none_or(|(lt, _)| t >= *lt) {
                    sent.insert(key, (t, v));
                }
            }
        }
    }
    for netdev in ["vethA", "vethB"] {
        let printed: BTreeMap<String, u64> = guest::run("/usr/bin/ethtool", &["-S", netdev])?
            .lines()
            .filter_map(|l| {
                let (stat, value) = l.trim().rsplit_once(':')?;
                Some((
                    format!("railscope_ethtool_{}_total", stat.trim()),
                    value.trim().parse().ok()?,
                ))
            })
            .collect();
        ensure!(
            !printed.is_empty(),
            "ethtool -S {netdev} printed no statistic"
        );
        let agent: BTreeMap<String, u64> = sent
            .iter()
            .filter(|((n, _), _)| n == netdev)
            .map(|((_, name), (_, v))| (name.clone(), *v))
            .collect();
        println!(
            "{netdev}: the agent sent {} ethtool statistics",
            agent.len()
        );
        ensure!(
            agent == printed,
            "{netdev}: the agent sent {agent:?}, ethtool -S prints {printed:?}"
        );
    }
    Ok(())
}
