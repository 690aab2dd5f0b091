//! Telling systemd how a daemon is doing (`Type=notify`): ready once it does its job,
//! alive at half the watchdog period, stopping. Outside systemd (no `NOTIFY_SOCKET`) it
//! sends nothing.

use std::time::Duration;

use sd_notify::NotifyState;

/// A daemon's link to its service manager.
#[derive(Debug)]
pub struct ServiceManager {
    ready: bool,
    ping_every: Option<Duration>,
}

impl ServiceManager {
    /// From the environment systemd sets (`NOTIFY_SOCKET`, `WATCHDOG_USEC`, `WATCHDOG_PID`).
    pub fn from_env() -> Self {
        Self {
            ready: false,
            // Pinged twice per period, as sd_watchdog_enabled(3) advises.
            ping_every: sd_notify::watchdog_enabled().map(|period| period / 2),
        }
    }

    /// How often [`alive`](Self::alive) must be called, if the watchdog is on.
    pub fn ping_every(&self) -> Option<Duration> {
        self.ping_every
    }

    /// The daemon is doing its job (sent once); `status` shows in `systemctl status`.
    pub fn ready(&mut self, status: &str) {
        if !self.ready {
            self.ready = true;
            self.send(&[NotifyState::Ready, NotifyState::Status(status)]);
        }
    }

    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// The watchdog ping.
    pub fn alive(&self) {
        self.send(&[NotifyState::Watchdog]);
    }

    pub fn stopping(&self) {
        self.send(&[NotifyState::Stopping]);
    }

    fn send(&self, states: &[NotifyState<'_>]) {
        if let Err(e) = sd_notify::notify(states) {
            tracing::warn!("cannot notify systemd: {e}");
        }
    }
}
