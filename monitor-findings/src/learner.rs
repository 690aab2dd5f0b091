//! The golden profile, learnt off the tick thread.
//!
//! Learning the profile reads every node's hardware path, votes each class's majority and
//! judges every node against it: at 12,500 nodes about 2 s, which on the tick thread made the
//! pass that learnt it the longest tick by far (bench/results/findings-tick.md). So the tick
//! hands a worker thread ("findings-profile") only what changed: the hardware series of the
//! nodes whose hardware series appeared, changed value or went since the last hand-over
//! (cheap: a series is two reference counts). The worker keeps each node's hardware path,
//! reads again only those nodes, learns, publishes the profile on the board and answers with
//! what its rules saw and the paths the affinity rule reads.
//!
//! The tick takes the answer at its next full pass, waiting for it if the worker is not done
//! (it has a whole tick, 5 s by default, to learn): the profile's findings come one pass after
//! the hardware they judge, the same pass whatever the worker's pace, so the findings are
//! the same on a loaded machine as on an idle one.

use std::{
    collections::HashMap,
    panic::AssertUnwindSafe,
    sync::{
        Arc,
        mpsc::{Receiver, Sender},
    },
    thread::JoinHandle,
};

use monitor_wire::Series;

use super::{
    Observation,
    hardware::{HardwareReader, NodeHardware},
    profile::{GoldenProfile, ProfileBoard},
};
use crate::live_table::Latest;

/// Each node's hardware path, as the profile last read it.
pub(crate) type FleetHardware = HashMap<Arc<str>, Arc<NodeHardware>>;

/// The hardware series of the nodes read again: each node with its every hardware series and
/// latest value (none: the node has no hardware series any more, and is forgotten).
pub(crate) type HardwareUpdate = Vec<(Arc<str>, Vec<(Series, Latest)>)>;

/// What a learning found.
pub(crate) struct Learnt {
    /// What the profile's rules saw.
    pub seen: Vec<Observation>,
    /// Each node's hardware path.
    pub hardware: FleetHardware,
    /// The worker failed (a bug: it is logged) and forgot the fleet: the next hand-over must
    /// name every node.
    pub forgot: bool,
}

impl Learnt {
    fn forgotten() -> Self {
        Self {
            seen: Vec::new(),
            hardware: FleetHardware::new(),
            forgot: true,
        }
    }
}

/// The worker's side: the fleet's hardware paths between learnings.
struct Profiler {
    nodes: FleetHardware,
    min_nodes: usize,
    board: Arc<ProfileBoard>,
}

impl Profiler {
    /// Reads the nodes of `update` again, learns the profile, publishes it and judges every
    /// node against it.
    fn learn(&mut self, update: HardwareUpdate) -> Learnt {
        for (node, series) in update {
            let mut reader = HardwareReader::default();
            for (series, latest) in &series {
                reader.take(series, latest);
            }
            if reader.is_empty() {
                self.nodes.remove(&node);
            } else {
                self.nodes.insert(node, Arc::new(reader.finish()));
            }
        }
        let golden = GoldenProfile::learn(
            self.nodes.iter().map(|(n, hw)| (&**n, &**hw)),
            self.min_nodes,
        );
        let mut seen = Vec::new();
        for (node, hw) in &self.nodes {
            golden.evaluate(node, hw, &mut seen);
        }
        self.board.publish(golden);
        Learnt {
            seen,
            hardware: self.nodes.clone(),
            forgot: false,
        }
    }

    /// [`learn`](Self::learn), and a panic of it caught: logged, the fleet forgotten, and an
    /// empty answer that says so (the daemon never dies because one rule failed).
    fn learn_or_forget(&mut self, update: HardwareUpdate) -> Learnt {
        match std::panic::catch_unwind(AssertUnwindSafe(|| self.learn(update))) {
            Ok(learnt) => learnt,
            Err(_) => {
                tracing::error!(
                    "learning the golden profile failed (a bug); the fleet's hardware is read \
                     again at the next learning"
                );
                self.nodes.clear();
                Learnt::forgotten()
            }
        }
    }
}

/// The worker thread, once started.
struct Worker {
    updates: Sender<HardwareUpdate>,
    learnt: Receiver<Learnt>,
    _thread: JoinHandle<()>,
}

/// The tick's side: hands hardware to the worker and takes what it learnt.
pub(crate) struct ProfileLearner {
    min_nodes: usize,
    board: Arc<ProfileBoard>,
    worker: Option<Worker>,
    /// A hand-over the worker has not answered yet.
    pending: bool,
    /// An answer already here: learnt on the tick thread where no worker could be started
    /// (`inline` is then that thread's profiler), or the worker found gone.
    ready: Option<Learnt>,
    inline: Option<Profiler>,
}

impl ProfileLearner {
    pub(crate) fn new(min_nodes: usize, board: Arc<ProfileBoard>) -> Self {
        Self {
            min_nodes,
            board,
            worker: None,
            pending: false,
            ready: None,
            inline: None,
        }
    }

    /// Publishes on `board` from now on (before anything was handed over).
    pub(crate) fn set_board(&mut self, board: Arc<ProfileBoard>) {
        self.board = board;
    }

    fn profiler(&self) -> Profiler {
        Profiler {
            nodes: FleetHardware::new(),
            min_nodes: self.min_nodes,
            board: self.board.clone(),
        }
    }

    fn start(&self) -> std::io::Result<Worker> {
        let (updates, updates_rx) = std::sync::mpsc::channel::<HardwareUpdate>();
        let (learnt_tx, learnt) = std::sync::mpsc::channel();
        let mut profiler = self.profiler();
        let thread = std::thread::Builder::new()
            .name("findings-profile".into())
            .spawn(move || {
                // Ends when the learner (the engine) is dropped.
                for update in updates_rx {
                    if learnt_tx.send(profiler.learn_or_forget(update)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Worker {
            updates,
            learnt,
            _thread: thread,
        })
    }

    /// Hands `update` over (starting the worker the first time); what it learnt comes from the
    /// next [`take`](Self::take). One hand-over at a time: the caller takes before it hands.
    pub(crate) fn hand(&mut self, update: HardwareUpdate) {
        debug_assert!(!self.pending && self.ready.is_none(), "an answer not taken");
        if self.worker.is_none() && self.inline.is_none() {
            match self.start() {
                Ok(worker) => self.worker = Some(worker),
                Err(e) => {
                    tracing::error!(
                        "starting the golden profile's thread: {e}; it is learnt on the tick \
                         thread"
                    );
                    self.inline = Some(self.profiler());
                }
            }
        }
        if let Some(profiler) = &mut self.inline {
            self.ready = Some(profiler.learn_or_forget(update));
        } else if let Some(worker) = &self.worker {
            if worker.updates.send(update).is_ok() {
                self.pending = true;
            } else {
                self.worker = None;
                self.ready = Some(Learnt::forgotten());
            }
        }
    }

    /// What the last hand-over learnt, waiting for the worker if it is not done; None if
    /// nothing was handed over since the last take.
    pub(crate) fn take(&mut self) -> Option<Learnt> {
        if let Some(ready) = self.ready.take() {
            return Some(ready);
        }
        if !std::mem::take(&mut self.pending) {
            return None;
        }
        let answer = self.worker.as_ref()?.learnt.recv();
        Some(answer.unwrap_or_else(|_| {
            // Gone (it catches its own panics, so this is not expected): another starts at
            // the next hand-over, which must name the whole fleet.
            self.worker = None;
            Learnt::forgotten()
        }))
    }
}
