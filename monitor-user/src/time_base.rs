//! One time base for everything the agent stamps: events (kernel CLOCK_MONOTONIC from
//! `bpf_ktime_get_ns`), samples, GPU events and frame send times.
//!
//! Everything is first taken on CLOCK_MONOTONIC, which never steps, and turned into wall-clock
//! time by [`TimeBase::unix_ns`] with the offset (CLOCK_REALTIME - CLOCK_MONOTONIC) that was
//! in force at that monotonic instant. The offset is measured again at every sweep
//! ([`TimeBase::refresh`]): a slew (NTP's small corrections) adjusts the current offset, a step
//! (`date -s`, a VM resumed, NTP stepping) starts a new one from that moment on. So an event
//! and a sample taken at the same instant always get the same wall-clock time, whichever is
//! converted first or later; within a stretch between two steps the spacing and order of
//! everything is the monotonic clock's, exact; and after a step the wall-clock times follow the
//! new clock within a sweep.
//!
//! The two clocks have a type each, [`MonoNs`] and [`UnixNs`], so a monotonic instant cannot
//! reach the wire unconverted (a GPU lost was once stamped 1970-01-01T00:33 that way, and no
//! finding opened for it): the only way from one to the other is [`TimeBase::unix_ns`].

use std::{
    collections::VecDeque,
    sync::{Mutex, OnceLock, PoisonError},
};

/// An offset change larger than this is a step of the wall clock (a new segment); smaller
/// ones are slews, folded into the current offset (NTP slews at most 0.5 ms a second).
const STEP_NS: i128 = 1_000_000;
/// Steps remembered: a monotonic time older than the oldest uses the oldest offset. Samples
/// are converted within a sweep or a flush of being read, so a handful is plenty.
const SEGMENTS: usize = 16;

/// An instant on CLOCK_MONOTONIC, in nanoseconds: what the probes stamp (`bpf_ktime_get_ns`)
/// and the sampler runs on. Never a wall-clock time: [`TimeBase::unix_ns`] makes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MonoNs(pub u64);

/// Nanoseconds since the Unix epoch (CLOCK_REALTIME): what events, samples and frames carry
/// on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixNs(pub u64);

/// CLOCK_REALTIME - CLOCK_MONOTONIC in force from `from_mono_ns` on.
#[derive(Clone, Copy, Debug)]
struct Segment {
    from_mono_ns: u64,
    offset_ns: i128,
}

/// The agent's conversion from CLOCK_MONOTONIC to wall-clock time, shared by its threads.
#[derive(Debug)]
pub struct TimeBase {
    segments: Mutex<VecDeque<Segment>>,
}

impl TimeBase {
    /// A time base with the offset measured now.
    pub fn new() -> Self {
        let (mono, real) = read_clocks();
        Self::starting_at(mono, real)
    }

    /// A time base whose first offset is `real - mono`.
    pub fn starting_at(mono: MonoNs, real: UnixNs) -> Self {
        let first = Segment {
            from_mono_ns: 0,
            offset_ns: i128::from(real.0) - i128::from(mono.0),
        };
        Self {
            segments: Mutex::new(VecDeque::from([first])),
        }
    }

    /// The process's time base (what the agent's loop, poller and GPU event thread use).
    pub fn global() -> &'static TimeBase {
        static GLOBAL: OnceLock<TimeBase> = OnceLock::new();
        GLOBAL.get_or_init(TimeBase::new)
    }

    /// Measures the offset again (a step or a slew of the wall clock since the last time is
    /// followed from now on) and returns CLOCK_MONOTONIC now.
    pub fn refresh(&self) -> MonoNs {
        let (mono, real) = read_clocks();
        self.observe(mono, real);
        mono
    }

    /// [`TimeBase::refresh`] with the clocks read by the caller.
    pub fn observe(&self, mono: MonoNs, real: UnixNs) {
        let (mono_ns, offset_ns) = (mono.0, i128::from(real.0) - i128::from(mono.0));
        let mut segments = self.segments.lock().unwrap_or_else(PoisonError::into_inner);
        match segments.back_mut() {
            Some(last) if (offset_ns - last.offset_ns).abs() <= STEP_NS => {
                last.offset_ns = offset_ns;
            }
            _ => {
                if segments.len() == SEGMENTS {
                    segments.pop_front();
                }
                segments.push_back(Segment {
                    from_mono_ns: mono_ns,
                    offset_ns,
                });
            }
        }
    }

    /// Unix nanoseconds for a CLOCK_MONOTONIC time, with the offset in force then.
    pub fn unix_ns(&self, mono: MonoNs) -> UnixNs {
        let mono_ns = mono.0;
        let segments = self.segments.lock().unwrap_or_else(PoisonError::into_inner);
        let offset = segments
            .iter()
            .rev()
            .find(|s| s.from_mono_ns <= mono_ns)
            .or(segments.front())
            .map_or(0, |s| s.offset_ns);
        UnixNs(u64::try_from((i128::from(mono_ns) + offset).max(0)).unwrap_or(u64::MAX))
    }

    /// Unix nanoseconds now, on this time base (not re-measured: see [`TimeBase::refresh`]).
    pub fn now_unix_ns(&self) -> UnixNs {
        self.unix_ns(monotonic_ns())
    }
}

