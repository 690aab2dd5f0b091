//! Which job a cgroup belongs to, from its path: the `job_id` label (and `job_step` for Slurm)
//! that per-cgroup verb series, events and the GPU series of a job's GPUs carry.
//!
//! - patterns from `agent.toml` (`[[jobs.patterns]]`), tried first and in order, so a site
//!   can name its own launcher's jobs or override a built-in rule;
//! - Slurm: a `job_<id>` directory under a Slurm one (`slurmstepd.scope` in cgroup v2, as
//!   slurmstepd lays it out; `slurm`, `slurm_<node>` in the v1-style layout), with the step
//!   from the `step_<n>` directory under it (`step_batch`, `step_extern` kept as named):
//!   `slurm:42`, step `0`;
//! - Kubernetes: the pod's directory under a `kubepods` one, with the systemd cgroup driver
//!   (`kubepods-burstable-pod<uid with _>.slice`) or the cgroupfs one (`pod<uid>`):
//!   `k8s:<uid with ->`;
//! - otherwise the innermost systemd unit (`*.service`, `*.scope`): `systemd:<unit>`.
//!
//! A path that none of these name (the root, a slice, a directory someone made by hand) has
//! no job.

use std::fmt;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// The label a job travels as (not `job`: Prometheus reserves it for its scrape job).
pub const JOB_ID_LABEL: &str = "job_id";
/// The label of a Slurm job's step.
pub const JOB_STEP_LABEL: &str = "job_step";

/// A job as the labels name it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Job {
    /// `slurm:<id>`, `k8s:<pod uid>`, `systemd:<unit>` or what a configured pattern names.
    #[serde(rename = "job_id")]
    pub id: String,
    /// The Slurm step (`0`, `batch`, `extern`, ...), or a configured pattern's `step`.
    #[serde(rename = "job_step", skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
}

impl Job {
    /// The job's labels: `job_id` and, if known, `job_step`.
    pub fn labels(&self) -> impl Iterator<Item = (&'static str, String)> + '_ {
        std::iter::once((JOB_ID_LABEL, self.id.clone()))
            .chain(self.step.iter().map(|s| (JOB_STEP_LABEL, s.clone())))
    }
}

impl fmt::Display for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)?;
        if let Some(step) = &self.step {
            write!(f, " step {step}")?;
        }
        Ok(())
    }
}

/// The `[jobs]` table of `agent.toml`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct JobSettings {
    /// Tried in order before the built-in rules; the first that matches names the job.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub patterns: Vec<JobPattern>,
}

/// `[[jobs.patterns]]`: a regular expression on the cgroup path (from the hierarchy's root,
/// e.g. `/mylauncher/run-17/rank-3`) and the job it names, with `$1`, `${name}` for its
/// groups. Checked when the file is read: a bad regular expression, or an `id` or `step` that
/// uses a group the expression does not have, is an error at its line.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(try_from = "PatternText", into = "PatternText")]
pub struct JobPattern {
    regex: Regex,
    id: String,
    step: Option<String>,
}

impl JobSettings {
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }
}

impl PartialEq for JobPattern {
    fn eq(&self, other: &Self) -> bool {
        self.regex.as_str() == other.regex.as_str()
            && self.id == other.id
            && self.step == other.step
    }
}

/// A pattern as written in the file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatternText {
    regex: PatternRegex,
    id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    step: Option<String>,
}

/// What is wrong with a configured pattern.
#[derive(Debug, thiserror::Error)]
pub enum PatternError {
    #[error("bad regular expression {regex:?}: {reason}")]
    Regex { regex: String, reason: String },
    #[error("`{field}` {template:?} uses group {group:?}, which regex {regex:?} does not have")]
    MissingGroup {
        field: &'static str,
        template: String,
        group: String,
        regex: String,
    },
    #[error("`id` is empty")]
    EmptyId,
}

/// A pattern's regular expression, compiled as the file is read, so that a bad one is an
/// error at its own line.
#[derive(Clone, Debug)]
struct PatternRegex(Regex);

impl<'de> Deserialize<'de> for PatternRegex {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Regex::new(&text).map(PatternRegex).map_err(|e| {
            serde::de::Error::custom(PatternError::Regex {
                regex: text.clone(),
                // The regex crate's message spans several lines (the expression, a caret).
                reason: e
                    .to_string()
                    .lines()
                    .last()
                    .unwrap_or_default()
                    .trim_start_matches("error: ")
                    .to_owned(),
            })
        })
    }
}

impl Serialize for PatternRegex {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0.as_str())
    }
}

impl TryFrom<PatternText> for JobPattern {
    type Error = PatternError;

