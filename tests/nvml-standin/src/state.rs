//! The replay: which step each GPU is at, the event sets and their queued XIDs, the GPM
//! samples. One `Replay` per loaded copy of the stand-in, behind one lock.
//!
//! Time is the number of `nvmlDeviceGetUtilizationRates` calls per GPU: the n-th call
//! (counting from 0) moves that GPU to step n, raises the XIDs scripted for step n, and it and
//! every later call about that GPU answer from step n until the next utilization call. Calls
//! before the first one answer from step 0. A source that reads utilization first in each
//! sweep therefore sees step n in its n-th sweep, whatever the wall clock does.

use std::{
    collections::{HashMap, VecDeque},
    ffi::c_void,
    path::PathBuf,
    sync::{
        Arc, Condvar, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{
    ffi::{self, Handle, NvmlReturn},
    script::{GpuTrace, Script, Step, Trace},
};

/// The environment variable naming the script, when no `nvml-standin.json` sits next to the
/// loaded library.
pub const SCRIPT_ENV: &str = "RAILSCOPE_NVML_STANDIN_SCRIPT";
/// The script file looked for in the directory the stand-in library was loaded from.
pub const SIDECAR_SCRIPT: &str = "nvml-standin.json";
/// Where the stand-in reports a caller's breach of NVML's documented usage, one line each,
/// in the directory the library was loaded from (tests read it and expect none).
pub const REPORT_FILE: &str = "nvml-standin.report";
/// NVML's documentation of `nvmlGpmMetricsGet`: "The interval between these two
/// nvmlGpmSampleGet() calls should be greater than 100ms due to the internal sample refresh
/// rate."
pub const GPM_MIN_SPACING: Duration = Duration::from_millis(100);

struct Replay {
    init_count: u32,
    run: Option<Run>,
}

static REPLAY: Mutex<Replay> = Mutex::new(Replay {
    init_count: 0,
    run: None,
});

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Device handles are `DEVICE_TAG + index`; event sets and GPM samples get ids from
/// `NEXT_ID`, above every device handle and never reused. None is ever dereferenced.
const DEVICE_TAG: usize = 0xD0_0000;
static NEXT_ID: AtomicUsize = AtomicUsize::new(0x100_0000);

fn new_id() -> usize {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

fn handle(addr: usize) -> Handle {
    std::ptr::without_provenance_mut::<c_void>(addr)
}

pub fn device_handle(index: usize) -> Handle {
    handle(DEVICE_TAG + index)
}

pub fn set_handle(id: usize) -> Handle {
    handle(id)
}

pub fn sample_handle(id: usize) -> Handle {
    handle(id)
}

/// One replay from `nvmlInit` to the last `nvmlShutdown`.
pub struct Run {
    pub trace: Trace,
    /// `nvmlDeviceGetUtilizationRates` calls so far, per GPU.
    calls: Vec<u64>,
    sets: HashMap<usize, Arc<EventQueue>>,
    samples: HashMap<usize, Option<Sample>>,
}

/// What `nvmlGpmSampleGet` recorded: which GPU, at which step.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub gpu: usize,
    pub step: u64,
    /// When `nvmlGpmSampleGet` filled it.
    pub taken: Instant,
}

/// An event set: the GPUs and event types registered with it, and the XIDs raised for them
/// that `nvmlEventSetWait_v2` has not delivered yet.
#[derive(Default)]
pub struct EventQueue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

#[derive(Default)]
struct QueueState {
    registered: Vec<(usize, u64)>,
    pending: VecDeque<(usize, u64)>,
}

impl EventQueue {
    /// The next XID raised for a registered GPU, as (GPU index, XID), waiting up to `timeout`.
    pub fn wait(&self, timeout: Duration) -> Option<(usize, u64)> {
        let deadline = Instant::now() + timeout;
        let mut q = lock(&self.state);
        loop {
            if let Some(event) = q.pending.pop_front() {
                return Some(event);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            q = self
                .ready
                .wait_timeout(q, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// A GPU as one call sees it: its script and the values of its current step.
pub struct View<'a> {
    pub index: usize,
    pub gpu: &'a GpuTrace,
    pub values: &'a Step,
    pub step: u64,
}

impl Run {
    pub fn new(trace: Trace) -> Self {
        let calls = vec![0; trace.gpus.len()];
        Self {
            trace,
            calls,
            sets: HashMap::new(),
            samples: HashMap::new(),
        }
    }

    pub fn device_count(&self) -> usize {
        self.trace.gpus.len()
    }

    fn index_of(&self, device: Handle) -> Result<usize, NvmlReturn> {
        device
            .addr()
            .checked_sub(DEVICE_TAG)
            .filter(|&i| i < self.trace.gpus.len())
            .ok_or(ffi::ERROR_INVALID_ARGUMENT)
    }

    fn answer(&self, index: usize, step: u64) -> Result<View<'_>, NvmlReturn> {
        let gpu = &self.trace.gpus[index];
        if gpu.lost_at_step.is_some_and(|s| step >= s) {
            return Err(ffi::ERROR_GPU_IS_LOST);
        }
        if gpu.error_from_step.is_some_and(|s| step >= s)
            && gpu.error_until_step.is_none_or(|until| step < until)
        {
            return Err(ffi::ERROR_UNKNOWN);
        }
        Ok(View {
            index,
            gpu,
            values: gpu.at(step),
            step,
        })
    }

    /// The GPU at index `index` at its current step, or the error it answers with.
    pub fn view_index(&self, index: usize) -> Result<View<'_>, NvmlReturn> {
        if index >= self.trace.gpus.len() {
            return Err(ffi::ERROR_INVALID_ARGUMENT);
        }
        self.answer(index, self.calls[index].saturating_sub(1))
    }

    /// `nvmlDeviceGetHandleByIndex_v2`: the GPU's index, or `NVML_ERROR_GPU_IS_LOST` once it
    /// fell off the bus. A GPU that answers errors (`error_from_step`) still has a handle, so
    /// the calls through it reach the GPU, and its utilization call moves it on.
    pub fn handle_index(&self, index: usize) -> Result<usize, NvmlReturn> {
        if index >= self.trace.gpus.len() {
            return Err(ffi::ERROR_INVALID_ARGUMENT);
        }
        let step = self.calls[index].saturating_sub(1);
        if self.trace.gpus[index]
            .lost_at_step
            .is_some_and(|s| step >= s)
        {
            return Err(ffi::ERROR_GPU_IS_LOST);
        }
        Ok(index)
    }

    /// The GPU behind `device` at its current step, or the error it answers with.
    pub fn view(&self, device: Handle) -> Result<View<'_>, NvmlReturn> {
        self.view_index(self.index_of(device)?)
    }

    /// `nvmlDeviceGetUtilizationRates`: move the GPU to its next step and raise that step's
    /// XIDs, then answer from it.
    pub fn advance(&mut self, device: Handle) -> Result<View<'_>, NvmlReturn> {
        let index = self.index_of(device)?;
        let step = self.calls[index];
        self.calls[index] += 1;
        for xid in self.trace.gpus[index]
            .xids
            .iter()
            .filter(|x| x.step == step)
        {
            for set in self.sets.values() {
                let mut q = lock(&set.state);
                let wanted = q.registered.iter().any(|&(gpu, types)| {
                    gpu == index && types & ffi::EVENT_TYPE_XID_CRITICAL_ERROR != 0
                });
                if wanted {
                    q.pending.push_back((index, xid.xid));
                    set.ready.notify_all();
                }
            }
            tracing::debug!(gpu = index, step, xid = xid.xid, "stand-in raises XID");
        }
        self.answer(index, step)
    }

    pub fn create_set(&mut self) -> usize {
        let id = new_id();
        self.sets.insert(id, Arc::default());
        id
    }

    pub fn set(&self, set: Handle) -> Result<Arc<EventQueue>, NvmlReturn> {
        self.sets
            .get(&set.addr())
            .cloned()
            .ok_or(ffi::ERROR_INVALID_ARGUMENT)
    }

    pub fn register(&mut self, device: Handle, types: u64, set: Handle) -> Result<(), NvmlReturn> {
        let index = self.view(device)?.index;
        if types & !ffi::EVENT_TYPE_XID_CRITICAL_ERROR != 0 {
            return Err(ffi::ERROR_NOT_SUPPORTED);
        }
        lock(&self.set(set)?.state).registered.push((index, types));
        Ok(())
    }

    pub fn free_set(&mut self, set: Handle) -> Result<(), NvmlReturn> {
        self.sets
            .remove(&set.addr())
            .map(drop)
            .ok_or(ffi::ERROR_INVALID_ARGUMENT)
    }

    pub fn alloc_sample(&mut self) -> usize {
        let id = new_id();
        self.samples.insert(id, None);
        id
    }

    pub fn take_sample(&mut self, device: Handle, sample: Handle) -> Result<(), NvmlReturn> {
        let v = self.view(device)?;
        if !v.gpu.gpm_supported {
            return Err(ffi::ERROR_NOT_SUPPORTED);
        }
        let taken = Sample {
            gpu: v.index,
            step: v.step,
            taken: Instant::now(),
        };
        let slot = self
            .samples
            .get_mut(&sample.addr())
            .ok_or(ffi::ERROR_INVALID_ARGUMENT)?;
        *slot = Some(taken);
        Ok(())
    }

    /// A sample that `nvmlGpmSampleGet` has filled.
    pub fn sample(&self, sample: Handle) -> Result<Sample, NvmlReturn> {
        self.samples
            .get(&sample.addr())
            .copied()
            .flatten()
            .ok_or(ffi::ERROR_INVALID_ARGUMENT)
    }

    pub fn free_sample(&mut self, sample: Handle) -> Result<(), NvmlReturn> {
        self.samples
            .remove(&sample.addr())
            .map(drop)
            .ok_or(ffi::ERROR_INVALID_ARGUMENT)
    }
}

/// Reports a caller's breach of NVML's documented usage: a warning, and a line appended to
/// [`REPORT_FILE`] next to the library (when that directory is writable).
pub fn report_breach(line: &str) {
    use std::io::Write as _;
    tracing::warn!("nvml stand-in: {line}");
    if let Some(dir) = library_dir() {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(REPORT_FILE));
        if let Ok(mut file) = file {
            let _ = writeln!(file, "{line}");
        }
    }
}

/// Run `f` on the current replay, or answer `NVML_ERROR_UNINITIALIZED`.
pub fn with_run<T>(f: impl FnOnce(&mut Run) -> Result<T, NvmlReturn>) -> Result<T, NvmlReturn> {
    let mut replay = lock(&REPLAY);
    match replay.run.as_mut() {
        Some(run) => f(run),
        None => Err(ffi::ERROR_UNINITIALIZED),
    }
}

/// `nvmlInit_v2`: the first call loads the script; later ones only count.
pub fn init(load: impl FnOnce() -> Result<Trace, NvmlReturn>) -> NvmlReturn {
    let mut replay = lock(&REPLAY);
    if replay.init_count == 0 {
        match load() {
            Ok(trace) => replay.run = Some(Run::new(trace)),
            Err(e) => return e,
        }
    }
    replay.init_count += 1;
    ffi::SUCCESS
}

/// Whether no `nvmlInit_v2` is in effect (after the last `nvmlShutdown`).
pub fn is_shut_down() -> bool {
    lock(&REPLAY).init_count == 0
}

/// `nvmlShutdown`: the last call ends the replay; the next `nvmlInit_v2` starts it over.
pub fn shutdown() -> NvmlReturn {
    let mut replay = lock(&REPLAY);
    match replay.init_count {
        0 => ffi::ERROR_UNINITIALIZED,
        n => {
            replay.init_count = n - 1;
            if n == 1 {
                replay.run = None;
            }
            ffi::SUCCESS
        }
    }
}

/// The script to replay: `nvml-standin.json` next to the loaded library if there is one (so
/// each copy of the library can replay its own trace), else the file named by
/// `RAILSCOPE_NVML_STANDIN_SCRIPT`.
pub fn load_script() -> Result<Trace, NvmlReturn> {
    let sidecar = library_dir()
        .map(|d| d.join(SIDECAR_SCRIPT))
        .filter(|p| p.is_file());
    let Some(path) = sidecar.or_else(|| std::env::var_os(SCRIPT_ENV).map(PathBuf::from)) else {
        tracing::error!(
            "nvml stand-in: no script: put {SIDECAR_SCRIPT} next to the library or set {SCRIPT_ENV}"
        );
        return Err(ffi::ERROR_DRIVER_NOT_LOADED);
    };
    match Script::load(&path) {
        Ok(trace) => {
            tracing::info!(
                script = %path.display(),
                gpus = trace.gpus.len(),
                "nvml stand-in replays its script"
            );
            Ok(trace)
        }
        Err(e) => {
            tracing::error!("nvml stand-in: {e}");
            Err(ffi::ERROR_UNKNOWN)
        }
    }
}

/// The directory of the file this code was loaded from (the stand-in library, or the test
/// binary when linked as an rlib).
fn library_dir() -> Option<PathBuf> {
    use std::{ffi::CStr, os::unix::ffi::OsStrExt as _, path::Path};
    // SAFETY: `Dl_info` is plain data; all-zero is a valid value that dladdr overwrites.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let addr = library_dir as fn() -> Option<PathBuf>;
    // SAFETY: dladdr only reads the address to find the object containing it.
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr succeeded, so dli_fname points to a NUL-terminated path owned by the
    // dynamic loader for as long as the object stays loaded.
    let path = unsafe { CStr::from_ptr(info.dli_fname) };
    Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()))
        .parent()
        .map(Path::to_path_buf)
}
