//! The fleet's golden profile (docs/findings.md): nodes are grouped by hardware class (GPU
//! model, NIC model), and each class learns what most of its nodes have; a node unlike its
//! class's majority is a finding. No manifest: the fleet is its own reference.
//!
//! The majority rule: a value is the class's when more than half of what voted holds it and
//! at least `profile-min-nodes` nodes hold it. Node values (driver, counts, a GPU–NIC
//! pair's distance) are voted by nodes; device values (firmware, VBIOS, the most a link can
//! train at) by devices. Without a majority the class has no value there, and nothing is
//! found against it. The class is the models alone, not the counts, so a node missing a
//! GPU stays in its class and is compared with it; the counts are what the class's majority
//! says.
//!
//! Rules, each `warning` (none breaks a running job; each costs throughput or a repair):
//! - `pcie_downtrained`: an RDMA device linked below its own maximum generation or width, a
//!   GPU below its own maximum width (a GPU's generation drops when idle: that is
//!   `gpu_pcie_degraded`'s, while busy), or a device whose maximum is below its class's;
//! - `firmware_drift`: an RDMA device's `fw_ver`, a GPU's VBIOS or the node's driver unlike
//!   the class's;
//! - `device_missing`: fewer GPUs, RDMA devices or active ports than the class;
//! - `topology_drift`: a GPU–NIC pair (GPU index × NIC ordinal in PCI-address order) whose
//!   distance differs from the class's for that pair. Nodes whose GPU or NIC count differs
//!   from the class's are left out (their ordinals do not line up; `device_missing` says why).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use monitor_wire::pci::Distance;
use serde::Serialize;
use serde_json::json;

use super::{
    Observation, Severity, Subject,
    hardware::{Class, Link, NodeHardware},
};

pub const RULES: &[&str] = &[
    "pcie_downtrained",
    "firmware_drift",
    "device_missing",
    "topology_drift",
];

/// A class's value and how many hold it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Majority<T> {
    pub value: T,
    /// Votes (nodes or devices) that hold it, of all votes.
    pub held: usize,
    pub of: usize,
    /// Nodes that hold it, of the class's nodes that voted.
    pub nodes: usize,
    pub of_nodes: usize,
}

impl<T: std::fmt::Display> Majority<T> {
    /// `28.39.1002 (held by 127 of 128 devices on 16 of 16 nodes)`: for a finding's summary.
    fn held_by(&self, unit: &str) -> String {
        if unit == "nodes" {
            format!("{} ({} of {} nodes)", self.value, self.held, self.of)
        } else {
            format!(
                "{} ({} of {} {unit}, on {} of {} nodes)",
                self.value, self.held, self.of, self.nodes, self.of_nodes
            )
        }
    }
}

/// Votes: (the node's index in its class, a value).
fn vote<T: Ord + Clone>(votes: &[(usize, T)], min_nodes: usize) -> Option<Majority<T>> {
    let mut held: BTreeMap<&T, (usize, BTreeSet<usize>)> = BTreeMap::new();
    for (node, v) in votes {
        let h = held.entry(v).or_default();
        h.0 += 1;
        h.1.insert(*node);
    }
    let of_nodes = votes.iter().map(|v| v.0).collect::<BTreeSet<_>>().len();
    let (value, (n, nodes)) = held.into_iter().max_by_key(|(_, (n, _))| *n)?;
    (n * 2 > votes.len() && nodes.len() >= min_nodes).then(|| Majority {
        value: value.clone(),
        held: n,
        of: votes.len(),
        nodes: nodes.len(),
        of_nodes,
    })
}

