//! lossy-link: 5 % random datagram loss and reordering between the agent and its collector,
//! both ways, and still every frame archived exactly once and every sample read back as the
//! agent sent it. The guest makes a network
//! namespace `lossy` joined to its own by a veth pair (lossyA 198.19.0.1, lossyB 198.19.0.2
//! in the namespace); a `railscope-collector` runs in the namespace and the agent sends to it
//! from the guest's own, through a recording relay on the guest's loopback (the testkit's
//! `Relay`, unimpaired: it keeps every datagram the agent sent, resends included). `tc netem` on both ends (loss 5 %, delay 60 ± 30 ms, a quarter of
//! the datagrams sent at once, so they overtake) impairs the frames on lossyA and the
//! acknowledgements coming back on lossyB. The agent flushes every 50 ms, so frames are in
//! flight together and overtake each other. After 20 s the impairment is lifted, the agent
//! catches up and stops, and:
//!
//! - the collector accepted exactly the frames of the agent's session (the frames it sent,
//!   less those it sent again), none missing from the sequence, each archived once;
//! - every sample of every series the agent sent, decoded from the relay's datagrams, is
//!   what `railscope query --json series` reads back from the archive, value by value, and
//!   the archive answers no series the agent did not send;
//! - netem really dropped frames and impaired the way back, the agent really sent frames
//!   again, and more frames arrived after a later one than were sent again (so netem
//!   reordered some): the test cannot pass on a quiet link.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{Context as _, bail, ensure};
use monitor_testkit::{
    Relay, key_from_hex,
    sent_frames::{decode_sent, metric_names, points_differing, queried_points_at},
};
use serde_json::Value;

use crate::{guest, http};

const NETNS: &str = "lossy";
const NEAR: &str = "lossyA";
const FAR: &str = "lossyB";
const NEAR_ADDR: &str = "198.19.0.1/24";
const FAR_ADDR: &str = "198.19.0.2/24";
const COLLECTOR: &str = "198.19.0.2:7670";
const COLLECTOR_HTTP: &str = "198.19.0.2:7671";

/// netem's impairment, the same on both ends.
const NETEM: &[&str] = &[
    "netem", "loss", "5%", "delay", "60ms", "30ms", "reorder", "25%",
];

/// How long the agent sends over the impaired link.
const IMPAIRED: Duration = Duration::from_secs(20);

pub(super) fn run() -> anyhow::Result<()> {
    for module in ["veth", "sch_netem"] {
        guest::run("/bin/modprobe", &[module])?;
    }
    let _netns = Namespace::create()?;
    let mut collector = CollectorInNamespace::start()?;
    impair(true)?;
    let relay = Relay::start(COLLECTOR.parse()?);
    let mut agent = guest::agent_sending_to(
        &relay.addr.to_string(),
        &["--interval", "0.5", "--flush", "0.05"],
        false,
    )?;
    thread::sleep(IMPAIRED);
    let (frames_way, acks_way) = (netem_stats(&[], NEAR)?, netem_stats(&["-n", NETNS], FAR)?);
    impair(false)?;
    println!(
        "netem: {} of {} datagrams to the collector dropped, {} of {} back",
        frames_way.dropped, frames_way.sent, acks_way.dropped, acks_way.sent
    );
    // Without loss the collector names what it lacks and gets it.
    guest::poll_until(
        Duration::from_secs(30),
        "the collector to lack no frame",
        || Ok(node(COLLECTOR_HTTP)?["lost"].as_u64() == Some(0)),
    )?;
    thread::sleep(Duration::from_secs(1));
    ensure!(agent.is_running(), "the agent died");
    let (_, stderr) = agent.stop()?;
    for l in stderr
        .iter()
        .filter(|l| l.contains("stopping") || l.contains("frames sent"))
    {
        println!("agent: {l}");
    }
    if let Some(l) = stderr
        .iter()
        .find(|l| l.contains("no collector acknowledged"))
    {
        bail!("the agent stopped with frames unacknowledged: {l}");
    }
    let resent = stderr
        .iter()
        .find_map(|l| state_value(l, "frames_resent"))
        .context("the agent logged no frames_resent at stop")?;
    let (sent, not_sent) = stderr
        .iter()
        .find_map(|l| sender_totals(l))
        .context("the agent logged no `N frames sent, M dropped` at stop")?;
    // Every frame of the session was handed to the kernel once, and again when resent.
    let session_frames = sent + not_sent - resent;

    let mut last = Value::Null;
    guest::poll_until(
        Duration::from_secs(10),
        "the archive to hold what was accepted",
        || {
            last = node(COLLECTOR_HTTP)?;
            Ok(Some(archived(COLLECTOR_HTTP)?) == last["frames"].as_u64())
        },
    )
    .with_context(|| format!("the collector's node: {last}"))?;
    let archived = archived(COLLECTOR_HTTP)?;
    let n = |k: &str| last[k].as_u64().unwrap_or(u64::MAX);
    println!(
        "agent: {sent} frames sent ({resent} again, {not_sent} not sent); collector: {} \
         accepted, {archived} archived, {} lost, {} reordered, {} duplicates refused, {} sessions",
        n("frames"),
        n("lost"),
        n("reordered"),
        n("duplicates"),
        n("sessions"),
    );
    read_back_as_sent(relay)?;
    collector.stop();
    ensure!(
        n("sessions") == 1,
        "the collector saw {} sessions of the agent",
        n("sessions")
    );
    ensure!(
        n("frames") == session_frames && n("lost") == 0 && archived == session_frames,
        "the session has {session_frames} frames; the collector accepted {}, archived \
         {archived}, lacks {}",
        n("frames"),
        n("lost")
    );
    // The frames' way loses about 20 datagrams; the way back carries about one
    // acknowledgement a second, so whether one of those 20 was lost is chance: it must have
    // been impaired, that is all.
    ensure!(
        frames_way.dropped > 0 && acks_way.sent > 0,
        "netem did not impair both ways: {frames_way:?} to the collector, {acks_way:?} back"
    );
    ensure!(
        resent > 0,
        "the agent sent nothing again: no frame was lost"
    );
    // A frame sent again to fill a gap arrives after later ones: more frames out of order
    // than frames sent again means netem reordered some.
    ensure!(
        n("reordered") > resent,
        "{} frames arrived after a later one, {resent} were sent again: netem reordered none",
        n("reordered")
    );
    Ok(())
}

