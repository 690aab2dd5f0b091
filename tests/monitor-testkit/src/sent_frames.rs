//! What real agents sent (the datagrams a [`Relay`](crate::relay::Relay) kept), in the forms
//! the end-to-end tests compare a collector's archive and a TSDB with, sample by sample: the
//! archive's (`railscope query --json series`) and the TSDB's (docs/deployment.md, "Naming").

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    process::Command,
};

use monitor_wire::{Frame, Key, ReceiverState, SeriesData, WireError};

/// The frames of an agent's datagrams as a receiver decodes them, each once.
pub struct SentFrames {
    pub state: ReceiverState,
    pub frames: Vec<Frame>,
    /// Datagrams that were a frame already decoded: sent again (the agent's spool).
    pub resent: usize,
}

/// Decodes every datagram with `key`: each must be a frame, or a copy of one already decoded
/// (a resend), which is counted, not decoded twice.
pub fn decode_sent<'a>(key: &Key, datagrams: impl IntoIterator<Item = &'a [u8]>) -> SentFrames {
    let mut state = ReceiverState::default();
    let mut frames = Vec::new();
    let mut resent = 0;
    for d in datagrams {
        match monitor_wire::decode(d, key, &mut state) {
            Ok(frame) => frames.push(frame),
            Err(WireError::Duplicate { .. }) => resent += 1,
            Err(e) => panic!("the agent sent a datagram that does not decode: {e}"),
        }
    }
    SentFrames {
        state,
        frames,
        resent,
    }
}

impl SentFrames {
    /// Every sample, per series (`name` and its labels with `node`), as the archive's query
    /// API answers it: counters `t value`, gauges `start t min max mean`; each list sorted.
    pub fn archive_points(&self) -> BTreeMap<String, Vec<String>> {
        archive_points(&self.state, &self.frames)
    }

    /// Every sample as a TSDB holds it by the documented convention (docs/deployment.md): a
    /// counter as it is; a gauge's mean at the end of its period, and for a period also
    /// `_min` and `_max`; label `node`; times in ms. Keyed by ([`canonical`] series, ms).
    pub fn tsdb_samples(&self) -> BTreeMap<(String, i64), f64> {
        let mut out = BTreeMap::new();
        for frame in &self.frames {
            tsdb_samples_of(&self.state, frame, &mut out);
        }
        out
    }
}

/// [`SentFrames::archive_points`] of `frames`, decoded with `state`.
pub fn archive_points(state: &ReceiverState, frames: &[Frame]) -> BTreeMap<String, Vec<String>> {
    let mut points: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for frame in frames {
        let node = state.node(&frame.node).unwrap();
        for s in &frame.samples {
            let series = node.series(s.id).expect("every sample named (loopback)");
            let mut labels: BTreeMap<String, String> = series
                .labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            labels.insert("node".into(), frame.node.clone());
            let list = points
                .entry(format!("{}{labels:?}", series.name))
                .or_default();
            match &s.data {
                SeriesData::Counter(v) => {
                    list.extend(v.iter().map(|c| format!("{} {}", c.unix_ns, c.value)));
                }
                SeriesData::Gauge(v) => list.extend(v.iter().map(|g| {
                    format!(
                        "{} {} {} {} {}",
                        g.start_unix_ns, g.end_unix_ns, g.min, g.max, g.mean
                    )
                })),
            }
        }
    }
    for list in points.values_mut() {
        list.sort();
    }
    points
}

/// [`SentFrames::tsdb_samples`] of one frame, into `out`.
pub fn tsdb_samples_of(
    state: &ReceiverState,
    frame: &Frame,
    out: &mut BTreeMap<(String, i64), f64>,
) {
    let node = state.node(&frame.node).unwrap();
    for s in &frame.samples {
        let series = node.series(s.id).expect("every sample named (loopback)");
        let mut labels: Vec<(&str, &str)> = series.labels.iter().collect();
        labels.push(("node", &frame.node));
        let mut put = |suffix: &str, ns: u64, v: f64| {
            let key = canonical(&format!("{}{suffix}", series.name), &labels);
            out.insert((key, (ns / 1_000_000) as i64), v);
        };
        match &s.data {
            SeriesData::Counter(v) => v.iter().for_each(|c| put("", c.unix_ns, c.value as f64)),
            SeriesData::Gauge(v) => {
                for g in v {
                    put("", g.end_unix_ns, g.mean);
                    if g.start_unix_ns < g.end_unix_ns || g.min != g.max {
                        put("_min", g.end_unix_ns, g.min);
                        put("_max", g.end_unix_ns, g.max);
                    }
                }
            }
        }
    }
}

