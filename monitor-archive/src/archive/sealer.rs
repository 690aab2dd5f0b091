//! The sealer thread: seals the open segments the writer froze, oldest first, so that the
//! writer only appends. A frozen segment stays readable as it is (its `.wal` file and index)
//! until its sealed form is written (`<id>.seg.tmp`, fsynced, renamed, directory fsynced) and
//! swapped in under the state lock; then its `.wal` is deleted. A kill at any point leaves
//! files that opening the archive recovers (docs/archive-format.md, "Crash states").
//!
//! A failed seal (a full disk) is logged once, counted and retried every [`SEAL_RETRY`]; the
//! frozen segment stays readable meanwhile. The thread beats its [`Heartbeat`] per block
//! sealed and at least every [`BEAT_EVERY`] when idle, so the watchdog sees it hang but not
//! a long seal.

use std::{
    path::PathBuf,
    sync::{Arc, Condvar, Mutex, MutexGuard, RwLock},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::{
    ArchiveError, State, open::OpenSegment, seal_snapshot, sealed::BlockSettings, sync_dir,
    write_lock,
};
use crate::liveness::{BEAT_EVERY, Heartbeat};

/// After a failed seal, how long until the next try.
pub(crate) const SEAL_RETRY: Duration = Duration::from_secs(10);

/// The running sealer thread; dropping it lets it finish the seal under way (and any other
/// frozen segment, unless sealing fails) and joins it.
pub(crate) struct Sealer {
    link: Arc<Link>,
    thread: Option<JoinHandle<()>>,
}

/// What the archive's writer and the sealer thread share besides the archive's state.
struct Link {
    control: Mutex<Control>,
    changed: Condvar,
    heartbeat: Heartbeat,
}

#[derive(Default)]
struct Control {
    stop: bool,
    /// Test hook: the thread stops where it is, without beating, while set.
    stalled: bool,
    sealed: u64,
    failures: u64,
    /// The last seal's error, while the segment waits for a retry.
    failing: Option<String>,
    retry_at: Option<Instant>,
}

/// What the sealer has done since the archive was opened.
#[derive(Clone, Debug, Default)]
pub(crate) struct SealerStatus {
    pub sealed: u64,
    pub failures: u64,
}

/// While held, the sealer thread stands still without beating (a test hook: a slow seal, a
/// hung thread). Dropping it lets the thread go on.
pub struct SealerStall {
    link: Arc<Link>,
}

impl Drop for SealerStall {
    fn drop(&mut self) {
        self.link.lock().stalled = false;
        self.link.changed.notify_all();
    }
}

impl Link {
    fn lock(&self) -> MutexGuard<'_, Control> {
        crate::lock::lock(&self.control)
    }
}

impl Sealer {
    /// Starts the thread for the archive `shared` under `dir`.
    pub(super) fn spawn(
        shared: Arc<RwLock<State>>,
        dir: PathBuf,
        settings: BlockSettings,
    ) -> Result<Self, ArchiveError> {
        let link = Arc::new(Link {
            control: Mutex::new(Control::default()),
            changed: Condvar::new(),
            heartbeat: Heartbeat::new(),
        });
        let thread = std::thread::Builder::new()
            .name("archive-sealer".into())
            .spawn({
                let (link, dir) = (link.clone(), dir.clone());
                move || run(&shared, &link, &dir, settings)
            })
            .map_err(|e| ArchiveError::io(&dir, e))?;
        Ok(Self {
            link,
            thread: Some(thread),
        })
    }

    /// A segment was frozen: look now.
    pub(super) fn wake(&self) {
        self.link.changed.notify_all();
    }

    pub(super) fn status(&self) -> SealerStatus {
        let c = self.link.lock();
        SealerStatus {
            sealed: c.sealed,
            failures: c.failures,
        }
    }

    pub(super) fn heartbeat(&self) -> Heartbeat {
        self.link.heartbeat.clone()
    }

    pub(super) fn stall(&self) -> SealerStall {
        self.link.lock().stalled = true;
        SealerStall {
            link: self.link.clone(),
        }
    }