/// Every sample the agent sent through `relay` is what the archive answers, value by value.
fn read_back_as_sent(relay: Relay) -> anyhow::Result<()> {
    let datagrams = relay.stop();
    let sent = decode_sent(
        &key_from_hex(guest::WIRE_KEY_HEX),
        datagrams.iter().map(Vec::as_slice),
    );
    let expected = sent.archive_points();
    let samples: usize = expected.values().map(Vec::len).sum();
    let answered = queried_points_at(
        Path::new("/usr/bin/railscope"),
        &format!("http://{COLLECTOR_HTTP}"),
        &metric_names(&expected),
    );
    let differ = points_differing(&expected, &answered);
    println!(
        "read back: {} series, {samples} samples sent in {} frames ({} datagrams sent again); \
         {} series answered, {} differ",
        expected.len(),
        sent.frames.len(),
        sent.resent,
        answered.len(),
        differ.len()
    );
    ensure!(samples > 1_000, "the agent sent only {samples} samples");
    ensure!(
        differ.is_empty() && answered.len() == expected.len(),
        "the archive differs from what the agent sent ({} series answered, {} sent): {differ:?}",
        answered.len(),
        expected.len()
    );
    Ok(())
}

/// The namespace and the veth pair, removed when dropped.
struct Namespace;

impl Namespace {
    fn create() -> anyhow::Result<Self> {
        let ip = |args: &[&str]| guest::run("/usr/bin/ip", args).map(drop);
        ip(&["netns", "add", NETNS])?;
        let ns = Self;
        ip(&["link", "add", NEAR, "type", "veth", "peer", "name", FAR])?;
        ip(&["link", "set", FAR, "netns", NETNS])?;
        ip(&["addr", "add", NEAR_ADDR, "dev", NEAR])?;
        ip(&["link", "set", NEAR, "up"])?;
        ip(&["-n", NETNS, "addr", "add", FAR_ADDR, "dev", FAR])?;
        ip(&["-n", NETNS, "link", "set", FAR, "up"])?;
        ip(&["-n", NETNS, "link", "set", "lo", "up"])?;
        Ok(ns)
    }
}

impl Drop for Namespace {
    /// Deleting the namespace deletes lossyB, and with it its peer lossyA.
    fn drop(&mut self) {
        let _ = guest::run("/usr/bin/ip", &["link", "del", NEAR]);
        let _ = guest::run("/usr/bin/ip", &["netns", "del", NETNS]);
    }
}

/// Puts netem on both ends, or takes it off.
fn impair(on: bool) -> anyhow::Result<()> {
    for (netns, dev) in [(None, NEAR), (Some(NETNS), FAR)] {
        let mut args: Vec<&str> = netns.map(|n| vec!["-n", n]).unwrap_or_default();
        args.extend(["qdisc", if on { "add" } else { "del" }, "dev", dev, "root"]);
        if on {
            args.extend(NETEM);
        }
        guest::run("/usr/bin/tc", &args)?;
    }
    Ok(())
}

/// What netem did on one device: datagrams sent on and dropped.
#[derive(Debug, PartialEq)]
struct NetemStats {
    sent: u64,
    dropped: u64,
}

/// netem's statistics on `dev` (`tc -s qdisc show`).
fn netem_stats(netns: &[&str], dev: &str) -> anyhow::Result<NetemStats> {
    let mut args = netns.to_vec();
    args.extend(["-s", "qdisc", "show", "dev", dev]);
    let out = guest::run("/usr/bin/tc", &args)?;
    parse_netem_stats(&out).with_context(|| format!("no netem statistics for {dev} in {out:?}"))
}

