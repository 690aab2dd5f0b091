//! The spool on disk, so that an agent restart loses no frame the collectors have not
//! acknowledged (docs/agent.md, "Delivery"). An append-only log in the spool directory
//! (`spool-dir`): a header record (the node, its session, the next sequence number and the
//! next free series id), then one record per frame sent, each written before the frame goes
//! out.
//!
//! Each record is its length (u32 LE), the CRC32 of its body (u32 LE), then the body, so a
//! crash leaves the file readable: a record cut short or garbled ends what is read, the
//! frames before it are kept, and what follows is cut off with one warning. A batch of
//! records is written and synced before its frames leave ([`SpoolFile::sync`]: one
//! `fdatasync` per batch, a flush every 10 s or an event), so neither a killed agent nor a
//! power loss loses a frame that was sent, and a resumed session never reuses a sequence
//! number or a series id that went out. Frames that left the spool are
//! dropped by rewriting the file (a temporary file, synced, renamed over it) once they are
//! most of it.
//!
//! A file written for another node name, or whose frames do not verify with this agent's
//! key (the settings changed), is set aside as `spool.old`: its frames could not be taken.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write as _},
    os::{
        fd::AsRawFd as _,
        unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    },
    path::{Path, PathBuf},
    time::Duration,
};

use monitor_wire::{Key, open_stored, peek_sequence};

/// The log's name in the spool directory.
pub(crate) const FILE_NAME: &str = "spool";
/// Held locked while an agent uses the directory: a second agent there keeps its frames in
/// memory only.
const LOCK_NAME: &str = "lock";
/// The file is rewritten once the records of frames that left the spool are at least this
/// many bytes, and at least as many as the live ones (so it stays below twice the spool).
const REWRITE_AFTER: u64 = 16 << 10;

const HEADER: u8 = 1;
const FRAME: u8 = 2;
const VERSION: u8 = 1;
/// Length and CRC before each record's body.
const RECORD_HEAD: usize = 8;
/// A frame record's body before the frame: kind, next series id, when it was spooled.
const FRAME_HEAD: usize = 1 + 4 + 8;
/// Largest body read back (a frame is at most a UDP datagram).
const MAX_BODY: usize = 1 << 17;

/// Where an encoder's session stands: what a resumed encoder starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionState {
    pub session: u32,
    /// The sequence number of the next frame.
    pub next_seq: u64,
    /// Above every series id the session used.
    pub next_series_id: u32,
}

/// A frame read back from the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpooledFrame {
    pub bytes: Vec<u8>,
    /// When it was first spooled (wall clock): its age counts from then.
    pub spooled_unix_ns: u64,
}