/// A series as `name{k=v,...}` with labels sorted (the key both sides are compared by).
pub fn canonical(name: &str, labels: &[(&str, &str)]) -> String {
    let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    labels.sort();
    format!("{name}{{{}}}", labels.join(","))
}

/// The metric names of [`SentFrames::archive_points`]' keys, each once.
pub fn metric_names(points: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    let names: BTreeSet<&str> = points
        .keys()
        .map(|k| k.split_once('{').map_or(k.as_str(), |(name, _)| name))
        .collect();
    names.into_iter().map(str::to_owned).collect()
}

/// What `railscope query --collector http://127.0.0.1:HTTP --json series METRIC --start -1h`
/// (`railscope` at `program`) answers for each metric, in the form of
/// [`SentFrames::archive_points`].
pub fn queried_points(
    program: &Path,
    http: u16,
    metrics: &[String],
) -> BTreeMap<String, Vec<String>> {
    queried_points_at(program, &format!("http://127.0.0.1:{http}"), metrics)
}

/// [`queried_points`] from the collector at `url` (`http://HOST:PORT`).
pub fn queried_points_at(
    program: &Path,
    url: &str,
    metrics: &[String],
) -> BTreeMap<String, Vec<String>> {
    let mut points: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for metric in metrics {
        let out = Command::new(program)
            .args(["query", "--collector", url])
            .args(["--json", "series", metric, "--start", "-1h"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "railscope query series {metric}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for s in json["series"].as_array().unwrap() {
            let labels: BTreeMap<String, String> = s["labels"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect();
            let key = format!("{}{labels:?}", s["metric"].as_str().unwrap());
            let list = points.entry(key).or_default();
            for p in s["points"].as_array().unwrap() {
                let t = p["t"].as_u64().unwrap();
                list.push(match s["kind"].as_str().unwrap() {
                    "counter" => format!("{t} {}", p["value"].as_u64().unwrap()),
                    _ => format!(
                        "{} {t} {} {} {}",
                        p["start"].as_u64().unwrap(),
                        p["min"].as_f64().unwrap(),
                        p["max"].as_f64().unwrap(),
                        p["mean"].as_f64().unwrap()
                    ),
                });
            }
        }
    }
    for list in points.values_mut() {
        list.sort();
    }
    points
}

/// What a TSDB read back (`(series, ms, value)`), judged against the samples the agents sent
/// (`sent`, from [`tsdb_samples_of`]): samples whose value differs from what was sent or that
/// were never sent, samples held more than once, and samples of `required` it lacks.
pub struct TsdbComparison {
    /// `series @ms: got v, sent e`, for every sample read back that was not sent as is.
    pub wrong: Vec<String>,
    /// Samples read back more than once, with the count.
    pub twice: Vec<((String, i64), usize)>,
    /// Samples of `required` not read back.
    pub missing: Vec<(String, i64)>,
    /// Every sample read back, by series and time, with the times it was read.
    pub seen: BTreeMap<(String, i64), usize>,
}

impl TsdbComparison {
    pub fn of(
        got: &[(String, i64, f64)],
        sent: &BTreeMap<(String, i64), f64>,
        required: &BTreeMap<(String, i64), f64>,
    ) -> Self {
        let mut seen: BTreeMap<(String, i64), usize> = BTreeMap::new();
        let mut wrong = Vec::new();
        for (series, ms, v) in got {
            *seen.entry((series.clone(), *ms)).or_default() += 1;
            match sent.get(&(series.clone(), *ms)) {
                Some(e) if e.to_bits() == v.to_bits() => {}
                e => wrong.push(format!("{series} @{ms}: got {v}, sent {e:?}")),
            }
        }
        let twice = seen
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, n)| (k.clone(), *n))
            .collect();
        let missing = required
            .keys()
            .filter(|k| !seen.contains_key(*k))
            .cloned()
            .collect();
        Self {
            wrong,
            twice,
            missing,
            seen,
        }
    }

    /// Nothing wrong, nothing twice, nothing missing.
    pub fn is_exact(&self) -> bool {
        self.wrong.is_empty() && self.twice.is_empty() && self.missing.is_empty()
    }
}

/// The series whose points a collector answered (`answered`, from [`queried_points`]) differ
/// from what the agents sent (`expected`, from [`archive_points`]), as `series: got N of M
/// samples`, the first five.
pub fn points_differing(
    expected: &BTreeMap<String, Vec<String>>,
    answered: &BTreeMap<String, Vec<String>>,
) -> Vec<String> {
    expected
        .iter()
        .filter(|(k, v)| answered.get(*k) != Some(v))
        .map(|(k, v)| {
            let got = answered.get(k).map_or(0, Vec::len);
            format!("{k}: {got} of {} samples", v.len())
        })
        .take(5)
        .collect()
}
