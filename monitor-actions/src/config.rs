//! The `[actions]` table of collector.toml (docs/actions.md lists every key, its default and
//! why): whether the collector acts or only says what it would do, which findings make it
//! drain a node in Slurm, post to a webhook or run a command, how long a node stays clear
//! before it is resumed, the brake, and `[actions.alertmanager]`.

use serde::{Deserialize, Serialize};

use monitor_findings::{Finding, Severity};

/// The rule of the collector's own finding when the brake holds drains.
pub(crate) const BRAKE_RULE: &str = "actions_brake";
/// The node name of the brake's own finding: it is about the fleet, not one node.
pub(crate) const BRAKE_NODE: &str = "fleet";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ActionsConfig {
    /// Log every action as what it would do, and do nothing (a rule may say otherwise).
    pub dry_run: bool,
    /// The `scontrol` program (a path, or a name looked up in `PATH`).
    pub scontrol: String,
    /// How long one `scontrol` call may take, seconds, before it is killed and retried.
    pub scontrol_timeout_s: u64,
    /// How long a node railscope drained must stay clear of findings after its last one
    /// ended before railscope resumes it, seconds.
    pub resume_hold_s: u64,
    /// The longest wait between two tries of a failed action, seconds (the wait doubles from
    /// one second up to this).
    pub retry_max_s: u64,
    /// The brake: at most this many nodes drained by railscope within `brake-window-s`...
    pub brake_max_nodes: u32,
    /// ...and at most this share of the nodes the collector holds, percent (at least one
    /// node).
    pub brake_max_percent: f64,
    pub brake_window_s: u64,
    /// The dashboard's address as its users reach it (`https://railscope.example:9091`):
    /// alerts and webhook bodies link to the finding's view under it. None: no link.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_url: Option<String>,
    /// Every active finding as an alert to Alertmanager, where the table is given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alertmanager: Option<AlertmanagerConfig>,
    /// Which findings are acted on, and how: the first rule that matches a finding decides.
    pub rule: Vec<ActionRule>,
}

/// `[actions.alertmanager]`: where alerts go and how often they are sent again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct AlertmanagerConfig {
    /// Alertmanager base URLs (`http://am1:9093`); each one gets every alert (an HA pair is
    /// two URLs).
    pub urls: Vec<String>,
    /// The least severity sent (default info: every finding).
    pub severity: Severity,
    /// How often an active finding's alert is sent again, seconds.
    pub resend_s: u64,
    /// How long one POST may take, seconds.
    pub timeout_s: u64,
    /// Only log what would be sent (default: the `[actions]` table's `dry-run`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
}

impl Default for AlertmanagerConfig {
    fn default() -> Self {
        Self {
            urls: Vec::new(),
            severity: Severity::Info,
            resend_s: 60,
            timeout_s: 10,
            dry_run: None,
        }
    }
}

impl Default for ActionsConfig {
    fn default() -> Self {
        Self {
            dry_run: true,
            scontrol: "scontrol".into(),
            scontrol_timeout_s: 10,
            resume_hold_s: 600,
            retry_max_s: 60,
            brake_max_nodes: 10,
            brake_max_percent: 10.0,
            brake_window_s: 3600,
            external_url: None,
            alertmanager: None,
            rule: Vec::new(),
        }
    }
}

/// Which findings an action applies to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ActionRule {
    /// A finding rule (`ib_link_flapping`, `gpu_xid`, ...), or `*` for every rule.
    pub rule: String,
    /// The least severity that matches (default critical).
    #[serde(default = "critical")]
    pub severity: Severity,
    /// What the finding is about: `ib_port`, `rdma_device`, `gpu`, `job`, `node`, or `*` (default).
    #[serde(default = "any")]
    pub device: String,
    /// The action: `slurm-drain` (drain, and resume once clear), `webhook` or `command`.
    pub action: String,
    /// This rule's own dry run (default: the table's `dry-run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<bool>,
    /// `webhook`: the URL the finding is POSTed to as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `command`: the program and its arguments (no shell); the finding is its stdin.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// `webhook`, `command`: how long one try may take, seconds, before it is cut off (the
    /// command killed) and counted as failed.
    #[serde(default = "notify_timeout_s")]
    pub timeout_s: u64,
    /// `webhook`, `command`: tries before railscope gives up on the finding.
    #[serde(default = "notify_attempts")]
    pub attempts: u32,
}

