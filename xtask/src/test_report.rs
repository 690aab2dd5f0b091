//! What failed in `cargo test --no-fail-fast`, read from its output as it streams by, so the
//! suite's closing list names every failed test and every test binary that died without
//! naming one (a crash, a signal): one failure must never hide the others.

use std::io::{BufRead as _, BufReader};
use std::process::Command;

use anyhow::Context as _;

/// Runs `cmd` (a `cargo test`), echoing its merged output line by line, and returns the
/// failures it reports: empty when it passed.
pub(crate) fn run_cargo_test(mut cmd: Command) -> anyhow::Result<Vec<String>> {
    let (reader, writer) = std::io::pipe().context("making a pipe for cargo test's output")?;
    let mut child = cmd
        .stdout(writer.try_clone()?)
        .stderr(writer)
        .spawn()
        .with_context(|| format!("failed to start {}", crate::cargo::render(&cmd)))?;
    // The command holds the pipe's write ends: drop them, or the reader never sees its end.
    drop(cmd);
    let mut report = Report::default();
    let mut reader = BufReader::new(reader);
    let mut bytes = Vec::new();
    // Read to the end whatever a test prints (bytes that are no UTF-8 too), so cargo never
    // blocks on a full pipe.
    while reader
        .read_until(b'\n', &mut bytes)
        .context("reading cargo test's output")?
        > 0
    {
        let line = String::from_utf8_lossy(&bytes);
        let line = line.trim_end_matches(['\n', '\r']);
        // println!, which a test harness captures: a nested run's lines stay its own.
        println!("{line}");
        report.line(line);
        bytes.clear();
    }
    let status = child.wait().context("waiting for cargo test")?;
    let mut failures = report.failures();
    if !status.success() && failures.is_empty() {
        failures.push(format!("cargo test failed ({status}) before any test ran"));
    }
    Ok(failures)
}

/// The state of a read through cargo test's output.
#[derive(Default)]
struct Report {
    /// The test binary running now, as cargo's `Running` line describes it.
    binary: String,
    /// Whether a failed test of the binary running now was named.
    named: bool,
    /// One line per failed test, and per failed binary that named none.
    failures: Vec<String>,
}

impl Report {
    fn line(&mut self, line: &str) {
        let trimmed = line.trim();
        if let Some(rest) = trimmed.strip_prefix("Running ") {
            // `Running unittests src/lib.rs (target/release/deps/monitor_user-0123abcd)`
            let (what, path) = rest.rsplit_once(" (").unwrap_or((rest, ""));
            let stem = path.trim_end_matches(')').rsplit('/').next().unwrap_or("");
            let name = stem.rsplit_once('-').map_or(stem, |(n, _)| n);
            self.start(format!("{what} ({name})"));
        } else if let Some(krate) = trimmed.strip_prefix("Doc-tests ") {
            self.start(format!("doc tests of {krate}"));
        } else if let Some(test) = trimmed
            .strip_prefix("test ")
            .and_then(|t| t.strip_suffix(" ... FAILED"))
        {
            self.failures.push(format!("{}: {test}", self.binary));
            self.named = true;
        } else if let Some(target) = trimmed.strip_prefix("error: test failed, to rerun pass ") {
            // Printed after each failed binary; one that named no test crashed or died.
            if !self.named {
                self.failures.push(format!(
                    "{} ({}) failed without naming a test: it crashed or could not start",
                    self.binary,
                    target.trim_matches('`')
                ));
            }
        }
    }

    fn start(&mut self, binary: String) {
        self.binary = binary;
        self.named = false;
    }

    fn failures(&self) -> Vec<String> {
        self.failures.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(output: &str) -> Vec<String> {
        let mut r = Report::default();
        output.lines().for_each(|l| r.line(l));
        r.failures()
    }

    /// Output of the shape `cargo test --no-fail-fast` prints: a failed unit test in one
    /// binary, a binary that aborted in another, a passing one between them.
    #[test]
    fn every_failed_test_and_every_crashed_binary_is_named() {
        let output = "\
     Running unittests src/lib.rs (target/release/deps/monitor_user-5f0c1d2e3a4b5c6d)

running 3 tests
test btf::tests::vmlinux_anonymous_members ... ok
test btf::tests::truncations_and_bit_flips_never_panic ... FAILED
test sampler::tests::x ... FAILED

failures:
    btf::tests::truncations_and_bit_flips_never_panic

test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out
error: test failed, to rerun pass `-p monitor-user --lib`
     Running tests/api.rs (target/release/deps/api-0123456789abcdef)
test result: ok. 12 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out
     Running tests/fleet_real_agents.rs (target/release/deps/fleet_real_agents-89abcdef01234567)

running 2 tests
error: test failed, to rerun pass `-p monitor-collector --test fleet_real_agents`

Caused by:
  process didn't exit successfully: `...` (signal: 6, SIGABRT: process abort signal)
   Doc-tests monitor_wire
test monitor-wire/src/lib.rs - frame (line 10) ... FAILED
error: 3 targets failed:
    `-p monitor-user --lib`
    `-p monitor-collector --test fleet_real_agents`
    `-p monitor-wire --doc`
";
        assert_eq!(
            read(output),
            [
                "unittests src/lib.rs (monitor_user): btf::tests::truncations_and_bit_flips_never_panic",
                "unittests src/lib.rs (monitor_user): sampler::tests::x",
                "tests/fleet_real_agents.rs (fleet_real_agents) (-p monitor-collector --test \
                 fleet_real_agents) failed without naming a test: it crashed or could not start",
                "doc tests of monitor_wire: monitor-wire/src/lib.rs - frame (line 10)",
            ]
        );
    }

    /// Real cargo on a throwaway crate: a failed test early, an aborting test binary, and a
    /// later binary that passes; every failure is named and the later binary still ran.
    #[test]
    fn cargo_test_no_fail_fast_runs_on_and_names_each_failure() {
        let dir =
            std::env::temp_dir().join(format!("railscope-test-report-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let file = |path: &str, text: &str| {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        file(
            "Cargo.toml",
            "[package]\nname = \"early-failure\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\
             [workspace]\n",
        );
        file(
            "src/lib.rs",
            "#[test]\nfn fails_on_purpose() { assert_eq!(1, 2); }\n#[test]\nfn passes() {}\n",
        );
        file(
            "tests/aborts.rs",
            "#[test]\nfn aborts() { std::process::abort(); }\n",
        );
        file(
            "tests/later.rs",
            "#[test]\nfn later_passes() { std::fs::write(env!(\"CARGO_MANIFEST_DIR\").to_owned() + \"/later-ran\", \"\").unwrap(); }\n",
        );
        let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cmd.current_dir(&dir)
            .args(["test", "--no-fail-fast", "--target-dir"])
            .arg(dir.join("target"))
            .env_remove("RUSTFLAGS");
        let failures = run_cargo_test(cmd).unwrap();
        assert!(
            dir.join("later-ran").exists(),
            "the binary after the failures did not run"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            failures,
            [
                "unittests src/lib.rs (early_failure): fails_on_purpose",
                "tests/aborts.rs (aborts) (--test aborts) failed without naming a test: it \
                 crashed or could not start",
            ]
        );
    }

    #[test]
    fn a_passing_run_has_no_failure() {
        let output = "     Running tests/api.rs (target/release/deps/api-0123456789abcdef)\n\
                      test a ... ok\ntest result: ok. 1 passed; 0 failed\n";
        assert!(read(output).is_empty());
    }
}