impl Default for TimeBase {
    fn default() -> Self {
        Self::new()
    }
}

/// The kernel's CLOCK_MONOTONIC, which `bpf_ktime_get_ns` reads, in nanoseconds.
pub fn monotonic_ns() -> MonoNs {
    MonoNs(clock_ns(libc::CLOCK_MONOTONIC))
}

/// CLOCK_REALTIME in nanoseconds since the Unix epoch.
pub fn realtime_ns() -> UnixNs {
    UnixNs(clock_ns(libc::CLOCK_REALTIME))
}

/// Both clocks, the monotonic one as the midpoint of two reads around the wall clock's.
fn read_clocks() -> (MonoNs, UnixNs) {
    let before = monotonic_ns().0;
    let real = realtime_ns();
    let after = monotonic_ns().0;
    (MonoNs(before + (after - before) / 2), real)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; these clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    /// Wall-clock time at monotonic 0 in these tests.
    const EPOCH: u64 = 1_700_000_000 * S;

    /// The test's clocks as the time base takes them.
    fn at(mono_ns: u64) -> MonoNs {
        MonoNs(mono_ns)
    }
    fn wall(unix_ns: u64) -> UnixNs {
        UnixNs(unix_ns)
    }

    #[test]
    fn converts_with_the_offset_in_force_at_each_instant() {
        let base = TimeBase::starting_at(at(100 * S), wall(EPOCH + 100 * S));
        assert_eq!(base.unix_ns(at(150 * S)).0, EPOCH + 150 * S);
        // At monotonic 200 s the wall clock is found stepped one hour ahead.
        base.observe(at(200 * S), wall(EPOCH + 200 * S + 3600 * S));
        // Before the step: the old offset, spacing exact; from it on: the new one.
        assert_eq!(base.unix_ns(at(199 * S)).0, EPOCH + 199 * S);
        assert_eq!(base.unix_ns(at(201 * S)).0, EPOCH + 201 * S + 3600 * S);
        // An event and a sample of the same instant agree, whichever is converted later.
        let event = base.unix_ns(at(250 * S)).0;
        base.observe(at(300 * S), wall(EPOCH + 300 * S + 3600 * S));
        assert_eq!(base.unix_ns(at(250 * S)).0, event);
        // A step back: both follow it, still together.
        base.observe(at(400 * S), wall(EPOCH + 400 * S - 60 * S));
        assert_eq!(base.unix_ns(at(401 * S)).0, EPOCH + 401 * S - 60 * S);
        assert_eq!(base.unix_ns(at(399 * S)).0, EPOCH + 399 * S + 3600 * S);
    }

    #[test]
    fn slews_adjust_the_offset_without_a_new_step() {
        let base = TimeBase::starting_at(at(0), wall(EPOCH));
        // NTP slewing: 0.4 ms over a second, folded into the current offset.
        base.observe(at(S), wall(EPOCH + S + 400_000));
        assert_eq!(base.unix_ns(at(2 * S)).0, EPOCH + 2 * S + 400_000);
        assert_eq!(base.segments.lock().unwrap().len(), 1);
    }

    #[test]
    fn old_steps_are_forgotten_past_a_bound() {
        let base = TimeBase::starting_at(at(0), wall(EPOCH));
        for i in 1..100u64 {
            base.observe(at(i * S), wall(EPOCH + i * S + i * 10 * S));
        }
        assert_eq!(base.segments.lock().unwrap().len(), SEGMENTS);
        // The newest steps still convert exactly; older times use the oldest offset kept.
        assert_eq!(base.unix_ns(at(99 * S)).0, EPOCH + 99 * S + 990 * S);
        let oldest = 100 - SEGMENTS as u64;
        assert_eq!(base.unix_ns(at(0)).0, EPOCH + oldest * 10 * S);
    }

    #[test]
    fn the_live_clocks_agree_at_start() {
        let base = TimeBase::new();
        let now = base.unix_ns(monotonic_ns()).0;
        assert!(now.abs_diff(realtime_ns().0) < S, "{now}");
    }
}