/// What a class's majority has (each `None` where there is no majority).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClassProfile {
    /// The class's nodes that send their hardware path.
    pub nodes: usize,
    pub gpus: Option<Majority<u32>>,
    pub rdma_devices: Option<Majority<u32>>,
    pub active_ports: Option<Majority<u32>>,
    pub driver: Option<Majority<String>>,
    pub vbios: Option<Majority<String>>,
    pub fw_ver: Option<Majority<String>>,
    pub gpu_max_generation: Option<Majority<u32>>,
    pub gpu_max_width: Option<Majority<u32>>,
    pub rdma_max_generation: Option<Majority<u32>>,
    pub rdma_max_width: Option<Majority<u32>>,
    /// (GPU row, NIC ordinal) → distance, among the nodes whose GPU and NIC counts are the
    /// class's.
    #[serde(serialize_with = "pairs")]
    pub distances: BTreeMap<(usize, usize), Majority<Distance>>,
}

fn pairs<S: serde::Serializer>(
    map: &BTreeMap<(usize, usize), Majority<Distance>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(map.len()))?;
    for ((g, n), m) in map {
        seq.serialize_element(&json!({
            "gpu": g, "nic": n, "distance": m.value.as_str(), "held": m.held, "of": m.of,
        }))?;
    }
    seq.end()
}

impl ClassProfile {
    fn learn(nodes: &[&NodeHardware], min_nodes: usize) -> Self {
        let per_node = |f: &dyn Fn(&NodeHardware) -> Option<u32>| {
            let votes: Vec<(usize, u32)> = nodes
                .iter()
                .enumerate()
                .filter_map(|(i, n)| Some((i, f(n)?)))
                .collect();
            vote(&votes, min_nodes)
        };
        let gpus = per_node(&|n| n.counts.gpus);
        let rdma_devices = per_node(&|n| n.counts.rdma_devices);
        let driver: Vec<(usize, String)> = nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| Some((i, n.info.as_ref()?.driver.clone())))
            .filter(|(_, d)| !d.is_empty())
            .collect();
        let device_text = |f: &dyn Fn(usize) -> Vec<String>| {
            let votes: Vec<(usize, String)> = (0..nodes.len())
                .flat_map(|i| f(i).into_iter().map(move |v| (i, v)))
                .filter(|(_, v)| !v.is_empty())
                .collect();
            vote(&votes, min_nodes)
        };
        let device_link = |f: &dyn Fn(usize) -> Vec<Option<u32>>| {
            let votes: Vec<(usize, u32)> = (0..nodes.len())
                .flat_map(|i| f(i).into_iter().flatten().map(move |v| (i, v)))
                .collect();
            vote(&votes, min_nodes)
        };
        let gpu_links = |i: usize, f: fn(&Link) -> Option<u32>| -> Vec<Option<u32>> {
            nodes[i].gpus.iter().map(|g| f(&g.link)).collect()
        };
        let rdma_links = |i: usize, f: fn(&Link) -> Option<u32>| -> Vec<Option<u32>> {
            nodes[i].rdma.iter().map(|r| f(&r.link)).collect()
        };
        // Pairs, among the nodes whose GPU and NIC lists are as long as the class's counts.
        let mut distances = BTreeMap::new();
        if let (Some(g), Some(r)) = (&gpus, &rdma_devices) {
            let mut votes: BTreeMap<(usize, usize), Vec<(usize, Distance)>> = BTreeMap::new();
            for (i, n) in nodes.iter().enumerate() {
                if n.gpus.len() != g.value as usize || n.rdma.len() != r.value as usize {
                    continue;
                }
                for (row, cols) in n.distances().into_iter().enumerate() {
                    // An unknown place votes for nothing: the class's wiring is what the
                    // nodes that tell it agree on.
                    for (col, d) in cols.into_iter().enumerate().filter(|(_, d)| d.is_known()) {
                        votes.entry((row, col)).or_default().push((i, d));
                    }
                }
            }
            for (pair, v) in votes {
                if let Some(m) = vote(&v, min_nodes) {
                    distances.insert(pair, m);
                }
            }
        }
        Self {
            nodes: nodes.len(),
            active_ports: per_node(&|n| n.counts.active_ports),
            driver: vote(&driver, min_nodes),
            vbios: device_text(&|i| nodes[i].gpus.iter().map(|g| g.vbios.clone()).collect()),
            fw_ver: device_text(&|i| nodes[i].rdma.iter().map(|r| r.fw_ver.clone()).collect()),
            gpu_max_generation: device_link(&|i| gpu_links(i, |l| l.max_generation)),
            gpu_max_width: device_link(&|i| gpu_links(i, |l| l.max_width)),
            rdma_max_generation: device_link(&|i| rdma_links(i, |l| l.max_generation)),
            rdma_max_width: device_link(&|i| rdma_links(i, |l| l.max_width)),
            gpus,
            rdma_devices,
            distances,
        }
    }
}