/// What a previous run left in the file.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The session to resume, when frames of it are still to deliver.
    pub resume: Option<SessionState>,
    pub frames: Vec<SpooledFrame>,
    /// Frames dropped for being older than the spool's age limit.
    pub too_old: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SpoolFileError {
    #[error("spool directory {}: {source}", path.display())]
    Dir { path: PathBuf, source: io::Error },
    #[error("spool directory {} is in use by another agent", path.display())]
    InUse { path: PathBuf },
    #[error("spool file {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

/// The open log, locked for this agent.
pub struct SpoolFile {
    dir: PathBuf,
    path: PathBuf,
    node: String,
    /// Open for appending once the first [`SpoolFile::rewrite`] made the file.
    file: Option<File>,
    _lock: File,
    state: SessionState,
    /// Bytes in the file, and of those, records of frames that left the spool.
    bytes: u64,
    dead: u64,
    unsynced: bool,
}

/// Bytes a frame of `len` bytes takes in the file.
pub(crate) fn record_len(len: usize) -> u64 {
    (RECORD_HEAD + FRAME_HEAD + len) as u64
}

impl SpoolFile {
    /// Locks `dir` (made if missing) and reads what a previous run of `node` left there:
    /// frames sealed with `key` no older than `max_age` at `now_unix_ns`. Call
    /// [`SpoolFile::rewrite`] next, with the session the agent goes on with.
    pub fn open(
        dir: &Path,
        node: &str,
        key: &Key,
        max_age: Duration,
        now_unix_ns: u64,
    ) -> Result<(Self, Loaded), SpoolFileError> {
        let dir_error = |source| SpoolFileError::Dir {
            path: dir.to_owned(),
            source,
        };
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(dir_error)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(dir.join(LOCK_NAME))
            .map_err(dir_error)?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            return Err(match e.kind() {
                io::ErrorKind::WouldBlock => SpoolFileError::InUse {
                    path: dir.to_owned(),
                },
                _ => dir_error(e),
            });
        }
        let path = dir.join(FILE_NAME);
        let spool = Self {
            dir: dir.to_owned(),
            path: path.clone(),
            node: node.to_owned(),
            file: None,
            _lock: lock,
            state: SessionState::default(),
            bytes: 0,
            dead: 0,
            unsynced: false,
        };
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((spool, Loaded::default())),
            Err(source) => return Err(SpoolFileError::Io { path, source }),
        };
        let (records, valid) = read_records(&bytes);
        if valid < bytes.len() {
            tracing::warn!(
                "spool file {}: {} bytes cut off after byte {valid} (a record cut short or \
                 garbled); the {} records before are kept",
                path.display(),
                bytes.len() - valid,
                records.len()
            );
        }
        let loaded = match take_frames(&records, node, key, max_age, now_unix_ns) {
            Ok(loaded) => loaded,
            Err(why) => {
                let old = dir.join(format!("{FILE_NAME}.old"));
                tracing::warn!(
                    "spool file {}: {why}: not sent, set aside as {}",
                    path.display(),
                    old.display()
                );
                fs::rename(&path, &old).map_err(|source| SpoolFileError::Io {
                    path: path.clone(),
                    source,
                })?;
                Loaded::default()
            }
        };
        Ok((spool, loaded))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The session written in the header at the next rewrite.
    pub fn set_state(&mut self, state: SessionState) {
        self.state = state;
    }

    /// Appends a frame about to be sent. Synced by [`SpoolFile::sync`], before it is sent.
    pub fn append(&mut self, frame: &[u8], spooled_unix_ns: u64) -> io::Result<()> {
        let file = self.file.as_mut().ok_or(io::ErrorKind::NotConnected)?;
        let record = frame_record(frame, self.state.next_series_id, spooled_unix_ns);
        file.write_all(&record)?;
        self.bytes += record.len() as u64;
        self.unsynced = true;
        Ok(())
    }

    /// Frames whose records take `bytes` ([`record_len`]) left the spool: dead weight until
    /// the rewrite.
    pub fn released(&mut self, bytes: u64) {
        self.dead += bytes;
    }

    /// Whether dead records are most of the file.
    pub fn wants_rewrite(&self) -> bool {
        self.dead >= REWRITE_AFTER && 2 * self.dead >= self.bytes
    }

    /// Syncs what was appended (nothing to do if nothing was).
    pub fn sync(&mut self) -> io::Result<()> {
        if !self.unsynced {
            return Ok(());
        }
        if let Some(file) = &self.file {
            file.sync_data()?;
        }
        self.unsynced = false;
        Ok(())
    }

    /// Replaces the file with the header and `live` frames (oldest first): written to a
    /// temporary file, synced, renamed over the log, the directory synced.
    pub fn rewrite<'a>(&mut self, live: impl Iterator<Item = (&'a [u8], u64)>) -> io::Result<()> {
        let tmp = self.dir.join(format!("{FILE_NAME}.tmp"));
        let mut out = Vec::new();
        out.extend(header_record(&self.node, &self.state));
        for (frame, unix_ns) in live {
            out.extend(frame_record(frame, self.state.next_series_id, unix_ns));
        }
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(&out)?;
        file.sync_all()?;
        fs::rename(&tmp, &self.path)?;
        File::open(&self.dir)?.sync_all()?;
        self.file = Some(OpenOptions::new().append(true).open(&self.path)?);
        self.bytes = out.len() as u64;
        self.dead = 0;
        self.unsynced = false;
        Ok(())
    }
}

/// The records at the start of `bytes` that are whole and intact, and where they end.
fn read_records(bytes: &[u8]) -> (Vec<&[u8]>, usize) {
    let mut records = Vec::new();
    let mut at = 0;
    while let Some(head) = bytes.get(at..at + RECORD_HEAD) {
        let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(head[4..].try_into().expect("4 bytes"));
        let body = match bytes.get(at + RECORD_HEAD..at + RECORD_HEAD + len) {
            Some(body) if (1..=MAX_BODY).contains(&len) && crc32fast::hash(body) == crc => body,
            _ => break,
        };
        records.push(body);
        at += RECORD_HEAD + len;
    }
    (records, at)
}