    /// Waits until no frozen segment waits, trying a failed one again at once; returns the
    /// error of a seal that fails meanwhile.
    pub(super) fn wait_idle(&self, shared: &RwLock<State>) -> Result<(), String> {
        let mut c = self.link.lock();
        c.retry_at = None;
        let failures = c.failures;
        self.link.changed.notify_all();
        loop {
            let waiting = !shared
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .frozen
                .is_empty();
            if !waiting {
                return Ok(());
            }
            if c.failures > failures {
                return Err(c.failing.clone().unwrap_or_default());
            }
            if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                return Err("the sealer thread stopped".into());
            }
            c = self
                .link
                .changed
                .wait_timeout(c, BEAT_EVERY)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Drop for Sealer {
    fn drop(&mut self) {
        self.link.lock().stop = true;
        self.link.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run(shared: &RwLock<State>, link: &Link, dir: &std::path::Path, settings: BlockSettings) {
    loop {
        {
            let mut c = link.lock();
            while c.stalled && !c.stop {
                c = link.changed.wait(c).unwrap_or_else(|p| p.into_inner());
            }
        }
        link.heartbeat.beat();
        let next = shared
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .frozen
            .first()
            .cloned();
        {
            let c = link.lock();
            let retry_later = c.retry_at.is_some_and(|t| Instant::now() < t);
            // Stopping: a frozen segment is still sealed, unless sealing fails (opening the
            // archive next time seals it) or the thread is stalled.
            if c.stop && (next.is_none() || c.failing.is_some() || c.stalled) {
                return;
            }
            if next.is_none() || retry_later || c.stalled {
                drop(
                    link.changed
                        .wait_timeout(c, BEAT_EVERY)
                        .unwrap_or_else(|p| p.into_inner()),
                );
                continue;
            }
        }
        let Some(seg) = next else { continue };
        let result = seal_frozen(shared, dir, &seg, settings, link);
        drop(seg);
        let mut c = link.lock();
        match result {
            Ok(()) => {
                c.retry_at = None;
                if c.failing.take().is_some() {
                    tracing::info!("archive {}: sealing works again", dir.display());
                }
            }
            Err(e) => {
                c.failures += 1;
                c.retry_at = Some(Instant::now() + SEAL_RETRY);
                if c.failing.is_none() {
                    tracing::error!(
                        "{e}: sealing a full open segment failed; it stays readable as it is and the seal is retried every {} s",
                        SEAL_RETRY.as_secs()
                    );
                }
                c.failing = Some(e.to_string());
            }
        }
        link.changed.notify_all();
    }
}

/// Writes the sealed form of the frozen segment `seg`, swaps it in, deletes the `.wal` and
/// counts the seal (the last three at once for whoever waits for the sealer).
fn seal_frozen(
    shared: &RwLock<State>,
    dir: &std::path::Path,
    seg: &OpenSegment,
    settings: BlockSettings,
    link: &Link,
) -> Result<(), ArchiveError> {
    seg.file
        .sync_data()
        .map_err(|e| ArchiveError::io(&seg.path, e))?;
    let sealed = seal_snapshot(dir, seg, settings, &|| link.heartbeat.beat())?;
    sync_dir(dir)?;
    let mut c = link.lock();
    {
        let mut st = write_lock(shared);
        st.frozen.retain(|f| f.id != seg.id);
        let at = st.sealed.partition_point(|s| s.id < sealed.id);
        st.sealed.insert(at, Arc::new(sealed));
    }
    // Sealed either way: a `.wal` left beside its `.seg` is deleted when the archive opens.
    let removed = std::fs::remove_file(&seg.path).map_err(|e| ArchiveError::io(&seg.path, e));
    c.sealed += 1;
    drop(c);
    match removed {
        Err(e) => {
            tracing::warn!("{e}: the sealed segment's open form is deleted at the next start")
        }
        Ok(()) => {
            if let Err(e) = sync_dir(dir) {
                tracing::warn!("{e}");
            }
        }
    }
    Ok(())
}