/// The latest golden profile, where the findings thread publishes it and the HTTP routes
/// read it.
#[derive(Default)]
pub struct ProfileBoard(std::sync::Mutex<std::sync::Arc<GoldenProfile>>);

impl ProfileBoard {
    pub fn publish(&self, profile: GoldenProfile) {
        *monitor_archive::lock::lock(&self.0) = std::sync::Arc::new(profile);
    }

    pub fn latest(&self) -> std::sync::Arc<GoldenProfile> {
        monitor_archive::lock::lock(&self.0).clone()
    }
}

/// The profile of every class, and which class each node is in.
#[derive(Clone, Debug, Default)]
pub struct GoldenProfile {
    pub classes: BTreeMap<Class, ClassProfile>,
    pub node_class: HashMap<String, Class>,
}

impl GoldenProfile {
    /// Learns each class's majority from `nodes` (those without `railscope_node_hardware_info`
    /// have no class and are left out); classes of fewer than `min_nodes` nodes learn nothing.
    pub fn learn<'a>(
        nodes: impl IntoIterator<Item = (&'a str, &'a NodeHardware)>,
        min_nodes: usize,
    ) -> Self {
        let mut by_class: BTreeMap<Class, Vec<&NodeHardware>> = BTreeMap::new();
        let mut node_class = HashMap::new();
        for (name, hw) in nodes {
            if let Some(class) = hw.class() {
                node_class.insert(name.to_owned(), class.clone());
                by_class.entry(class).or_default().push(hw);
            }
        }
        let classes = by_class
            .into_iter()
            .map(|(class, nodes)| {
                let profile = if nodes.len() >= min_nodes {
                    ClassProfile::learn(&nodes, min_nodes)
                } else {
                    ClassProfile {
                        nodes: nodes.len(),
                        ..ClassProfile::default()
                    }
                };
                (class, profile)
            })
            .collect();
        Self {
            classes,
            node_class,
        }
    }

    pub fn class_of(&self, node: &str) -> Option<(&Class, &ClassProfile)> {
        let class = self.node_class.get(node)?;
        Some((class, self.classes.get(class)?))
    }

    /// The findings of one node against its class.
    pub fn evaluate(&self, node: &str, hw: &NodeHardware, out: &mut Vec<Observation>) {
        // A node without a class (no `railscope_node_hardware_info`) is judged by its own
        // links alone.
        let unclassed = ClassProfile::default();
        let (class, p) = match self.class_of(node) {
            Some((c, p)) => (Some(c), p),
            None => (None, &unclassed),
        };
        let at_ns = hw.seen_ns;
        let obs = |rule: &'static str, subject: Subject, summary: String, evidence| Observation {
            rule,
            severity: Severity::Warning,
            subject,
            job_id: None,
            at_ns,
            summary,
            evidence,
        };
        // pcie_downtrained
        let devices = hw
            .gpus
            .iter()
            .map(|g| {
                (
                    Subject::gpu(node, &g.gpu),
                    format!("GPU {}", g.gpu),
                    g.link,
                    true,
                )
            })
            .chain(hw.rdma.iter().map(|r| {
                (
                    Subject::device(node, &r.device),
                    r.device.clone(),
                    r.link,
                    false,
                )
            }));
        for (subject, name, link, gpu) in devices {
            let (class_gen, class_width) = if gpu {
                (&p.gpu_max_generation, &p.gpu_max_width)
            } else {
                (&p.rdma_max_generation, &p.rdma_max_width)
            };
            let below =
                |a: Option<u32>, b: Option<u32>| matches!((a, b), (Some(a), Some(b)) if a < b);
            let mut why = Vec::new();
            if !gpu && below(link.generation, link.max_generation) {
                why.push(format!(
                    "generation {} of its maximum {}",
                    link.generation.unwrap_or(0),
                    link.max_generation.unwrap_or(0)
                ));
            }
            if below(link.width, link.max_width) {
                why.push(format!(
                    "x{} of its maximum x{}",
                    link.width.unwrap_or(0),
                    link.max_width.unwrap_or(0)
                ));
            }
            if let Some(m) = class_gen
                && below(link.max_generation, Some(m.value))
            {
                why.push(format!(
                    "maximum generation {} below the class's {}",
                    link.max_generation.unwrap_or(0),
                    m.held_by("devices")
                ));
            }
            if let Some(m) = class_width
                && below(link.max_width, Some(m.value))
            {
                why.push(format!(
                    "maximum width x{} below the class's x{}",
                    link.max_width.unwrap_or(0),
                    m.held_by("devices")
                ));
            }
            if !why.is_empty() {
                out.push(obs(
                    "pcie_downtrained",
                    subject,
                    format!(
                        "{name} linked at {}: {}; reseat it, check the riser and the slot",
                        Link::describe(link.generation, link.width),
                        why.join("; ")
                    ),
                    json!({
                        "link": link, "class": class,
                        "class_max_generation": class_gen, "class_max_width": class_width,
                    }),
                ));
            }
        }
        // firmware_drift
        let text_drift = |value: &str, m: &Option<Majority<String>>| {
            m.as_ref()
                .filter(|m| !value.is_empty() && value != m.value)
                .cloned()
        };
        for r in &hw.rdma {
            if let Some(m) = text_drift(&r.fw_ver, &p.fw_ver) {
                out.push(obs(
                    "firmware_drift",
                    Subject::device(node, &r.device),
                    format!(
                        "{} runs firmware {} where its class runs {}: update it",
                        r.device,
                        r.fw_ver,
                        m.held_by("devices")
                    ),
                    json!({"fw_ver": r.fw_ver, "class": class, "class_fw_ver": m}),
                ));
            }
        }
        for g in &hw.gpus {
            if let Some(m) = text_drift(&g.vbios, &p.vbios) {
                out.push(obs(
                    "firmware_drift",
                    Subject::gpu(node, &g.gpu),
                    format!(
                        "GPU {} runs VBIOS {} where its class runs {}: update it",
                        g.gpu,
                        g.vbios,
                        m.held_by("devices")
                    ),
                    json!({"vbios": g.vbios, "class": class, "class_vbios": m}),
                ));
            }
        }
        if let Some(info) = &hw.info
            && let Some(m) = text_drift(&info.driver, &p.driver)
        {
            out.push(obs(
                "firmware_drift",
                Subject::node(node),
                format!(
                    "driver {} where its class runs {}: install the class's",
                    info.driver,
                    m.held_by("nodes")
                ),
                json!({"driver": info.driver, "class": class, "class_driver": m}),
            ));
        }
        // device_missing
        let mut missing = Vec::new();
        let mut evidence = serde_json::Map::new();
        for (what, have, m) in [
            ("GPUs", hw.counts.gpus, &p.gpus),
            ("RDMA devices", hw.counts.rdma_devices, &p.rdma_devices),
            ("active ports", hw.counts.active_ports, &p.active_ports),
        ] {
            if let (Some(have), Some(m)) = (have, m)
                && have < m.value
            {
                missing.push(format!(
                    "{have} {what} of the class's {}",
                    m.held_by("nodes")
                ));
                evidence.insert(
                    what.replace(' ', "_").to_lowercase(),
                    json!({"value": have, "class": m}),
                );
            }
        }
        if !missing.is_empty() {
            evidence.insert("class".into(), json!(class));
            out.push(obs(
                "device_missing",
                Subject::node(node),
                format!(
                    "{}: check the devices are seated and their ports cabled",
                    missing.join("; ")
                ),
                evidence.into(),
            ));
        }
        // topology_drift
        let lined_up = |count: usize, m: &Option<Majority<u32>>| {
            m.as_ref().is_some_and(|m| m.value as usize == count)
        };
        if lined_up(hw.gpus.len(), &p.gpus) && lined_up(hw.rdma.len(), &p.rdma_devices) {
            let mut differ = Vec::new();
            for (row, cols) in hw.distances().into_iter().enumerate() {
                for (col, d) in cols.into_iter().enumerate() {
                    if let Some(m) = p.distances.get(&(row, col))
                        && m.value != d
                        && d.is_known()
                    {
                        differ.push((row, col, d, m));
                    }
                }
            }
            if !differ.is_empty() {
                let named: Vec<String> = differ
                    .iter()
                    .map(|(row, col, d, m)| {
                        format!(
                            "GPU {} – {} {d} (class {})",
                            hw.gpus[*row].gpu, hw.rdma[*col].device, m.value
                        )
                    })
                    .collect();
                let shown = named.iter().take(4).cloned().collect::<Vec<_>>().join(", ");
                let more = named.len().saturating_sub(4);
                out.push(obs(
                    "topology_drift",
                    Subject::node(node),
                    format!(
                        "{} GPU–NIC pairs wired unlike the class: {shown}{}; check the PCIe switch layout and its firmware",
                        named.len(),
                        if more > 0 { format!(" and {more} more") } else { String::new() }
                    ),
                    json!({
                        "class": class,
                        "pairs": differ.iter().map(|(row, col, d, m)| json!({
                            "gpu": hw.gpus[*row].gpu, "nic": hw.rdma[*col].device,
                            "distance": d.as_str(), "class_distance": m.value.as_str(),
                            "held": m.held, "of": m.of,
                        })).collect::<Vec<_>>(),
                    }),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use monitor_testkit::{HgxNode, hgx as layout, sim_hardware};
    use monitor_wire::{Kind, Labels, Series, names::metric};

    use super::*;
    use crate::{
        hardware::HardwareReader,
        live_table::{Latest, LatestValue},
    };

    fn latest(v: f64) -> Latest {
        Latest {
            unix_ns: 1_000,
            value: LatestValue::Gauge {
                min: v,
                max: v,
                mean: v,
            },
        }
    }

    fn gauge(name: &str, labels: Labels) -> Series {
        Series {
            name: name.into(),
            labels,
            kind: Kind::Gauge,
        }
    }

    /// Node `n` of the testkit's HGX layout, as `node` has it; GPU `slow` (if any) linked at
    /// (generation, width); `gpu_model` and `nic_model` replaced where given.
    fn hgx(
        n: usize,
        node: &HgxNode,
        slow: Option<(usize, f64, f64)>,
        models: Option<(&str, &str)>,
    ) -> NodeHardware {
        let mut r = HardwareReader::default();
        for (name, labels, v) in sim_hardware::series(n, node) {
            let labels = match (name, models) {
                (metric::NODE_HARDWARE_INFO, Some((gpu, nic))) => {
                    Labels::new(labels.iter().map(|(k, v)| match k {
                        "gpu_model" => (k, gpu),
                        "nic_model" => (k, nic),
                        _ => (k, v),
                    }))
                }
                _ => labels,
            };
            r.take(&gauge(name, labels), &latest(v));
        }
        for g in 0..8 {
            let (generation, width) = match slow {
                Some((s, generation, width)) if s == g => (generation, width),
                _ => (5.0, 16.0),
            };
            let labels = Labels::new([("gpu", g.to_string())]);
            for (name, v) in [
                (metric::GPU_PCIE_LINK_GENERATION, generation),
                (metric::GPU_PCIE_LINK_MAX_GENERATION, 5.0),
                (metric::GPU_PCIE_LINK_WIDTH_LANES, width),
                (metric::GPU_PCIE_LINK_MAX_WIDTH_LANES, 16.0),
            ] {
                r.take(&gauge(name, labels.clone()), &latest(v));
            }
        }
        r.finish()
    }

    fn healthy(n: usize) -> NodeHardware {
        hgx(n, &HgxNode::new(n as u32), None, None)
    }

    fn findings(nodes: &[NodeHardware], min_nodes: usize) -> Vec<Observation> {
        let names: Vec<String> = (0..nodes.len()).map(|i| format!("node{i:02}")).collect();
        let profile = GoldenProfile::learn(names.iter().map(String::as_str).zip(nodes), min_nodes);
        let mut out = Vec::new();
        for (name, hw) in names.iter().zip(nodes) {
            profile.evaluate(name, hw, &mut out);
        }
        out
    }

    /// (rule, node, subject's device or GPU).
    fn places(found: &[Observation]) -> Vec<(&str, String, Option<String>)> {
        let mut out: Vec<_> = found
            .iter()
            .map(|o| {
                (
                    o.rule,
                    o.subject.node.clone(),
                    o.subject.device.clone().or(o.subject.gpu.clone()),
                )
            })
            .collect();
        out.sort();
        out
    }

    #[test]
    fn a_majority_is_more_than_half_and_at_least_min_nodes() {
        let votes = |v: &[(usize, &str)]| {
            v.iter()
                .map(|&(n, s)| (n, s.to_owned()))
                .collect::<Vec<_>>()
        };
        let m = vote(&votes(&[(0, "a"), (1, "a"), (2, "b")]), 2).unwrap();
        assert_eq!(
            (m.value.as_str(), m.held, m.of, m.nodes, m.of_nodes),
            ("a", 2, 3, 2, 3)
        );
        // Half is not more than half.
        assert_eq!(
            vote(&votes(&[(0, "a"), (1, "a"), (2, "b"), (3, "b")]), 2),
            None
        );
        // Held by too few nodes: eight devices of one node.
        let one_node: Vec<(usize, String)> = (0..8).map(|_| (0, "a".to_owned())).collect();
        assert_eq!(vote(&one_node, 3), None);
        assert_eq!(vote(&one_node, 1).unwrap().held, 8);
        assert_eq!(vote::<String>(&[], 1), None);
    }

    #[test]
    fn a_healthy_fleet_has_no_finding_and_learns_the_hgx_layout() {
        let nodes: Vec<NodeHardware> = (0..4).map(healthy).collect();
        assert_eq!(findings(&nodes, 3), []);
        let names = ["a", "b", "c", "d"];
        let profile = GoldenProfile::learn(names.into_iter().zip(&nodes), 3);
        let (class, p) = profile.class_of("a").unwrap();
        assert_eq!(class.gpu_model, layout::GPU_MODEL);
        assert_eq!(p.nodes, 4);
        assert_eq!(p.gpus.as_ref().unwrap().value, 8);
        assert_eq!(p.fw_ver.as_ref().unwrap().value, layout::FIRMWARE);
        assert_eq!(p.fw_ver.as_ref().unwrap().held, 32);
        // GPU 0 and NIC 0 share a switch; NIC 2 is on the other switch of NUMA node 0,
        // NIC 4 across the sockets.
        let d = |g, n| p.distances[&(g, n)].value;
        assert_eq!(
            [d(0, 0), d(0, 1), d(0, 2), d(0, 4), d(7, 7)],
            [
                Distance::Switch,
                Distance::Switch,
                Distance::NumaNode,
                Distance::System,
                Distance::Switch
            ]
        );
    }

    /// The fleet: 16 HGX nodes, one GPU at Gen4 x8, one NIC on older firmware, one
    /// node without a NIC, one wired like PFN's: exactly four findings.
    #[test]
    fn the_four_faults_of_sixteen_nodes_are_four_findings() {
        let mut nodes: Vec<NodeHardware> = (0..16).map(healthy).collect();
        nodes[3] = hgx(3, &HgxNode::new(3), Some((5, 4.0, 8.0)), None);
        nodes[6] = hgx(6, &HgxNode::new(6).nic_with_old_firmware(2), None, None);
        nodes[9] = hgx(9, &HgxNode::new(9).without_nic(7), None, None);
        nodes[12] = hgx(12, &HgxNode::new(12).pfn_wired(), None, None);
        let found = findings(&nodes, 3);
        assert_eq!(
            places(&found),
            [
                ("device_missing", "node09".into(), None),
                ("firmware_drift", "node06".into(), Some("mlx5_2".into())),
                ("pcie_downtrained", "node03".into(), Some("5".into())),
                ("topology_drift", "node12".into(), None),
            ]
        );
        let of = |rule: &str| found.iter().find(|o| o.rule == rule).unwrap();
        for o in &found {
            assert_eq!(o.severity, Severity::Warning);
        }
        let pcie = of("pcie_downtrained");
        assert_eq!(pcie.evidence["link"]["width"], 8);
        assert_eq!(pcie.evidence["link"]["max_width"], 16);
        assert!(pcie.summary.contains("Gen4 x8"), "{}", pcie.summary);
        let fw = of("firmware_drift");
        assert_eq!(fw.evidence["fw_ver"], layout::OLD_FIRMWARE);
        assert_eq!(fw.evidence["class_fw_ver"]["value"], layout::FIRMWARE);
        // 127 of the 128 NICs, on 16 nodes; the node without a NIC has 7.
        assert_eq!(fw.evidence["class_fw_ver"]["held"], 126);
        assert_eq!(fw.evidence["class_fw_ver"]["of"], 127);
        let missing = of("device_missing");
        assert_eq!(missing.evidence["rdma_devices"]["value"], 7);
        assert_eq!(missing.evidence["rdma_devices"]["class"]["value"], 8);
        assert_eq!(missing.evidence["rdma_devices"]["class"]["held"], 15);
        assert_eq!(missing.evidence["active_ports"]["value"], 7);
        assert!(missing.evidence.get("gpus").is_none());
        // PFN's node: each GPU reaches the two NICs of its switch through the CPU.
        let topo = of("topology_drift");
        let pairs = topo.evidence["pairs"].as_array().unwrap();
        assert_eq!(pairs.len(), 16, "{pairs:#?}");
        assert!(
            pairs
                .iter()
                .all(|p| p["distance"] == "NODE" && p["class_distance"] == "PIX")
        );
        assert_eq!(pairs[0]["gpu"], "0");
        assert_eq!(pairs[0]["nic"], "mlx5_0");
        assert_eq!(pairs[0]["held"], 14);
    }

    /// A node whose kernel gives no NUMA node (`numa_node` -1, common on single-socket
    /// servers): its pairs across root ports are unknown, not "across the sockets", and
    /// unknown is no drift from the class (issue 45).
    #[test]
    fn unknown_places_are_no_topology_drift() {
        let mut nodes: Vec<NodeHardware> = (0..8).map(healthy).collect();
        let no_numa = &mut nodes[5];
        no_numa
            .gpus
            .iter_mut()
            .for_each(|g| g.place.numa_node = None);
        no_numa
            .rdma
            .iter_mut()
            .for_each(|r| r.place.numa_node = None);
        let d = nodes[5].distances();
        assert_eq!(
            (d[0][0], d[0][2], d[0][4]),
            (Distance::Switch, Distance::Unknown, Distance::Unknown)
        );
        assert_eq!(findings(&nodes, 3), []);
        // The class is still learnt from the nodes that tell it.
        let names: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
        let profile = GoldenProfile::learn(names.iter().map(String::as_str).zip(&nodes), 3);
        let (_, p) = profile.class_of("n0").unwrap();
        assert_eq!(p.distances[&(0, 4)].value, Distance::System);
        assert_eq!(p.distances[&(0, 4)].of, 7);
    }

    #[test]
    fn classes_are_kept_apart() {
        // Four nodes of one class on one firmware, four of another NIC on another: each class
        // is its own majority.
        let other = |n: usize, models| {
            let mut hw = hgx(n, &HgxNode::new(n as u32), None, models);
            for r in &mut hw.rdma {
                r.fw_ver = "22.31.1014".into();
            }
            hw
        };
        let mut nodes: Vec<NodeHardware> = (0..4).map(healthy).collect();
        nodes.extend((4..8).map(|n| other(n, Some((layout::GPU_MODEL, "MT4123")))));
        assert_eq!(findings(&nodes, 3), []);
        // The same eight nodes as one class: no majority (half and half), no finding.
        let mut one_class: Vec<NodeHardware> = (0..4).map(healthy).collect();
        one_class.extend((4..8).map(|n| other(n, None)));
        assert_eq!(findings(&one_class, 3), []);
    }

    #[test]
    fn too_small_a_class_or_no_majority_finds_nothing_against_it() {
        let odd = hgx(
            1,
            &HgxNode::new(1).nic_with_old_firmware(0).without_nic(1),
            None,
            None,
        );
        // Two nodes: below profile-min-nodes.
        assert_eq!(findings(&[healthy(0), odd.clone()], 3), []);
        // Three nodes, each counting differently: no majority of counts, no device_missing.
        let mut fewer = hgx(2, &HgxNode::new(2).without_nic(1), None, None);
        fewer.rdma.remove(1);
        fewer.counts.rdma_devices = Some(6);
        fewer.counts.active_ports = Some(6);
        let found = findings(&[healthy(0), odd, fewer], 3);
        assert_eq!(
            places(&found),
            [("firmware_drift", "node01".into(), Some("mlx5_0".into()))]
        );
    }

    #[test]
    fn a_node_missing_a_gpu_stays_in_its_class_and_only_the_count_is_found() {
        let mut nodes: Vec<NodeHardware> = (0..4).map(healthy).collect();
        // GPU 3 fell off: the node sends seven GPUs and counts seven.
        let mut r = HardwareReader::default();
        for (name, labels, v) in sim_hardware::series(4, &HgxNode::new(4)) {
            let (name, v) = match name {
                metric::GPU_PCI_INFO if labels.get("gpu") == Some("3") => continue,
                metric::NODE_GPUS => (name, 7.0),
                _ => (name, v),
            };
            r.take(&gauge(name, labels), &latest(v));
        }
        nodes.push(r.finish());
        let found = findings(&nodes, 3);
        assert_eq!(places(&found), [("device_missing", "node04".into(), None)]);
        assert_eq!(found[0].evidence["gpus"]["value"], 7);
        assert!(
            found[0].summary.contains("7 GPUs of the class's 8"),
            "{}",
            found[0].summary
        );
    }

    #[test]
    fn a_nic_below_its_own_link_or_the_class_maximum_and_a_driver_apart() {
        let mut nodes: Vec<NodeHardware> = (0..4).map(healthy).collect();
        nodes[1].rdma[3].link.generation = Some(3);
        nodes[2].rdma[0].link.max_width = Some(8);
        nodes[2].rdma[0].link.width = Some(8);
        nodes[3].info.as_mut().unwrap().driver = "535.54.03".into();
        nodes[3].gpus[1].vbios = "96.00.61.00.01".into();
        let found = findings(&nodes, 3);
        assert_eq!(
            places(&found),
            [
                ("firmware_drift", "node03".into(), None),
                ("firmware_drift", "node03".into(), Some("1".into())),
                ("pcie_downtrained", "node01".into(), Some("mlx5_3".into())),
                ("pcie_downtrained", "node02".into(), Some("mlx5_0".into())),
            ]
        );
        let summary = |node: &str, rule: &str| {
            found
                .iter()
                .find(|o| o.subject.node == node && o.rule == rule && o.subject.gpu.is_none())
                .unwrap()
                .summary
                .clone()
        };
        assert!(summary("node01", "pcie_downtrained").contains("generation 3 of its maximum 5"));
        assert!(
            summary("node02", "pcie_downtrained")
                .contains("maximum width x8 below the class's x16")
        );
        assert!(summary("node03", "firmware_drift").contains("driver 535.54.03"));
    }
}
