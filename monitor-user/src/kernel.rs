//! Facts about the running kernel that decide whether a probe can attach: loaded modules,
//! kprobe support, BTF. Read from sysfs each time they are asked for, because modules come and
//! go while the agent runs.

use std::path::{Path, PathBuf};

/// Where the kernel exposes what we look at. Tests may point it elsewhere.
#[derive(Clone, Debug)]
pub struct Kernel {
    sys: PathBuf,
}

impl Default for Kernel {
    fn default() -> Self {
        Self::at("/sys")
    }
}

impl Kernel {
    pub fn at(sys: impl Into<PathBuf>) -> Self {
        Self { sys: sys.into() }
    }

    /// A module is usable when sysfs lists it, loaded or built in.
    pub fn module_present(&self, module: &str) -> bool {
        self.sys.join("module").join(module).is_dir()
    }

    /// Kprobes can be created through the `kprobe` perf PMU (what aya uses) or, on older
    /// kernels, through tracefs `kprobe_events`.
    pub fn has_kprobes(&self) -> bool {
        self.sys.join("bus/event_source/devices/kprobe").exists()
            || self.sys.join("kernel/tracing/kprobe_events").exists()
            || self.sys.join("kernel/debug/tracing/kprobe_events").exists()
    }

    /// Which load of a module is present: a module unloaded and loaded again (between two
    /// looks, even) gets a new `/sys/module/<module>` directory and so a new identity.
    pub fn module_identity(&self, module: &str) -> Option<FileIdentity> {
        FileIdentity::of(&self.sys.join("module").join(module))
    }

    /// The split BTF of a module, if the kernel exposes one (CONFIG_DEBUG_INFO_BTF_MODULES).
    pub fn module_btf(&self, module: &str) -> Option<PathBuf> {
        let path = self.sys.join("kernel/btf").join(module);
        path.is_file().then_some(path)
    }

    pub fn vmlinux_btf(&self) -> PathBuf {
        self.sys.join("kernel/btf/vmlinux")
    }

    pub fn sys_root(&self) -> &Path {
        &self.sys
    }

    /// `/proc/kallsyms`, next to the sysfs root (`/sys` -> `/proc/kallsyms`).
    pub fn kallsyms(&self) -> PathBuf {
        self.sys
            .parent()
            .unwrap_or(Path::new("/"))
            .join("proc/kallsyms")
    }
}

/// Which file a path names now, by device and inode number: sysfs numbers each file or
/// directory it creates anew (a 64-bit id, not reused), so a reloaded module (or its BTF) is
/// told from the one before. Times are no help: sysfs sets them when the inode is brought into
/// memory, which happens again after the cache drops it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileIdentity {
    dev: u64,
    ino: u64,
}

impl FileIdentity {
    pub fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let m = std::fs::metadata(path).ok()?;
        Some(Self {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

/// The address of `symbol` of `module` in a kallsyms listing (`ADDRESS TYPE NAME [MODULE]`
/// lines), for a static function a probe compares pointers with. An error names what is
/// missing: the file, the symbol, or its address (all zeros when `kernel.kptr_restrict`
/// hides addresses from us).
pub fn module_symbol(kallsyms: &Path, module: &str, symbol: &str) -> Result<u64, String> {
    let text = std::fs::read_to_string(kallsyms)
        .map_err(|e| format!("cannot read {}: {e}", kallsyms.display()))?;
    let tag = format!("[{module}]");
    let address = text
        .lines()
        .filter(|l| l.ends_with(&tag))
        .find_map(|l| {
            let mut words = l.split_whitespace();
            let (address, _kind, name) = (words.next()?, words.next()?, words.next()?);
            (name == symbol).then_some(address)
        })
        .ok_or_else(|| format!("{symbol} {tag} is not in {}", kallsyms.display()))?;
    match u64::from_str_radix(address, 16) {
        Ok(0) => Err(format!(
            "{} hides the address of {symbol} (kernel.kptr_restrict)",
            kallsyms.display()
        )),
        Ok(a) => Ok(a),
        Err(_) => Err(format!(
            "bad address {address:?} for {symbol} in {}",
            kallsyms.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_presence_follows_sysfs() {
        let dir = std::env::temp_dir().join(format!("railscope-kernel-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("module/ib_core")).unwrap();
        let kernel = Kernel::at(&dir);
        assert!(kernel.module_present("ib_core"));
        assert!(!kernel.module_present("mlx5_ib"));
        assert!(!kernel.has_kprobes());
        std::fs::create_dir_all(dir.join("bus/event_source/devices/kprobe")).unwrap();
        assert!(kernel.has_kprobes());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn module_symbol_is_found_by_module_and_name() {
        let dir = std::env::temp_dir().join(format!("railscope-kallsyms-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kallsyms");
        std::fs::write(
            &path,
            "ffffffff81000000 T _stext\n\
             ffffffffc0a10000 t cma_listen_handler\t[other]\n\
             ffffffffc0b2c3d0 t cma_listen_handler\t[rdma_cm]\n\
             ffffffffc0b2c400 t cma_cm_event_handler\t[rdma_cm]\n",
        )
        .unwrap();
        assert_eq!(
            module_symbol(&path, "rdma_cm", "cma_listen_handler"),
            Ok(0xffff_ffff_c0b2_c3d0)
        );
        let missing = module_symbol(&path, "rdma_cm", "nope").unwrap_err();
        assert!(missing.contains("nope [rdma_cm] is not in"), "{missing}");
        std::fs::write(&path, "0000000000000000 t cma_listen_handler\t[rdma_cm]\n").unwrap();
        let hidden = module_symbol(&path, "rdma_cm", "cma_listen_handler").unwrap_err();
        assert!(hidden.contains("kptr_restrict"), "{hidden}");
        assert!(module_symbol(&dir.join("absent"), "rdma_cm", "x").is_err());
        assert_eq!(
            Kernel::at("/sys").kallsyms(),
            std::path::Path::new("/proc/kallsyms")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
