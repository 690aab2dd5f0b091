//! Reading the archive back: by node and time range for queries ([`ArchiveReader::scan`]),
//! and in sequence order from a cursor for remote-write ([`SequentialReader`]).

use std::{
    cmp::Reverse,
    collections::{BTreeSet, BinaryHeap, VecDeque},
    fs::File,
    ops::ControlFlow,
    sync::{Arc, RwLock, RwLockReadGuard},
};

use super::{
    ArchiveError, Record, State,
    open::OpenSegment,
    record::{RecordView, read_block_records},
    sealed::{BlockRef, NodeBlocks, SealedSegment},
};

/// Which nodes a scan reads: decided on the segments' indexes, before any block is read.
#[derive(Clone)]
pub enum NodeSelector {
    All,
    Only(BTreeSet<String>),
    /// The nodes a predicate accepts (a query's matchers on the `node` label).
    Matching(Arc<dyn Fn(&str) -> bool + Send + Sync>),
}

impl std::fmt::Debug for NodeSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeSelector::All => f.write_str("All"),
            NodeSelector::Only(set) => f.debug_tuple("Only").field(set).finish(),
            NodeSelector::Matching(_) => f.write_str("Matching(..)"),
        }
    }
}

impl NodeSelector {
    fn wants(&self, node: &str) -> bool {
        match self {
            NodeSelector::All => true,
            NodeSelector::Only(set) => set.contains(node),
            NodeSelector::Matching(accepts) => accepts(node),
        }
    }
}

/// What a scan reads: nodes and a time range (Unix ns, inclusive).
#[derive(Clone, Debug)]
pub struct ScanFilter {
    pub nodes: NodeSelector,
    pub start_ns: u64,
    pub end_ns: u64,
    /// A range an earlier scan of the same nodes read: a node's records in a segment where
    /// they overlap it are passed over (that scan visited all of them, from the segment's
    /// start). A query reads its own range first, then the look-back a counter's first rate
    /// needs only where the first scan did not go.
    pub read_before: Option<(u64, u64)>,
}

impl ScanFilter {
    /// The nodes of `nodes` over `[start_ns, end_ns]`.
    pub fn new(nodes: NodeSelector, start_ns: u64, end_ns: u64) -> Self {
        Self {
            nodes,
            start_ns,
            end_ns,
            read_before: None,
        }
    }

    /// Whether a node's records in a segment, spanning `[min_ns, max_ns]`, are read.
    fn reads(&self, min_ns: u64, max_ns: u64) -> bool {
        min_ns <= self.end_ns
            && max_ns >= self.start_ns
            && self
                .read_before
                .is_none_or(|(start, end)| min_ns > end || max_ns < start)
    }
}

/// What a scan read: how much of the archive a query touched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanStats {
    /// Sealed segments whose index was read.
    pub segments: usize,
    /// Blocks decompressed.
    pub blocks: usize,
    /// Records visited (from sealed blocks and the open segment).
    pub records: usize,
}

/// Reads the archive; cheap to clone, and sees everything the writer appended.
#[derive(Clone)]
pub struct ArchiveReader {
    shared: Arc<RwLock<State>>,
}

fn open_file(seg: &SealedSegment) -> Result<Option<File>, ArchiveError> {
    match File::open(&seg.path) {
        Ok(f) => Ok(Some(f)),
        // Deleted by retention since the list was taken.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ArchiveError::io(&seg.path, e)),
    }
}

impl ArchiveReader {
    pub(crate) fn new(shared: Arc<RwLock<State>>) -> Self {
        Self { shared }
    }

