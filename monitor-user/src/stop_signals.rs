//! What stops a long-running command (the agent, capture, listen): SIGINT (Ctrl-C) or
//! SIGTERM (systemd's stop). Handlers are installed rather than left to the default action,
//! so the command always ends through its own shutdown path (flushing what it holds), also
//! when it inherited SIGINT ignored, as a non-interactive shell's background jobs do.

use std::io;

use tokio::signal::unix::{Signal, SignalKind, signal};

pub(crate) struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
}

impl StopSignals {
    /// Installs the handlers: call it before the work a stop request must be able to end.
    pub(crate) fn install() -> io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// Waits for SIGINT or SIGTERM. Cancel-safe: usable as a branch of a `select!` loop.
    pub(crate) async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}
