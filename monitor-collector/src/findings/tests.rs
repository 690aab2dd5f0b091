//! Each rule fires on its evidence, on the device that has it, and nothing fires on a healthy
//! fleet: simulated fleets (monitor-testkit, real frames) are ingested by a node table and the
//! engine evaluates the live view and the events as the findings thread does.

use std::{net::SocketAddr, sync::Arc};

use monitor_testkit::SimulatedFleet;
use monitor_wire::Key;

use crate::{config::Limits, nodes::NodeTable};
use monitor_findings::{
    Finding, FindingsStore, Severity, Thresholds,
    engine::{FindingsEngine, Pass, port_states},
};

fn key() -> Key {
    Key::from_bytes([9; 32])
}

/// (rule, node, device, port, GPU) of a finding.
type Place = (String, String, Option<String>, Option<u32>, Option<String>);

const T0: u64 = 1_790_000_000_000_000_000;
const S: u64 = 1_000_000_000;

/// Runs `ticks` ticks of `fleet` through a node table and the engine (a full pass every
/// `tick_s` simulated seconds, events at once); returns every finding, and the store.
fn run_with(
    fleet: &mut SimulatedFleet,
    ticks: u64,
    th: Thresholds,
) -> (Vec<Finding>, Arc<FindingsStore>, FindingsEngine, NodeTable) {
    let table = NodeTable::new(key(), Limits::default());
    let store = Arc::new(FindingsStore::in_memory());
    let mut engine = FindingsEngine::new(th.clone(), store.clone());
    feed(fleet, ticks, &table, &mut engine);
    let all = store.list(&monitor_findings::store::FindingFilter {
        start_ns: 0,
        end_ns: u64::MAX,
        ..Default::default()
    });
    (all, store, engine, table)
}

/// Runs `ticks` ticks of `fleet` through `table` and `engine`, as [`run_with`] does.
fn feed(fleet: &mut SimulatedFleet, ticks: u64, table: &NodeTable, engine: &mut FindingsEngine) {
    feed_but(fleet, ticks, table, engine, None);
}

/// [`feed`], `silent`'s frames never arriving.
fn feed_but(
    fleet: &mut SimulatedFleet,
    ticks: u64,
    table: &NodeTable,
    engine: &mut FindingsEngine,
    silent: Option<&str>,
) {
    let tick_s = engine.thresholds().tick_s;
    let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
    for _ in 0..ticks {
        let tick = fleet.ticks();
        let t = fleet.tick_unix_ns(tick);
        let frames = fleet.tick();
        let mut events = false;
        for f in frames {
            if silent.is_some() && monitor_wire::peek_node(&f) == silent {
                continue;
            }
            let accepted = table.ingest(&f, from, t + 1_000_000).expect("accepted");
            events |= engine.take_frame(&accepted.node, &accepted.frame, &accepted.schema, t);
        }
        if events {
            engine.evaluate(Pass::Events, t);
        }
        if (tick + 1).is_multiple_of(tick_s) {
            engine.refresh(table);
            engine.evaluate(Pass::All, t);
        }
    }
}

fn run(fleet: &mut SimulatedFleet, ticks: u64) -> Vec<Finding> {
    run_with(fleet, ticks, Thresholds::default()).0
}

fn fleet(nodes: usize) -> monitor_testkit::FleetBuilder {
    SimulatedFleet::builder(nodes)
        .job("slurm:42", 0..nodes)
        .roce()
        .flush_every(5)
        .start_unix_ns(T0)
}

