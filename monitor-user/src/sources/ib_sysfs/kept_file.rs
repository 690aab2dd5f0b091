//! Sysfs files kept open and re-read with one `pread`, within a budget of descriptors shared
//! by the whole process.

use std::{
    fs, io,
    os::unix::fs::FileExt as _,
    path::PathBuf,
    sync::{
        OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
};

/// A file kept open and read again from offset 0: sysfs builds an attribute's text anew on
/// every read at offset 0, so one `pread` replaces `open`, `read` and `close`.
#[derive(Debug)]
pub(super) struct OpenFile {
    pub(super) path: PathBuf,
    pub(super) file: Option<fs::File>,
}

/// Files kept open by every source of the process, against [`max_kept_files`]: a node with
/// many ports has thousands of counter files, and an agent that ran out of descriptors could
/// open nothing else. Beyond the budget a file is opened, read and closed each time.
pub(super) static KEPT_FILES: AtomicUsize = AtomicUsize::new(0);

/// Half of the descriptor limit (the agent raises its soft limit to the hard one at start).
pub(super) fn max_kept_files() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    *MAX.get_or_init(|| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes a valid rlimit struct it is given.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return 256;
        }
        usize::try_from(limit.rlim_cur / 2).unwrap_or(usize::MAX)
    })
}

/// Counts one more kept file, if the budget allows it.
pub(super) fn reserve_kept_file() -> bool {
    let max = max_kept_files();
    KEPT_FILES
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < max).then_some(n + 1)
        })
        .is_ok()
}

impl OpenFile {
    pub(super) fn new(path: PathBuf) -> Self {
        Self { path, file: None }
    }

    /// The whole contents, (re)opening the file when needed. After an error the file is
    /// closed, so the next read opens the path again (a file replaced, a device re-registered).
    pub(super) fn read<'b>(&mut self, buf: &'b mut [u8]) -> io::Result<&'b [u8]> {
        let result = match &self.file {
            Some(file) => read_whole(file, buf),
            None => {
                let file = fs::File::open(&self.path)?;
                let result = read_whole(&file, buf);
                if result.is_ok() && reserve_kept_file() {
                    self.file = Some(file);
                }
                return result;
            }
        };
        if result.is_err() {
            self.close();
        }
        result
    }

    pub(super) fn close(&mut self) {
        if self.file.take().is_some() {
            KEPT_FILES.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        self.close();
    }
}

/// One read: a sysfs attribute gives its whole text (at most a page) at once; reading on to
/// see the end of the file would double the system calls.
pub(super) fn read_whole<'b>(file: &fs::File, buf: &'b mut [u8]) -> io::Result<&'b [u8]> {
    loop {
        match file.read_at(buf, 0) {
            Ok(n) => return Ok(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}