    fn try_from(text: PatternText) -> Result<Self, PatternError> {
        let PatternRegex(regex) = text.regex;
        if text.id.is_empty() {
            return Err(PatternError::EmptyId);
        }
        for (field, template) in
            std::iter::once(("id", &text.id)).chain(text.step.iter().map(|s| ("step", s)))
        {
            if let Some(group) = missing_group(&regex, template) {
                return Err(PatternError::MissingGroup {
                    field,
                    template: template.clone(),
                    group,
                    regex: regex.as_str().to_owned(),
                });
            }
        }
        Ok(Self {
            regex,
            id: text.id,
            step: text.step,
        })
    }
}

impl From<JobPattern> for PatternText {
    fn from(p: JobPattern) -> Self {
        Self {
            regex: PatternRegex(p.regex),
            id: p.id,
            step: p.step,
        }
    }
}

/// The first group `template` refers to (`$1`, `${1}`, `$name`, `${name}`; `$$` is a dollar)
/// that `regex` does not have.
fn missing_group(regex: &Regex, template: &str) -> Option<String> {
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('$') {
            rest = after;
            continue;
        }
        let (group, after) = match rest.strip_prefix('{') {
            Some(braced) => match braced.find('}') {
                Some(end) => (&braced[..end], &braced[end + 1..]),
                None => (braced, ""),
            },
            None => {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                (&rest[..end], &rest[end..])
            }
        };
        rest = after;
        let known = match group.parse::<usize>() {
            Ok(n) => n < regex.captures_len(),
            Err(_) => regex.capture_names().flatten().any(|n| n == group),
        };
        if !known {
            return Some(group.to_owned());
        }
    }
    None
}

/// The rules that name a cgroup's job: the configured patterns, then the built-in ones.
#[derive(Clone, Debug, Default)]
pub struct JobRules {
    patterns: Vec<JobPattern>,
}

impl JobRules {
    pub fn new(settings: &JobSettings) -> Self {
        Self {
            patterns: settings.patterns.clone(),
        }
    }

    /// The job of the cgroup at `path` (relative to the hierarchy's root, starting with `/`),
    /// if any rule names one.
    pub fn job_of(&self, path: &str) -> Option<Job> {
        for pattern in &self.patterns {
            if let Some(captures) = pattern.regex.captures(path) {
                let mut id = String::new();
                captures.expand(&pattern.id, &mut id);
                let step = pattern.step.as_ref().map(|template| {
                    let mut step = String::new();
                    captures.expand(template, &mut step);
                    step
                });
                if !id.is_empty() {
                    return Some(Job {
                        id,
                        step: step.filter(|s| !s.is_empty()),
                    });
                }
            }
        }
        slurm(path)
            .or_else(|| kubernetes(path))
            .or_else(|| systemd_unit(path))
    }
}

fn components(path: &str) -> impl DoubleEndedIterator<Item = &str> + Clone {
    path.split('/').filter(|c| !c.is_empty())
}

/// `.../<slurm dir>/[uid_<n>/]job_<id>[/step_<step>/...]`.
fn slurm(path: &str) -> Option<Job> {
    let mut parts = components(path);
    // The Slurm directory: slurmstepd.scope (cgroup v2), slurm or slurm_<node> (v1 layout).
    parts.by_ref().find(|c| is_slurm_dir(c))?;
    let mut next = parts.next()?;
    if let Some(uid) = next.strip_prefix("uid_") {
        if !is_number(uid) {
            return None;
        }
        next = parts.next()?;
    }
    let id = next.strip_prefix("job_").filter(|id| is_number(id))?;
    let step = parts
        .next()
        .and_then(|c| c.strip_prefix("step_"))
        .filter(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric()))
        .map(str::to_owned);
    Some(Job {
        id: format!("slurm:{id}"),
        step,
    })
}

