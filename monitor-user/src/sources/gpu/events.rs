//! Things that happen to a GPU once ([`GpuEvent`]: an XID, a GPU lost), and the thread that
//! blocks in NVML's event wait for XIDs.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc::{self, Sender, SyncSender},
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use nvml_wrapper::{
    Device, EventSet, Nvml, bitmasks::event::EventTypes, enums::event::XidError, error::NvmlError,
};

use super::{GpuError, XID_UNKNOWN, gpu_labels, now_unix_ns};
use crate::time_base::UnixNs;
use monitor_wire::{Labels, names::event_kind};

/// How long the event thread blocks in one wait, which bounds how long stopping it takes.
const EVENT_WAIT_MS: u32 = 250;

/// Something that happened to a GPU once; never sampled away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuEvent {
    /// One XID error occurrence as the driver reported it (two identical XIDs are two events).
    Xid {
        unix_ns: UnixNs,
        gpu: u32,
        uuid: String,
        /// The XID number; [`XID_UNKNOWN`] when NVML could not tell.
        xid: u64,
    },
    /// The GPU stopped answering; its metrics stop from this sweep on.
    Lost {
        unix_ns: UnixNs,
        gpu: u32,
        uuid: String,
        reason: String,
    },
}

impl GpuEvent {
    /// The generic event kind: `"xid"` or `"gpu_lost"`.
    pub fn kind(&self) -> &'static str {
        match self {
            GpuEvent::Xid { .. } => event_kind::XID,
            GpuEvent::Lost { .. } => event_kind::GPU_LOST,
        }
    }

    pub fn unix_ns(&self) -> UnixNs {
        match self {
            GpuEvent::Xid { unix_ns, .. } | GpuEvent::Lost { unix_ns, .. } => *unix_ns,
        }
    }

    /// `{gpu, uuid}`, the labels of the GPU's series.
    pub fn labels(&self) -> Labels {
        match self {
            GpuEvent::Xid { gpu, uuid, .. } | GpuEvent::Lost { gpu, uuid, .. } => {
                gpu_labels(*gpu, uuid)
            }
        }
    }

    /// The XID number for an XID event.
    pub fn code(&self) -> Option<u64> {
        match self {
            GpuEvent::Xid { xid, .. } => Some(*xid),
            GpuEvent::Lost { .. } => None,
        }
    }
}

/// The XID event thread; stops (within a quarter second) when stopped or dropped, or by
/// itself when the receiver of its channel is gone.
pub struct EventThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl EventThread {
    /// Starts the thread for `gpus` (index, UUID) and waits until they are registered.
    pub(super) fn start(
        nvml: Arc<Nvml>,
        gpus: Vec<(u32, String)>,
        tx: Sender<GpuEvent>,
    ) -> Result<EventThread, GpuError> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::sync_channel(1);
        let handle = thread::Builder::new()
            .name("railscope-gpu-xid".into())
            .spawn({
                let stop = Arc::clone(&stop);
                move || xid_thread(&nvml, &gpus, &tx, &stop, ready_tx)
            })
            .map_err(|e| GpuError::Events(format!("cannot start the event thread: {e}")))?;
        let registered = ready_rx
            .recv()
            .unwrap_or_else(|_| Err(GpuError::Events("the event thread ended".into())));
        match registered {
            Ok(n) => {
                tracing::info!(gpus = n, "GPU XID events on");
                Ok(EventThread {
                    stop,
                    handle: Some(handle),
                })
            }
            Err(e) => {
                let _ = handle.join();
                Err(e)
            }
        }
    }

    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

