//! A writer of the cpio "newc" format, the one the kernel unpacks an initramfs from.
//!
//! Written here rather than through `find | cpio` so that the archive does not depend on who
//! builds it: every entry is owned by root, the order is sorted, the times are zero, and entries
//! a host could not create without privileges (`/dev/console`) can be added.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use anyhow::{Context, Result, bail};

const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFLNK: u32 = 0o120_000;
const S_IFCHR: u32 = 0o020_000;

/// Writes newc entries to `W`; [`NewcWriter::finish`] adds the trailer.
pub(crate) struct NewcWriter<W: Write> {
    out: W,
    next_ino: u32,
    offset: u64,
    /// Entries written, trailer excluded.
    pub entries: usize,
    /// Bytes of file and symlink contents written.
    pub content_bytes: u64,
}

impl<W: Write> NewcWriter<W> {
    pub(crate) fn new(out: W) -> Self {
        Self {
            out,
            next_ino: 1,
            offset: 0,
            entries: 0,
            content_bytes: 0,
        }
    }

    /// A directory; `name` is relative to the archive's root, without a leading `/`.
    pub(crate) fn dir(&mut self, name: &str, perm: u32) -> io::Result<()> {
        self.entry(name, S_IFDIR | (perm & 0o7777), 2, (0, 0), &[])
    }

    /// A regular file.
    pub(crate) fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        self.entry(name, S_IFREG | (perm & 0o7777), 1, (0, 0), data)
    }

    /// A symbolic link to `target`.
    pub(crate) fn symlink(&mut self, name: &str, target: &str) -> io::Result<()> {
        self.entry(name, S_IFLNK | 0o777, 1, (0, 0), target.as_bytes())
    }

    /// A character device node.
    pub(crate) fn char_dev(
        &mut self,
        name: &str,
        perm: u32,
        major: u32,
        minor: u32,
    ) -> io::Result<()> {
        self.entry(name, S_IFCHR | (perm & 0o7777), 1, (major, minor), &[])
    }

    /// Writes the trailer and returns the underlying writer.
    pub(crate) fn finish(mut self) -> io::Result<W> {
        self.header(0, 0, 1, 0, (0, 0), "TRAILER!!!")?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn entry(
        &mut self,
        name: &str,
        mode: u32,
        nlink: u32,
        rdev: (u32, u32),
        data: &[u8],
    ) -> io::Result<()> {
        if name.is_empty() || name.starts_with('/') || name.contains('\0') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad cpio entry name {name:?}"),
            ));
        }
        let size = u32::try_from(data.len()).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{name} is over 4 GiB"))
        })?;
        let ino = self.next_ino;
        self.next_ino += 1;
        self.header(ino, mode, nlink, size, rdev, name)?;
        self.write(data)?;
        self.pad()?;
        self.entries += 1;
        self.content_bytes += u64::from(size);
        Ok(())
    }

    fn header(
        &mut self,
        ino: u32,
        mode: u32,
        nlink: u32,
        size: u32,
        rdev: (u32, u32),
        name: &str,
    ) -> io::Result<()> {
        let namesize = name.len() + 1;
        let fields = [
            ino,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime
            size,
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            namesize as u32,
            0, // check
        ];
        let mut h = String::with_capacity(110);
        h.push_str("070701");
        for f in fields {
            h.push_str(&format!("{f:08x}"));
        }
        self.write(h.as_bytes())?;
        self.write(name.as_bytes())?;
        self.write(&[0])?;
        self.pad()
    }

    fn write(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        self.offset += b.len() as u64;
        Ok(())
    }

    /// Pads to the format's 4-byte alignment.
    fn pad(&mut self) -> io::Result<()> {
        let n = (4 - (self.offset % 4) as usize) % 4;
        self.write(&[0; 3][..n])
    }
}

/// Adds everything under `root` (not `root` itself), sorted, directories before their contents.
/// Owners and times are not kept; permission bits are.
pub(crate) fn add_tree<W: Write>(w: &mut NewcWriter<W>, root: &Path) -> Result<()> {
    add_dir_contents(w, root, "")
}

