//! Telling other systems of a finding: a JSON POST to a URL (webhooks, and Alertmanager's
//! API through [`HttpPoster`]) and a command with the finding as JSON on its stdin. Each try
//! is bounded by a timeout (a command past it is killed with its process group), so an
//! endpoint or a program that hangs costs one try, never a thread forever.

use std::{
    io::{Read as _, Write as _},
    os::unix::process::CommandExt as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::json;

use monitor_findings::Finding;

/// At most this much of an answer or of a command's stderr goes into a record's detail.
const DETAIL_BYTES: usize = 256;

/// Where a finding goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Webhook { url: String },
    Command { argv: Vec<String> },
}

impl Target {
    /// The target as the audit log names it.
    pub fn describe(&self) -> String {
        match self {
            Target::Webhook { url } => url.clone(),
            Target::Command { argv } => argv.join(" "),
        }
    }
}

/// Delivers a finding's JSON to a target; [`Deliver`] in the collector, a fake in unit tests.
pub trait Notifier: Send + Sync {
    /// `Ok` with a word on what the receiver said, or why it failed.
    fn deliver(&self, target: &Target, body: &[u8], timeout: Duration) -> Result<String, String>;
}

/// Real deliveries: HTTP POST and child processes.
pub(crate) struct Deliver;

impl Notifier for Deliver {
    fn deliver(&self, target: &Target, body: &[u8], timeout: Duration) -> Result<String, String> {
        match target {
            Target::Webhook { url } => HttpPoster::new(url, timeout)?.post(url, body),
            Target::Command { argv } => run_command(argv, body, timeout),
        }
    }
}

/// What a webhook or a command receives: the finding as the API serves it, the dashboard
/// link to its view, and where it came from.
pub(crate) fn body(f: &Finding, external_url: Option<&str>) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "source": "railscope",
        "finding": f,
        "link": external_url.map(|base| view_url(base, f)),
    }))
    .unwrap_or_default()
}

/// The dashboard's view of a finding under `base`: its job's for a verbs finding with a job,
/// the fleet's for the brake's, else its node's (which lists the node's findings).
pub(crate) fn view_url(base: &str, f: &Finding) -> String {
    let base = base.trim_end_matches('/');
    let view = match (&f.job_id, f.rule.starts_with("verbs_")) {
        (Some(job), true) => format!("#/job/{}", path_segment(job)),
        _ if f.node == super::config::BRAKE_NODE => "#/fleet".into(),
        _ => format!("#/node/{}", path_segment(&f.node)),
    };
    format!("{base}/{view}")
}

/// `text` percent-encoded for a URL path segment.
fn path_segment(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An HTTP(S) client that POSTs JSON with a timeout over the whole request.
pub(crate) struct HttpPoster {
    agent: ureq::Agent,
}

impl HttpPoster {
    /// A client for `url` (an https URL is verified against the system's roots).
    pub(crate) fn new(url: &str, timeout: Duration) -> Result<Self, String> {
        let mut builder = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .user_agent(concat!("railscope-collector/", env!("CARGO_PKG_VERSION")));
        if url.starts_with("https://") {
            let tls =
                monitor_client::tls::load(url, &Default::default()).map_err(|e| e.to_string())?;
            builder = builder.tls_config(tls);
        }
        Ok(Self {
            agent: builder.build().into(),
        })
    }

    /// POSTs `body` as JSON; `Ok("HTTP 200")` for a 2xx answer, else what went wrong.
    pub(crate) fn post(&self, url: &str, body: &[u8]) -> Result<String, String> {
        let response = self
            .agent
            .post(url)
            .header("Content-Type", "application/json")
            .send(body)
            .map_err(|e| format!("POST {url}: {e}"))?;
        let status = response.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(format!("HTTP {status}"));
        }
        let mut text = String::new();
        let _ = response
            .into_body()
            .into_reader()
            .take(DETAIL_BYTES as u64)
            .read_to_string(&mut text);
        Err(format!("POST {url}: HTTP {status}: {}", one_line(&text)))
    }
}