/// The frames of `records` still to deliver, or why none of them can be taken.
fn take_frames(
    records: &[&[u8]],
    node: &str,
    key: &Key,
    max_age: Duration,
    now_unix_ns: u64,
) -> Result<Loaded, String> {
    let Some((first, rest)) = records.split_first() else {
        return Ok(Loaded::default());
    };
    let (header_node, mut state) = parse_header(first).ok_or("no header: not a spool file")?;
    if header_node != node {
        return Err(format!("written for node {header_node:?}, not {node:?}"));
    }
    let max_age = u64::try_from(max_age.as_nanos()).unwrap_or(u64::MAX);
    let mut loaded = Loaded::default();
    for record in rest {
        let Some((series_end, spooled_unix_ns, bytes)) = parse_frame(record) else {
            return Err("a record that is not a frame".into());
        };
        let stored = open_stored(bytes, key)
            .map_err(|e| format!("a frame that does not verify with this agent's key ({e})"))?;
        if stored.node != node || stored.session != state.session {
            return Err(format!(
                "a frame of node {:?} session {:08x} in the file of session {:08x}",
                stored.node, stored.session, state.session
            ));
        }
        state.next_seq = state.next_seq.max(stored.seq + 1);
        state.next_series_id = state.next_series_id.max(series_end);
        if now_unix_ns.saturating_sub(spooled_unix_ns) >= max_age {
            loaded.too_old += 1;
            continue;
        }
        loaded.frames.push(SpooledFrame {
            bytes: bytes.to_vec(),
            spooled_unix_ns,
        });
    }
    if !loaded.frames.is_empty() {
        loaded.resume = Some(state);
    }
    Ok(loaded)
}

fn record(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEAD + body.len());
    out.extend((body.len() as u32).to_le_bytes());
    out.extend(crc32fast::hash(body).to_le_bytes());
    out.extend(body);
    out
}

fn header_record(node: &str, state: &SessionState) -> Vec<u8> {
    let mut body = vec![HEADER, VERSION];
    body.extend(state.session.to_le_bytes());
    body.extend(state.next_seq.to_le_bytes());
    body.extend(state.next_series_id.to_le_bytes());
    body.extend(node.as_bytes());
    record(&body)
}

fn parse_header(body: &[u8]) -> Option<(String, SessionState)> {
    let [HEADER, VERSION, rest @ ..] = body else {
        return None;
    };
    let session = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?);
    let next_seq = u64::from_le_bytes(rest.get(4..12)?.try_into().ok()?);
    let next_series_id = u32::from_le_bytes(rest.get(12..16)?.try_into().ok()?);
    let node = std::str::from_utf8(rest.get(16..)?).ok()?.to_owned();
    Some((
        node,
        SessionState {
            session,
            next_seq,
            next_series_id,
        },
    ))
}

fn frame_record(frame: &[u8], series_end: u32, unix_ns: u64) -> Vec<u8> {
    let mut body = Vec::with_capacity(FRAME_HEAD + frame.len());
    body.push(FRAME);
    body.extend(series_end.to_le_bytes());
    body.extend(unix_ns.to_le_bytes());
    body.extend(frame);
    record(&body)
}

fn parse_frame(body: &[u8]) -> Option<(u32, u64, &[u8])> {
    let [FRAME, rest @ ..] = body else {
        return None;
    };
    let series_end = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?);
    let unix_ns = u64::from_le_bytes(rest.get(4..12)?.try_into().ok()?);
    let frame = rest.get(12..)?;
    peek_sequence(frame)?;
    Some((series_end, unix_ns, frame))
}

#[cfg(test)]
mod tests {
    use monitor_wire::{Frame, encode_frame};

    use super::*;

    const MINUTE: u64 = 60_000_000_000;
    const NOW: u64 = 1_700_000_000_000_000_000;

    fn key() -> Key {
        Key::from_bytes([1; 32])
    }

    fn frame(node: &str, seq: u64, key: &Key) -> Vec<u8> {
        let frame = Frame {
            node: node.into(),
            session: 7,
            seq,
            send_unix_ns: NOW,
            time_quantum_ns: 1_000_000,
            schema: Vec::new(),
            samples: Vec::new(),
            events: Vec::new(),
        };
        encode_frame(&frame, key).unwrap()
    }

