//! A binary under test run as a child process whose output the test reads when it stops it.

use std::{
    ffi::OsStr,
    io::Read,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

/// How long [`Running::signal`] waits for the child to exit: a collector writing its archive
/// out on a loaded machine takes seconds, a child that ignores the signal forever.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(120);

/// A child whose stdout and stderr are drained by threads as it runs (a full pipe would
/// otherwise block it). Killed on drop if still running, its stderr then printed when the
/// test is failing, so a failed assertion neither leaves it running nor hides its log.
pub struct Running {
    child: Child,
    out: Option<thread::JoinHandle<String>>,
    err: Option<thread::JoinHandle<String>>,
    /// What the child has printed on stdout so far.
    stdout_so_far: Arc<Mutex<Vec<u8>>>,
}

fn drain(
    mut pipe: impl Read + Send + 'static,
    so_far: Arc<Mutex<Vec<u8>>>,
) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        while let Ok(n @ 1..) = pipe.read(&mut chunk) {
            so_far.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
        String::from_utf8_lossy(&so_far.lock().unwrap()).into_owned()
    })
}

impl Running {
    /// `program args...`, with `NO_COLOR=1` so its log is plain text.
    pub fn spawn<I, S>(program: impl AsRef<OsStr>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Self::command(program);
        command.args(args);
        Self::spawn_command(command)
    }

    /// A command for `program` as [`Running::spawn`] starts it (`NO_COLOR=1`), for a test
    /// that adds to it before [`Running::spawn_command`].
    pub fn command(program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new(program);
        command.env("NO_COLOR", "1");
        command
    }

    /// `command` as given, with its stdout and stderr piped.
    pub fn spawn_command(mut command: Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {:?}: {e}", command.get_program()));
        let stdout_so_far = Arc::default();
        let out = Some(drain(
            child.stdout.take().unwrap(),
            Arc::clone(&stdout_so_far),
        ));
        let err = Some(drain(child.stderr.take().unwrap(), Arc::default()));
        Self {
            child,
            out,
            err,
            stdout_so_far,
        }
    }

    /// Waits until the child has printed at least `lines` lines on stdout (true), or
    /// `timeout` has passed (false): a listener decodes at its own pace, slower on a loaded
    /// machine, so a test waits for what it expects rather than a fixed time.
    pub fn wait_for_stdout_lines(&self, lines: usize, timeout: Duration) -> bool {
        let start = Instant::now();
        loop {
            let printed = self
                .stdout_so_far
                .lock()
                .unwrap()
                .iter()
                .filter(|&&b| b == b'\n')
                .count();
            if printed >= lines {
                return true;
            }
            if start.elapsed() > timeout {
                return false;
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether the child has not exited yet.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Sends `signal` and waits: (exited successfully, stdout, stderr). A child still running
    /// [`STOP_TIMEOUT`] later is killed and the test fails naming it, rather than hanging.
    pub fn signal(mut self, signal: libc::c_int) -> (bool, String, String) {
        // SAFETY: signalling our own child, which has not been waited for.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                start.elapsed() < STOP_TIMEOUT,
                "child {} still running {STOP_TIMEOUT:?} after signal {signal}",
                self.child.id()
            );
            thread::sleep(Duration::from_millis(20));
        };
        let out = self.out.take().unwrap().join().unwrap();
        let err = self.err.take().unwrap().join().unwrap();
        (status.success(), out, err)
    }

    /// [`Running::signal`] with SIGINT, as Ctrl-C stops it.
    pub fn interrupt(self) -> (bool, String, String) {
        self.signal(libc::SIGINT)
    }
}

/// Runs `program args...` to completion (no backtrace asked for): it must succeed, else its
/// stderr is the failure; its stdout as JSON.
pub fn json_output(
    program: impl AsRef<OsStr>,
    args: impl IntoIterator<Item = impl AsRef<OsStr>>,
) -> serde_json::Value {
    let mut command = Command::new(program);
    command.args(args).env_remove("RUST_BACKTRACE");
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{command:?} printed no JSON: {e}"))
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.out.is_none() {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let err = self.err.take().and_then(|e| e.join().ok());
        if thread::panicking() {
            eprintln!(
                "stderr of {} (killed):\n{}",
                self.child.id(),
                err.unwrap_or_default()
            );
        }
    }
}