fn rules(findings: &[Finding]) -> Vec<Place> {
    let mut v: Vec<_> = findings
        .iter()
        .map(|f| {
            (
                f.rule.clone(),
                f.node.clone(),
                f.device.clone(),
                f.port,
                f.gpu.clone(),
            )
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

fn port(rule: &str, node: &str, device: &str) -> Place {
    (rule.into(), node.into(), Some(device.into()), Some(1), None)
}

fn gpu(rule: &str, node: &str, g: &str) -> Place {
    (rule.into(), node.into(), None, None, Some(g.into()))
}

#[test]
fn a_healthy_fleet_has_no_findings() {
    let found = run(&mut fleet(8).build(key()), 180);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn two_downs_are_not_flapping() {
    // Downs at 18 s and 38 s.
    let found = run(&mut fleet(2).flapping_port(1, 3).build(key()), 50);
    assert_eq!(
        rules(&found),
        [
            port("ib_link_downed", "node-001", "mlx5_3"),
            port("ib_port_down", "node-001", "mlx5_3"),
        ]
    );
}

#[test]
fn a_port_going_down_is_found_at_its_event_and_ends_when_it_comes_back() {
    // Down for 2 s at 18 s and 38 s; each DOWN transition 1 ms after its tick.
    let found = run(&mut fleet(2).flapping_port(1, 3).build(key()), 50);
    let downs: Vec<&Finding> = found.iter().filter(|f| f.rule == "ib_port_down").collect();
    assert_eq!(downs.len(), 2, "{found:#?}");
    for (f, tick) in downs.iter().zip([18, 38]) {
        let at = T0 + tick * S + 1_000_000;
        assert_eq!(
            (f.node.as_str(), f.device.as_deref(), f.port),
            ("node-001", Some("mlx5_3"), Some(1))
        );
        assert_eq!(f.severity, Severity::Critical);
        assert_eq!(f.start, at, "{f:#?}");
        // Ended at the UP transition's own time, two ticks later (1 ms after its tick): not at
        // the pass that took it, which depends on when its frame came.
        assert_eq!(f.end, Some(T0 + (tick + 2) * S + 1_000_000), "{f:#?}");
        let e = &f.evidence;
        assert_eq!(e["state"], "DOWN", "{f:#?}");
        assert_eq!(e["down_at"], at);
        assert_eq!(e["source"], "port_transition");
        assert_eq!(e["from"], "UP");
        // Back within `fabric-settle-s`: still being grouped when it ended (so no action
        // acted on it), and judged the node's own once the burst was: no `upstream`, never
        // "pending" for ever (issue 45).
        assert!(e.get("upstream").is_none(), "{f:#?}");
        assert!(e.get("upstream_from").is_none(), "{f:#?}");
    }
    // Within the settle time after the last DOWN (at 38 s, ended at 40 s): still pending.
    let found = run(&mut fleet(2).flapping_port(1, 3).build(key()), 42);
    let last = found
        .iter()
        .filter(|f| f.rule == "ib_port_down")
        .max_by_key(|f| f.start)
        .unwrap();
    assert!(last.end.is_some(), "{last:#?}");
    assert_eq!(last.evidence["upstream"], "pending", "{last:#?}");
}

#[test]
fn a_port_down_without_a_port_event_is_found_from_its_state_samples() {
    // An agent without the eBPF probes (or started with the port already down) sends no
    // port transition: the state samples say it, as they arrive (the fleet's events are left
    // out here). Down from tick 65 to 99, judged its node's after `fabric-settle-s`.
    let mut fleet = fleet(2)
        .flapping_port(1, 2)
        .flap_period(100, 35)
        .build(key());
    let table = NodeTable::new(key(), Limits::default());
    let store = Arc::new(FindingsStore::in_memory());
    let mut engine = FindingsEngine::new(Thresholds::default(), store.clone());
    let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut open_at_90 = None;
    for _ in 0..110 {
        let tick = fleet.ticks();
        let t = fleet.tick_unix_ns(tick);
        for f in fleet.tick() {
            let accepted = table.ingest(&f, from, t).expect("accepted");
            engine.take_port_states(
                &accepted.node,
                port_states(&accepted.frame, &accepted.schema),
            );
        }
        engine.evaluate(Pass::Events, t);
        if tick == 90 {
            open_at_90 = store
                .active()
                .into_iter()
                .find(|f| f.rule == "ib_port_down");
        }
    }
    let f = open_at_90.expect("the port's finding, open while it is down");
    assert_eq!(f.node, "node-001");
    assert_eq!((f.device.as_deref(), f.port), (Some("mlx5_2"), Some(1)));
    assert_eq!(f.severity, Severity::Critical);
    assert_eq!(f.evidence["source"], "railscope_ib_port_state", "{f:#?}");
    assert_eq!(f.evidence["phys_state_name"], "Polling", "{f:#?}");
    assert!(f.evidence.get("upstream").is_none(), "{f:#?}");
    let all = store.list(&monitor_findings::store::FindingFilter {
        start_ns: 0,
        end_ns: u64::MAX,
        ..Default::default()
    });
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(all[0].id, f.id);
    assert_eq!(all[0].start, f.evidence["down_at"].as_u64().unwrap());
    assert!(!all[0].is_active(), "{all:#?}");
}

#[test]
fn a_flapping_port_is_found_from_its_port_events() {
    // Down for 2 s every 20 s: 3 downs by t = 60 s.
    let found = run(&mut fleet(4).flapping_port(2, 3).build(key()), 120);
    assert_eq!(
        rules(&found),
        [
            port("ib_link_downed", "node-002", "mlx5_3"),
            port("ib_link_flapping", "node-002", "mlx5_3"),
            port("ib_port_down", "node-002", "mlx5_3"),
        ]
    );
    let flap = found.iter().find(|f| f.rule == "ib_link_flapping").unwrap();
    assert_eq!(flap.severity, Severity::Critical);
    assert!(flap.is_active());
    // Six downs by the end (tick 118), the last not judged yet: its burst waits
    // `fabric-settle-s` for other nodes' frames before it counts.
    assert_eq!(flap.evidence["downs"], 5, "{flap:?}");
    // Found at the third down (ticks 18, 38, 58), starting at the first.
    assert_eq!(flap.start, T0 + 18 * S + 1_000_000);
    assert_eq!(
        flap.id,
        format!("ib_link_flapping/node-002/mlx5_3/1/{}", flap.start)
    );
}

#[test]
fn a_port_down_for_long_is_found_by_its_phys_state_and_not_as_flapping() {
    // Down 60 s of every 100 s: one down in 100 s, longer than the 25 s grace.
    let found = run(
        &mut fleet(4)
            .flapping_port(1, 0)
            .flap_period(100, 60)
            .build(key()),
        90,
    );
    assert_eq!(
        rules(&found),
        [
            port("ib_link_downed", "node-001", "mlx5_0"),
            port("ib_phys_state", "node-001", "mlx5_0"),
            port("ib_port_down", "node-001", "mlx5_0"),
        ]
    );
    let phys = found.iter().find(|f| f.rule == "ib_phys_state").unwrap();
    assert_eq!(phys.evidence["name"], "Polling");
    assert_eq!(phys.severity, Severity::Critical);
    // Found at once, and still down: judged its node's, so the actions may act on it.
    let down = found.iter().find(|f| f.rule == "ib_port_down").unwrap();
    assert!(down.is_active() && down.start < phys.start, "{found:#?}");
    assert!(down.evidence.get("upstream").is_none(), "{down:#?}");
}

#[test]
fn a_degraded_port_is_found_by_its_width_and_symbol_errors() {
    let found = run(&mut fleet(4).degraded_port(3, 6).build(key()), 90);
    assert_eq!(
        rules(&found),
        [
            port("ib_port_degraded", "node-003", "mlx5_6"),
            port("ib_symbol_errors", "node-003", "mlx5_6"),
        ]
    );
    let degraded = found.iter().find(|f| f.rule == "ib_port_degraded").unwrap();
    assert_eq!(degraded.evidence["width_lanes"], 2.0);
    assert_eq!(degraded.evidence["expected_width_lanes"], 4.0);
    assert_eq!(degraded.evidence["expected_rate_gbps"], 400.0);
    // 40 errors/s: above 10/s at once, and above 120 in the hour within seconds.
    let symbols = found.iter().find(|f| f.rule == "ib_symbol_errors").unwrap();
    assert_eq!(symbols.severity, Severity::Critical);
}

/// A DGX A100's ports: InfiniBand compute ports at 400 Gb/s and RoCE storage ports at 100.
/// Each is judged against its own class (link layer, device, port), so no storage port is
/// "degraded" against the compute ports' rate, and a compute port trained down still is.
#[test]
fn ports_are_judged_against_their_own_class() {
    let found = run(&mut fleet(4).storage_ports(2).build(key()), 60);
    assert!(
        found.iter().all(|f| f.rule != "ib_port_degraded"),
        "{found:#?}"
    );
    let found = run(
        &mut fleet(4).storage_ports(2).degraded_port(3, 1).build(key()),
        60,
    );
    let degraded: Vec<&Finding> = found
        .iter()
        .filter(|f| f.rule == "ib_port_degraded")
        .collect();
    assert_eq!(degraded.len(), 1, "{found:#?}");
    assert_eq!(
        (degraded[0].node.as_str(), degraded[0].device.as_deref()),
        ("node-003", Some("mlx5_1"))
    );
    assert_eq!(degraded[0].evidence["expected_rate_gbps"], 400.0);
}

/// A node whose agent stops sending is `node_silent`, dated by its last frame; its findings
/// stay open, marked stale, though a rate cannot be computed without samples (the symbol
/// errors' rate ended the finding before); heard again, the silence ends and they are judged
/// as before (issue 45).
#[test]
fn a_silent_node_is_its_own_finding_and_its_other_findings_stay_open_marked_stale() {
    let mut fleet = fleet(4).degraded_port(2, 6).build(key());
    let table = NodeTable::new(key(), Limits::default());
    let store = Arc::new(FindingsStore::in_memory());
    let mut engine = FindingsEngine::new(Thresholds::default(), store.clone());
    feed(&mut fleet, 90, &table, &mut engine);
    let before: Vec<Finding> = store.active();
    assert_eq!(
        rules(&before),
        [
            port("ib_port_degraded", "node-002", "mlx5_6"),
            port("ib_symbol_errors", "node-002", "mlx5_6"),
        ]
    );
    let last_heard = table
        .summaries()
        .into_iter()
        .find(|n| n.node == "node-002")
        .unwrap()
        .last_seen_unix_ns;
    feed_but(&mut fleet, 120, &table, &mut engine, Some("node-002"));
    let during = store.active();
    let silent: Vec<&Finding> = during.iter().filter(|f| f.rule == "node_silent").collect();
    assert_eq!(silent.len(), 1, "{during:#?}");
    assert_eq!(silent[0].node, "node-002");
    assert_eq!(silent[0].start, last_heard);
    assert_eq!(silent[0].evidence["last_heard"], last_heard);
    for f in &before {
        let kept = during.iter().find(|d| d.id == f.id).expect("still open");
        assert_eq!(
            kept.evidence["stale"]["last_heard"], last_heard,
            "{kept:#?}"
        );
    }
    // Heard again: the silence ends, and the port's findings, still true, are fresh.
    feed(&mut fleet, 30, &table, &mut engine);
    let after = store.active();
    assert!(after.iter().all(|f| f.rule != "node_silent"), "{after:#?}");
    for f in &before {
        let again = after.iter().find(|a| a.id == f.id).expect("still open");
        assert!(again.evidence.get("stale").is_none(), "{again:#?}");
    }
    let ended = store.get(&silent[0].id).unwrap();
    assert!(ended.end.is_some());
}

/// A restarted collector knows the nodes its archive heard before it started: one it does not
/// hear again is silent since its last frame (issue 45: a node that fell silent while the
/// collector was down was never found, its findings open and unmarked).
#[test]
fn a_node_not_heard_since_the_collector_restarted_is_silent_since_its_last_frame() {
    let mut fleet = fleet(2).build(key());
    let table = NodeTable::new(key(), Limits::default());
    let store = Arc::new(FindingsStore::in_memory());
    let last_heard = T0 - 20 * S;
    let heard: std::collections::HashMap<Arc<str>, u64> = [
        (Arc::from("node-001"), last_heard),
        (Arc::from("node-007"), last_heard),
    ]
    .into();
    let mut engine = FindingsEngine::new(Thresholds::default(), store.clone()).heard_before(heard);
    // 30 s: node-007 was last heard 50 s ago, under `silent-after-s` (60).
    feed(&mut fleet, 30, &table, &mut engine);
    assert!(store.active().is_empty(), "{:#?}", store.active());
    feed(&mut fleet, 30, &table, &mut engine);
    let active = store.active();
    assert_eq!(
        rules(&active),
        [(
            "node_silent".to_owned(),
            "node-007".to_owned(),
            None,
            None,
            None
        )],
        "{active:#?}"
    );
    assert_eq!(active[0].start, last_heard);
    assert_eq!(active[0].evidence["last_heard"], last_heard);
}

#[test]
fn thresholds_are_configurable() {
    let th = Thresholds {
        symbol_errors_per_s: 100.0,
        symbol_errors_per_hour: 1_000_000,
        expected_width_lanes: Some(2.0),
        expected_rate_gbps: Some(200.0),
        ..Thresholds::default()
    };
    let (found, ..) = run_with(&mut fleet(4).degraded_port(3, 6).build(key()), 90, th);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn roce_congestion_far_above_the_fleets_norm_is_found() {
    let found = run(&mut fleet(8).congested_port(5, 2).build(key()), 120);
    assert_eq!(
        rules(&found),
        [port("roce_congestion", "node-005", "mlx5_2")]
    );
    let f = &found[0];
    assert!(f.evidence["score"].as_f64().unwrap() > 3.5);
    assert_eq!(f.evidence["ports"], 64);
}

/// 16 RoCE ports (two nodes) through the agent's own sampler, with mlx5's PFC counters as
/// the ethtool source names them: one port sends 50,000 pause frames/s on priority 3 where
/// the others send about 20, one is paused 80 % of the time; a fleet without either has no
/// finding.
#[test]
fn a_pfc_pause_storm_and_a_port_paused_most_of_the_time_are_found() {
    let healthy = run(&mut fleet(2).adaptive(true).pfc().build(key()), 150);
    assert!(healthy.is_empty(), "{healthy:#?}");

    let mut fleet = fleet(2)
        .adaptive(true)
        .pfc_storm_port(0, 5)
        .pfc_paused_port(1, 2, 0.8)
        .build(key());
    let found = run(&mut fleet, 150);
    assert_eq!(
        rules(&found),
        [
            port("pfc_pause_storm", "node-000", "mlx5_5"),
            port("pfc_pause_storm", "node-001", "mlx5_2"),
        ]
    );
    let storm = found.iter().find(|f| f.node == "node-000").unwrap();
    assert_eq!(storm.evidence["priority"], 3);
    assert_eq!(storm.evidence["direction"], "tx");
    let rate = storm.evidence["pause_per_s"].as_f64().unwrap();
    assert!((rate - 50_000.0).abs() < 1_000.0, "{rate}");
    let median = storm.evidence["fleet_median"].as_f64().unwrap();
    assert!((10.0..30.0).contains(&median), "{median}");
    assert_eq!(storm.evidence["ports"], 16);
    let paused = found.iter().find(|f| f.node == "node-001").unwrap();
    assert_eq!(paused.evidence["priority"], 3);
    assert_eq!(paused.evidence["direction"], "rx");
    let fraction = paused.evidence["paused_fraction"].as_f64().unwrap();
    assert!((fraction - 0.8).abs() < 0.05, "{fraction}");
}

#[test]
fn a_throttled_gpu_is_found_with_its_job() {
    let found = run(&mut fleet(4).slow_gpu(1, 5).build(key()), 30);
    assert_eq!(
        rules(&found),
        [gpu("gpu_thermal_throttle", "node-001", "5")]
    );
    assert_eq!(found[0].job_id.as_deref(), Some("slurm:42"));
    assert_eq!(found[0].evidence["reasons"][0], "hw_thermal_slowdown");
}

#[test]
fn xids_are_classified_and_end_after_the_hold() {
    let th = Thresholds {
        xid_hold_s: 30,
        ..Thresholds::default()
    };
    let (found, ..) = run_with(
        &mut fleet(2).xid(0, 4, 79, 3).xid(1, 2, 13, 5).build(key()),
        60,
        th,
    );
    assert_eq!(
        rules(&found),
        [
            gpu("gpu_xid", "node-000", "4"),
            gpu("gpu_xid", "node-001", "2")
        ]
    );
    let fatal = &found.iter().find(|f| f.node == "node-000").unwrap();
    assert_eq!(fatal.severity, Severity::Critical);
    assert_eq!(fatal.evidence["xids"][0]["action"], "RESTART_BM");
    assert_eq!(fatal.job_id.as_deref(), Some("slurm:42"));
    let app = &found.iter().find(|f| f.node == "node-001").unwrap();
    assert_eq!(app.severity, Severity::Warning);
    // 30 s after it, the XID's finding ends.
    assert!(fatal.end.is_some_and(|e| e >= T0 + 33 * S), "{fatal:?}");
    assert!(app.end.is_some());
}

#[test]
fn a_lost_gpu_is_found_and_its_stale_series_are_not() {
    let found = run(
        &mut fleet(2)
            .lost_gpu(1, 7, 10)
            .ecc_double_bit(1, 7)
            .build(key()),
        30,
    );
    // The ECC rule saw the GPU's errors before it was lost. Once lost, its stale series are
    // no evidence either way: the ECC finding stays as it was (nothing showed the errors
    // gone: a reset GPU's count starts again at 0), the loss is found, and nothing else.
    let mut active: Vec<_> = found
        .iter()
        .filter(|f| f.is_active())
        .map(|f| (f.rule.as_str(), f.gpu.as_deref()))
        .collect();
    active.sort();
    assert_eq!(
        active,
        [("gpu_ecc_uncorrected", Some("7")), ("gpu_lost", Some("7"))],
        "{found:#?}"
    );
    assert_eq!(found.len(), 2, "{found:#?}");
    let lost = found.iter().find(|f| f.rule == "gpu_lost").unwrap();
    let ecc = found.iter().find(|f| f.rule != "gpu_lost").unwrap();
    assert!(ecc.start < lost.start, "{found:#?}");
}

#[test]
fn gpu_memory_and_pcie_rules() {
    let found = run(
        &mut fleet(2)
            .ecc_double_bit(0, 1)
            .remap_pending(0, 2)
            .pcie_gen_dropped(1, 3)
            .pcie_degraded(1, 5)
            .build(key()),
        20,
    );
    // Gen4 x16 while busy: the generation dropped; Gen4 x8: lanes lost, which the golden
    // profile finds (busy or not), and not both rules on one GPU.
    assert_eq!(
        rules(&found),
        [
            gpu("gpu_ecc_uncorrected", "node-000", "1"),
            gpu("gpu_pcie_degraded", "node-001", "3"),
            gpu("gpu_row_remap_pending", "node-000", "2"),
            gpu("pcie_downtrained", "node-001", "5"),
        ]
    );
    let pcie = found
        .iter()
        .find(|f| f.rule == "gpu_pcie_degraded")
        .unwrap();
    assert_eq!(pcie.evidence["generation"], 4.0);
    assert_eq!(pcie.evidence["max_generation"], 5.0);
    assert_eq!(pcie.evidence["width"], 16.0);
    let lanes = found.iter().find(|f| f.rule == "pcie_downtrained").unwrap();
    assert_eq!(lanes.evidence["link"]["width"], 8);
    assert_eq!(lanes.evidence["link"]["max_width"], 16);
}

#[test]
fn an_idle_gpu_at_a_lower_pcie_link_is_not_a_finding() {
    let mut fleet = SimulatedFleet::builder(2)
        .pcie_gen_dropped(1, 3)
        .start_unix_ns(T0)
        .build(key());
    assert!(run(&mut fleet, 20).is_empty());
}

#[test]
fn qp_errors_and_cm_rejects_are_found_per_job() {
    let found = run(
        &mut fleet(3)
            .qp_errors(1, "slurm:42")
            .cm_rejects(2, "slurm:42")
            .build(key()),
        40,
    );
    // Both counters rise from the first tick: the two findings start together.
    let mut got: Vec<(String, String, Option<String>)> = found
        .iter()
        .map(|f| (f.rule.clone(), f.node.clone(), f.job_id.clone()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (
                "verbs_cm_reject".into(),
                "node-002".into(),
                Some("slurm:42".into())
            ),
            (
                "verbs_qp_error".into(),
                "node-001".into(),
                Some("slurm:42".into())
            ),
        ]
    );
    let qp = found.iter().find(|f| f.rule == "verbs_qp_error").unwrap();
    assert_eq!(
        qp.id,
        format!("verbs_qp_error/node-001/slurm:42/{}", qp.start)
    );
}

#[test]
fn qps_moved_to_err_by_closed_connections_are_no_finding() {
    // rping's teardown: each side's QP to ERR, each side a DISCONNECTED event.
    let found = run(
        &mut fleet(3)
            .qp_errors(1, "slurm:42")
            .cm_disconnects(1, "slurm:42")
            .build(key()),
        40,
    );
    assert!(
        found.iter().all(|f| f.rule != "verbs_qp_error"),
        "{found:?}"
    );
}

#[test]
fn findings_are_counted_and_shown_on_metrics() {
    let (_, store, ..) = run_with(
        &mut fleet(2).degraded_port(0, 1).build(key()),
        30,
        Thresholds::default(),
    );
    let mut page = String::new();
    super::api::write_metrics(&mut page, &store);
    assert!(
        page.contains(
            "railscope_finding_active{device=\"mlx5_1\",node=\"node-000\",port=\"1\",rule=\"ib_port_degraded\",severity=\"warning\"} 1"
        ),
        "{page}"
    );
    assert!(
        page.contains("railscope_findings_total{rule=\"ib_port_degraded\",severity=\"warning\"} 1")
    );
}

#[test]
fn findings_go_to_remote_write_as_series() {
    let (_, store, ..) = run_with(
        &mut fleet(2).degraded_port(0, 1).build(key()),
        30,
        Thresholds::default(),
    );
    let body = monitor_remote_write::prompb::encode_body(&monitor_findings::remote::write_request(
        &store, T0,
    ));
    let request = monitor_remote_write::prompb::decode_body(&body).unwrap();
    let series: Vec<String> = request
        .timeseries
        .iter()
        .map(|t| {
            let labels: Vec<String> = t
                .labels
                .iter()
                .map(|l| format!("{}={}", l.name, l.value))
                .collect();
            format!(
                "{} {} @{}",
                labels.join(","),
                t.samples[0].value,
                t.samples[0].timestamp
            )
        })
        .collect();
    assert_eq!(
        series,
        [
            "__name__=railscope_finding_active,device=mlx5_1,node=node-000,port=1,rule=ib_port_degraded,severity=warning 1 @1790000000000",
            "__name__=railscope_finding_active,device=mlx5_1,node=node-000,port=1,rule=ib_symbol_errors,severity=critical 1 @1790000000000",
            "__name__=railscope_findings_total,rule=ib_port_degraded,severity=warning 1 @1790000000000",
            "__name__=railscope_findings_total,rule=ib_symbol_errors,severity=critical 1 @1790000000000",
        ]
    );
}

#[test]
fn a_port_seen_down_at_every_pass_is_not_stuck_down_when_it_flaps_between() {
    // Down 5 s of every 20 s; the engine's pass every 20 s falls in each down episode.
    let th = Thresholds {
        tick_s: 20,
        ..Thresholds::default()
    };
    let (found, ..) = run_with(
        &mut fleet(2).flapping_port(1, 0).flap_period(20, 5).build(key()),
        120,
        th,
    );
    assert_eq!(
        rules(&found),
        [
            port("ib_link_downed", "node-001", "mlx5_0"),
            port("ib_link_flapping", "node-001", "mlx5_0"),
            port("ib_port_down", "node-001", "mlx5_0"),
        ]
    );
}

/// Every tick of `fleet` handed over in one burst (a node's backlog, history sent at once, a
/// collector catching up), then one full pass at the last tick's time.
fn run_in_one_burst(fleet: &mut SimulatedFleet, ticks: u64) -> Vec<Finding> {
    let table = NodeTable::new(key(), Limits::default());
    let store = Arc::new(FindingsStore::in_memory());
    let mut engine = FindingsEngine::new(Thresholds::default(), store.clone());
    let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut last = 0;
    for _ in 0..ticks {
        last = fleet.tick_unix_ns(fleet.ticks());
        for f in fleet.tick() {
            let accepted = table.ingest(&f, from, last + 1_000_000).expect("accepted");
            engine.take_frame(&accepted.node, &accepted.frame, &accepted.schema, last);
        }
    }
    engine.refresh(&table);
    engine.evaluate(Pass::All, last);
    store.list(&monitor_findings::store::FindingFilter {
        start_ns: 0,
        end_ns: u64::MAX,
        ..Default::default()
    })
}

/// A node's port events taken as one backlog (as after an outage: five flaps' DOWN and UP
/// transitions at once, no pass between them) give the same `ib_port_down` findings — ids,
/// starts, ends — as the same events taken live, one pass each (issue 45: the backlog gave
/// none).
#[test]
fn port_down_findings_do_not_depend_on_the_pace_events_arrive_at() {
    let build = || fleet(2).flapping_port(1, 3).flap_period(10, 2).build(key());
    let downs = |found: &[Finding]| {
        let mut v: Vec<(String, u64, Option<u64>)> = found
            .iter()
            .filter(|f| f.rule == "ib_port_down")
            .map(|f| (f.id.clone(), f.start, f.end))
            .collect();
        v.sort();
        v
    };
    // Five flaps, the last ended 4 s before the end.
    let ticks = 56;
    let live = downs(&run(&mut build(), ticks));
    let backlog = downs(&run_in_one_burst(&mut build(), ticks));
    assert_eq!(live.len(), 5, "{live:#?}");
    assert!(live.iter().all(|(_, _, end)| end.is_some()), "{live:#?}");
    assert_eq!(backlog, live);
}

#[test]
fn counter_findings_do_not_depend_on_the_pace_frames_arrive_at() {
    // Within the shortest counter window (60 s), so a live run's findings are all still open.
    let ticks = 55;
    let build = || {
        fleet(4)
            .degraded_port(3, 6)
            .flapping_port(1, 2)
            .qp_errors(0, "slurm:42")
            .cm_rejects(2, "slurm:42")
            .build(key())
    };
    let counter_rules = |found: &[Finding]| {
        let mut v: Vec<_> = found
            .iter()
            .filter(|f| {
                [
                    "ib_symbol_errors",
                    "ib_link_downed",
                    "verbs_qp_error",
                    "verbs_cm_reject",
                ]
                .contains(&f.rule.as_str())
            })
            .map(|f| (f.id.clone(), f.start, f.end))
            .collect();
        v.sort();
        v
    };
    let live = counter_rules(&run(&mut build(), ticks));
    let burst = counter_rules(&run_in_one_burst(&mut build(), ticks));
    assert_eq!(live.len(), 4, "{live:#?}");
    assert_eq!(burst, live);
}

#[test]
fn a_switch_wide_flap_is_one_upstream_finding_and_no_port_of_it_is_flapping() {
    // Port mlx5_2 of 6 of 8 nodes down at the same ticks (18, 38, 58, 78): a switch, not
    // six flapping ports.
    let mut builder = fleet(8);
    for n in 0..6 {
        builder = builder.flapping_port(n, 2);
    }
    let found = run(&mut builder.build(key()), 90);
    let upstream: Vec<&Finding> = found
        .iter()
        .filter(|f| f.rule == "fabric_upstream_down")
        .collect();
    assert_eq!(upstream.len(), 1, "{found:#?}");
    let u = upstream[0];
    assert_eq!(u.node, "fabric");
    assert_eq!(u.evidence["nodes"].as_array().unwrap().len(), 6);
    assert_eq!(u.evidence["bursts"], 4, "{u:#?}");
    assert!(
        found.iter().all(|f| f.rule != "ib_link_flapping"),
        "{found:#?}"
    );
    let downed: Vec<&Finding> = found
        .iter()
        .filter(|f| f.rule == "ib_link_downed")
        .collect();
    assert_eq!(downed.len(), 6, "{found:#?}");
    for f in downed {
        assert_eq!(f.evidence["upstream"], u.id.as_str(), "{f:#?}");
    }
    // Each port came back within the settle time: its ended port_down findings carry the
    // upstream finding's id once the burst was judged, never "pending".
    let ended_downs: Vec<&Finding> = found
        .iter()
        .filter(|f| f.rule == "ib_port_down" && f.end.is_some())
        .collect();
    assert_eq!(ended_downs.len(), 6 * 4, "{found:#?}");
    for f in ended_downs {
        assert_eq!(f.evidence["upstream"], u.id.as_str(), "{f:#?}");
    }
}

#[test]
fn ports_down_in_a_fabric_burst_are_found_at_once_and_blamed_upstream_once_judged() {
    // Port mlx5_2 of 6 of 8 nodes goes down for good at tick 10 (a switch), node-007's
    // mlx5_1 alone at tick 20.
    let build = |ticks| {
        let mut builder = fleet(8).port_down(7, 1, 20);
        for n in 0..6 {
            builder = builder.port_down(n, 2, 10);
        }
        run(&mut builder.build(key()), ticks)
    };
    // Within the settle time: found, and the actions wait.
    let early = build(12);
    let pending: Vec<&Finding> = early.iter().filter(|f| f.rule == "ib_port_down").collect();
    assert_eq!(pending.len(), 6, "{early:#?}");
    for f in &pending {
        assert_eq!(f.evidence["upstream"], "pending", "{f:#?}");
        assert_eq!(f.start, T0 + 10 * S + 1_000_000);
    }
    let found = build(30);
    let u = found
        .iter()
        .find(|f| f.rule == "fabric_upstream_down")
        .expect("the upstream finding");
    let downs: Vec<&Finding> = found.iter().filter(|f| f.rule == "ib_port_down").collect();
    assert_eq!(downs.len(), 7, "{found:#?}");
    for f in downs {
        assert!(f.is_active(), "{f:#?}");
        if f.node == "node-007" {
            assert_eq!(f.device.as_deref(), Some("mlx5_1"));
            assert!(f.evidence.get("upstream").is_none(), "{f:#?}");
        } else {
            // Still raised (the port is down), carrying the upstream finding's id.
            assert_eq!(f.device.as_deref(), Some("mlx5_2"));
            assert_eq!(f.evidence["upstream"], u.id.as_str(), "{f:#?}");
        }
    }
}

/// The golden profile is learnt off the tick thread, from the hardware of the nodes that
/// changed since it was last learnt: a node whose agent comes back with older NIC firmware,
/// after the profile was learnt from a healthy fleet, is found, and what is active then is
/// what a collector that only ever saw the fleet as it is now finds.
#[test]
fn a_node_whose_hardware_changed_after_the_profile_was_learnt_is_judged_again() {
    let fleet = |start: u64, old_firmware: bool| {
        let mut b = SimulatedFleet::builder(16)
            .hardware_path()
            .flush_every(5)
            .start_unix_ns(start);
        if old_firmware {
            b = b.hgx_node(6, monitor_testkit::HgxNode::new(6).nic_with_old_firmware(2));
        }
        b.build(key())
    };
    let active = |store: &FindingsStore| rules(&store.active());
    // Long enough for the profile to be learnt more than once (every 6 passes at most).
    let ticks = 80;
    let table = NodeTable::new(key(), Limits::default());
    let store = Arc::new(FindingsStore::in_memory());
    let mut engine = FindingsEngine::new(Thresholds::default(), store.clone());
    feed(&mut fleet(T0, false), ticks, &table, &mut engine);
    assert_eq!(active(&store), [], "a healthy fleet");
    // Every agent restarts (new sessions); node 6's with one NIC on older firmware.
    feed(&mut fleet(T0 + ticks * S, true), ticks, &table, &mut engine);
    let found = active(&store);
    assert_eq!(
        found,
        [(
            "firmware_drift".to_owned(),
            "node-006".to_owned(),
            Some("mlx5_2".to_owned()),
            None,
            None
        )]
    );
    // As a collector that saw only the restarted fleet.
    let (_, fresh, ..) = run_with(
        &mut fleet(T0 + ticks * S, true),
        ticks,
        Thresholds::default(),
    );
    assert_eq!(found, active(&fresh));
}

/// The tick reads the live view before the findings threads take the counter samples of the
/// frames it shows (ingest updates the live view first, then hands the samples over): here at
/// every tick, a pass every simulated second, frames every 5 s. Every counter's track is made
/// after the reading that found its series, and the quiet readings between two frames must
/// not forget it: forgotten, its history went, and its findings ended and opened again at
/// every flush (issue 45: `roce_congestion` ended in the middle of a storm).
#[test]
fn a_counter_read_before_its_samples_came_keeps_its_history_and_its_finding() {
    let th = Thresholds {
        tick_s: 1,
        ..Thresholds::default()
    };
    let mut fleet = fleet(8).congested_port(5, 2).build(key());
    let table = NodeTable::new(key(), Limits::default());
    let store = Arc::new(FindingsStore::in_memory());
    let mut engine = FindingsEngine::new(th, store.clone());
    let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
    for _ in 0..120 {
        let t = fleet.tick_unix_ns(fleet.ticks());
        let accepted: Vec<_> = fleet
            .tick()
            .iter()
            .map(|f| table.ingest(f, from, t + 1_000_000).expect("accepted"))
            .collect();
        engine.refresh(&table);
        engine.evaluate(Pass::All, t);
        for a in &accepted {
            engine.take_frame(&a.node, &a.frame, &a.schema, t);
        }
    }
    let found = store.list(&monitor_findings::store::FindingFilter {
        start_ns: 0,
        end_ns: u64::MAX,
        ..Default::default()
    });
    assert_eq!(
        rules(&found),
        [port("roce_congestion", "node-005", "mlx5_2")]
    );
    assert_eq!(found.len(), 1, "opened once: {found:#?}");
    assert!(found[0].is_active(), "{found:#?}");
}

/// A pass that cannot judge a subject (too few samples for a rate, a fleet too small to
/// compare against, its series not there) leaves its finding as it was: only a pass that
/// judged it and did not see the condition ends it.
#[test]
fn a_finding_ends_only_when_a_pass_judged_its_subject_and_did_not_see_it() {
    use monitor_findings::{Observation, Subject, verdicts::Verdicts};
    let store = FindingsStore::in_memory();
    let subject = Subject::port("n1", "mlx5_0", 1);
    let storm = Observation {
        rule: "roce_congestion",
        severity: Severity::Warning,
        subject: subject.clone(),
        job_id: None,
        at_ns: T0,
        summary: "20000 CNPs/s".into(),
        evidence: serde_json::json!({}),
    };
    let rules = ["roce_congestion"];
    let mut opened = Verdicts::new(store.open_nodes(&rules));
    opened.push(storm);
    store.apply_judged(&opened, &rules, T0);
    assert_eq!(store.active().len(), 1);
    // Nothing judged (no rate): open.
    let unjudged = Verdicts::new(store.open_nodes(&rules));
    store.apply_judged(&unjudged, &rules, T0 + 5 * S);
    assert_eq!(store.active().len(), 1, "ended without evidence");
    // Another port of the node judged: still open.
    let mut other = Verdicts::new(store.open_nodes(&rules));
    other.judged("roce_congestion", "n1", || {
        Some(Subject::port("n1", "mlx5_1", 1))
    });
    store.apply_judged(&other, &rules, T0 + 10 * S);
    assert_eq!(store.active().len(), 1, "ended on another port's evidence");
    // Its own port judged, the condition not seen: ended at that pass.
    let mut gone = Verdicts::new(store.open_nodes(&rules));
    gone.judged("roce_congestion", "n1", || Some(subject.clone()));
    store.apply_judged(&gone, &rules, T0 + 15 * S);
    assert!(store.active().is_empty());
    let all = store.list(&monitor_findings::store::FindingFilter {
        start_ns: 0,
        end_ns: u64::MAX,
        ..Default::default()
    });
    assert_eq!(all[0].end, Some(T0 + 15 * S));
}

/// A restarted collector has lost the XIDs behind a reloaded `gpu_xid` finding: the finding
/// holds for `xid-hold-s` after its last XID, as it would have without the restart, not
/// only for `restart-grace-s` (ended then, its node was resumed for want of the events).
#[test]
fn a_reloaded_xid_finding_holds_for_its_own_hold_not_only_the_restart_grace() {
    use monitor_findings::{Observation, Subject};
    let dir = std::env::temp_dir().join(format!("railscope-xid-hold-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let xid = Observation {
        rule: "gpu_xid",
        severity: Severity::Critical,
        subject: Subject::gpu("n1", "3"),
        job_id: None,
        at_ns: T0,
        summary: "XID 79".into(),
        evidence: serde_json::json!({"last": T0 + 10 * S, "hold_s": 3600}),
    };
    {
        let store = FindingsStore::open(&dir, 0, 0).unwrap();
        store.apply(&[xid], &["gpu_xid"], T0 + 10 * S);
    }
    // Restarted 20 s later with the default grace (300 s).
    let grace_until = T0 + 320 * S;
    let store = FindingsStore::open(&dir, 0, grace_until).unwrap();
    store.apply(&[], &["gpu_xid"], grace_until + S);
    assert_eq!(store.active().len(), 1, "ended at the grace");
    store.apply(&[], &["gpu_xid"], T0 + 3609 * S);
    assert_eq!(store.active().len(), 1, "ended before its hold");
    store.apply(&[], &["gpu_xid"], T0 + 3610 * S);
    assert!(store.active().is_empty(), "held past its hold");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The agents' clock offsets, read by the tick, make `clock_skew` of the node that is off and
/// put its port DOWN transitions on the collector's clock for the fabric grouping (which the
/// events thread runs: the tick hands it the offsets).
#[test]
fn a_node_s_clock_offset_finds_it_skewed_and_places_its_downs_for_the_fabric_grouping() {
    use monitor_wire::{
        EncoderConfig, FrameEncoder, Kind, Labels, Reading, Series, Value, WireEvent,
        names::{event_kind, metric},
    };
    const MS: u64 = 1_000_000;
    let table = NodeTable::new(key(), Limits::default());
    let store = Arc::new(FindingsStore::in_memory());
    let mut engine = FindingsEngine::new(Thresholds::default(), store.clone());
    let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
    // Four nodes; node-4's clock runs 3 s ahead. Each sends its estimate (within 0.5 ms),
    // stamped on its own clock.
    let skews = [0, 0, 0, 3 * S];
    let mut encoders: Vec<FrameEncoder> = (1..=4)
        .map(|n| FrameEncoder::new(EncoderConfig::new(format!("node-{n}")), key()).unwrap())
        .collect();
    let send = |engine: &mut FindingsEngine, frames: Vec<Vec<u8>>, at: u64| {
        for f in frames {
            let a = table.ingest(&f, from, at).expect("accepted");
            engine.take_frame(&a.node, &a.frame, &a.schema, at);
        }
    };
    for (enc, skew) in encoders.iter_mut().zip(skews) {
        for (name, value) in [
            (metric::AGENT_CLOCK_OFFSET_SECONDS, skew as f64 / 1e9),
            (metric::AGENT_CLOCK_OFFSET_ERROR_SECONDS, 0.0005),
        ] {
            enc.push_reading(&Reading {
                series: Series {
                    name: name.into(),
                    labels: Labels::default(),
                    kind: Kind::Gauge,
                },
                value: Value::F64(value),
                unix_ns: T0 + skew,
            })
            .unwrap();
        }
        let frames = enc.flush(T0 + skew);
        send(&mut engine, frames, T0);
    }
    engine.refresh(&table);
    engine.evaluate(Pass::All, T0);
    let skewed: Vec<(String, String)> = store
        .active()
        .into_iter()
        .filter(|f| f.rule == "clock_skew")
        .map(|f| (f.node, f.summary))
        .collect();
    assert_eq!(skewed.len(), 1, "{skewed:?}");
    assert_eq!(skewed[0].0, "node-4");
    assert!(
        skewed[0]
            .1
            .starts_with("clock 3000.0 ms ahead of the collector's"),
        "{skewed:?}"
    );

    // A switch drops a port of each at T0 + 10 s, 2 ms apart as their kernels see it.
    let moment = T0 + 10 * S;
    for (n, (enc, skew)) in encoders.iter_mut().zip(skews).enumerate() {
        enc.push_event(WireEvent {
            unix_ns: moment + n as u64 * 2 * MS + skew,
            kind: event_kind::PORT_TRANSITION.into(),
            labels: Labels::new([("device", "mlx5_0"), ("port", "1"), ("from", "ACTIVE")]),
            code: 0,
            text: "DOWN".into(),
        });
        let frames = enc.flush_events(moment + skew);
        send(&mut engine, frames, moment);
    }
    engine.evaluate(Pass::Events, moment);
    engine.evaluate(Pass::Events, moment + 10 * S);
    let upstream = store
        .active()
        .into_iter()
        .find(|f| f.rule == "fabric_upstream_down")
        .expect("one burst of the four nodes");
    assert_eq!(
        upstream.evidence["nodes"],
        serde_json::json!(["node-1", "node-2", "node-3", "node-4"])
    );
    assert_eq!(upstream.evidence["clock_unknown"], serde_json::json!([]));
    assert_eq!(upstream.evidence["spread_ms"], 6.0);
    assert_eq!(upstream.start, moment);
}
