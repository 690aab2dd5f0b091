//! collector-away: link flaps while the host's collector is stopped. The agent sends to the
//! collector on the host (as in `host-collector`); the guest has the host stop it (SIGTERM,
//! as an upgrade stops it: xtask/src/vm_test/host_collector.rs, over a control port), flaps
//! vethA three times, and has it started again on the same data directory. Then, from the
//! collector's API: every port event the agent reported (`ib_port` and `port_transition`)
//! is in the archive exactly once with the agent's own time, nothing else is, and the
//! `ib_link_flapping` finding of rxe0 port 1 starts at the first DOWN's kernel time and names
//! the last one (not the time they arrived after the outage). After the boot the host
//! compares the TSDB with the archive (`host-collector`'s check), the outage included.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Write as _},
    net::TcpStream,
    thread,
    time::Duration,
};

use anyhow::{Context as _, bail, ensure};
use serde_json::Value;

use super::host_collector::{agent_to_host, host_address};
use crate::{guest, http};

/// Flaps while the collector is away: the default `flap-downs` threshold of
/// `ib_link_flapping`.
const FLAPS: usize = 3;

/// The port the scenario flaps, as the agent and the collector name it.
const DEVICE: &str = "rxe0";
const LINK: &str = "vethA";

/// A port event as both ends can name it: kind, its own time, device, port, and what
/// happened (`PORT_ERR`..., `UP`/`DOWN`).
type PortEvent = (String, u64, String, u32, String);

pub(super) fn run() -> anyhow::Result<()> {
    let http = host_address("railscope.collector_http")?;
    let mut control = Control::connect(&host_address("railscope.collector_control")?)?;
    let frames_before = node_frames(&http)?;
    let since_ns = guest::realtime_ns();
    let (mut agent, collector) =
        agent_to_host(&["--json", "--interval", "0.5", "--flush", "1"], true)?;
    agent.wait_for_log("ib_dispatch_event attached", Duration::from_secs(20))?;
    // The collector knows the session before it goes.
    guest::poll_until(
        Duration::from_secs(20),
        "the collector to accept the agent's frames",
        || Ok(node_frames(&http)? >= frames_before + 2),
    )?;

    control.ask("stop")?;
    println!("the collector at {collector} is stopped; flapping {LINK} {FLAPS} times");
    guest::flap_link(LINK, FLAPS)?;
    thread::sleep(Duration::from_secs(2));
    let back_ns = guest::realtime_ns();
    control.ask("start")?;
    println!("the collector is back");

    let expected = agent_port_events(&agent.stdout_lines());
    let downs: Vec<u64> = expected
        .iter()
        .filter(|e| e.0 == "port_transition" && e.2 == DEVICE && e.3 == 1 && e.4 == "DOWN")
        .map(|e| e.1)
        .collect();
    ensure!(
        downs.len() == FLAPS && downs.iter().all(|&t| t < back_ns),
        "the agent reported {} DOWN transitions of {DEVICE} port 1 while the collector was \
         away, expected {FLAPS}: {expected:?}",
        downs.len()
    );
    // The agent sends what the collector lacks once it answers again.
    let mut last = Vec::new();
    let caught_up = guest::poll_until(
        Duration::from_secs(45),
        "the archive to hold every port event",
        || {
            last = archived_port_events(&http, since_ns)?;
            Ok(differences(&expected, &last).is_empty())
        },
    );
    ensure!(agent.is_running(), "the agent died");
    let (_, stderr) = agent.stop()?;
    if let Err(e) = caught_up {
        bail!("{e}: {}", differences(&expected, &last).join("; "));
    }
    if let Some(l) = stderr
        .iter()
        .find(|l| l.contains("no collector acknowledged"))
    {
        bail!("the agent stopped with frames unacknowledged: {l}");
    }
    // Nothing came twice later either.
    let archived = archived_port_events(&http, since_ns)?;
    let wrong = differences(&expected, &archived);
    ensure!(
        wrong.is_empty(),
        "archive against the agent: {}",
        wrong.join("; ")
    );
    println!(
        "{} port events, all made while the collector was away, in the archive once",
        archived.len()
    );
    check_finding(&http, &downs, back_ns)
}

