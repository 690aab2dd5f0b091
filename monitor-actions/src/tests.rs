//! The actions' decisions against a fake Slurm: drain, resume after the hold, someone else's
//! drain, a person's resume, dry run, the brake, failures and a restart.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use super::{
    Actions, ActionsConfig,
    audit::Outcome,
    config::{ActionRule, BRAKE_RULE},
    slurm::{NodeState, Scheduler, SlurmError},
};
use monitor_findings::{FindingsStore, Observation, Severity, Subject};

const S: u64 = 1_000_000_000;
const T0: u64 = 1_800_000_000 * S;

/// A node as the fake Slurm holds it: drained, and its reason. A node not drained with a
/// reason is DOWN (Slurm keeps a reason only with DOWN, DRAIN or FAIL).
type FakeNode = (bool, Option<String>);

/// Slurm as a map of node → (drained, reason), with every update counted.
#[derive(Clone, Default)]
struct FakeSlurm {
    nodes: Arc<Mutex<BTreeMap<String, FakeNode>>>,
    drains: Arc<Mutex<Vec<String>>>,
    down: Arc<Mutex<bool>>,
}

impl FakeSlurm {
    fn with(nodes: &[&str]) -> Self {
        let s = Self::default();
        for n in nodes {
            s.nodes.lock().unwrap().insert((*n).into(), (false, None));
        }
        s
    }
    fn set(&self, node: &str, drained: bool, reason: Option<&str>) {
        self.nodes
            .lock()
            .unwrap()
            .insert(node.into(), (drained, reason.map(Into::into)));
    }
    fn get(&self, node: &str) -> FakeNode {
        self.nodes.lock().unwrap()[node].clone()
    }
    fn drains(&self) -> Vec<String> {
        self.drains.lock().unwrap().clone()
    }
}

impl Scheduler for FakeSlurm {
    fn show(&self, node: &str) -> Result<NodeState, SlurmError> {
        if *self.down.lock().unwrap() {
            return Err(SlurmError::Failed(
                "slurm_load_node error: Unable to contact slurm controller".into(),
            ));
        }
        let nodes = self.nodes.lock().unwrap();
        let (drained, reason) = nodes
            .get(node)
            .ok_or_else(|| SlurmError::UnknownNode(node.into()))?;
        Ok(NodeState {
            state: match (drained, reason) {
                (true, _) => "IDLE+DRAIN",
                (false, Some(_)) => "DOWN",
                (false, None) => "IDLE",
            }
            .into(),
            drained: *drained,
            reason: reason.clone(),
        })
    }
    fn drain(&self, node: &str, reason: &str) -> Result<(), SlurmError> {
        self.drains.lock().unwrap().push(node.into());
        self.set(node, true, Some(reason));
        Ok(())
    }
    fn undrain(&self, node: &str) -> Result<(), SlurmError> {
        self.set(node, false, None);
        Ok(())
    }
}

fn config(dry_run: bool) -> ActionsConfig {
    ActionsConfig {
        dry_run,
        resume_hold_s: 60,
        brake_max_nodes: 2,
        brake_max_percent: 100.0,
        rule: vec![ActionRule {
            rule: "gpu_xid".into(),
            severity: Severity::Critical,
            device: "*".into(),
            action: "slurm-drain".into(),
            dry_run: None,
            url: None,
            command: Vec::new(),
            timeout_s: 10,
            attempts: 10,
        }],
        ..ActionsConfig::default()
    }
}

fn xid(node: &str, at: u64) -> Observation {
    Observation {
        rule: "gpu_xid",
        severity: Severity::Critical,
        subject: Subject::gpu(node, "3"),
        job_id: None,
        at_ns: at,
        summary: "XID 79".into(),
        evidence: serde_json::json!({}),
    }
}

