//! The kernel's BTF as the probe families need it, parsed once and shared: vmlinux for the
//! agent's lifetime (it cannot change), each module's split BTF until the module is loaded
//! again (its BTF file is then a new file).
//!
//! Parsing vmlinux's BTF is most of what attaching a family costs before the verifier; a
//! family retried while it fails, or reattached after its module reloads, reuses it.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use crate::{
    btf::{Btf, BtfError},
    kernel::{FileIdentity, Kernel},
};

/// Parsed BTF of the running kernel, shared by the families' attaches (which run on blocking
/// threads, hence the lock).
pub struct BtfCache {
    kernel: Kernel,
    cached: Mutex<Cached>,
}

#[derive(Default)]
struct Cached {
    vmlinux: Option<Btf>,
    /// Per module: which BTF file was parsed, and vmlinux with it on top.
    modules: HashMap<String, (FileIdentity, Btf)>,
    parses: Parses,
}

/// How many blobs were parsed, for tests and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Parses {
    pub vmlinux: usize,
    pub modules: usize,
}

impl BtfCache {
    pub fn new(kernel: Kernel) -> Self {
        Self {
            kernel,
            cached: Mutex::default(),
        }
    }

    /// vmlinux's BTF with `module`'s split BTF on top, or vmlinux's alone for a module built
    /// into the kernel (its types are in vmlinux). Parsed at the first call and again only
    /// when the module's BTF file changed (the module was loaded again).
    pub fn module(&self, module: &str) -> Result<Btf, BtfError> {
        let mut cached = self.cached.lock().unwrap_or_else(PoisonError::into_inner);
        let vmlinux = match &cached.vmlinux {
            Some(btf) => btf.clone(),
            None => {
                let btf = Btf::from_files(&self.kernel.vmlinux_btf(), None)?;
                cached.parses.vmlinux += 1;
                cached.vmlinux = Some(btf.clone());
                btf
            }
        };
        let Some(path) = self.kernel.module_btf(module) else {
            cached.modules.remove(module);
            return Ok(vmlinux);
        };
        let identity = FileIdentity::of(&path);
        if let Some((seen, btf)) = cached.modules.get(module)
            && Some(*seen) == identity
        {
            return Ok(btf.clone());
        }
        let btf = vmlinux.with_split(&path)?;
        cached.parses.modules += 1;
        match identity {
            Some(identity) => {
                cached
                    .modules
                    .insert(module.to_owned(), (identity, btf.clone()));
            }
            None => {
                cached.modules.remove(module);
            }
        }
        Ok(btf)
    }

    pub fn parses(&self) -> Parses {
        self.cached
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .parses
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmlinux_parsed_once_and_a_module_again_only_when_it_reloads() {
        let dir = std::env::temp_dir().join(format!("railscope-btf-cache-{}", std::process::id()));
        let btf_dir = dir.join("kernel/btf");
        std::fs::create_dir_all(&btf_dir).unwrap();
        let (base, split) = crate::btf::synthetic_blobs();
        std::fs::write(btf_dir.join("vmlinux"), &base).unwrap();
        std::fs::write(btf_dir.join("ib_core"), &split).unwrap();
        let cache = BtfCache::new(Kernel::at(&dir));

        let first = cache.module("ib_core").unwrap();
        assert!(first.has_function("split_fn"), "the module's own types");
        assert!(first.has_function("do_thing"), "vmlinux's types");
        let again = cache.module("ib_core").unwrap();
        assert!(again.has_function("split_fn"));
        // A module without split BTF (built in): vmlinux alone, not parsed again.
        let builtin = cache.module("rdma_cm").unwrap();
        assert!(builtin.has_function("do_thing") && !builtin.has_function("split_fn"));
        assert_eq!(
            cache.parses(),
            Parses {
                vmlinux: 1,
                modules: 1
            }
        );

        // The module is loaded again: its BTF is a new file (another inode, as sysfs gives
        // it), parsed on top of the same vmlinux.
        std::fs::write(btf_dir.join("ib_core.next"), &split).unwrap();
        std::fs::rename(btf_dir.join("ib_core.next"), btf_dir.join("ib_core")).unwrap();
        assert!(cache.module("ib_core").unwrap().has_function("split_fn"));
        assert_eq!(
            cache.parses(),
            Parses {
                vmlinux: 1,
                modules: 2
            }
        );

        // A module that went away leaves vmlinux; a broken vmlinux is an error naming it.
        std::fs::remove_file(btf_dir.join("ib_core")).unwrap();
        assert!(!cache.module("ib_core").unwrap().has_function("split_fn"));
        let broken = BtfCache::new(Kernel::at(dir.join("absent")));
        let e = broken.module("ib_core").err().expect("no vmlinux BTF");
        assert!(e.to_string().contains("absent/kernel/btf/vmlinux"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