/// The flapping finding of [`DEVICE`] port 1: it starts at the first DOWN's own time and its
/// evidence names the last one and how many.
fn check_finding(http: &str, downs: &[u64], back_ns: u64) -> anyhow::Result<()> {
    let mut found = Vec::new();
    guest::poll_until(
        Duration::from_secs(20),
        "the ib_link_flapping finding",
        || {
            let answer = http::get_json(http, "/api/v1/findings?node=guest")?;
            found = answer["findings"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|f| {
                    f["rule"] == "ib_link_flapping" && f["device"] == DEVICE && f["port"] == 1
                })
                .cloned()
                .collect();
            Ok(!found.is_empty())
        },
    )?;
    println!("finding: {}", found[0]);
    ensure!(
        found.len() == 1,
        "{} flapping findings of {DEVICE}/1: {found:?}",
        found.len()
    );
    let f = &found[0];
    let (first, last) = (downs[0], downs[downs.len() - 1]);
    ensure!(
        f["start"].as_u64() == Some(first),
        "the finding starts at {}, the first DOWN was at {first} (the collector came back at \
         {back_ns})",
        f["start"]
    );
    ensure!(
        f["evidence"]["last_down"].as_u64() == Some(last)
            && f["evidence"]["downs"].as_u64() == Some(downs.len() as u64),
        "the finding's evidence {} does not name the {} DOWNs, the last at {last}",
        f["evidence"],
        downs.len()
    );
    Ok(())
}

/// The port events among the agent's JSON lines.
fn agent_port_events(lines: &[String]) -> Vec<PortEvent> {
    let mut out: Vec<PortEvent> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| {
            let (kind, what) = match v["kind"].as_str()? {
                "ib_event" if v["origin"] == "port" => ("ib_port", v["event"].as_str()?),
                "port_transition" => ("port_transition", v["to"].as_str()?),
                _ => return None,
            };
            Some((
                kind.to_owned(),
                v["unix_ns"].as_u64()?,
                v["device"].as_str()?.to_owned(),
                u32::try_from(v["port"].as_u64()?).ok()?,
                what.to_owned(),
            ))
        })
        .collect();
    out.sort();
    out
}

/// The node's port events the archive holds from `since_ns` on (events API; the end is far
/// enough ahead that a guest clock ahead of the host's loses nothing).
fn archived_port_events(http: &str, since_ns: u64) -> anyhow::Result<Vec<PortEvent>> {
    let seconds = |ns: u64| format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000);
    let path = format!(
        "/api/v1/events?node=guest&start={}&end={}",
        seconds(since_ns),
        seconds(guest::realtime_ns() + 600_000_000_000)
    );
    let answer = http::get_json(http, &path)?;
    Ok(archive_port_events(&answer))
}

