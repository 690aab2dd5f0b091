//! Finding the devices: listing `class/infiniband`, planning a device that appeared or whose
//! plan is due again, dropping one that went away, and warning once per broken file.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::Instant,
};

use super::{
    IbSysfs,
    listing::list_dir,
    plan::{DevicePlan, forget_listing_problems, forget_problems_under, plan_device},
    sweep::Sweep,
};
use crate::sources::ReadingSink;

impl IbSysfs {
    pub(super) fn scan(&mut self, sink: Option<&mut dyn ReadingSink>) {
        let class = self.root.join("class/infiniband");
        if let Some((at, names)) = &self.listed
            && at.elapsed() < self.relist_every
        {
            // Between listings, one stat per device: a removed device's files may still read
            // (an unlinked file does; sysfs gives ENODEV), its directory does not.
            let names: Vec<String> = names
                .iter()
                .filter(|name| class.join(name).is_dir())
                .cloned()
                .collect();
            if self
                .listed
                .as_ref()
                .is_some_and(|(_, all)| all.len() != names.len())
            {
                // A device went away (a driver unloading?): list again at the next read.
                self.listed = None;
            }
            self.scan_devices(&class, names, sink);
            return;
        }
        let class_problem = class.clone();
        self.problems.remove(&class_problem);
        let names = match list_dir(&class) {
            Ok(names) => {
                if self.class_seen != Some(true) {
                    tracing::debug!("reading RDMA devices under {}", class.display());
                }
                self.class_seen = Some(true);
                names
            }
            Err(e) if e.not_found() => {
                // Absent from the start is the caller's to say (the agent does, once); gone
                // after it existed (the drivers unloaded) is news.
                if self.class_seen == Some(true) {
                    tracing::info!("no RDMA devices: {} no longer exists", class.display());
                }
                self.class_seen = Some(false);
                Vec::new()
            }
            Err(e) => {
                self.problems.insert(class_problem, e);
                // Keep reading the devices already known.
                self.devices.keys().cloned().collect()
            }
        };
        self.listed = Some((Instant::now(), names.clone()));
        self.scan_devices(&class, names, sink);
    }

    pub(super) fn scan_devices(
        &mut self,
        class: &Path,
        names: Vec<String>,
        sink: Option<&mut dyn ReadingSink>,
    ) {
        let mut sweep = Sweep {
            sink,
            buf: &mut self.buf,
            problems: &mut self.problems,
        };
        let before: BTreeSet<String> = self.devices.keys().cloned().collect();
        // A device that went away: list the class directory again at the next read.
        let mut relist = false;
        let mut present = BTreeMap::new();
        for name in names {
            let dir = class.join(&name);
            let plan = match self.devices.remove(&name) {
                Some(plan) if !plan.stale && plan.planned_at.elapsed() < self.replan_every => {
                    Some(plan)
                }
                old => {
                    forget_listing_problems(sweep.problems, &dir);
                    let mut new = plan_device(&name, dir.clone(), sweep.problems);
                    if let (Some(mut old), Some(new)) = (old, new.as_mut()) {
                        warn_counter_files_gone(&old, new);
                        new.keep_open_files(&mut old);
                    }
                    new
                }
            };
            let Some(mut plan) = plan else {
                // Gone while being listed: a device unregistered during the scan.
                tracing::debug!(device = name, "vanished while being listed");
                forget_problems_under(sweep.problems, &dir);
                relist = true;
                continue;
            };
            let failed = sweep.device(&mut plan);
            // A device unregistered while it was being read leaves files that vanished; that
            // is the device going away, not a broken file.
            if failed && !plan.dir.is_dir() {
                tracing::debug!(device = name, "vanished while being read");
                forget_problems_under(sweep.problems, &plan.dir);
                relist = true;
                continue;
            }
            present.insert(name, plan);
        }

        if relist {
            self.listed = None;
        }
        // What is left of the previous plans: devices no longer listed (those that vanished
        // while being read have had their problems dropped already).
        for plan in self.devices.values() {
            forget_problems_under(&mut self.problems, &plan.dir);
        }
        for gone in before.iter().filter(|d| !present.contains_key(*d)) {
            tracing::info!(device = %gone, "RDMA device disappeared");
        }
        for new in present.keys().filter(|d| !before.contains(*d)) {
            tracing::info!(device = %new, "RDMA device appeared");
        }
        self.devices = present;
        self.links = self
            .devices
            .values()
            .flat_map(|d| d.ports.iter().map(|p| p.link.clone()))
            .collect();

        for (path, p) in &self.problems {
            // Warned again only when a file turns from saturated to failing or back.
            if self.warned.get(path) == Some(&p.is_saturation()) {
                continue;
            }
            if p.is_saturation() {
                tracing::warn!("{p}");
            } else {
                tracing::warn!("{p}; the other counters are still read");
            }
        }
        for (fixed, saturated) in &self.warned {
            if self.problems.contains_key(fixed) {
                continue;
            }
            if *saturated {
                tracing::info!(
                    "{}: counter below its maximum again (reset): it counts again",
                    fixed.display()
                );
            } else {
                tracing::info!("{} reads normally again", fixed.display());
            }
        }
        self.warned = self
            .problems
            .iter()
            .map(|(path, p)| (path.clone(), p.is_saturation()))
            .collect();
    }
}

/// Counter files of a device that are gone from its new listing while the device stays (a
/// driver or firmware that stopped exporting one), one warning each naming the file: its
/// series stops. A file that comes back is picked up at a later listing.
fn warn_counter_files_gone(old: &DevicePlan, new: &DevicePlan) {
    let counter_paths = |plan: &DevicePlan| -> BTreeSet<PathBuf> {
        plan.counters
            .iter()
            .chain(plan.ports.iter().flat_map(|p| p.counters.iter()))
            .map(|c| c.file.path.clone())
            .collect()
    };
    let now = counter_paths(new);
    for gone in counter_paths(old).difference(&now) {
        tracing::warn!(
            "{}: counter file gone while its device stays: its series stops",
            gone.display()
        );
    }
}
