//! Headless Chromium for the dashboard tests (Debian's package, driven over the DevTools
//! protocol by `headless_chrome`): starting it on a page, evaluating in the page, waiting for
//! the page's own state, screenshots, and what the page reported that an operator would call
//! broken. Shared by `dashboard.rs` and `fleet_real_agents.rs`.

#![allow(dead_code)] // each test file uses its part

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use headless_chrome::{
    Browser, LaunchOptions, Tab,
    protocol::cdp::{Page::CaptureScreenshotFormatOption, types::Event},
};
use serde_json::Value;

/// Debian's Chromium (or `RAILSCOPE_CHROMIUM`); None, with a message, when it is missing,
/// unless `RAILSCOPE_REQUIRE_CHROMIUM=1` (set by `cargo xtask test`), which makes that a
/// failure.
pub(crate) fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("RAILSCOPE_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if path.exists() {
        return Some(path);
    }
    if std::env::var("RAILSCOPE_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1") {
        panic!(
            "{} is missing: install Debian's chromium (`cargo xtask setup` does)",
            path.display()
        );
    }
    eprintln!(
        "skipped: {} is missing (install Debian's chromium, or set RAILSCOPE_CHROMIUM)",
        path.display()
    );
    None
}

/// What the page reported that an operator would call broken.
#[derive(Default)]
pub(crate) struct PageProblems(Mutex<Vec<String>>);

impl PageProblems {
    pub(crate) fn record(&self, event: &Event) {
        let problem = match event {
            Event::RuntimeExceptionThrown(e) => Some(format!(
                "exception: {}",
                e.params
                    .exception_details
                    .exception
                    .as_ref()
                    .and_then(|x| x.description.clone())
                    .unwrap_or_else(|| e.params.exception_details.text.clone())
            )),
            Event::LogEntryAdded(e)
                if format!("{:?}", e.params.entry.level).to_lowercase() == "error" =>
            {
                Some(format!(
                    "log: {} {}",
                    e.params.entry.text,
                    e.params.entry.url.clone().unwrap_or_default()
                ))
            }
            Event::RuntimeConsoleAPICalled(e)
                if format!("{:?}", e.params.Type).to_lowercase() == "error"
                    || format!("{:?}", e.params.Type).to_lowercase() == "warning" =>
            {
                Some(format!(
                    "console: {}",
                    e.params
                        .args
                        .iter()
                        .map(|a| a
                            .value
                            .as_ref()
                            .map(|v| v.to_string())
                            .or_else(|| a.description.clone())
                            .unwrap_or_default())
                        .collect::<Vec<_>>()
                        .join(" ")
                ))
            }
            _ => None,
        };
        if let Some(p) = problem {
            self.0.lock().unwrap().push(p);
        }
    }

    pub(crate) fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// Evaluates `expression` in the page; its JSON value.
pub(crate) fn eval(tab: &Tab, expression: &str) -> Value {
    let wrapped = format!("JSON.stringify((() => {{ {expression} }})() ?? null)");
    let result = tab
        .evaluate(&wrapped, false)
        .unwrap_or_else(|e| panic!("evaluating {expression}: {e}"));
    match result.value {
        Some(Value::String(s)) => serde_json::from_str(&s).unwrap(),
        other => panic!("evaluating {expression}: {other:?}"),
    }
}

/// Waits until `expression` gives true in the page (it re-renders every poll); a page still
/// loading (the expression failing) is waited for too.
pub(crate) fn wait_until(tab: &Tab, what: &str, expression: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    let wrapped = format!("JSON.stringify((() => {{ {expression} }})() ?? null)");
    loop {
        let value = tab.evaluate(&wrapped, false).ok().and_then(|r| r.value);
        if value == Some(Value::String("true".into())) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the page never showed {what} ({expression})"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Opens a view and waits for a completed update of it after it was opened.
pub(crate) fn open(tab: &Tab, hash: &str, view: &str) {
    eval(
        tab,
        &format!("location.hash = {}; return true", Value::from(hash)),
    );
    let before = eval(tab, "return window.railscope.updates")
        .as_u64()
        .unwrap();
    wait_until(
        tab,
        &format!("the {view} view updated"),
        &format!(
            "return document.getElementById('view').dataset.view === '{view}' \
             && window.railscope.updates >= {}",
            before + 1
        ),
    );
}

pub(crate) fn screenshot(tab: &Tab, name: &str) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    let png = tab
        .capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)
        .unwrap();
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

pub(crate) fn assert_no_problem(tab: &Tab, problems: &PageProblems, after: &str) {
    let banner = eval(
        tab,
        "const p = document.getElementById('problem'); return p.hidden ? null : p.textContent",
    );
    assert_eq!(banner, Value::Null, "the error banner showed after {after}");
    let seen = problems.take();
    assert!(
        seen.is_empty(),
        "after {after}, the page reported: {seen:#?}"
    );
}

/// Headless Chromium showing `url`, what the page reports recorded.
pub(crate) struct Page {
    pub tab: Arc<Tab>,
    pub problems: Arc<PageProblems>,
    _browser: Browser,
    _profile: tempfile::TempDir,
}

impl Page {
    pub(crate) fn open(chromium: PathBuf, url: &str) -> Self {
        Self::open_with(chromium, url, &[], None)
    }

    /// [`Page::open`] with more Chromium flags, answering the server's basic-auth
    /// challenges with `credentials` (as a user typing them in the browser's own prompt).
    pub(crate) fn open_with(
        chromium: PathBuf,
        url: &str,
        extra_args: &[&str],
        credentials: Option<(&str, &str)>,
    ) -> Self {
        let profile = tempfile::tempdir().unwrap();
        let mut args = vec![
            OsStr::new("--disable-quic"),
            OsStr::new("--disable-component-update"),
            OsStr::new("--no-first-run"),
        ];
        args.extend(extra_args.iter().map(OsStr::new));
        let browser = Browser::new(
            LaunchOptions::default_builder()
                .path(Some(chromium))
                .headless(true)
                .sandbox(false)
                .window_size(Some((1500, 1100)))
                .user_data_dir(Some(profile.path().to_owned()))
                .args(args)
                .idle_browser_timeout(Duration::from_secs(300))
                .build()
                .unwrap(),
        )
        .expect("starting headless Chromium");
        let tab = browser.new_tab().unwrap();
        tab.set_default_timeout(Duration::from_secs(60));
        let problems = Arc::new(PageProblems::default());
        let recorder = problems.clone();
        tab.add_event_listener(Arc::new(move |event: &Event| recorder.record(event)))
            .unwrap();
        tab.enable_log().unwrap().enable_runtime().unwrap();
        if let Some((user, password)) = credentials {
            // Every request passes through the Fetch domain (continued as it is); the
            // challenges are answered with the credentials.
            tab.enable_fetch(None, Some(true)).unwrap();
            tab.authenticate(Some(user.into()), Some(password.into()))
                .unwrap();
        }
        tab.navigate_to(url).unwrap();
        // On a loaded machine (the other test's browser and fleet beside this one) the load
        // event can come later than the tab's timeout: the callers wait for the page's own
        // state instead (`wait_until`, which retries while the page is not there yet).
        if let Err(e) = tab.wait_until_navigated() {
            eprintln!("navigating to {url}: {e}; waiting for the page instead");
        }
        Self {
            tab,
            problems,
            _browser: browser,
            _profile: profile,
        }
    }
}