/// The port events of an events API answer.
fn archive_port_events(answer: &Value) -> Vec<PortEvent> {
    let mut out: Vec<PortEvent> = answer["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["kind"] == "ib_port" || e["kind"] == "port_transition")
        .filter_map(|e| {
            Some((
                e["kind"].as_str()?.to_owned(),
                e["t"].as_u64()?,
                e["labels"]["device"].as_str()?.to_owned(),
                e["labels"]["port"].as_str()?.parse().ok()?,
                e["text"].as_str()?.to_owned(),
            ))
        })
        .collect();
    out.sort();
    out
}

/// What differs between the events the agent reported and those archived: each event
/// missing, or archived more (or less) often than reported, or archived but never reported.
fn differences(reported: &[PortEvent], archived: &[PortEvent]) -> Vec<String> {
    let count = |events: &[PortEvent]| {
        let mut n: BTreeMap<PortEvent, usize> = BTreeMap::new();
        for e in events {
            *n.entry(e.clone()).or_default() += 1;
        }
        n
    };
    let (want, got) = (count(reported), count(archived));
    let mut out = Vec::new();
    for (e, &n) in &want {
        match got.get(e).copied().unwrap_or(0) {
            0 => out.push(format!("missing {e:?}")),
            m if m != n => out.push(format!("{e:?} archived {m} times, reported {n}")),
            _ => {}
        }
    }
    for e in got.keys().filter(|e| !want.contains_key(*e)) {
        out.push(format!("archived but never reported {e:?}"));
    }
    out
}

/// Frames the collector accepted from node `guest` since it started (0 before the first).
pub(super) fn node_frames(http: &str) -> anyhow::Result<u64> {
    let nodes = http::get_json(http, "/api/v1/live/nodes")?;
    Ok(nodes
        .as_array()
        .into_iter()
        .flatten()
        .find(|n| n["node"] == "guest")
        .and_then(|n| n["frames"].as_u64())
        .unwrap_or(0))
}

/// The host's control port: one line asked, one line answered once done.
struct Control {
    out: TcpStream,
    answers: BufReader<TcpStream>,
}

impl Control {
    fn connect(addr: &str) -> anyhow::Result<Self> {
        let out = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
        out.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(Self {
            answers: BufReader::new(out.try_clone()?),
            out,
        })
    }

    /// Asks the host to `command` the collector and waits until it has.
    fn ask(&mut self, command: &str) -> anyhow::Result<()> {
        writeln!(self.out, "{command}")?;
        let mut answer = String::new();
        self.answers
            .read_line(&mut answer)
            .with_context(|| format!("waiting for the host to {command} the collector"))?;
        ensure!(
            answer.trim() == "ok",
            "the host could not {command} the collector: {}",
            answer.trim()
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(kind: &str, t: u64, what: &str) -> PortEvent {
        (kind.into(), t, "rxe0".into(), 1, what.into())
    }

    #[test]
    fn the_agents_port_events_and_the_archives_name_the_same_things() {
        let lines = [
            r#"{"kind":"ib_event","origin":"port","device":"rxe0","port":1,"event":"PORT_ERR","unix_ns":5,"ktime_ns":1}"#,
            r#"{"kind":"port_transition","device":"rxe0","port":1,"from":"UP","to":"DOWN","unix_ns":5,"ktime_ns":1}"#,
            r#"{"kind":"ib_event","origin":"qp_async","device":"rxe0","port":0,"event":"QP_FATAL","unix_ns":6}"#,
            "agent log line, not JSON",
        ]
        .map(String::from);
        let answer: Value = serde_json::from_str(
            r#"{"events":[
                {"t":5,"node":"guest","kind":"port_transition","labels":{"device":"rxe0","port":"1","from":"UP"},"code":0,"text":"DOWN"},
                {"t":5,"node":"guest","kind":"ib_port","labels":{"device":"rxe0","port":"1","cgroup":"/"},"code":10,"text":"PORT_ERR"},
                {"t":6,"node":"guest","kind":"qp_async","labels":{"device":"rxe0","qp":"17"},"code":1,"text":"QP_FATAL"}
            ]}"#,
        )
        .unwrap();
        let reported = agent_port_events(&lines);
        assert_eq!(
            reported,
            [e("ib_port", 5, "PORT_ERR"), e("port_transition", 5, "DOWN")]
        );
        assert_eq!(archive_port_events(&answer), reported);
        assert!(differences(&reported, &archive_port_events(&answer)).is_empty());
    }

    #[test]
    fn names_what_is_missing_twice_or_unreported() {
        let reported = [e("ib_port", 5, "PORT_ERR"), e("ib_port", 7, "PORT_ACTIVE")];
        assert_eq!(
            differences(
                &reported,
                &[e("ib_port", 5, "PORT_ERR"), e("ib_port", 5, "PORT_ERR")]
            ),
            [
                "(\"ib_port\", 5, \"rxe0\", 1, \"PORT_ERR\") archived 2 times, reported 1",
                "missing (\"ib_port\", 7, \"rxe0\", 1, \"PORT_ACTIVE\")"
            ]
        );
        // rxe raises PORT_ACTIVE twice per link-up: both are events, both are archived.
        let twice = [
            e("ib_port", 7, "PORT_ACTIVE"),
            e("ib_port", 7, "PORT_ACTIVE"),
        ];
        assert!(differences(&twice, &twice).is_empty());
        assert_eq!(
            differences(&[], &[e("ib_port", 9, "PORT_ERR")]),
            ["archived but never reported (\"ib_port\", 9, \"rxe0\", 1, \"PORT_ERR\")"]
        );
    }
}