    /// An empty directory of its own.
    fn dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "railscope-spool-file-{name}-{}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn open(dir: &Path, node: &str) -> (SpoolFile, Loaded) {
        SpoolFile::open(dir, node, &key(), Duration::from_secs(3600), NOW).unwrap()
    }

    /// A file of session 7 holding frames 0..n of node `n1`, spooled a minute ago, written by
    /// a run that had sent frames up to 20 and named series up to 30; the run ends without
    /// dropping them (killed).
    fn written(dir: &Path, n: u64) -> Vec<Vec<u8>> {
        let (mut file, loaded) = open(dir, "n1");
        assert!(loaded.resume.is_none());
        file.set_state(SessionState {
            session: 7,
            next_seq: 0,
            next_series_id: 0,
        });
        file.rewrite(std::iter::empty()).unwrap();
        file.set_state(SessionState {
            session: 7,
            next_seq: 20,
            next_series_id: 30,
        });
        let frames: Vec<_> = (0..n).map(|seq| frame("n1", seq, &key())).collect();
        for f in &frames {
            file.append(f, NOW - MINUTE).unwrap();
        }
        frames
    }

    fn seqs(loaded: &Loaded) -> Vec<u64> {
        (loaded.frames.iter())
            .map(|f| peek_sequence(&f.bytes).unwrap().1)
            .collect()
    }

    #[test]
    fn a_restart_takes_back_every_frame_and_resumes_above_them() {
        let dir = dir("restart");
        let frames = written(&dir, 3);
        let (mut file, loaded) = open(&dir, "n1");
        let resume = loaded.resume.unwrap();
        // The appended records carry the series ids used; the sequence numbers come from
        // the frames themselves.
        assert_eq!(
            resume,
            SessionState {
                session: 7,
                next_seq: 3,
                next_series_id: 30
            }
        );
        assert_eq!(seqs(&loaded), [0, 1, 2]);
        assert_eq!(loaded.frames[2].bytes, frames[2]);
        assert_eq!(loaded.frames[0].spooled_unix_ns, NOW - MINUTE);
        // A second agent on the same directory is refused while this one holds it.
        let second = SpoolFile::open(&dir, "n1", &key(), Duration::from_secs(3600), NOW);
        assert!(matches!(second, Err(SpoolFileError::InUse { .. })));
        // Rewritten with what is still to deliver: the last frame only.
        file.set_state(resume);
        let live = loaded.frames[2..].iter();
        file.rewrite(live.map(|f| (f.bytes.as_slice(), f.spooled_unix_ns)))
            .unwrap();
        drop(file);
        let (_, loaded) = open(&dir, "n1");
        assert_eq!(seqs(&loaded), [2]);
        assert_eq!(loaded.resume.unwrap().next_seq, 3);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_torn_tail_is_cut_off_and_the_frames_before_it_kept() {
        let dir = dir("torn");
        written(&dir, 3);
        let path = dir.join(FILE_NAME);
        let bytes = fs::read(&path).unwrap();
        // The last record half written, as a crash during its write leaves it.
        fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
        let (_, loaded) = open(&dir, "n1");
        assert_eq!(seqs(&loaded), [0, 1]);
        assert_eq!(loaded.resume.unwrap().next_seq, 2);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_corrupt_record_ends_what_is_read() {
        let dir = dir("corrupt");
        let frames = written(&dir, 3);
        let path = dir.join(FILE_NAME);
        let mut bytes = fs::read(&path).unwrap();
        // A bit flipped in the middle of the second frame's record: its CRC fails, and
        // nothing after it can be trusted to start where its length says.
        let second = bytes.len() - 2 * record_len(frames[0].len()) as usize;
        bytes[second + 20] ^= 0x10;
        fs::write(&path, &bytes).unwrap();
        let (_, loaded) = open(&dir, "n1");
        assert_eq!(seqs(&loaded), [0]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_of_another_node_or_key_is_set_aside() {
        let dir = dir("other");
        written(&dir, 2);
        let (_, loaded) = open(&dir, "n2");
        assert!(loaded.resume.is_none() && loaded.frames.is_empty());
        assert!(dir.join("spool.old").exists() && !dir.join(FILE_NAME).exists());

        written(&dir, 2);
        let other_key = Key::from_bytes([2; 32]);
        let (_, loaded) =
            SpoolFile::open(&dir, "n1", &other_key, Duration::from_secs(3600), NOW).unwrap();
        assert!(loaded.resume.is_none() && loaded.frames.is_empty());
        assert!(!dir.join(FILE_NAME).exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn frames_past_the_age_limit_are_dropped_and_counted() {
        let dir = dir("old");
        written(&dir, 2);
        let (_, loaded) =
            SpoolFile::open(&dir, "n1", &key(), Duration::from_secs(30), NOW).unwrap();
        assert_eq!((loaded.frames.len(), loaded.too_old), (0, 2));
        assert!(
            loaded.resume.is_none(),
            "nothing to deliver: a fresh session"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_directory_that_cannot_be_made_is_named() {
        let e = SpoolFile::open(
            Path::new("/proc/railscope-spool"),
            "n1",
            &key(),
            Duration::from_secs(1),
            NOW,
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.starts_with("spool directory /proc/railscope-spool: "),
            "{e}"
        );
    }
}