fn outcomes(actions: &Actions, node: &str) -> Vec<String> {
    actions.view(10, 0)["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["node"] == node)
        .map(|r| {
            format!(
                "{} {}",
                r["action"].as_str().unwrap(),
                r["outcome"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn a_node_is_drained_with_its_finding_and_resumed_after_the_hold() {
    let store = FindingsStore::in_memory();
    let slurm = FakeSlurm::with(&["n1", "n2"]);
    let actions = Actions::in_memory(config(false));
    store.apply(&[xid("n1", T0)], &["gpu_xid"], T0);
    actions.pass(&store, 10, T0, &slurm);
    let id = store.active()[0].id.clone();
    let (drained, reason) = slurm.get("n1");
    assert!(drained);
    assert_eq!(reason.unwrap(), format!("railscope: gpu_xid {id}"));
    // Still active: stays drained, drained once.
    actions.pass(&store, 10, T0 + S, &slurm);
    assert_eq!(slurm.drains(), ["n1"]);
    // The finding ends; not resumed before the hold.
    store.apply(&[], &["gpu_xid"], T0 + 10 * S);
    actions.pass(&store, 10, T0 + 69 * S, &slurm);
    assert!(slurm.get("n1").0);
    actions.pass(&store, 10, T0 + 70 * S, &slurm);
    assert!(!slurm.get("n1").0);
    assert_eq!(
        outcomes(&actions, "n1"),
        ["drain tried", "drain done", "resume tried", "resume done"]
    );
}

#[test]
fn a_node_drained_by_someone_else_is_never_drained_nor_resumed() {
    let store = FindingsStore::in_memory();
    let slurm = FakeSlurm::with(&["n1"]);
    slurm.set("n1", true, Some("bad DIMM, ticket 42"));
    let actions = Actions::in_memory(config(false));
    store.apply(&[xid("n1", T0)], &["gpu_xid"], T0);
    actions.pass(&store, 10, T0, &slurm);
    store.apply(&[], &["gpu_xid"], T0 + S);
    actions.pass(&store, 10, T0 + 1000 * S, &slurm);
    assert_eq!(slurm.get("n1"), (true, Some("bad DIMM, ticket 42".into())));
    assert!(slurm.drains().is_empty());
    assert_eq!(outcomes(&actions, "n1"), ["drain tried", "drain skipped"]);
}

/// A node an operator set DOWN with a reason is not drained over it: the reason stays, and
/// nothing railscope does later leaves the node down under railscope's word.
#[test]
fn a_node_down_with_an_operators_reason_keeps_it() {
    let store = FindingsStore::in_memory();
    let slurm = FakeSlurm::with(&["n1"]);
    slurm.set("n1", false, Some("psu dead"));
    let actions = Actions::in_memory(config(false));
    store.apply(&[xid("n1", T0)], &["gpu_xid"], T0);
    actions.pass(&store, 10, T0, &slurm);
    store.apply(&[], &["gpu_xid"], T0 + S);
    actions.pass(&store, 10, T0 + 1000 * S, &slurm);
    assert_eq!(slurm.get("n1"), (false, Some("psu dead".into())));
    assert!(slurm.drains().is_empty());
    assert_eq!(outcomes(&actions, "n1"), ["drain tried", "drain skipped"]);
    let detail = actions.view(10, 0)["records"][1]["detail"].clone();
    assert_eq!(
        detail,
        "DOWN with a reason railscope did not write (psu dead): railscope leaves it to them"
    );
}

#[test]
fn a_node_a_person_resumed_is_left_alone_until_a_new_finding() {
    let store = FindingsStore::in_memory();
    let slurm = FakeSlurm::with(&["n1"]);
    let actions = Actions::in_memory(config(false));
    store.apply(&[xid("n1", T0)], &["gpu_xid"], T0);
    actions.pass(&store, 10, T0, &slurm);
    slurm.set("n1", false, None); // a person resumes it
    actions.pass(&store, 10, T0 + S, &slurm);
    assert_eq!(slurm.drains(), ["n1"]);
    store.apply(&[], &["gpu_xid"], T0 + 2 * S);
    actions.pass(&store, 10, T0 + 100 * S, &slurm);
    assert_eq!(
        outcomes(&actions, "n1").last().unwrap(),
        "resume left",
        "{:?}",
        outcomes(&actions, "n1")
    );
    // A new finding drains it again.
    store.apply(&[xid("n1", T0 + 200 * S)], &["gpu_xid"], T0 + 200 * S);
    actions.pass(&store, 10, T0 + 200 * S, &slurm);
    assert_eq!(slurm.drains(), ["n1", "n1"]);
}

#[test]
fn a_dry_run_asks_slurm_nothing_and_records_what_it_would_do() {
    let store = FindingsStore::in_memory();
    let slurm = FakeSlurm::with(&["n1"]);
    *slurm.down.lock().unwrap() = true; // any call would fail
    let actions = Actions::in_memory(config(true));
    store.apply(&[xid("n1", T0)], &["gpu_xid"], T0);
    actions.pass(&store, 10, T0, &slurm);
    store.apply(&[], &["gpu_xid"], T0 + S);
    actions.pass(&store, 10, T0 + 61 * S, &slurm);
    assert_eq!(outcomes(&actions, "n1"), ["drain would", "resume would"]);
    assert!(!slurm.get("n1").0);
}

#[test]
fn the_brake_holds_drains_past_its_limit_reports_them_and_a_release_lets_them_go() {
    let store = FindingsStore::in_memory();
    let nodes = ["n1", "n2", "n3", "n4"];
    let slurm = FakeSlurm::with(&nodes);
    let actions = Actions::in_memory(config(false));
    let seen: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| xid(n, T0 + i as u64))
        .collect();
    store.apply(&seen, &["gpu_xid"], T0);
    actions.pass(&store, 10, T0, &slurm);
    assert_eq!(slurm.drains(), ["n1", "n2"]);
    let brake: Vec<_> = store
        .active()
        .into_iter()
        .filter(|f| f.rule == BRAKE_RULE)
        .collect();
    assert_eq!(brake.len(), 1);
    assert_eq!(brake[0].severity, Severity::Critical);
    assert!(brake[0].summary.contains("n3, n4"), "{}", brake[0].summary);
    // Held until released, however long.
    actions.pass(&store, 10, T0 + 7200 * S, &slurm);
    assert_eq!(slurm.drains().len(), 2);
    assert_eq!(actions.release(T0 + 7201 * S), ["n3", "n4"]);
    actions.pass(&store, 10, T0 + 7202 * S, &slurm);
    assert_eq!(slurm.drains(), ["n1", "n2", "n3", "n4"]);
    assert!(store.active().iter().all(|f| f.rule != BRAKE_RULE));
}

/// What the log and the brake's finding say of a held drain is what the node is: not
/// drained ("joined ... it stays drained" was said of it), one drain, not "1 drains".
#[test]
fn a_held_drain_is_said_as_held_and_counted_in_words() {
    let store = FindingsStore::in_memory();
    let nodes = ["n1", "n2", "n3"];
    let slurm = FakeSlurm::with(&nodes);
    let actions = Actions::in_memory(config(false));
    let seen: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| xid(n, T0 + i as u64))
        .collect();
    store.apply(&seen, &["gpu_xid"], T0);
    actions.pass(&store, 10, T0, &slurm);
    assert_eq!(slurm.drains(), ["n1", "n2"]);
    let brake = store
        .active()
        .into_iter()
        .find(|f| f.rule == BRAKE_RULE)
        .unwrap();
    assert_eq!(
        brake.summary,
        "the actions brake holds 1 drain (n3): `railscope actions release` lets it go"
    );
    // A second finding on the held node joins the held drain, and says so.
    let mut other_gpu = xid("n3", T0 + 5 * S);
    other_gpu.subject = Subject::gpu("n3", "5");
    let mut seen = seen;
    seen.push(other_gpu);
    store.apply(&seen, &["gpu_xid"], T0 + 5 * S);
    actions.pass(&store, 10, T0 + 5 * S, &slurm);
    let records = actions.view(10, 0)["records"].clone();
    let joined = records
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["node"] == "n3" && r["outcome"] == "joined")
        .unwrap();
    assert_eq!(
        joined["detail"],
        "railscope's drain of the node is held by the brake (the node is not drained): once \
         released it is for this finding too"
    );
    assert!(!slurm.get("n3").0);
}

#[test]
fn slurm_down_is_retried_with_backoff_and_drains_once_it_answers() {
    let store = FindingsStore::in_memory();
    let slurm = FakeSlurm::with(&["n1"]);
    *slurm.down.lock().unwrap() = true;
    let actions = Actions::in_memory(config(false));
    store.apply(&[xid("n1", T0)], &["gpu_xid"], T0);
    for s in 0..10 {
        actions.pass(&store, 10, T0 + s * S, &slurm);
    }
    // Tries at 0, 1, 3, 7 s (1, 2, 4 s apart).
    assert_eq!(
        outcomes(&actions, "n1"),
        [
            "drain tried",
            "drain failed",
            "drain failed",
            "drain failed",
            "drain failed"
        ]
    );
    *slurm.down.lock().unwrap() = false;
    actions.pass(&store, 10, T0 + 20 * S, &slurm);
    assert_eq!(slurm.drains(), ["n1"]);
}

#[test]
fn a_node_unknown_to_slurm_is_reported_once() {
    let store = FindingsStore::in_memory();
    let slurm = FakeSlurm::with(&[]);
    let actions = Actions::in_memory(config(false));
    store.apply(&[xid("ghost", T0)], &["gpu_xid"], T0);
    for s in 0..5 {
        actions.pass(&store, 10, T0 + s * S, &slurm);
    }
    assert_eq!(
        outcomes(&actions, "ghost"),
        ["drain tried", "drain gave_up"]
    );
}

#[test]
fn after_a_restart_nothing_is_acted_on_twice_and_older_findings_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let store = FindingsStore::in_memory();
    let slurm = FakeSlurm::with(&["n1", "n2", "n3"]);
    {
        let actions = Actions::open(dir.path(), config(false)).unwrap();
        store.apply(&[xid("n1", T0 + 10 * S)], &["gpu_xid"], T0 + 10 * S);
        actions.pass(&store, 10, T0 + 10 * S, &slurm);
    }
    // Restarted: n1's finding still active; a finding older than it appears (a rule enabled
    // since), and a newer one.
    let actions = Actions::open(dir.path(), config(false)).unwrap();
    store.apply(
        &[
            xid("n1", T0 + 10 * S),
            xid("n2", T0),
            xid("n3", T0 + 20 * S),
        ],
        &["gpu_xid"],
        T0 + 30 * S,
    );
    actions.pass(&store, 10, T0 + 30 * S, &slurm);
    assert_eq!(slurm.drains(), ["n1", "n3"]);
    assert_eq!(outcomes(&actions, "n2"), ["drain skipped"]);
    // A drain tried and cut short by a crash (recorded as tried, done by Slurm) is adopted.
    let records: Vec<Outcome> =
        monitor_archive::framed_log::FramedLog::read::<super::audit::Record>(
            &dir.path().join(super::audit::FILE_NAME),
        )
        .unwrap()
        .iter()
        .map(|r| r.outcome)
        .collect();
    assert_eq!(records.iter().filter(|o| **o == Outcome::Done).count(), 2);
}

#[test]
fn a_drain_in_flight_at_a_crash_is_adopted_not_repeated() {
    let dir = tempfile::tempdir().unwrap();
    let store = FindingsStore::in_memory();
    let slurm = FakeSlurm::with(&["n1"]);
    store.apply(&[xid("n1", T0)], &["gpu_xid"], T0);
    {
        // Decided and written as tried; the collector dies while scontrol drains the node.
        let actions = Actions::open(dir.path(), config(false)).unwrap();
        let mut down = FakeSlurm::with(&["n1"]);
        down.down = Arc::new(Mutex::new(true));
        actions.pass(&store, 10, T0, &down);
        let id = store.active()[0].id.clone();
        slurm.set("n1", true, Some(&format!("railscope: gpu_xid {id}")));
    }
    let actions = Actions::open(dir.path(), config(false)).unwrap();
    actions.pass(&store, 10, T0 + 10 * S, &slurm);
    assert!(slurm.drains().is_empty());
    assert_eq!(outcomes(&actions, "n1").last().unwrap(), "drain done");
}

#[test]
fn a_finding_of_an_acting_rule_drains_a_node_a_dry_run_rule_only_would_have() {
    let store = FindingsStore::in_memory();
    let slurm = FakeSlurm::with(&["n1"]);
    let mut c = config(true);
    c.rule.insert(
        0,
        ActionRule {
            rule: "ib_link_flapping".into(),
            severity: Severity::Critical,
            device: "*".into(),
            action: "slurm-drain".into(),
            dry_run: Some(false),
            url: None,
            command: Vec::new(),
            timeout_s: 10,
            attempts: 10,
        },
    );
    let actions = Actions::in_memory(c);
    store.apply(&[xid("n1", T0)], &["gpu_xid"], T0);
    actions.pass(&store, 10, T0, &slurm);
    assert!(slurm.drains().is_empty());
    let flap = Observation {
        rule: "ib_link_flapping",
        severity: Severity::Critical,
        subject: Subject::port("n1", "mlx5_0", 1),
        job_id: None,
        at_ns: T0 + S,
        summary: "flapping".into(),
        evidence: serde_json::json!({}),
    };
    store.apply(&[flap], &["ib_link_flapping"], T0 + S);
    actions.pass(&store, 10, T0 + S, &slurm);
    assert_eq!(slurm.drains(), ["n1"]);
    assert_eq!(
        outcomes(&actions, "n1"),
        ["drain would", "drain tried", "drain done"]
    );
}

#[test]
fn a_drain_not_made_does_not_count_against_the_brake() {
    let store = FindingsStore::in_memory();
    let slurm = FakeSlurm::with(&["n1", "n2", "n3"]);
    slurm.set("n1", true, Some("maintenance"));
    slurm.set("n2", true, Some("maintenance"));
    let actions = Actions::in_memory(config(false));
    store.apply(
        &[xid("n1", T0), xid("n2", T0 + 1), xid("ghost", T0 + 2)],
        &["gpu_xid"],
        T0,
    );
    actions.pass(&store, 10, T0, &slurm);
    store.apply(&[xid("n3", T0 + S)], &["gpu_xid"], T0 + S);
    actions.pass(&store, 10, T0 + S, &slurm);
    // Two drains skipped, one given up on: the brake (2) still lets n3's go.
    assert_eq!(slurm.drains(), ["n3"]);
}

/// Deliveries as a list of (target, body), failing the first `fail` tries.
#[derive(Default)]
struct FakeNotifier {
    got: Mutex<Vec<(String, String)>>,
    fail: Mutex<u32>,
}

impl super::notify::Notifier for FakeNotifier {
    fn deliver(
        &self,
        target: &super::notify::Target,
        body: &[u8],
        _timeout: std::time::Duration,
    ) -> Result<String, String> {
        self.got.lock().unwrap().push((
            target.describe(),
            String::from_utf8_lossy(body).into_owned(),
        ));
        let mut fail = self.fail.lock().unwrap();
        if *fail > 0 {
            *fail -= 1;
            return Err("HTTP 503: busy".into());
        }
        Ok("HTTP 200".into())
    }
}

fn webhook_config(dry_run: bool, attempts: u32) -> ActionsConfig {
    let mut c = config(dry_run);
    c.rule[0].action = "webhook".into();
    c.rule[0].url = Some("http://hooks.example/x".into());
    c.rule[0].attempts = attempts;
    c.external_url = Some("https://rs.example".into());
    c.validate().unwrap();
    c
}

/// A pass, its deliveries waited for, and the next pass that records them.
fn pass_and_record(actions: &Actions, store: &FindingsStore, slurm: &FakeSlurm, now: u64) {
    actions.pass(store, 10, now, slurm);
    actions.wait_deliveries();
    actions.pass(store, 10, now, slurm);
}

#[test]
fn a_webhook_is_retried_after_a_failure_delivered_once_and_never_again_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = FindingsStore::in_memory();
    let slurm = FakeSlurm::with(&["n1"]);
    let notifier = Arc::new(FakeNotifier::default());
    *notifier.fail.lock().unwrap() = 1;
    {
        let actions = Actions::open(dir.path(), webhook_config(false, 5))
            .unwrap()
            .with_notifier(notifier.clone());
        store.apply(&[xid("n1", T0)], &["gpu_xid"], T0);
        pass_and_record(&actions, &store, &slurm, T0);
        // The back-off: not tried again within the second.
        pass_and_record(&actions, &store, &slurm, T0 + S / 2);
        assert_eq!(notifier.got.lock().unwrap().len(), 1);
        pass_and_record(&actions, &store, &slurm, T0 + 2 * S);
        assert_eq!(
            outcomes(&actions, "n1"),
            ["webhook tried", "webhook failed", "webhook done"]
        );
    }
    let got = notifier.got.lock().unwrap().clone();
    assert_eq!(got.len(), 2);
    let id = store.active()[0].id.clone();
    let body: serde_json::Value = serde_json::from_str(&got[1].1).unwrap();
    assert_eq!(
        (got[1].0.as_str(), &body["finding"]["id"]),
        ("http://hooks.example/x", &serde_json::json!(id))
    );
    assert_eq!(body["link"], "https://rs.example/#/node/n1");
    // Restarted with the finding still active: nothing is sent again; Slurm is not asked.
    let actions = Actions::open(dir.path(), webhook_config(false, 5))
        .unwrap()
        .with_notifier(notifier.clone());
    pass_and_record(&actions, &store, &slurm, T0 + 10 * S);
    assert_eq!(notifier.got.lock().unwrap().len(), 2);
    assert!(slurm.drains().is_empty());
}

#[test]
fn a_webhook_is_given_up_after_its_attempts_and_a_dry_run_sends_nothing() {
    let store = FindingsStore::in_memory();
    let slurm = FakeSlurm::with(&["n1", "n2"]);
    let notifier = Arc::new(FakeNotifier::default());
    *notifier.fail.lock().unwrap() = 100;
    let actions = Actions::in_memory(webhook_config(false, 2)).with_notifier(notifier.clone());
    store.apply(&[xid("n1", T0)], &["gpu_xid"], T0);
    for t in 0..10 {
        pass_and_record(&actions, &store, &slurm, T0 + t * 10 * S);
    }
    assert_eq!(notifier.got.lock().unwrap().len(), 2);
    assert_eq!(
        outcomes(&actions, "n1"),
        ["webhook tried", "webhook failed", "webhook gave_up"]
    );
    let dry = Actions::in_memory(webhook_config(true, 2)).with_notifier(notifier.clone());
    store.apply(&[xid("n2", T0)], &["gpu_xid"], T0);
    pass_and_record(&dry, &store, &slurm, T0 + S);
    assert_eq!(outcomes(&dry, "n2"), ["webhook would"]);
    assert_eq!(notifier.got.lock().unwrap().len(), 2);
}

#[test]
fn a_port_finding_blamed_on_the_fabric_never_drains_and_waits_while_it_is_judged() {
    // A counter's finding, and a port down found from its port event at once.
    for rule in ["ib_link_downed", "ib_port_down"] {
        port_finding_blamed_on_the_fabric(rule);
    }
}

fn port_finding_blamed_on_the_fabric(rule: &'static str) {
    let store = FindingsStore::in_memory();
    let slurm = FakeSlurm::with(&["n1", "n2"]);
    let mut c = config(false);
    c.rule[0].rule = "*".into();
    let actions = Actions::in_memory(c);
    let downed = |node: &str, upstream: Option<&str>| Observation {
        rule,
        severity: Severity::Critical,
        subject: Subject::port(node, "mlx5_0", 1),
        job_id: None,
        at_ns: T0,
        summary: "link_downed rose by 1".into(),
        evidence: match upstream {
            Some(u) => serde_json::json!({"increase": 1, "upstream": u}),
            None => serde_json::json!({"increase": 1}),
        },
    };
    let upstream = Observation {
        rule: monitor_findings::fabric::RULE,
        severity: Severity::Critical,
        subject: Subject {
            node: "leaf1".into(),
            device: None,
            port: None,
            gpu: None,
            job: None,
        },
        job_id: None,
        at_ns: T0,
        summary: "4 ports on 4 nodes went down within 6.0 ms".into(),
        evidence: serde_json::json!({}),
    };
    let rules = [rule, monitor_findings::fabric::RULE];
    // Being judged: nothing decided, nothing recorded.
    store.apply(&[downed("n1", Some("pending"))], &rules, T0);
    actions.pass(&store, 10, T0, &slurm);
    assert!(outcomes(&actions, "n1").is_empty());
    // Judged upstream: skipped, saying why; the upstream finding's node is no Slurm node.
    let id = monitor_findings::Finding::open(&upstream).id;
    store.apply(&[downed("n1", Some(&id)), upstream.clone()], &rules, T0 + S);
    actions.pass(&store, 10, T0 + S, &slurm);
    actions.pass(&store, 10, T0 + 2 * S, &slurm);
    assert_eq!(outcomes(&actions, "n1"), ["drain skipped"]);
    assert!(outcomes(&actions, "leaf1").is_empty());
    let view = actions.view(10, 0);
    let detail = view["records"][0]["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("blamed on the fabric ({id})")),
        "{detail}"
    );
    // A lone port's finding drains its node as before.
    store.apply(
        &[downed("n1", Some(&id)), upstream, downed("n2", None)],
        &rules,
        T0 + 3 * S,
    );
    actions.pass(&store, 10, T0 + 3 * S, &slurm);
    assert_eq!(slurm.drains(), ["n2"]);
}