fn add_dir_contents<W: Write>(w: &mut NewcWriter<W>, dir: &Path, prefix: &str) -> Result<()> {
    let mut names = Vec::new();
    for e in fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        names.push(e?.file_name());
    }
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let Some(name) = name.to_str() else {
            bail!("{} is not a UTF-8 name", path.display());
        };
        let archived = format!("{prefix}{name}");
        let md = fs::symlink_metadata(&path)
            .with_context(|| format!("cannot stat {}", path.display()))?;
        let perm = md.permissions().mode();
        let ft = md.file_type();
        if ft.is_dir() {
            w.dir(&archived, perm)?;
            add_dir_contents(w, &path, &format!("{archived}/"))?;
        } else if ft.is_symlink() {
            let target = fs::read_link(&path)?;
            let Some(target) = target.to_str() else {
                bail!("{} points to a non-UTF-8 name", path.display());
            };
            w.symlink(&archived, target)?;
        } else if ft.is_file() {
            let data =
                fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
            w.file(&archived, perm, &data)?;
        } else {
            bail!(
                "{} is neither a file, a directory nor a symlink (mode {:o})",
                path.display(),
                md.mode()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(h: &[u8], i: usize) -> u32 {
        let s = std::str::from_utf8(&h[6 + 8 * i..6 + 8 * (i + 1)]).unwrap();
        u32::from_str_radix(s, 16).unwrap()
    }

    #[test]
    fn newc_layout() {
        let mut w = NewcWriter::new(Vec::new());
        w.dir("bin", 0o755).unwrap();
        w.file("bin/hello", 0o755, b"hi!\n!").unwrap();
        w.symlink("bin/sh", "hello").unwrap();
        let out = w.finish().unwrap();

        // First entry: "bin" directory; header 110 bytes + "bin\0" = 114, padded to 116.
        assert_eq!(&out[..6], b"070701");
        assert_eq!(field(&out, 1), S_IFDIR | 0o755);
        assert_eq!(field(&out, 2), 0, "uid");
        assert_eq!(field(&out, 11), 4, "namesize counts the NUL");
        assert_eq!(&out[110..114], b"bin\0");
        // Second entry at 116: 110 + "bin/hello\0" (10) = 120, data 5 bytes padded to 8.
        let f = &out[116..];
        assert_eq!(field(f, 1), S_IFREG | 0o755);
        assert_eq!(field(f, 6), 5, "filesize");
        assert_eq!(&f[110..120], b"bin/hello\0");
        assert_eq!(&f[120..125], b"hi!\n!");
        assert_eq!(&f[125..128], &[0, 0, 0]);
        let l = &f[128..];
        assert_eq!(field(l, 1), S_IFLNK | 0o777);
        assert_eq!(field(l, 6), 5, "symlink size is its target's length");
        assert!(out.len() % 4 == 0);
        let tail = String::from_utf8_lossy(&out[out.len() - 124..]).into_owned();
        assert!(tail.contains("TRAILER!!!"), "{tail:?}");
    }

    #[test]
    fn bad_names_are_refused() {
        let mut w = NewcWriter::new(Vec::new());
        assert!(w.file("/abs", 0o644, b"").is_err());
        assert!(w.file("", 0o644, b"").is_err());
    }

    /// Cross-checks with GNU cpio when the host has it.
    #[test]
    fn gnu_cpio_reads_a_packed_tree() {
        if std::process::Command::new("cpio")
            .arg("--version")
            .output()
            .is_err()
        {
            eprintln!("cpio not installed: skipped");
            return;
        }
        let dir = std::env::temp_dir().join(format!("railscope-cpio-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("a/b")).unwrap();
        fs::write(dir.join("a/b/f.txt"), b"content").unwrap();
        fs::write(dir.join("top"), b"x").unwrap();
        std::os::unix::fs::symlink("a/b/f.txt", dir.join("link")).unwrap();
        let mut w = NewcWriter::new(Vec::new());
        add_tree(&mut w, &dir).unwrap();
        w.char_dev("console", 0o600, 5, 1).unwrap();
        assert_eq!(w.entries, 6);
        let archive = w.finish().unwrap();
        let _ = fs::remove_dir_all(&dir);

        let mut child = std::process::Command::new("cpio")
            .args(["-t", "--quiet"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&archive).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let listed = String::from_utf8(out.stdout).unwrap();
        assert_eq!(listed, "a\na/b\na/b/f.txt\nlink\ntop\nconsole\n");
    }
}