/// Runs `argv` (no shell) with `input` on its stdin; stdout is discarded, stderr kept for the
/// detail. Past `timeout` the command's whole process group is killed.
fn run_command(argv: &[String], input: &[u8], timeout: Duration) -> Result<String, String> {
    let (program, args) = argv.split_first().ok_or("no command")?;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    // Fed and read from threads of their own: a program that reads nothing, or writes a lot
    // to stderr, cannot block the wait below.
    let feed = child.stdin.take().map(|mut stdin| {
        let input = input.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        })
    });
    let drain = child.stderr.take().map(|mut err| {
        std::thread::spawn(move || {
            let mut all = Vec::new();
            let _ = err.read_to_end(&mut all);
            all
        })
    });
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if started.elapsed() >= timeout => {
                // SAFETY: kill(2) on the group this child leads (process_group(0) above).
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                let _ = child.wait();
                break Err(format!(
                    "{program} took more than {timeout:?} and was killed"
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => break Err(format!("{program}: {e}")),
        }
    };
    if let Some(feed) = feed {
        let _ = feed.join();
    }
    let stderr = drain
        .and_then(|d| d.join().ok())
        .map(|b| one_line(&String::from_utf8_lossy(&b)))
        .unwrap_or_default();
    let status = status?;
    if status.success() {
        Ok("exit 0".into())
    } else {
        Err(format!("{program} failed ({status}): {stderr}"))
    }
}

/// `text` on one line, at most [`DETAIL_BYTES`] long.
fn one_line(text: &str) -> String {
    let mut line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.len() > DETAIL_BYTES {
        let mut cut = DETAIL_BYTES;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finding(node: &str, rule: &str, job: Option<&str>) -> Finding {
        Finding {
            id: format!("{rule}/{node}/x/1"),
            rule: rule.into(),
            severity: monitor_findings::Severity::Critical,
            node: node.into(),
            device: None,
            port: None,
            gpu: None,
            job_id: job.map(Into::into),
            start: 1,
            end: None,
            summary: "s".into(),
            evidence: serde_json::Value::Null,
        }
    }

    #[test]
    fn the_link_is_the_node_view_or_the_job_view_of_a_verbs_finding() {
        let f = finding("gpu node/1", "gpu_xid", Some("77"));
        assert_eq!(
            view_url("https://rs.example:9091/", &f),
            "https://rs.example:9091/#/node/gpu%20node%2F1"
        );
        let f = finding("n1", "verbs_qp_errors", Some("77"));
        assert_eq!(view_url("http://h", &f), "http://h/#/job/77");
    }

    #[test]
    fn a_command_gets_the_finding_on_stdin_and_one_past_its_timeout_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("got");
        let script = format!("cat > {}", out.display());
        let argv = ["/bin/sh".to_owned(), "-c".into(), script];
        let body = body(&finding("n1", "gpu_xid", None), None);
        assert_eq!(
            run_command(&argv, &body, Duration::from_secs(20)),
            Ok("exit 0".into())
        );
        assert_eq!(std::fs::read(&out).unwrap(), body);
        let argv = [
            "/bin/sh".to_owned(),
            "-c".into(),
            "echo no >&2; exit 3".into(),
        ];
        let e = run_command(&argv, &body, Duration::from_secs(20)).unwrap_err();
        assert!(e.contains("exit status: 3") && e.contains("no"), "{e}");
        let argv = ["/bin/sh".to_owned(), "-c".into(), "sleep 600".into()];
        let e = run_command(&argv, &body, Duration::from_millis(300)).unwrap_err();
        assert!(e.contains("was killed"), "{e}");
        let e = run_command(&["/nonexistent/x".into()], &body, Duration::from_secs(1));
        assert!(e.unwrap_err().contains("cannot run /nonexistent/x"));
    }
}