/// The netem qdisc's ` Sent B bytes P pkt (dropped D, ...)` line of `tc -s qdisc show`.
fn parse_netem_stats(tc_stats: &str) -> Option<NetemStats> {
    let mut lines = tc_stats
        .lines()
        .skip_while(|l| !l.starts_with("qdisc netem"));
    lines.next()?;
    let (before, after) = lines.next()?.split_once(" pkt (dropped ")?;
    Some(NetemStats {
        sent: before.rsplit(' ').next()?.parse().ok()?,
        dropped: after.split(',').next()?.trim().parse().ok()?,
    })
}

/// `key=N` in the agent's `stopping; state: ...` line.
fn state_value(line: &str, key: &str) -> Option<u64> {
    let (_, state) = line.split_once("stopping; state: ")?;
    state
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))?
        .parse()
        .ok()
}

/// (sent, dropped) of the agent's `to ADDR: N frames sent, M dropped (...)` line at stop.
fn sender_totals(line: &str) -> Option<(u64, u64)> {
    let (before, after) = line.split_once(" frames sent, ")?;
    let sent = before.rsplit(' ').next()?.parse().ok()?;
    let dropped = after.split(' ').next()?.parse().ok()?;
    Some((sent, dropped))
}

/// The collector's receive state of node `guest` (`/api/v1/live/nodes`).
fn node(http: &str) -> anyhow::Result<Value> {
    let nodes = http::get_json(http, "/api/v1/live/nodes")?;
    nodes
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["node"] == "guest")
        .cloned()
        .context("the collector holds no node `guest`")
}

/// Frames the collector appended to its archive.
fn archived(http: &str) -> anyhow::Result<u64> {
    let (status, page) = http::get(http, "/metrics/collector")?;
    ensure!(status == 200, "GET /metrics/collector: status {status}");
    http::sample(&page, "railscope_collector_archive_frames_total")
        .map(|v| v as u64)
        .context("no railscope_collector_archive_frames_total")
}

/// `railscope-collector run` in the namespace, with an archive in /tmp and the test bed's
/// shared key; stopped when dropped.
struct CollectorInNamespace(Option<Child>);

impl CollectorInNamespace {
    fn start() -> anyhow::Result<Self> {
        guest::write_wire_key()?;
        let args = [
            "netns",
            "exec",
            NETNS,
            "/usr/bin/railscope-collector",
            "run",
            "--listen",
            COLLECTOR,
            "--http",
            COLLECTOR_HTTP,
            "--web.allow-unauthenticated",
            "--sockets",
            "1",
            "--key",
            guest::WIRE_KEY,
            "--data",
            "/tmp/lossy-archive",
        ];
        println!("+ ip {}", args.join(" "));
        let mut child = Command::new("/usr/bin/ip")
            .args(args)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting railscope-collector in the namespace")?;
        guest::collect(child.stdout.take().expect("piped"), "collector> ");
        guest::collect(child.stderr.take().expect("piped"), "collector! ");
        let collector = Self(Some(child));
        guest::poll_until(Duration::from_secs(20), "the collector's HTTP API", || {
            Ok(http::get(COLLECTOR_HTTP, "/metrics/collector")?.0 == 200)
        })?;
        Ok(collector)
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.0.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let _ = child.wait();
        }
    }
}

impl Drop for CollectorInNamespace {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_netems_statistics() {
        let out = "qdisc netem 8001: root refcnt 2 limit 1000 delay 60ms  30ms reorder 25% loss 5%\n \
                   Sent 41234 bytes 377 pkt (dropped 19, overlimits 0 requeues 0)\n \
                   backlog 0b 0p requeues 0\n";
        assert_eq!(
            parse_netem_stats(out),
            Some(NetemStats {
                sent: 377,
                dropped: 19
            })
        );
        let other = "qdisc noqueue 0: root refcnt 2\n \
                     Sent 0 bytes 0 pkt (dropped 0, overlimits 0 requeues 0)\n";
        assert_eq!(parse_netem_stats(other), None);
    }

    #[test]
    fn reads_the_agents_totals_at_stop() {
        let state = "2026-05-20T10:00:00Z  INFO railscope::agent: stopping; state: verb_keys=3 \
                     spool_frames=2 frames_resent=17 acks_refused=0";
        assert_eq!(state_value(state, "frames_resent"), Some(17));
        assert_eq!(state_value(state, "spool_frames"), Some(2));
        assert_eq!(state_value("frames_resent=17", "frames_resent"), None);
        let sender = "INFO railscope::agent: to 198.19.0.2:7670: 412 frames sent, 3 dropped (3 \
                      queue full, 0 send failed, 0 unreachable at stop, 0 after stop), 0 refused";
        assert_eq!(sender_totals(sender), Some((412, 3)));
        assert_eq!(sender_totals("nothing here"), None);
    }
}