    fn state(&self) -> RwLockReadGuard<'_, State> {
        self.shared.read().unwrap_or_else(|p| p.into_inner())
    }

    /// What a scan starts from: the sealed segments overlapping `[start_ns, end_ns]` and the
    /// frozen ones (immutable: read without the lock), and the open segment's id (segments
    /// from it on are looked at last, under the lock).
    fn snapshot(
        &self,
        start_ns: u64,
        end_ns: u64,
    ) -> (Vec<Arc<SealedSegment>>, Vec<Arc<OpenSegment>>, u64) {
        let st = self.state();
        let sealed = st
            .sealed
            .iter()
            .filter(|s| s.min_ns <= end_ns && s.max_ns >= start_ns)
            .cloned()
            .collect();
        (sealed, st.frozen.clone(), st.open.id)
    }

    /// Sealed segments with an id from `*from_id` on (sealed since a snapshot was taken)
    /// overlapping `[start_ns, end_ns]`; `*from_id` moves past every one sealed since. None
    /// when none was.
    fn sealed_since(
        &self,
        from_id: &mut u64,
        start_ns: u64,
        end_ns: u64,
    ) -> Option<Vec<Arc<SealedSegment>>> {
        let st = self.state();
        let since = &st.sealed[st.sealed.partition_point(|s| s.id < *from_id)..];
        *from_id = since.last()?.id + 1;
        Some(
            since
                .iter()
                .filter(|s| s.min_ns <= end_ns && s.max_ns >= start_ns)
                .cloned()
                .collect(),
        )
    }

    /// Visits, segment by segment in time order and for each selected node, that node's
    /// records of every segment overlapping the time range, in the order they were appended.
    /// A node's records in a segment are visited from the segment's first one (its schema
    /// record and the frames whose schema entries later frames rely on), up to the last block
    /// that starts before the range ends: the caller filters samples by time. The scan stops
    /// when `visit` breaks. A segment frozen or sealed while the scan runs is read once, in
    /// whichever form it has when the scan gets to it.
    pub fn scan(
        &self,
        filter: &ScanFilter,
        visit: &mut dyn FnMut(&RecordView<'_>) -> ControlFlow<()>,
    ) -> Result<ScanStats, ArchiveError> {
        let mut stats = ScanStats::default();
        let (sealed, frozen, mut from_id) = self.snapshot(filter.start_ns, filter.end_ns);
        if scan_sealed(&sealed, filter, visit, &mut stats)?.is_break() {
            return Ok(stats);
        }
        for seg in &frozen {
            if scan_wal(seg, filter, visit, &mut stats)?.is_break() {
                return Ok(stats);
            }
        }
        loop {
            if let Some(newly) = self.sealed_since(&mut from_id, filter.start_ns, filter.end_ns) {
                if scan_sealed(&newly, filter, visit, &mut stats)?.is_break() {
                    return Ok(stats);
                }
                continue;
            }
            let st = self.state();
            if st.sealed.last().is_some_and(|s| s.id >= from_id) {
                continue; // sealed meanwhile
            }
            for seg in st.wal_segments().filter(|s| s.id >= from_id) {
                if scan_wal(seg, filter, visit, &mut stats)?.is_break() {
                    break;
                }
            }
            return Ok(stats);
        }
    }

    /// The nodes with records in the time range.
    pub fn nodes(&self, start_ns: u64, end_ns: u64) -> Result<BTreeSet<String>, ArchiveError> {
        let mut nodes = BTreeSet::new();
        let in_sealed = |segs: &[Arc<SealedSegment>], nodes: &mut BTreeSet<String>| {
            for seg in segs {
                let Some(file) = open_file(seg)? else {
                    continue;
                };
                for nb in seg.index(&file)? {
                    if nb.min_ns() <= end_ns && nb.max_ns() >= start_ns {
                        nodes.insert(nb.node.to_string());
                    }
                }
            }
            Ok::<_, ArchiveError>(())
        };
        let in_wal = |seg: &OpenSegment, nodes: &mut BTreeSet<String>| {
            for e in &seg.entries {
                if e.first_ns <= end_ns && e.last_ns >= start_ns {
                    nodes.insert(seg.nodes[e.node as usize].to_string());
                }
            }
        };
        let (sealed, frozen, mut from_id) = self.snapshot(start_ns, end_ns);
        in_sealed(&sealed, &mut nodes)?;
        for seg in &frozen {
            in_wal(seg, &mut nodes);
        }
        loop {
            if let Some(newly) = self.sealed_since(&mut from_id, start_ns, end_ns) {
                in_sealed(&newly, &mut nodes)?;
                continue;
            }
            let st = self.state();
            if st.sealed.last().is_some_and(|s| s.id >= from_id) {
                continue;
            }
            for seg in st.wal_segments().filter(|s| s.id >= from_id) {
                in_wal(seg, &mut nodes);
            }
            return Ok(nodes);
        }
    }

    /// The sequence number of the oldest record still kept (retention deletes from there).
    pub fn oldest_seq(&self) -> Option<u64> {
        let st = self.state();
        st.sealed.first().map(|s| s.first_seq).or_else(|| {
            st.wal_segments()
                .find_map(|o| o.entries.first().map(|e| e.seq))
        })
    }

    /// The sequence number the next appended record will get (a cursor there reads only
    /// what comes after now).
    pub fn end_seq(&self) -> u64 {
        let st = self.state();
        let wal: Vec<&OpenSegment> = st.wal_segments().collect();
        wal.iter()
            .rev()
            .find_map(|o| o.entries.last().map(|e| e.seq + 1))
            .or_else(|| st.sealed.last().map(|s| s.last_seq + 1))
            .unwrap_or(0)
    }

    /// When the newest record was received (0 for an empty archive): the last moment the
    /// collector that wrote it was taking frames.
    pub fn last_received_ns(&self) -> u64 {
        let st = self.state();
        let wal = st
            .wal_segments()
            .flat_map(|o| o.entries.iter().map(|e| e.received_ns))
            .max();
        let sealed = st.sealed.iter().map(|s| s.max_received_ns).max();
        wal.max(sealed).unwrap_or(0)
    }

    /// The first record of the oldest segment that holds a record received at or after
    /// `cutoff_ns`: a reader from there sees every record received since (and some before).
    pub fn received_since(&self, cutoff_ns: u64) -> u64 {
        let st = self.state();
        if let Some(s) = st.sealed.iter().find(|s| s.max_received_ns >= cutoff_ns) {
            return s.first_seq;
        }
        let in_wal = st.wal_segments().find_map(|o| {
            o.entries
                .iter()
                .any(|e| e.received_ns >= cutoff_ns)
                .then(|| o.entries.first().map(|e| e.seq))
                .flatten()
        });
        drop(st);
        in_wal.unwrap_or_else(|| self.end_seq())
    }

    /// The sequence number of the first record of the segment that holds `seq`, where that
    /// segment's schema records are (`seq` itself when no kept segment holds it): a reader
    /// that resumes at `seq` reads from there to learn what the series ids stand for.
    pub fn segment_start(&self, seq: u64) -> u64 {
        let st = self.state();
        if let Some(s) = st.sealed.iter().find(|s| s.last_seq >= seq) {
            return s.first_seq.min(seq);
        }
        st.wal_segments()
            .find(|o| o.entries.last().is_some_and(|e| e.seq >= seq))
            .unwrap_or(&st.open)
            .entries
            .first()
            .map_or(seq, |e| e.seq.min(seq))
    }

    /// Reads every record from sequence number `from` on, in sequence order.
    pub fn sequential(&self, from: u64) -> SequentialReader {
        SequentialReader {
            reader: self.clone(),
            next: from,
            skipped: 0,
            merge: None,
        }
    }
}

