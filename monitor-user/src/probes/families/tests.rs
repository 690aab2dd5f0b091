//! The families' lifecycle with a stand-in attach (no eBPF here): attempts run off the loop,
//! failures back off, a module loaded again is tried at once.

use std::{
    path::PathBuf,
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use super::*;
use crate::probes::{ProbeReport, Unavailable, ring::EVENT_DRAIN_INTERVAL};

/// A fake `/sys` with the given modules loaded.
struct FakeSys(PathBuf);

impl FakeSys {
    fn new(name: &str, modules: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("railscope-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for m in modules {
            std::fs::create_dir_all(dir.join("module").join(m)).unwrap();
        }
        Self(dir)
    }

    /// Unloads and loads `module` again: a new directory (made before the old one goes, so
    /// that it gets another inode, as sysfs gives it).
    fn reload(&self, module: &str) {
        let path = self.0.join("module").join(module);
        let next = path.with_extension("next");
        std::fs::create_dir(&next).unwrap();
        std::fs::remove_dir(&path).unwrap();
        std::fs::rename(&next, &path).unwrap();
    }
}

impl Drop for FakeSys {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn failed(family: Family, why: &str) -> Box<FamilyUnavailable> {
    let rows = family
        .probes()
        .map(|p| ProbeReport::new(p, Status::Unavailable(why.into())))
        .collect();
    Box::new(FamilyUnavailable {
        reason: Unavailable::Program(why.into()),
        rows,
    })
}

fn reason(families: &Families, family: Family) -> Option<String> {
    match families.state(family)? {
        FamilyState::Unavailable { reason, .. } => Some(reason.clone()),
        _ => None,
    }
}

#[test]
fn backoff_doubles_from_a_second_to_a_minute() {
    let mut retry = Backoff::default();
    let t0 = Instant::now();
    assert!(retry.due(t0), "a first failure has not happened yet");
    let mut waits = Vec::new();
    for _ in 0..9 {
        waits.push(retry.delay().as_secs());
        retry.failed(t0);
    }
    assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
    assert!(!retry.due(t0 + Duration::from_secs(59)));
    assert!(retry.due(t0 + Duration::from_secs(60)));
}

/// An attach that blocks for two seconds (BTF, verifier on a slow machine) runs off the loop:
/// a 250 ms ticker on the same single-threaded runtime, standing for the event drain and the
/// sender, keeps its pace, and the attempt's result reaches the loop.
#[tokio::test(flavor = "current_thread")]
async fn a_slow_attach_does_not_stall_the_loop() {
    let sys = FakeSys::new("slow-attach", &["ib_core"]);
    let attach: AttachFn = Arc::new(|family| {
        if family == Family::IbCore {
            std::thread::sleep(Duration::from_secs(2));
        }
        Err(failed(family, "stand-in attach failed"))
    });
    let (records, _records_rx) = mpsc::channel(1);
    let mut ticker = tokio::time::interval(EVENT_DRAIN_INTERVAL);
    ticker.tick().await;
    let (start, mut last, mut longest) = (Instant::now(), Instant::now(), Duration::ZERO);
    let mut families = Families::start(Kernel::at(&sys.0), attach, records);
    while start.elapsed() < Duration::from_secs(3) {
        tokio::select! {
            _ = ticker.tick() => {
                longest = longest.max(last.elapsed());
                last = Instant::now();
            }
            attempt = families.next_attempt() => families.on_attempt(attempt),
        }
    }
    assert!(families.started(), "every first attempt came back");
    assert_eq!(
        reason(&families, Family::IbCore).as_deref(),
        Some("stand-in attach failed")
    );
    // Blocked by the attach, the ticker would wait 2 s; a loaded machine delays it far less.
    assert!(
        longest < Duration::from_secs(1),
        "the loop stalled for {longest:?} during a 2 s attach"
    );
}

/// A family that fails is not tried again before its backoff is due, unless its module is
/// loaded again: then at once.
#[tokio::test(flavor = "current_thread")]
async fn a_failing_family_waits_its_backoff_unless_its_module_reloads() {
    let sys = FakeSys::new("retry-attach", &["ib_core"]);
    let tries = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&tries);
    let attach: AttachFn = Arc::new(move |family| {
        if family == Family::IbCore {
            counted.fetch_add(1, Ordering::SeqCst);
        }
        Err(failed(family, "verifier says no"))
    });
    let (records, _records_rx) = mpsc::channel(1);
    let mut families = Families::start(Kernel::at(&sys.0), attach, records);
    while !families.started() {
        let attempt = families.next_attempt().await;
        families.on_attempt(attempt);
    }
    assert_eq!(tries.load(Ordering::SeqCst), 1);

    // Rescans within the first second of backoff start nothing.
    families.rescan();
    families.rescan();
    assert!(reason(&families, Family::IbCore).is_some(), "not attaching");

    // The module is loaded again: the next rescan tries at once.
    sys.reload("ib_core");
    families.rescan();
    assert!(
        matches!(
            families.state(Family::IbCore),
            Some(FamilyState::Attaching { .. })
        ),
        "a reloaded module is tried at once"
    );
    let attempt = families.next_attempt().await;
    families.on_attempt(attempt);
    assert_eq!(tries.load(Ordering::SeqCst), 2);

    // Families whose module is absent are never tried again while it stays absent.
    let absent = Family::IbUverbs;
    assert!(reason(&families, absent).is_some());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    families.rescan();
    // ib_core's backoff (1 s) is due now: tried again; ib_uverbs is not.
    assert!(matches!(
        families.state(Family::IbCore),
        Some(FamilyState::Attaching { .. })
    ));
    assert!(reason(&families, absent).is_some());
    let attempt = families.next_attempt().await;
    families.on_attempt(attempt);
    assert_eq!(tries.load(Ordering::SeqCst), 3);
}