impl Drop for EventThread {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A GPU registered for XIDs, recognised in event data by its NVML handle.
struct Watched {
    handle: usize,
    gpu: u32,
    uuid: String,
}

fn xid_thread(
    nvml: &Nvml,
    gpus: &[(u32, String)],
    tx: &Sender<GpuEvent>,
    stop: &AtomicBool,
    ready: SyncSender<Result<usize, GpuError>>,
) {
    let (set, watched) = match register_xids(nvml, gpus) {
        Ok(registered) => registered,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(watched.len()));
    let mut failing = false;
    while !stop.load(Ordering::Relaxed) {
        match set.wait(EVENT_WAIT_MS) {
            Ok(data) => {
                failing = false;
                let unix_ns = now_unix_ns();
                // SAFETY: only the handle's address is read, to compare it.
                let handle = unsafe { data.device.handle() }.addr();
                let (Some(w), Some(xid)) =
                    (watched.iter().find(|w| w.handle == handle), data.event_data)
                else {
                    tracing::debug!(?data.event_type, "event for no watched GPU");
                    continue;
                };
                let xid = match xid {
                    XidError::Value(v) => v,
                    XidError::Unknown => XID_UNKNOWN,
                };
                let event = GpuEvent::Xid {
                    unix_ns,
                    gpu: w.gpu,
                    uuid: w.uuid.clone(),
                    xid,
                };
                if tx.send(event).is_err() {
                    return;
                }
            }
            Err(NvmlError::Timeout) => failing = false,
            Err(e) => {
                if !failing {
                    tracing::warn!("waiting for GPU XID events: {e}");
                }
                failing = true;
                thread::sleep(Duration::from_millis(EVENT_WAIT_MS.into()));
            }
        }
    }
}

/// One event set with every GPU that can report XIDs. NVML frees the set when a
/// registration fails, so a GPU that refuses is dropped and the set built again without it.
fn register_xids<'n>(
    nvml: &'n Nvml,
    gpus: &[(u32, String)],
) -> Result<(EventSet<'n>, Vec<Watched>), GpuError> {
    let mut candidates: Vec<(Device<'n>, Watched)> = Vec::new();
    for (gpu, uuid) in gpus {
        let device = match nvml.device_by_index(*gpu) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(gpu, "no XID events: {e}");
                continue;
            }
        };
        match device.supported_event_types() {
            Ok(types) if types.contains(EventTypes::CRITICAL_XID_ERROR) => {
                // SAFETY: only the handle's address is read, to recognise event data.
                let handle = unsafe { device.handle() }.addr();
                let watched = Watched {
                    handle,
                    gpu: *gpu,
                    uuid: uuid.clone(),
                };
                candidates.push((device, watched));
            }
            Ok(_) => tracing::warn!(gpu, "no XID events: not supported"),
            Err(e) => tracing::warn!(gpu, "no XID events: {e}"),
        }
    }
    loop {
        if candidates.is_empty() {
            return Err(GpuError::Events("no GPU reports XID errors".into()));
        }
        let mut set = Some(
            nvml.create_event_set()
                .map_err(|e| GpuError::Events(e.to_string()))?,
        );
        let mut refused = None;
        for (i, (device, _)) in candidates.iter().enumerate() {
            let Some(s) = set.take() else { break };
            match device.register_events(EventTypes::CRITICAL_XID_ERROR, s) {
                Ok(s) => set = Some(s),
                Err(e) => {
                    refused = Some((i, e.error));
                    break;
                }
            }
        }
        match (set, refused) {
            (Some(set), None) => {
                return Ok((set, candidates.into_iter().map(|(_, w)| w).collect()));
            }
            (_, Some((i, e))) => {
                tracing::warn!(gpu = candidates[i].1.gpu, "no XID events: {e}");
                candidates.remove(i);
            }
            (None, None) => return Err(GpuError::Events("event set lost".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_events_map_to_a_kind_labels_and_a_code() {
        let xid = GpuEvent::Xid {
            unix_ns: UnixNs(7),
            gpu: 3,
            uuid: "GPU-x".into(),
            xid: 79,
        };
        assert_eq!(xid.kind(), "xid");
        assert_eq!(xid.code(), Some(79));
        assert_eq!(xid.unix_ns(), UnixNs(7));
        assert_eq!(xid.labels().get("gpu"), Some("3"));
        assert_eq!(xid.labels().get("uuid"), Some("GPU-x"));
        let lost = GpuEvent::Lost {
            unix_ns: UnixNs(8),
            gpu: 5,
            uuid: "GPU-y".into(),
            reason: "gone".into(),
        };
        assert_eq!(lost.kind(), "gpu_lost");
        assert_eq!(lost.code(), None);
        assert_eq!(lost.labels(), gpu_labels(5, "GPU-y"));
    }
}