/// Reads the archive in sequence (= append) order from a cursor, as remote-write follows it:
/// [`position`](Self::position) is the cursor to resume from after a restart. Records that
/// retention deleted before they were read are skipped and counted.
pub struct SequentialReader {
    reader: ArchiveReader,
    next: u64,
    skipped: u64,
    merge: Option<Merge>,
}

/// A sealed segment read in sequence order: its blocks are per node, so the nodes' records
/// are merged, holding one decompressed block per node.
struct Merge {
    seg: Arc<SealedSegment>,
    file: File,
    nodes: Vec<NodeCursor>,
    heads: BinaryHeap<Reverse<(u64, usize)>>,
}

struct NodeCursor {
    node: Arc<str>,
    blocks: Vec<BlockRef>,
    next_block: usize,
    records: VecDeque<Record>,
}

impl Merge {
    fn new(seg: Arc<SealedSegment>, file: File, from: u64) -> Result<Self, ArchiveError> {
        let index: Vec<NodeBlocks> = seg.index(&file)?;
        let mut merge = Merge {
            seg,
            file,
            nodes: Vec::with_capacity(index.len()),
            heads: BinaryHeap::new(),
        };
        for nb in index {
            let next_block = nb.blocks.partition_point(|b| b.last_seq < from);
            merge.nodes.push(NodeCursor {
                node: nb.node,
                blocks: nb.blocks,
                next_block,
                records: VecDeque::new(),
            });
            let ix = merge.nodes.len() - 1;
            merge.refill(ix, from)?;
        }
        Ok(merge)
    }

    /// Loads node `ix`'s next block if its records ran out, and queues its head.
    fn refill(&mut self, ix: usize, from: u64) -> Result<(), ArchiveError> {
        let n = &mut self.nodes[ix];
        while n.records.is_empty() && n.next_block < n.blocks.len() {
            let raw = self.seg.read_block(&self.file, &n.blocks[n.next_block])?;
            n.next_block += 1;
            n.records.extend(
                read_block_records(&raw, "")
                    .flatten()
                    .filter(|r| r.seq >= from)
                    .map(|r| r.to_record(n.node.clone())),
            );
        }
        if let Some(r) = n.records.front() {
            self.heads.push(Reverse((r.seq, ix)));
        }
        Ok(())
    }

    fn pop(&mut self, from: u64) -> Result<Option<Record>, ArchiveError> {
        let Some(Reverse((_, ix))) = self.heads.pop() else {
            return Ok(None);
        };
        let r = self.nodes[ix].records.pop_front().expect("queued head");
        self.refill(ix, from)?;
        Ok(Some(r))
    }
}