fn is_slurm_dir(c: &str) -> bool {
    c == "slurmstepd.scope" || c == "slurm" || c.starts_with("slurm_")
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// A pod's directory under a `kubepods` one: `kubepods[-<qos>]-pod<uid_>.slice` (systemd
/// driver, also under `kubelet-kubepods...`) or `pod<uid>` (cgroupfs driver).
fn kubernetes(path: &str) -> Option<Job> {
    let mut parts = components(path);
    parts.by_ref().find(|c| c.contains("kubepods"))?;
    parts.find_map(|c| {
        let uid = match c.strip_suffix(".slice") {
            Some(unit) => {
                unit.contains("kubepods")
                    .then_some(unit)?
                    .rsplit_once("-pod")?
                    .1
            }
            None => c.strip_prefix("pod")?,
        };
        let uid = uid.replace('_', "-");
        is_pod_uid(&uid).then(|| Job {
            id: format!("k8s:{uid}"),
            step: None,
        })
    })
}

/// A pod UID: a UUID (8-4-4-4-12 hex digits), or the 32 hex digits of a static pod's
/// config hash.
fn is_pod_uid(uid: &str) -> bool {
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    let groups: Vec<&str> = uid.split('-').collect();
    match groups.as_slice() {
        [one] => hex(one, 32),
        [a, b, c, d, e] => hex(a, 8) && hex(b, 4) && hex(c, 4) && hex(d, 4) && hex(e, 12),
        _ => false,
    }
}

/// The innermost `*.service` or `*.scope` directory.
fn systemd_unit(path: &str) -> Option<Job> {
    components(path)
        .rev()
        .find(|c| {
            c.strip_suffix(".service")
                .or_else(|| c.strip_suffix(".scope"))
                .is_some_and(|name| !name.is_empty())
        })
        .map(|unit| Job {
            id: format!("systemd:{unit}"),
            step: None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(path: &str) -> Option<(String, Option<String>)> {
        JobRules::default().job_of(path).map(|j| (j.id, j.step))
    }

    fn named(id: &str, step: Option<&str>) -> Option<(String, Option<String>)> {
        Some((id.to_owned(), step.map(str::to_owned)))
    }

    #[test]
    fn slurm_jobs_and_steps_as_slurmstepd_lays_them_out() {
        // cgroup v2 (cgroup/v2 plugin): under slurmstepd.scope.
        for (path, id, step) in [
            (
                "/system.slice/slurmstepd.scope/job_42/step_0/user/task_0",
                "slurm:42",
                Some("0"),
            ),
            (
                "/system.slice/slurmstepd.scope/job_42/step_0/user/task_special",
                "slurm:42",
                Some("0"),
            ),
            (
                "/system.slice/slurmstepd.scope/job_1234567/step_batch/user/task_0",
                "slurm:1234567",
                Some("batch"),
            ),
            (
                "/system.slice/slurmstepd.scope/job_7/step_extern/user/task_0",
                "slurm:7",
                Some("extern"),
            ),
            (
                "/system.slice/slurmstepd.scope/job_7/step_interactive",
                "slurm:7",
                Some("interactive"),
            ),
            ("/system.slice/slurmstepd.scope/job_7", "slurm:7", None),
            ("/system.slice/slurmstepd.scope/job_7/user", "slurm:7", None),
            // cgroup v1-style layout (cgroup/v1 plugin, or a hybrid host's unified tree).
            ("/slurm/uid_1000/job_42/step_0", "slurm:42", Some("0")),
            (
                "/slurm/uid_1000/job_42/step_0/task_3",
                "slurm:42",
                Some("0"),
            ),
            ("/slurm/uid_0/job_9", "slurm:9", None),
            // Several slurmd on one host (--enable-multiple-slurmd): slurm_<node>.
            ("/slurm_node07/uid_1000/job_5/step_2", "slurm:5", Some("2")),
        ] {
            assert_eq!(job(path), named(id, step), "{path}");
        }
    }

    #[test]
    fn kubernetes_pods_with_either_cgroup_driver() {
        let uid = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
        let underscored = uid.replace('-', "_");
        for path in [
            // systemd driver: burstable, besteffort, guaranteed (no QoS slice).
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{underscored}.slice/cri-containerd-5b9d0f2e.scope"
            ),
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{underscored}.slice"
            ),
            format!("/kubepods.slice/kubepods-pod{underscored}.slice/crio-1f2e3d.scope"),
            // kubelet under its own slice (kind, some distributions).
            format!(
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{underscored}.slice/cri-containerd-aa.scope"
            ),
            // cgroupfs driver.
            format!("/kubepods/burstable/pod{uid}/5b9d0f2e8c"),
            format!("/kubepods/pod{uid}/5b9d0f2e8c"),
            format!("/kubepods/besteffort/pod{uid}"),
        ] {
            assert_eq!(job(&path), named(&format!("k8s:{uid}"), None), "{path}");
        }
        // A static pod's UID is its config's hash, 32 hex digits.
        let hash = "6a5f2d8e9b0c4d7e8f1a2b3c4d5e6f70";
        assert_eq!(
            job(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{hash}.slice/cri-containerd-1.scope"
            )),
            named(&format!("k8s:{hash}"), None)
        );
    }

    #[test]
    fn a_systemd_unit_otherwise_the_innermost_one() {
        for (path, unit) in [
            ("/system.slice/sshd.service", "sshd.service"),
            (
                "/user.slice/user-1000.slice/session-3.scope",
                "session-3.scope",
            ),
            (
                "/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1a2.scope",
                "run-r1a2.scope",
            ),
            (
                "/user.slice/user-1000.slice/user@1000.service/init.scope",
                "init.scope",
            ),
            (
                "/system.slice/docker-0123abcd.scope",
                "docker-0123abcd.scope",
            ),
            (
                "/system.slice/railscope-agent.service",
                "railscope-agent.service",
            ),
            // slurmd itself is a service, not a job.
            ("/system.slice/slurmd.service", "slurmd.service"),
            // A directory under a unit belongs to it.
            ("/system.slice/train.service/worker-2", "train.service"),
        ] {
            assert_eq!(job(path), named(&format!("systemd:{unit}"), None), "{path}");
        }
    }

    #[test]
    fn paths_that_name_no_job() {
        for path in [
            "/",
            "",
            "/system.slice",
            "/user.slice/user-1000.slice",
            "/kubepods.slice",
            "/kubepods.slice/kubepods-burstable.slice",
            "cgroup:12345",
            // A job_ directory outside any Slurm one is not Slurm's.
            "/job_42/step_0",
            "/mywork/job_42",
            // Slurm's own directories above the job.
            "/slurm",
            "/slurm/uid_1000",
            // Not a numeric job id, not a uid.
            "/slurm/uid_1000/job_abc/step_0",
            "/slurm/uidx/job_4",
            "/slurm/uid_1000/myjob_42",
            // A pod directory outside kubepods, and malformed UIDs inside it.
            "/pod0a1b2c3d-4e5f-6789-abcd-ef0123456789",
            "/kubepods/burstable/pod0a1b2c3d-4e5f-6789-abcd",
            "/kubepods/burstable/podxyz",
            "/kubepods/burstable/pod0a1b2c3d-4e5f-6789-abcd-ef012345678z",
            // A unit name with nothing before the suffix.
            "/system.slice/.service",
        ] {
            assert_eq!(job(path), None, "{path}");
        }
    }

    #[test]
    fn slurm_inside_a_systemd_unit_is_slurm() {
        // The unit is slurmstepd's scope: the job inside it wins over the unit.
        assert_eq!(
            job("/system.slice/slurmstepd.scope/job_3/step_1/user/task_0"),
            named("slurm:3", Some("1"))
        );
        // slurmstepd's own process, outside any job.
        assert_eq!(
            job("/system.slice/slurmstepd.scope/system"),
            named("systemd:slurmstepd.scope", None)
        );
    }

    fn settings(toml_text: &str) -> Result<JobSettings, toml::de::Error> {
        #[derive(Deserialize)]
        struct File {
            jobs: JobSettings,
        }
        toml::from_str::<File>(toml_text).map(|f| f.jobs)
    }

    #[test]
    fn configured_patterns_come_first_with_their_groups() {
        let rules = JobRules::new(
            &settings(
                r#"
[[jobs.patterns]]
regex = '^/mylauncher/run-(\d+)/rank-(?<rank>\d+)'
id = "mylauncher:$1"
step = "rank${rank}"

[[jobs.patterns]]
regex = '^/system\.slice/slurmstepd\.scope/job_(\d+)'
id = "cluster-a:$1"
"#,
            )
            .unwrap(),
        );
        let job = |p: &str| rules.job_of(p).map(|j| j.to_string());
        assert_eq!(
            job("/mylauncher/run-17/rank-3/x").as_deref(),
            Some("mylauncher:17 step rank3")
        );
        assert_eq!(
            job("/system.slice/slurmstepd.scope/job_42/step_0").as_deref(),
            Some("cluster-a:42"),
            "a configured pattern overrides a built-in rule"
        );
        // Not matched by a pattern: the built-in rules.
        assert_eq!(
            job("/slurm/uid_1/job_8/step_0").as_deref(),
            Some("slurm:8 step 0")
        );
        assert_eq!(job("/mylauncher/run-x").as_deref(), None);
    }

    #[test]
    fn a_bad_pattern_is_refused_with_its_reason() {
        let e = settings("[[jobs.patterns]]\nregex = '^/run-(\\d+'\nid = \"x:$1\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad regular expression"), "{e}");
        assert!(e.contains("unclosed group"), "{e}");
        let e = settings("[[jobs.patterns]]\nregex = '^/run-(\\d+)'\nid = \"x:$2\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("uses group \"2\""), "{e}");
        let e = settings("[[jobs.patterns]]\nregex = '^/(?<a>x)'\nid = \"x\"\nstep = \"${b}\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`step` \"${b}\" uses group \"b\""), "{e}");
        let e = settings("[[jobs.patterns]]\nregex = 'x'\nid = \"x\"\nname = \"y\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `name`"), "{e}");
        // `$$` is a dollar, not a group.
        settings("[[jobs.patterns]]\nregex = 'x'\nid = \"x$$1\"\n").unwrap();
    }
}
