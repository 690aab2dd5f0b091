//! GPU rules: XIDs classified ([`xid`](super::xid)), a GPU fallen off the bus, uncorrected
//! (double-bit) ECC errors, row remapping pending or failed, thermal and power throttling,
//! a PCIe link below its maximum generation while busy (a link below its maximum width is the
//! golden profile's `pcie_downtrained`).

use std::collections::HashMap;

use monitor_wire::names::metric;
use serde_json::json;

use super::{
    Observation, Severity, Subject, Thresholds,
    verdicts::Verdicts,
    view::{EventState, Place, Track, TrackKey, View},
    xid,
};

pub(crate) const RULES: &[&str] = &[
    "gpu_xid",
    "gpu_lost",
    "gpu_ecc_uncorrected",
    "gpu_row_remap_pending",
    "gpu_row_remap_failed",
    "gpu_thermal_throttle",
    "gpu_power_throttle",
    "gpu_pcie_degraded",
];

const ECC: &str = metric::GPU_ECC_ERRORS_TOTAL;
const REMAP_PENDING: &str = metric::GPU_ROW_REMAP_PENDING;
const REMAP_FAILED: &str = metric::GPU_ROW_REMAP_FAILED;
const THROTTLE: &str = metric::GPU_THROTTLE_ACTIVE;
const UTILIZATION: &str = metric::GPU_UTILIZATION_RATIO;
pub(crate) const PCIE_GEN: &str = metric::GPU_PCIE_LINK_GENERATION;
pub(crate) const PCIE_MAX_GEN: &str = metric::GPU_PCIE_LINK_MAX_GENERATION;
pub(crate) const PCIE_WIDTH: &str = metric::GPU_PCIE_LINK_WIDTH_LANES;
pub(crate) const PCIE_MAX_WIDTH: &str = metric::GPU_PCIE_LINK_MAX_WIDTH_LANES;

pub(crate) const SERIES: &[&str] = &[
    ECC,
    REMAP_PENDING,
    REMAP_FAILED,
    THROTTLE,
    UTILIZATION,
    PCIE_GEN,
    PCIE_MAX_GEN,
    PCIE_WIDTH,
    PCIE_MAX_WIDTH,
];

/// Throttle reasons (the agent's `reason` label) by rule. `sw_power_cap` is left out: a GPU
/// at its power cap under load is normal.
const THERMAL: &[&str] = &["hw_thermal_slowdown", "sw_thermal_slowdown"];
const POWER: &[&str] = &["hw_power_brake_slowdown", "hw_slowdown"];

const S: u64 = 1_000_000_000;

/// A GPU's active throttle reasons (name, fraction of the sample) and one of their series.
/// A GPU's throttle reasons that are active, its first flag's track and key.
type Throttled<'a> = (Vec<(&'a str, f64)>, &'a Track, &'a TrackKey);

fn gpu_of(key: &TrackKey) -> Option<(Subject, Option<String>)> {
    let gpu = key.1.labels.get("gpu")?;
    Some((
        Subject::gpu(&key.0, gpu),
        key.1.labels.get("job_id").map(str::to_owned),
    ))
}

/// XIDs and lost GPUs, each active for `xid-hold-s` after its last occurrence.
pub(crate) fn evaluate_events(
    events: &EventState,
    now_ns: u64,
    th: &Thresholds,
    out: &mut Vec<Observation>,
) {
    let from = now_ns.saturating_sub(th.xid_hold_s * S);
    for ((node, gpu), xids) in &events.xids {
        let recent: Vec<(u64, u64)> = xids.iter().copied().filter(|x| x.0 >= from).collect();
        let Some(&(first, _)) = recent.first() else {
            continue;
        };
        let mut codes: Vec<u64> = recent.iter().map(|x| x.1).collect();
        codes.sort_unstable();
        codes.dedup();
        let classes: Vec<xid::XidClass> = codes.iter().map(|&c| xid::classify(c)).collect();
        let worst = classes
            .iter()
            .max_by_key(|c| c.severity)
            .copied()
            .expect("at least one XID");
        out.push(Observation {
            rule: "gpu_xid",
            severity: worst.severity,
            subject: Subject::gpu(node, gpu),
            job_id: events.job_of(node, gpu),
            at_ns: first,
            summary: format!(
                "XID {} on GPU {gpu}: {} — {}",
                worst.code, worst.meaning, worst.advice
            ),
            evidence: json!({
                "xids": classes.iter().map(|c| json!({
                    "code": c.code, "meaning": c.meaning, "severity": c.severity,
                    "action": c.action, "advice": c.advice,
                    "count": recent.iter().filter(|x| x.1 == c.code).count(),
                })).collect::<Vec<_>>(),
                "last": recent[recent.len() - 1].0,
                "hold_s": th.xid_hold_s,
            }),
        });
    }
    for ((node, gpu), &t) in &events.lost {
        if t < from {
            continue;
        }
        out.push(Observation {
            rule: "gpu_lost",
            severity: Severity::Critical,
            subject: Subject::gpu(node, gpu),
            job_id: events.job_of(node, gpu),
            at_ns: t,
            summary: format!(
                "GPU {gpu} stopped answering (fallen off the bus): drain and reboot the node"
            ),
            evidence: json!({"lost_at": t, "hold_s": th.xid_hold_s}),
        });
    }
}