impl SequentialReader {
    /// The cursor: the sequence number of the next record this reader returns.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// Records retention deleted before this reader got to them.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Up to `max` next records in sequence order; empty when it has read everything
    /// appended so far (call again later for more).
    pub fn next_batch(&mut self, max: usize) -> Result<Vec<Record>, ArchiveError> {
        let mut out = Vec::new();
        while out.len() < max {
            if let Some(merge) = &mut self.merge {
                match merge.pop(self.next)? {
                    Some(r) => {
                        self.next = r.seq + 1;
                        out.push(r);
                    }
                    None => {
                        self.next = self.next.max(merge.seg.last_seq + 1);
                        self.merge = None;
                    }
                }
                continue;
            }
            let st = self.reader.state();
            if let Some(seg) = st.sealed.iter().find(|s| s.last_seq >= self.next).cloned() {
                drop(st);
                if seg.first_seq > self.next {
                    self.skipped += seg.first_seq - self.next;
                    self.next = seg.first_seq;
                }
                match open_file(&seg)? {
                    Some(file) => self.merge = Some(Merge::new(seg, file, self.next)?),
                    None => continue, // deleted meanwhile: the next one is found next turn
                }
                continue;
            }
            let mut first_wal = st.sealed.is_empty();
            for open in st.wal_segments() {
                if out.len() >= max {
                    break;
                }
                let start = open.entries.partition_point(|e| e.seq < self.next);
                if let Some(first) = open.entries.get(start)
                    && first.seq > self.next
                    && first_wal
                    && start == 0
                {
                    self.skipped += first.seq - self.next;
                }
                if !open.entries.is_empty() {
                    first_wal = false;
                }
                for e in open.entries[start..].iter().take(max - out.len()) {
                    out.push(open.record(e)?);
                    self.next = e.seq + 1;
                }
            }
            break;
        }
        Ok(out)
    }
}

/// Visits the selected nodes' records of the sealed segments `segs` (see `scan`).
fn scan_sealed(
    segs: &[Arc<SealedSegment>],
    filter: &ScanFilter,
    visit: &mut dyn FnMut(&RecordView<'_>) -> ControlFlow<()>,
    stats: &mut ScanStats,
) -> Result<ControlFlow<()>, ArchiveError> {
    for seg in segs {
        let Some(file) = open_file(seg)? else {
            continue;
        };
        stats.segments += 1;
        for nb in seg.index_of(&file, &|node| filter.nodes.wants(node))? {
            if !filter.reads(nb.min_ns(), nb.max_ns()) {
                continue;
            }
            for block in nb.blocks.iter().filter(|b| b.min_ns <= filter.end_ns) {
                let raw = seg.read_block(&file, block)?;
                stats.blocks += 1;
                for r in read_block_records(&raw, &nb.node).flatten() {
                    stats.records += 1;
                    if visit(&r).is_break() {
                        return Ok(ControlFlow::Break(()));
                    }
                }
            }
        }
    }
    Ok(ControlFlow::Continue(()))
}

/// Visits the selected nodes' records of an open (or frozen) segment (see `scan`).
fn scan_wal(
    open: &OpenSegment,
    filter: &ScanFilter,
    visit: &mut dyn FnMut(&RecordView<'_>) -> ControlFlow<()>,
    stats: &mut ScanStats,
) -> Result<ControlFlow<()>, ArchiveError> {
    let wanted: Vec<bool> = open.nodes.iter().map(|n| filter.nodes.wants(n)).collect();
    // Whether each node has a record in the range, and one in the range read before.
    let mut in_range = vec![false; open.nodes.len()];
    let mut read_before = vec![false; open.nodes.len()];
    for e in &open.entries {
        let n = e.node as usize;
        in_range[n] |= e.first_ns <= filter.end_ns && e.last_ns >= filter.start_ns;
        read_before[n] |= filter
            .read_before
            .is_some_and(|(start, end)| e.first_ns <= end && e.last_ns >= start);
    }
    let read: Vec<bool> = (0..open.nodes.len())
        .map(|n| wanted[n] && in_range[n] && !read_before[n])
        .collect();
    for e in &open.entries {
        if !read[e.node as usize] || e.first_ns > filter.end_ns {
            continue;
        }
        let bytes = open.entry_bytes(e)?;
        let (r, _) = super::record::read_entry(&bytes).map_err(|_| ArchiveError::Corrupt {
            path: open.path.clone(),
            what: format!("entry at byte {}", e.offset),
        })?;
        stats.records += 1;
        if visit(&r).is_break() {
            return Ok(ControlFlow::Break(()));
        }
    }
    Ok(ControlFlow::Continue(()))
}