fn notify_timeout_s() -> u64 {
    10
}

fn notify_attempts() -> u32 {
    10
}

fn critical() -> Severity {
    Severity::Critical
}

fn any() -> String {
    "*".into()
}

/// The device kinds a rule can name.
pub(crate) const DEVICE_KINDS: &[&str] = &["ib_port", "rdma_device", "gpu", "job", "node", "*"];
/// The actions a rule can name.
pub(crate) const ACTIONS: &[&str] = &["slurm-drain", "webhook", "command"];

/// What a finding is about, as a rule's `device` names it.
pub(crate) fn device_kind(f: &Finding) -> &'static str {
    if f.device.is_some() && f.port.is_some() {
        "ib_port"
    } else if f.device.is_some() {
        "rdma_device"
    } else if f.gpu.is_some() {
        "gpu"
    } else if f.job_id.is_some() && f.rule.starts_with("verbs_") {
        "job"
    } else {
        "node"
    }
}

impl ActionRule {
    pub fn matches(&self, f: &Finding) -> bool {
        (self.rule == "*" || self.rule == f.rule)
            && f.severity >= self.severity
            && (self.device == "*" || self.device == device_kind(f))
    }
}

impl ActionsConfig {
    /// Every value usable; the error names the key and what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.scontrol.is_empty() {
            return Err("scontrol: empty".into());
        }
        if self.scontrol_timeout_s == 0 {
            return Err("scontrol-timeout-s: must be at least 1".into());
        }
        if self.retry_max_s == 0 {
            return Err("retry-max-s: must be at least 1".into());
        }
        if self.brake_window_s == 0 {
            return Err("brake-window-s: must be at least 1".into());
        }
        if !(self.brake_max_percent > 0.0 && self.brake_max_percent <= 100.0) {
            return Err(format!(
                "brake-max-percent: {} is not above 0 and at most 100",
                self.brake_max_percent
            ));
        }
        for (i, r) in self.rule.iter().enumerate() {
            let at = format!("rule {} (rule = {:?})", i + 1, r.rule);
            if r.rule.is_empty() {
                return Err(format!("{at}: rule is empty"));
            }
            if r.rule == BRAKE_RULE {
                return Err(format!(
                    "{at}: {BRAKE_RULE} is the brake's own finding and drains nothing"
                ));
            }
            if !DEVICE_KINDS.contains(&r.device.as_str()) {
                return Err(format!(
                    "{at}: device {:?} is not one of {}",
                    r.device,
                    DEVICE_KINDS.join(", ")
                ));
            }
            match r.action.as_str() {
                "slurm-drain" => {
                    if r.url.is_some() || !r.command.is_empty() {
                        return Err(format!("{at}: url and command are for webhook and command"));
                    }
                }
                "webhook" => {
                    let url = r.url.as_deref().unwrap_or_default();
                    check_url(url).map_err(|e| format!("{at}: url: {e}"))?;
                    if !r.command.is_empty() {
                        return Err(format!("{at}: command is for action \"command\""));
                    }
                }
                "command" => {
                    if r.command.first().is_none_or(|p| p.is_empty()) {
                        return Err(format!(
                            "{at}: command: the program and its arguments, e.g. \
                             [\"/usr/local/bin/cordon\", \"--reason\", \"railscope\"]"
                        ));
                    }
                    if r.url.is_some() {
                        return Err(format!("{at}: url is for action \"webhook\""));
                    }
                }
                _ => {
                    return Err(format!(
                        "{at}: action {:?} is not one of {}",
                        r.action,
                        ACTIONS.join(", ")
                    ));
                }
            }
            if r.action != "slurm-drain" {
                if r.timeout_s == 0 {
                    return Err(format!("{at}: timeout-s: must be at least 1"));
                }
                if r.attempts == 0 {
                    return Err(format!("{at}: attempts: must be at least 1"));
                }
            }
        }
        if let Some(url) = &self.external_url {
            check_url(url).map_err(|e| format!("external-url: {e}"))?;
        }
        if let Some(am) = &self.alertmanager {
            if am.urls.is_empty() {
                return Err("alertmanager.urls: give at least one Alertmanager URL".into());
            }
            for url in &am.urls {
                check_url(url).map_err(|e| format!("alertmanager.urls: {e}"))?;
            }
            if am.resend_s == 0 {
                return Err("alertmanager.resend-s: must be at least 1".into());
            }
            if am.timeout_s == 0 {
                return Err("alertmanager.timeout-s: must be at least 1".into());
            }
        }
        Ok(())
    }

    /// Whether the alerts to Alertmanager are only logged.
    pub fn alertmanager_dry_run(&self) -> bool {
        self.alertmanager
            .as_ref()
            .and_then(|a| a.dry_run)
            .unwrap_or(self.dry_run)
    }

    /// The rule that decides what to do about `f`, if any (never for the brake's finding, nor
    /// an upstream one, whose node is a switch or the fabric).
    pub fn rule_for(&self, f: &Finding) -> Option<&ActionRule> {
        if f.rule == BRAKE_RULE || f.rule == monitor_findings::fabric::RULE {
            return None;
        }
        self.rule.iter().find(|r| r.matches(f))
    }

    /// Whether actions by `rule` are only logged.
    pub fn dry_run_of(&self, rule: &ActionRule) -> bool {
        rule.dry_run.unwrap_or(self.dry_run)
    }

    /// How many nodes the brake lets railscope drain within its window, the collector
    /// holding `nodes_seen` nodes.
    pub fn brake_limit(&self, nodes_seen: usize) -> usize {
        let share = (self.brake_max_percent / 100.0 * nodes_seen as f64).floor() as usize;
        share.max(1).min(self.brake_max_nodes as usize)
    }
}