pub(crate) fn evaluate_series(view: &View, events: &EventState, out: &mut Verdicts) {
    let th = view.th;
    // A lost GPU's last samples stay in the live view for a while: the loss is the finding,
    // not what its stale series say, and they are no evidence that a condition is gone.
    let lost_nodes: std::collections::HashSet<&str, foldhash::fast::RandomState> =
        events.lost.keys().map(|(node, _)| node.as_str()).collect();
    let lost = |key: &TrackKey| {
        lost_nodes.contains(&*key.0)
            && key
                .1
                .labels
                .get("gpu")
                .is_some_and(|gpu| events.lost.keys().any(|(n, g)| **n == *key.0 && g == gpu))
    };
    let push = |out: &mut Verdicts,
                rule: &'static str,
                severity: Severity,
                key: &TrackKey,
                track: &Track,
                summary: String,
                evidence: serde_json::Value| {
        if let Some((subject, job)) = gpu_of(key) {
            out.push(Observation {
                rule,
                severity,
                subject,
                job_id: job,
                at_ns: track.latest.unix_ns,
                summary,
                evidence,
            });
        }
    };
    let judged = |out: &mut Verdicts, rule: &'static str, key: &TrackKey| {
        out.judged(rule, &key.0, || gpu_of(key).map(|(subject, _)| subject));
    };
    for (key, track) in view.named(ECC) {
        // The value first: a label lookup per series of the fleet costs more.
        let Some(n) = track.counter() else {
            continue;
        };
        if n == 0 {
            // No uncorrected error since the driver loaded (a reset clears the count).
            out.judged("gpu_ecc_uncorrected", &key.0, || {
                gpu_of(key)
                    .filter(|_| volatile_uncorrected(key))
                    .map(|(s, _)| s)
            });
            continue;
        }
        if !volatile_uncorrected(key) || lost(key) {
            continue;
        }
        push(
            out,
            "gpu_ecc_uncorrected",
            Severity::Critical,
            key,
            track,
            format!(
                "{n} uncorrected (double-bit) ECC errors since the driver loaded: drain and reset the GPU"
            ),
            json!({"volatile_uncorrected": n}),
        );
    }
    for (name, rule, severity, advice) in [
        (
            REMAP_PENDING,
            "gpu_row_remap_pending",
            Severity::Warning,
            "a row remapping is pending: reset the GPU to apply it",
        ),
        (
            REMAP_FAILED,
            "gpu_row_remap_failed",
            Severity::Critical,
            "a row remapping failed: drain the node and replace the GPU",
        ),
    ] {
        for (key, track) in view.named(name) {
            if lost(key) {
                continue;
            }
            judged(out, rule, key);
            if track.gauge().is_some_and(|v| v >= 0.5) {
                push(
                    out,
                    rule,
                    severity,
                    key,
                    track,
                    advice.into(),
                    json!({name: track.gauge()}),
                );
            }
        }
    }
    // Throttle flags, grouped per GPU and rule.
    let mut per_gpu: GpuMap<(&'static str, GpuId), Throttled> = GpuMap::default();
    for (key, track) in view.named(THROTTLE) {
        let Some(v) = track.gauge() else {
            continue;
        };
        // Most flags are off: their reason is looked up only where a finding may end.
        if v < 0.5
            && !out.is_open("gpu_thermal_throttle", &key.0)
            && !out.is_open("gpu_power_throttle", &key.0)
        {
            continue;
        }
        let Some(reason) = key.1.labels.get("reason") else {
            continue;
        };
        let rule = if THERMAL.contains(&reason) {
            "gpu_thermal_throttle"
        } else if POWER.contains(&reason) {
            "gpu_power_throttle"
        } else {
            continue;
        };
        if lost(key) {
            continue;
        }
        // Judged on any of its reasons: a GPU's throttle flags come in one sample.
        judged(out, rule, key);
        if v < 0.5 {
            continue;
        }
        per_gpu
            .entry((rule, gpu_id(key)))
            .or_insert_with(|| (Vec::new(), track, key))
            .0
            .push((reason, v));
    }
    for ((rule, _), (reasons, track, first)) in per_gpu {
        let key = gpu_key(first);
        let names: Vec<&str> = reasons.iter().map(|r| r.0).collect();
        push(
            out,
            rule,
            Severity::Warning,
            &key,
            track,
            format!(
                "GPU {} clocks held down ({}): check cooling and power",
                key.1.labels.get("gpu").unwrap_or("?"),
                names.join(", ")
            ),
            json!({"reasons": names, "fraction_active": reasons.iter().map(|r| r.1).fold(0.0, f64::max)}),
        );
    }
    // PCIe link: current against maximum, on busy GPUs only (idle GPUs lower their link).
    // The GPUs below their maximum generation first (few, usually none); then only their
    // width and utilisation are looked up, not every GPU's.
    let gen_max: GpuMap<Place, &Track> = view
        .placed(PCIE_MAX_GEN)
        .map(|(_, t, p)| (p.gpu, t))
        .collect();
    let mut low: Vec<(&TrackKey, &Track, Place)> = Vec::new();
    for (k, t, p) in view.placed(PCIE_GEN) {
        let gm = gen_max.get(&p.gpu).and_then(|t| t.gauge());
        match (t.gauge(), gm) {
            (Some(a), Some(b)) if a < b => low.push((k, t, p.gpu)),
            (Some(_), Some(_)) if !lost(k) => judged(out, "gpu_pcie_degraded", k),
            _ => {}
        }
    }
    let of_low = |name: &'static str| -> GpuMap<Place, &Track> {
        if low.is_empty() {
            return GpuMap::default();
        }
        let wanted: GpuMap<Place, ()> = low.iter().map(|l| (l.2, ())).collect();
        view.placed(name)
            .map(|(_, t, p)| (p.gpu, t))
            .filter(|(id, _)| wanted.contains_key(id))
            .collect()
    };
    let (width, width_max, util) = (
        of_low(PCIE_WIDTH),
        of_low(PCIE_MAX_WIDTH),
        of_low(UTILIZATION),
    );
    for &(series_key, track, key) in &low {
        let busy = util
            .get(&key)
            .and_then(|t| t.gauge())
            .is_none_or(|u| u >= th.pcie_busy_utilization);
        let g = track.gauge();
        let gm = gen_max.get(&key).and_then(|t| t.gauge());
        let w = width.get(&key).and_then(|t| t.gauge());
        let wm = width_max.get(&key).and_then(|t| t.gauge());
        // A width below the maximum is `pcie_downtrained`'s (the golden profile's): lanes are
        // not lowered to save power, so it is judged busy or not. Until the width is known
        // (the gauges arrive apart) neither is judged here.
        let full_width = matches!((w, wm), (Some(a), Some(b)) if a >= b);
        let width_known = w.is_some() && wm.is_some();
        if lost(series_key) {
            continue;
        }
        // Idle (it lowers its link) or narrower than its maximum (not this rule's): gone.
        if !busy || width_known {
            judged(out, "gpu_pcie_degraded", series_key);
        }
        if busy && full_width {
            push(
                out,
                "gpu_pcie_degraded",
                Severity::Warning,
                &gpu_key(series_key),
                track,
                format!(
                    "PCIe link at Gen{} x{} of Gen{} x{}: reseat the GPU or check the riser",
                    g.unwrap_or(f64::NAN),
                    w.unwrap_or(f64::NAN),
                    gm.unwrap_or(f64::NAN),
                    wm.unwrap_or(f64::NAN)
                ),
                json!({"generation": g, "max_generation": gm, "width": w, "max_width": wm}),
            );
        }
    }
}

