//! How far an endpoint has got: which archive batches its shards have finished, and the
//! cursor file that survives a restart.
//!
//! Batches are read in archive order and split across shards, which finish at their own
//! pace. Each batch carries a [`Ticket`] counting its unfinished pieces; [`Progress`] keeps
//! the batches in order and commits the cursor after the longest finished prefix, so the
//! cursor on disk never passes a sample the endpoint has not acknowledged (or refused for
//! good). After a restart, what the shards had sent past it is sent again: receivers take an
//! identical sample twice without harm (docs/deployment.md).

use std::{
    collections::VecDeque,
    fs,
    io::Write,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use super::{RemoteWriteError, source::Cursor};

/// The unfinished pieces of one batch.
#[derive(Debug)]
pub(crate) struct Ticket(AtomicUsize);

impl Ticket {
    pub(crate) fn new(pieces: usize) -> Arc<Self> {
        Arc::new(Self(AtomicUsize::new(pieces)))
    }

    /// One piece is acknowledged (or refused for good).
    pub(crate) fn finish_one(&self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }

    fn is_finished(&self) -> bool {
        self.0.load(Ordering::Acquire) == 0
    }
}

/// The batches dispatched and not yet committed, in archive order, and the cursor file.
pub(crate) struct Progress {
    file: PathBuf,
    in_flight: VecDeque<(Arc<Ticket>, Cursor)>,
    committed: Cursor,
    persisted: Cursor,
    persisted_at: Instant,
    sync_interval: Duration,
}

impl Progress {
    /// Loads the endpoint's cursor from `file` (none yet: [`Cursor::START`]).
    pub(crate) fn load(file: PathBuf, sync_interval: Duration) -> Result<Self, RemoteWriteError> {
        let committed = read_cursor(&file)?.unwrap_or(Cursor::START);
        Ok(Self {
            file,
            in_flight: VecDeque::new(),
            committed,
            persisted: committed,
            persisted_at: Instant::now(),
            sync_interval,
        })
    }

    pub(crate) fn committed(&self) -> Cursor {
        self.committed
    }

    pub(crate) fn batches_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// A batch ending at `next` was handed to the shards.
    pub(crate) fn dispatched(&mut self, ticket: Arc<Ticket>, next: Cursor) {
        self.in_flight.push_back((ticket, next));
    }

    /// Commits the finished prefix and writes the cursor file if it moved and the last write
    /// is `sync_interval` old (or `force`).
    pub(crate) fn commit(&mut self, force: bool) -> Result<Cursor, RemoteWriteError> {
        while let Some((ticket, next)) = self.in_flight.front() {
            if !ticket.is_finished() {
                break;
            }
            self.committed = *next;
            self.in_flight.pop_front();
        }
        if self.committed != self.persisted
            && (force || self.persisted_at.elapsed() >= self.sync_interval)
        {
            write_cursor(&self.file, self.committed)?;
            self.persisted = self.committed;
            self.persisted_at = Instant::now();
        }
        Ok(self.committed)
    }
}

/// The cursor file: one line, `segment offset`.
fn read_cursor(file: &Path) -> Result<Option<Cursor>, RemoteWriteError> {
    let text = match fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(RemoteWriteError::CursorFile {
                path: file.to_owned(),
                source,
            });
        }
    };
    let mut parts = text.split_whitespace().map(str::parse::<u64>);
    match (parts.next(), parts.next(), parts.next()) {
        (Some(Ok(segment)), Some(Ok(offset)), None) => Ok(Some(Cursor { segment, offset })),
        _ => Err(RemoteWriteError::BadCursorFile {
            path: file.to_owned(),
            text: text.chars().take(80).collect(),
        }),
    }
}

/// Written to a temporary file, synced and renamed over the old one: a crash leaves the old
/// cursor or the new one, never a torn one.
fn write_cursor(file: &Path, cursor: Cursor) -> Result<(), RemoteWriteError> {
    let err = |source| RemoteWriteError::CursorFile {
        path: file.to_owned(),
        source,
    };
    let tmp = file.with_extension("cursor.tmp");
    let mut f = fs::File::create(&tmp).map_err(err)?;
    writeln!(f, "{} {}", cursor.segment, cursor.offset).map_err(err)?;
    f.sync_all().map_err(err)?;
    fs::rename(&tmp, file).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset: u64) -> Cursor {
        Cursor { segment: 1, offset }
    }

    #[test]
    fn cursor_moves_only_past_a_finished_prefix_and_survives_reload() {
        let dir = std::env::temp_dir().join(format!("rs-rw-progress-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("ep.cursor");
        let _ = fs::remove_file(&file);
        let mut p = Progress::load(file.clone(), Duration::ZERO).unwrap();
        assert_eq!(p.committed(), Cursor::START);
        let (a, b, c) = (Ticket::new(2), Ticket::new(1), Ticket::new(0));
        p.dispatched(a.clone(), at(10));
        p.dispatched(b.clone(), at(20));
        p.dispatched(c, at(30));
        b.finish_one();
        a.finish_one();
        // The first batch has one piece left: nothing is committed, though later ones are done.
        assert_eq!(p.commit(false).unwrap(), Cursor::START);
        assert!(!file.exists());
        a.finish_one();
        assert_eq!(p.commit(false).unwrap(), at(30));
        assert_eq!(p.batches_in_flight(), 0);
        let reloaded = Progress::load(file.clone(), Duration::ZERO).unwrap();
        assert_eq!(reloaded.committed(), at(30));

        fs::write(&file, "12 x\n").unwrap();
        let err = Progress::load(file.clone(), Duration::ZERO).err().unwrap();
        assert!(err.to_string().contains("ep.cursor"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