/// An `http://` or `https://` URL with a host.
fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{url:?} is not an http:// or https:// URL"))?;
    if rest.is_empty() || rest.starts_with('/') || url.chars().any(char::is_whitespace) {
        return Err(format!("{url:?} has no host, or holds spaces"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(rule: &str, severity: Severity, device: Option<&str>, gpu: Option<&str>) -> Finding {
        Finding {
            id: format!("{rule}/n1/x/1"),
            rule: rule.into(),
            severity,
            node: "n1".into(),
            device: device.map(Into::into),
            port: device.map(|_| 1),
            gpu: gpu.map(Into::into),
            job_id: None,
            start: 1,
            end: None,
            summary: String::new(),
            evidence: serde_json::Value::Null,
        }
    }

    fn parse(text: &str) -> Result<ActionsConfig, String> {
        let c: ActionsConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        c.validate()?;
        Ok(c)
    }

    #[test]
    fn a_new_install_is_a_dry_run_with_no_rule() {
        let c = parse("").unwrap();
        assert!(c.dry_run);
        assert!(c.rule.is_empty());
        let f = finding("ib_link_flapping", Severity::Critical, Some("mlx5_0"), None);
        assert!(c.rule_for(&f).is_none());
    }

    #[test]
    fn rules_match_by_rule_severity_and_device_kind_and_override_the_dry_run() {
        let c = parse(
            r#"
            [[rule]]
            rule = "ib_link_flapping"
            action = "slurm-drain"
            dry-run = false
            [[rule]]
            rule = "*"
            severity = "warning"
            device = "gpu"
            action = "slurm-drain"
            "#,
        )
        .unwrap();
        let flap = finding("ib_link_flapping", Severity::Critical, Some("mlx5_0"), None);
        let rule = c.rule_for(&flap).unwrap();
        assert!(!c.dry_run_of(rule));
        let xid = finding("gpu_xid", Severity::Warning, None, Some("3"));
        assert!(c.dry_run_of(c.rule_for(&xid).unwrap()));
        let info = finding("gpu_xid", Severity::Info, None, Some("3"));
        assert!(c.rule_for(&info).is_none());
        let port = finding("ib_symbol_errors", Severity::Critical, Some("mlx5_0"), None);
        assert!(c.rule_for(&port).is_none());
        let brake = finding(BRAKE_RULE, Severity::Critical, None, None);
        assert!(c.rule_for(&brake).is_none());
        // A device as a whole (no port): `rdma_device`, not `ib_port`.
        let mut firmware = finding("firmware_drift", Severity::Warning, Some("mlx5_2"), None);
        firmware.port = None;
        assert_eq!(device_kind(&firmware), "rdma_device");
        assert_eq!(device_kind(&port), "ib_port");
    }

    #[test]
    fn bad_rules_are_refused_with_what_is_wrong() {
        let e = parse("[[rule]]\nrule = \"x\"\naction = \"reboot\"\n").unwrap_err();
        assert!(e.contains("action \"reboot\""), "{e}");
        let e = parse("[[rule]]\nrule = \"x\"\ndevice = \"nic\"\naction = \"slurm-drain\"\n")
            .unwrap_err();
        assert!(e.contains("device \"nic\""), "{e}");
        let e = parse("brake-max-percent = 0\n").unwrap_err();
        assert!(e.contains("brake-max-percent"), "{e}");
        assert!(parse("[[rule]]\nrule = \"x\"\n").is_err());
    }

    #[test]
    fn webhooks_commands_and_alertmanager_are_checked_naming_the_key() {
        let c = parse(
            r#"
            external-url = "https://railscope.example:9091"
            [alertmanager]
            urls = ["http://am1:9093", "http://am2:9093"]
            [[rule]]
            rule = "gpu_xid"
            action = "webhook"
            url = "https://hooks.example/railscope"
            [[rule]]
            rule = "*"
            action = "command"
            command = ["/usr/local/bin/cordon", "--why"]
            timeout-s = 30
            "#,
        )
        .unwrap();
        let am = c.alertmanager.as_ref().unwrap();
        assert_eq!(
            (am.resend_s, am.timeout_s, am.severity),
            (60, 10, Severity::Info)
        );
        assert!(c.alertmanager_dry_run(), "the table's dry run by default");
        assert_eq!((c.rule[0].timeout_s, c.rule[0].attempts), (10, 10));
        assert_eq!(c.rule[1].timeout_s, 30);

        let bad = [
            (
                "[[rule]]\nrule = \"x\"\naction = \"webhook\"\n",
                "rule 1 (rule = \"x\"): url:",
            ),
            (
                "[[rule]]\nrule = \"x\"\naction = \"webhook\"\nurl = \"ftp://h/\"\n",
                "is not an http:// or https:// URL",
            ),
            (
                "[[rule]]\nrule = \"x\"\naction = \"command\"\n",
                "rule 1 (rule = \"x\"): command:",
            ),
            (
                "[[rule]]\nrule = \"x\"\naction = \"command\"\ncommand = [\"/bin/true\"]\nurl = \"http://h\"\n",
                "url is for action \"webhook\"",
            ),
            (
                "[[rule]]\nrule = \"x\"\naction = \"slurm-drain\"\nurl = \"http://h\"\n",
                "url and command are for webhook and command",
            ),
            (
                "[[rule]]\nrule = \"x\"\naction = \"webhook\"\nurl = \"http://h\"\nattempts = 0\n",
                "attempts: must be at least 1",
            ),
            ("[alertmanager]\n", "alertmanager.urls: give at least one"),
            (
                "[alertmanager]\nurls = [\"am:9093\"]\n",
                "alertmanager.urls: \"am:9093\"",
            ),
            (
                "[alertmanager]\nurls = [\"http://am:9093\"]\nresend-s = 0\n",
                "alertmanager.resend-s",
            ),
            ("external-url = \"http:///x\"\n", "external-url:"),
        ];
        for (text, want) in bad {
            let e = parse(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
        let e = parse("[alertmanager]\nurls = [\"http://am\"]\nresend = 5\n").unwrap_err();
        assert!(e.contains("unknown field `resend`"), "{e}");
    }

    #[test]
    fn the_brake_limit_is_the_smaller_of_its_count_and_share_and_at_least_one() {
        let c = ActionsConfig::default();
        assert_eq!(c.brake_limit(0), 1);
        assert_eq!(c.brake_limit(8), 1);
        assert_eq!(c.brake_limit(64), 6);
        assert_eq!(c.brake_limit(2048), 10);
    }
}