/// Whether an ECC counter is the volatile uncorrected one (`gpu_ecc_uncorrected`'s).
fn volatile_uncorrected(key: &TrackKey) -> bool {
    let labels = &key.1.labels;
    labels.get("type") == Some("uncorrected") && labels.get("scope") == Some("volatile")
}

/// A GPU's identity borrowed from a series key (node, `gpu`, `job_id`, `uuid`): the same
/// GPU as [`gpu_key`] makes, without making one. The rules group a tick's series per GPU with
/// it, thousands of GPUs each tick, and build a finding's key only for a finding.
type GpuId<'a> = (&'a str, Option<&'a str>, Option<&'a str>, Option<&'a str>);

/// Maps of a tick's GPUs (foldhash, as the tracks: see `view::Tracks`).
type GpuMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

fn gpu_id(key: &TrackKey) -> GpuId<'_> {
    let labels = &key.1.labels;
    (
        &key.0,
        labels.get("gpu"),
        labels.get("job_id"),
        labels.get("uuid"),
    )
}

/// The GPU's identity in a series key: node, `gpu` and `job_id` labels, no metric detail.
fn gpu_key(key: &TrackKey) -> TrackKey {
    let labels = monitor_wire::Labels::new(
        key.1
            .labels
            .iter()
            .filter(|(k, _)| matches!(*k, "gpu" | "job_id" | "uuid")),
    );
    (
        key.0.clone(),
        monitor_wire::Series {
            name: "gpu".into(),
            labels,
            kind: monitor_wire::Kind::Gauge,
        },
    )
}
