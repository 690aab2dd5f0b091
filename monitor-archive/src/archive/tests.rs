//! The archive against what a user of it checks: every frame back, by node and time, from
//! only the segments needed; a torn tail cut; a SIGKILLed writer losing nothing it wrote out;
//! retention; a full disk.

use std::{
    collections::HashMap,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use monitor_wire::{Key, ReceiverState, decode};

use monitor_testkit::node_frames::{self, NodeFrame, NodeSender};

use super::*;

const T0: u64 = 1_790_000_000_000_000_000;

fn key() -> Key {
    Key::from_bytes([7; 32])
}

fn config(dir: &Path) -> ArchiveConfig {
    ArchiveConfig {
        segment_bytes: 64 << 10,
        segment_span: Duration::from_secs(1 << 40),
        retention_age: None,
        ..ArchiveConfig::new(dir)
    }
}

/// Frames of `nodes` simulated nodes (about 280 B a second each) over `seconds`, in the order they arrive.
struct Fleet {
    senders: HashMap<String, NodeSender>,
    frames: Vec<(String, NodeFrame)>,
}

impl Fleet {
    fn new(nodes: usize, seconds: u64) -> Self {
        let mut senders = HashMap::new();
        let mut frames = Vec::new();
        for n in 0..nodes {
            let name = format!("gpu-node-{n:03}");
            let mut s = NodeSender::new(&name, n as u64 + 1, key());
            frames.extend(
                s.run(T0, seconds, 10)
                    .into_iter()
                    .map(|f| (name.clone(), f)),
            );
            senders.insert(name, s);
        }
        frames.sort_by_key(|(_, f)| f.received_ns);
        Fleet { senders, frames }
    }

    fn schema(&self) -> impl Fn(&str) -> Option<Vec<u8>> + '_ {
        |node| self.senders[node].schema_frame()
    }

    fn append(&self, archive: &mut Archive, frames: &[(String, NodeFrame)]) {
        for (i, (node, f)) in frames.iter().enumerate() {
            archive.append(&accepted(node, f), &self.schema()).unwrap();
            if i % 10 == 9 {
                archive.tick().unwrap();
            }
        }
        archive.tick().unwrap();
    }

    /// Appends as a writer at a real pace would: the sealer keeps up (it seals each segment
    /// before the next one is full).
    fn append_paced(&self, archive: &mut Archive, frames: &[(String, NodeFrame)]) {
        for chunk in frames.chunks(20) {
            self.append(archive, chunk);
            archive.wait_for_sealer().unwrap();
        }
    }

    fn of(&self, node: &str) -> Vec<&NodeFrame> {
        self.frames
            .iter()
            .filter(|(n, _)| n == node)
            .map(|(_, f)| f)
            .collect()
    }
}

fn accepted<'a>(node: &'a str, f: &'a NodeFrame) -> AcceptedFrame<'a> {
    AcceptedFrame {
        node,
        received_ns: f.received_ns,
        first_ns: f.first_ns,
        last_ns: f.last_ns,
        bytes: &f.bytes,
    }
}

fn only(node: &str) -> NodeSelector {
    NodeSelector::Only([node.to_owned()].into())
}

/// Every record the scan visits: (kind, node, bytes).
fn scan_all(
    reader: &ArchiveReader,
    filter: &ScanFilter,
) -> (Vec<(RecordKind, String, Vec<u8>)>, ScanStats) {
    let mut seen = Vec::new();
    let stats = reader
        .scan(filter, &mut |r| {
            seen.push((r.kind, r.node.to_owned(), r.bytes.to_vec()));
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
    (seen, stats)
}

fn frames_only(seen: &[(RecordKind, String, Vec<u8>)]) -> Vec<&[u8]> {
    seen.iter()
        .filter(|(k, _, _)| *k == RecordKind::Frame)
        .map(|(_, _, b)| &b[..])
        .collect()
}

fn sealed_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "seg")
        })
        .count()
}

/// A collector restarted after an outage longer than [`HELD_HORIZON`](super::recent::HELD_HORIZON) still
/// knows the frames it took in its last minutes (so it refuses the agents' copies of them
/// instead of storing them twice): the horizon runs back from the newest record.
#[test]
fn a_collector_back_after_a_long_outage_knows_the_frames_of_its_last_minutes() {
    let tmp = tempfile::tempdir().unwrap();
    // Records received in 2026-09, long before this test runs (any "now"-based horizon
    // would find none of them).
    let fleet = Fleet::new(2, 1200);
    let mut archive = Archive::open(config(tmp.path())).unwrap();
    fleet.append_paced(&mut archive, &fleet.frames);
    drop(archive);
    let archive = Archive::open(config(tmp.path())).unwrap();
    let reader = archive.reader();
    let newest = fleet
        .frames
        .iter()
        .map(|(_, f)| f.received_ns)
        .max()
        .unwrap();
    assert_eq!(reader.last_received_ns(), newest);

    let horizon = super::recent::HELD_HORIZON.as_nanos() as u64;
    let held = super::recent::held_in_archive(&reader).unwrap();
    for node in ["gpu-node-000", "gpu-node-001"] {
        let (_, seqs) = &held[node];
        for f in fleet.of(node) {
            let (_, seq) = monitor_wire::peek_sequence(&f.bytes).unwrap();
            if f.received_ns + horizon >= newest {
                assert!(
                    seqs.contains(seq),
                    "{node}: frame {seq} of the last 10 min not held"
                );
            }
        }
    }
}

/// The same after a SIGKILL: what the writer had synced, in its open segment's log only,
/// is known as held when the collector starts again.
#[test]
fn a_collector_killed_knows_the_frames_it_had_synced() {
    let tmp = tempfile::tempdir().unwrap();
    let fleet = Fleet::new(1, 20);
    let mut archive = Archive::open(config(tmp.path())).unwrap();
    fleet.append(&mut archive, &fleet.frames);
    std::thread::sleep(Duration::from_millis(1100));
    archive.tick().unwrap(); // the 1 s sync
    std::mem::forget(archive); // killed: no freeze, no seal
    let archive = Archive::open(config(tmp.path())).unwrap();
    let reader = archive.reader();
    let newest = fleet
        .frames
        .iter()
        .map(|(_, f)| f.received_ns)
        .max()
        .unwrap();
    assert_eq!(reader.last_received_ns(), newest);
    let held = super::recent::held_in_archive(&reader).unwrap();
    let (_, seqs) = &held["gpu-node-000"];
    assert_eq!(seqs.end(), fleet.frames.len() as u64, "{seqs:?}");
}

#[test]
fn frames_read_back_by_node_and_time_range_from_only_the_segments_they_need() {
    let tmp = tempfile::tempdir().unwrap();
    let fleet = Fleet::new(3, 600);
    let mut archive = Archive::open(config(tmp.path())).unwrap();
    fleet.append_paced(&mut archive, &fleet.frames);
    let sealed = sealed_count(tmp.path());
    assert!(
        sealed >= 5,
        "expected several sealed segments, got {sealed}"
    );
    let reader = archive.reader();

    // One node, all time: exactly its frames, in order.
    let all = ScanFilter::new(only("gpu-node-001"), 0, u64::MAX);
    let (seen, stats) = scan_all(&reader, &all);
    let want: Vec<&[u8]> = fleet
        .of("gpu-node-001")
        .iter()
        .map(|f| &f.bytes[..])
        .collect();
    assert_eq!(frames_only(&seen), want);
    assert!(seen.iter().all(|(_, n, _)| n == "gpu-node-001"));
    assert_eq!(stats.segments, sealed);

    // Twenty seconds of one node: one or two segments, every frame of the range, and each
    // frame's samples decode with the schema read from its own segment.
    let (start, end) = (T0 + 300_000_000_000, T0 + 320_000_000_000);
    let narrow = ScanFilter::new(only("gpu-node-002"), start, end);
    let (seen, stats) = scan_all(&reader, &narrow);
    assert!(stats.segments <= 2, "read {} segments", stats.segments);
    let got = frames_only(&seen);
    for f in fleet.of("gpu-node-002") {
        if f.first_ns <= end && f.last_ns >= start {
            assert!(
                got.contains(&&f.bytes[..]),
                "a frame of the range is missing"
            );
        }
    }
    let mut schema = std::collections::HashSet::new();
    let mut in_range_samples = 0;
    for (_, _, bytes) in &seen {
        let frame = decode(bytes, &key(), &mut ReceiverState::default()).unwrap();
        schema.extend(frame.schema.iter().map(|e| e.id));
        let (lo, hi) = node_frames::time_range(&frame).unwrap_or((0, 0));
        if lo <= end && hi >= start {
            for s in &frame.samples {
                assert!(schema.contains(&s.id), "series id {} has no schema", s.id);
                in_range_samples += s.data.len();
            }
        }
    }
    let series = fleet.senders["gpu-node-002"].series();
    assert!(
        in_range_samples >= 20 * series,
        "{in_range_samples} samples in range"
    );
}

#[test]
fn reopening_keeps_every_record_and_sequence_numbers_go_on() {
    let tmp = tempfile::tempdir().unwrap();
    let fleet = Fleet::new(2, 300);
    let (first, second) = fleet.frames.split_at(fleet.frames.len() / 2);
    {
        let mut archive = Archive::open(config(tmp.path())).unwrap();
        fleet.append(&mut archive, first);
    }
    let mut archive = Archive::open(config(tmp.path())).unwrap();
    assert_eq!(archive.stats().torn_tails_cut, 0);
    fleet.append(&mut archive, second);
    let records = archive
        .reader()
        .sequential(0)
        .next_batch(usize::MAX)
        .unwrap();
    let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (0..records.len() as u64).collect::<Vec<_>>());
    let frames: Vec<&[u8]> = records
        .iter()
        .filter(|r| r.kind == RecordKind::Frame)
        .map(|r| &r.bytes[..])
        .collect();
    let want: Vec<&[u8]> = fleet.frames.iter().map(|(_, f)| &f.bytes[..]).collect();
    assert_eq!(frames, want);
    assert_eq!(archive.stats().records, records.len() as u64);
}

fn wal_file(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "wal"))
        .expect("an open segment")
}

#[test]
fn a_torn_tail_is_cut_at_start_up_and_the_records_before_it_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let fleet = Fleet::new(1, 240);
    let frames = &fleet.frames[..40];
    let cfg = ArchiveConfig {
        segment_bytes: 1 << 30,
        ..config(tmp.path())
    };
    {
        let mut archive = Archive::open(cfg.clone()).unwrap();
        fleet.append(&mut archive, frames);
    }
    // The last entry cut short, as a crash in the middle of a write leaves it.
    let wal = wal_file(tmp.path());
    let len = std::fs::metadata(&wal).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&wal)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    let mut archive = Archive::open(cfg.clone()).unwrap();
    assert_eq!(archive.stats().torn_tails_cut, 1);
    let back = archive
        .reader()
        .sequential(0)
        .next_batch(usize::MAX)
        .unwrap();
    // The schema record and the first 39 frames.
    assert_eq!(back.len(), 40);
    let want: Vec<&[u8]> = frames[..39].iter().map(|(_, f)| &f.bytes[..]).collect();
    let got: Vec<&[u8]> = back[1..].iter().map(|r| &r.bytes[..]).collect();
    assert_eq!(got, want);
    // Appending goes on after the cut, and a flipped byte in the last entry is cut too.
    fleet.append(&mut archive, &fleet.frames[40..45]);
    drop(archive);
    let len = std::fs::metadata(&wal).unwrap().len();
    let mut bytes = std::fs::read(&wal).unwrap();
    bytes[len as usize - 10] ^= 0xff;
    std::fs::write(&wal, &bytes).unwrap();
    let archive = Archive::open(cfg).unwrap();
    assert_eq!(archive.stats().torn_tails_cut, 1);
    let back = archive
        .reader()
        .sequential(0)
        .next_batch(usize::MAX)
        .unwrap();
    assert_eq!(back.len(), 44);
    assert_eq!(back[43].bytes, fleet.frames[43].1.bytes);
}

/// The child side of the SIGKILL test: appends the frames of `frames.bin` from where the
/// archive stands, ticking every 5 frames and printing how many frames were written out.
#[test]
#[ignore = "run by sigkill_mid_append_loses_nothing_written_out, in a child process"]
fn sigkill_child_writer() {
    let Ok(dir) = std::env::var("RAILSCOPE_ARCHIVE_CHILD_DIR") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let frames = read_frames(&dir.join("frames.bin"));
    let cfg = ArchiveConfig {
        segment_bytes: 64 << 10,
        ..config(&dir.join("archive"))
    };
    let mut archive = Archive::open(cfg).unwrap();
    let done = archive
        .reader()
        .sequential(0)
        .next_batch(usize::MAX)
        .unwrap()
        .len();
    let mut out = std::io::stdout().lock();
    for (i, f) in frames.iter().enumerate().skip(done) {
        archive
            .append(&accepted("gpu-node-000", f), &|_| None)
            .unwrap();
        if i % 5 == 4 {
            archive.tick().unwrap();
            writeln!(out, "written {}", i + 1).unwrap();
            out.flush().unwrap();
        }
    }
    archive.tick().unwrap();
    writeln!(out, "finished").unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

fn write_frames(path: &Path, frames: &[(String, NodeFrame)]) {
    let mut b = Vec::new();
    for (_, f) in frames {
        for v in [f.received_ns, f.first_ns, f.last_ns, f.bytes.len() as u64] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&f.bytes);
    }
    std::fs::write(path, b).unwrap();
}

fn read_frames(path: &Path) -> Vec<NodeFrame> {
    let b = std::fs::read(path).unwrap();
    let mut at = 0;
    let mut out = Vec::new();
    let u = |at: &mut usize| {
        let v = u64::from_le_bytes(b[*at..*at + 8].try_into().unwrap());
        *at += 8;
        v
    };
    while at < b.len() {
        let (received_ns, first_ns, last_ns, len) =
            (u(&mut at), u(&mut at), u(&mut at), u(&mut at));
        out.push(NodeFrame {
            bytes: b[at..at + len as usize].to_vec(),
            received_ns,
            first_ns,
            last_ns,
            samples: 0,
        });
        at += len as usize;
    }
    out
}

#[test]
fn sigkill_mid_append_loses_nothing_written_out() {
    let tmp = tempfile::tempdir().unwrap();
    let fleet = Fleet::new(1, 900);
    write_frames(&tmp.path().join("frames.bin"), &fleet.frames);
    let total = fleet.frames.len();
    // Kill the writer at three points (some of them in the middle of a seal), then let it
    // finish; after each kill the archive must hold at least every frame written out, as a
    // prefix of what was sent, in order.
    for (round, kill_after) in [total / 5, total / 2, total * 4 / 5, usize::MAX]
        .into_iter()
        .enumerate()
    {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "archive::tests::sigkill_child_writer",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("RAILSCOPE_ARCHIVE_CHILD_DIR", tmp.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut acked = 0;
        for line in BufReader::new(child.stdout.take().unwrap()).lines() {
            let line = line.unwrap();
            if line == "finished" {
                acked = total;
                break;
            }
            if let Some(n) = line.strip_prefix("written ") {
                acked = n.parse().unwrap();
                if acked >= kill_after {
                    break;
                }
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let archive = Archive::open(config(&tmp.path().join("archive"))).unwrap();
        let back = archive
            .reader()
            .sequential(0)
            .next_batch(usize::MAX)
            .unwrap();
        assert!(
            back.len() >= acked,
            "round {round}: {} frames back, {acked} were written out",
            back.len()
        );
        for (i, r) in back.iter().enumerate() {
            assert_eq!(r.seq, i as u64, "round {round}");
            assert_eq!(r.bytes, fleet.frames[i].1.bytes, "round {round}: frame {i}");
        }
        if kill_after == usize::MAX {
            assert_eq!(back.len(), total);
        }
    }
}

#[test]
fn retention_deletes_the_oldest_segments_by_size_and_by_age() {
    let tmp = tempfile::tempdir().unwrap();
    let fleet = Fleet::new(2, 1200);
    let mut archive = Archive::open(ArchiveConfig {
        // Segments of about 40 s of the two nodes (the by-age check below allows one).
        segment_bytes: 24 << 10,
        retention_bytes: Some(128 << 10),
        ..config(tmp.path())
    })
    .unwrap();
    fleet.append_paced(&mut archive, &fleet.frames);
    let stats = archive.stats();
    assert!(stats.segments_deleted > 0, "nothing was deleted: {stats:?}");
    assert!(stats.bytes_on_disk <= 128 << 10, "{stats:?}");
    // What is left is the newest records, to the last one.
    let reader = archive.reader();
    let mut seq = reader.sequential(0);
    let back = seq.next_batch(usize::MAX).unwrap();
    assert_eq!(seq.skipped(), reader.oldest_seq().unwrap());
    assert!(seq.skipped() > 0);
    let frames: Vec<&[u8]> = back
        .iter()
        .filter(|r| r.kind == RecordKind::Frame)
        .map(|r| &r.bytes[..])
        .collect();
    let want: Vec<&[u8]> = fleet.frames.iter().map(|(_, f)| &f.bytes[..]).collect();
    assert!(
        want.ends_with(&frames),
        "the newest frames must all be kept"
    );

    // By age: segments whose newest record is older than the cut-off go, the rest stay.
    archive.config.retention_bytes = None;
    archive.config.retention_age = Some(Duration::from_secs(3600));
    let sealed_before = sealed_count(tmp.path());
    let mid = back[back.len() / 2].received_ns;
    let deleted = archive.apply_retention(mid + 3_600_000_000_000);
    assert!(
        deleted > 0 && deleted < sealed_before,
        "deleted {deleted} of {sealed_before}"
    );
    let after = archive
        .reader()
        .sequential(0)
        .next_batch(usize::MAX)
        .unwrap();
    assert!(after.iter().all(|r| r.received_ns >= mid - 60_000_000_000));
    assert_eq!(after.last().unwrap().seq, back.last().unwrap().seq);
}

#[test]
fn sequential_reader_resumes_from_its_cursor_across_sealed_and_open_segments() {
    let tmp = tempfile::tempdir().unwrap();
    let fleet = Fleet::new(3, 300);
    let (first, second) = fleet.frames.split_at(fleet.frames.len() * 3 / 4);
    let mut archive = Archive::open(config(tmp.path())).unwrap();
    fleet.append(&mut archive, first);
    let reader = archive.reader();
    let mut all = Vec::new();
    let mut seq = reader.sequential(0);
    loop {
        let batch = seq.next_batch(97).unwrap();
        if batch.is_empty() {
            break;
        }
        all.extend(batch);
    }
    assert_eq!(seq.position(), reader.end_seq());
    // A reader made from a cursor in the middle resumes exactly there.
    let cursor = all[all.len() / 3].seq;
    let rest = reader.sequential(cursor).next_batch(usize::MAX).unwrap();
    assert_eq!(rest[..], all[all.len() / 3..]);
    // New appends show up on the next call.
    fleet.append(&mut archive, second);
    let more = seq.next_batch(usize::MAX).unwrap();
    all.extend(more);
    let seqs: Vec<u64> = all.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (0..all.len() as u64).collect::<Vec<_>>());
    let frames: Vec<&[u8]> = all
        .iter()
        .filter(|r| r.kind == RecordKind::Frame)
        .map(|r| &r.bytes[..])
        .collect();
    let want: Vec<&[u8]> = fleet.frames.iter().map(|(_, f)| &f.bytes[..]).collect();
    assert_eq!(frames, want);
}

/// A small tmpfs, so the disk really fills. Needs root (the project's tests run as root).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: PathBuf, size: &str) -> Option<Self> {
        std::fs::create_dir_all(&at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs(at))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_stops_archiving_with_a_clear_error_and_it_resumes_when_space_is_freed() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(fs) = Tmpfs::mount(tmp.path().join("small"), "2m") else {
        assert_ne!(
            unsafe_geteuid(),
            0,
            "mounting a tmpfs failed although we are root"
        );
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    };
    // A filler leaves little room.
    let filler = fs.0.join("filler");
    std::fs::write(&filler, vec![1u8; 1700 << 10]).unwrap();
    let fleet = Fleet::new(1, 3600);
    let mut archive = Archive::open(ArchiveConfig {
        segment_bytes: 1 << 30,
        max_unwritten_bytes: 64 << 10,
        ..config(&fs.0.join("archive"))
    })
    .unwrap();
    let mut full_at = None;
    let mut dropped_seen = false;
    for (i, (node, f)) in fleet.frames.iter().enumerate() {
        match archive.append(&accepted(node, f), &fleet.schema()) {
            Ok(()) => {}
            Err(e @ ArchiveError::Dropped { .. }) => {
                assert!(e.to_string().contains("disk full"), "{e}");
                dropped_seen = true;
            }
            Err(e) => assert!(e.is_disk_full(), "{e}"),
        }
        if let Err(e) = archive.tick() {
            assert!(e.is_disk_full(), "{e}");
            assert!(e.to_string().contains("small/archive"), "{e}");
            full_at.get_or_insert(i);
        }
        if dropped_seen && i > full_at.unwrap_or(0) + 100 {
            break;
        }
    }
    let full_at = full_at.expect("the disk never filled");
    assert!(dropped_seen);
    let stats = archive.stats();
    assert!(
        stats
            .failing
            .as_deref()
            .is_some_and(|f| f.contains("disk full"))
    );
    assert!(stats.dropped_records > 0 && stats.write_errors > 0);
    // Space comes back: the next tick writes what waits, and later frames are kept.
    std::fs::remove_file(&filler).unwrap();
    archive.tick().unwrap();
    let later = &fleet.frames[full_at + 200..full_at + 220];
    fleet.append(&mut archive, later);
    assert_eq!(archive.stats().failing, None);
    drop(archive);
    let archive = Archive::open(config(&fs.0.join("archive"))).unwrap();
    assert_eq!(archive.stats().torn_tails_cut, 0, "no half entry was left");
    let back = archive
        .reader()
        .sequential(0)
        .next_batch(usize::MAX)
        .unwrap();
    let got: Vec<&[u8]> = back.iter().map(|r| &r.bytes[..]).collect();
    for (_, f) in later {
        assert!(got.contains(&&f.bytes[..]));
    }
    // Every frame before the disk filled is there, in order.
    for (i, (_, f)) in fleet.frames[..full_at.saturating_sub(50)]
        .iter()
        .enumerate()
    {
        assert_eq!(got[i + 1], &f.bytes[..]);
    }
}

fn unsafe_geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe extern "C" {
        fn geteuid() -> u32;
    }
    unsafe { geteuid() }
}

fn files_with(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_str().is_some_and(|s| s.ends_with(ext)))
        .collect();
    files.sort();
    files
}

/// Every frame the archive gives back in sequence order, each record's seq checked to be
/// the next one (nothing doubled, nothing missing in between).
fn frames_back(archive: &Archive) -> Vec<Vec<u8>> {
    let records = archive
        .reader()
        .sequential(0)
        .next_batch(usize::MAX)
        .unwrap();
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.seq, i as u64, "records out of sequence");
    }
    records
        .into_iter()
        .filter(|r| r.kind == RecordKind::Frame)
        .map(|r| r.bytes)
        .collect()
}

fn sent(frames: &[(String, NodeFrame)]) -> Vec<Vec<u8>> {
    frames.iter().map(|(_, f)| f.bytes.clone()).collect()
}

#[test]
fn appends_go_on_and_are_read_back_while_the_sealer_is_slow() {
    let tmp = tempfile::tempdir().unwrap();
    let fleet = Fleet::new(2, 600);
    let cfg = ArchiveConfig {
        segment_bytes: 64 << 10,
        ..config(tmp.path())
    };
    let mut archive = Archive::open(cfg).unwrap();
    let reader = archive.reader();
    // The sealer stands still (a seal that takes long): the writer freezes full segments up
    // to MAX_FROZEN, then the open segment grows; every append lands and is read back.
    let stall = archive.stall_sealer();
    fleet.append(&mut archive, &fleet.frames);
    let stats = archive.stats();
    assert_eq!(stats.frames_appended, fleet.frames.len() as u64);
    assert_eq!(stats.dropped_records, 0);
    assert_eq!(stats.segments_waiting_seal, MAX_FROZEN as u64, "{stats:?}");
    assert_eq!(stats.segments_sealed, 0);
    assert_eq!(sealed_count(tmp.path()), 0);
    assert_eq!(files_with(tmp.path(), ".wal").len(), MAX_FROZEN + 1);
    assert!(stats.bytes_on_disk > 3 * (64 << 10), "{stats:?}");
    assert_eq!(frames_back(&archive), sent(&fleet.frames));
    // A query sees the frozen segments' frames as the open one's, by node and time.
    let node = "gpu-node-001";
    let all = ScanFilter::new(only(node), 0, u64::MAX);
    let want: Vec<&[u8]> = fleet.of(node).iter().map(|f| &f.bytes[..]).collect();
    let (seen, stats) = scan_all(&reader, &all);
    assert_eq!(frames_only(&seen), want);
    assert_eq!(stats.segments, 0, "no sealed segment yet");
    assert_eq!(reader.end_seq(), archive.stats().records);

    // The sealer goes on: the frozen segments are sealed, the open one frozen and sealed in
    // turn, and the same frames come back, once each, from sealed segments.
    drop(stall);
    archive.wait_for_sealer().unwrap();
    let stats = archive.stats();
    assert_eq!(stats.segments_waiting_seal, 0, "{stats:?}");
    assert!(stats.segments_sealed > MAX_FROZEN as u64, "{stats:?}");
    assert_eq!(sealed_count(tmp.path()) as u64, stats.segments_sealed);
    assert_eq!(files_with(tmp.path(), ".wal").len(), 1);
    assert_eq!(frames_back(&archive), sent(&fleet.frames));
    let (seen, stats) = scan_all(&reader, &all);
    assert_eq!(frames_only(&seen), want);
    assert!(stats.segments > MAX_FROZEN, "{stats:?}");
    // seal(): what is open is sealed too, waiting for the sealer.
    let records = archive.stats().records;
    archive.seal().unwrap();
    let stats = archive.stats();
    assert_eq!(stats.records, records);
    assert_eq!(stats.segments, stats.segments_sealed + 1, "{stats:?}");
    assert_eq!(frames_back(&archive), sent(&fleet.frames));
}

/// An archive directory as a kill leaves it with a frozen segment not yet sealed: the
/// sealer stands still while segments are frozen, and the archive goes away without sealing.
/// Returns the frames appended.
fn leave_frozen(dir: &Path, fleet: &Fleet) -> Vec<Vec<u8>> {
    let cfg = ArchiveConfig {
        segment_bytes: 64 << 10,
        ..config(dir)
    };
    // About 1.5 segments: one frozen, one open.
    let frames = &fleet.frames[..80];
    let mut archive = Archive::open(cfg).unwrap();
    let _stall = archive.stall_sealer();
    fleet.append(&mut archive, frames);
    assert_eq!(archive.stats().segments_waiting_seal, 1);
    drop(archive);
    assert_eq!(files_with(dir, ".wal").len(), 2);
    assert_eq!(sealed_count(dir), 0);
    sent(frames)
}

#[test]
fn a_frozen_segment_left_by_a_kill_is_sealed_after_the_restart_and_nothing_is_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let fleet = Fleet::new(1, 600);
    let want = leave_frozen(tmp.path(), &fleet);
    let frozen = files_with(tmp.path(), ".wal");
    let mut archive = Archive::open(config(tmp.path())).unwrap();
    // Readable at once (handed to the sealer again), then sealed: the same frames, once.
    assert_eq!(frames_back(&archive), want);
    archive.wait_for_sealer().unwrap();
    assert_eq!(frames_back(&archive), want);
    assert_eq!(sealed_count(tmp.path()), frozen.len() - 1);
    for wal in &frozen[..frozen.len() - 1] {
        assert!(
            !wal.exists(),
            "{} was not deleted once sealed",
            wal.display()
        );
    }
    // Appending goes on in the newest open segment, sequence numbers after the old ones.
    let rest = &fleet.frames[80..];
    fleet.append(&mut archive, rest);
    let mut all = want.clone();
    all.extend(sent(rest));
    assert_eq!(frames_back(&archive), all);
}

#[test]
fn a_seal_killed_before_its_swap_or_midway_is_recovered_without_doubles() {
    let tmp = tempfile::tempdir().unwrap();
    let fleet = Fleet::new(1, 600);
    let want = leave_frozen(tmp.path(), &fleet);
    let frozen = files_with(tmp.path(), ".wal");
    let oldest = frozen[0].clone();
    let saved = std::fs::read(&oldest).unwrap();
    // Sealed once; then the frozen file put back: the state of a kill after the sealed file
    // was renamed in place, before the `.wal` was deleted.
    {
        let mut archive = Archive::open(config(tmp.path())).unwrap();
        archive.wait_for_sealer().unwrap();
    }
    let seg = oldest.with_extension("seg");
    assert!(seg.exists() && !oldest.exists());
    std::fs::write(&oldest, &saved).unwrap();
    {
        let archive = Archive::open(config(tmp.path())).unwrap();
        assert!(!oldest.exists(), "the sealed segment's .wal is deleted");
        assert_eq!(frames_back(&archive), want);
    }
    // A seal cut short while writing: a partial `.seg.tmp` beside the `.wal`. And a `.seg`
    // that is damaged while its `.wal` is still there: sealed again from the `.wal`.
    let sealed_bytes = std::fs::read(&seg).unwrap();
    std::fs::write(&oldest, &saved).unwrap();
    std::fs::remove_file(&seg).unwrap();
    let tmp_seg = oldest.with_extension("seg.tmp");
    std::fs::write(&tmp_seg, &sealed_bytes[..sealed_bytes.len() / 2]).unwrap();
    {
        let mut archive = Archive::open(config(tmp.path())).unwrap();
        assert!(!tmp_seg.exists());
        assert_eq!(frames_back(&archive), want);
        archive.wait_for_sealer().unwrap();
        assert_eq!(frames_back(&archive), want);
    }
    std::fs::write(&oldest, &saved).unwrap();
    std::fs::write(&seg, &sealed_bytes[..sealed_bytes.len() - 10]).unwrap();
    let mut archive = Archive::open(config(tmp.path())).unwrap();
    assert_eq!(frames_back(&archive), want);
    archive.wait_for_sealer().unwrap();
    assert_eq!(frames_back(&archive), want);
    assert_eq!(
        std::fs::read(&seg).unwrap(),
        sealed_bytes,
        "sealed again, whole"
    );
    assert!(!oldest.exists());
}

#[test]
fn a_seal_that_fails_is_retried_and_appends_go_on_meanwhile() {
    let tmp = tempfile::tempdir().unwrap();
    let fleet = Fleet::new(1, 600);
    let cfg = ArchiveConfig {
        segment_bytes: 64 << 10,
        ..config(tmp.path())
    };
    let mut archive = Archive::open(cfg).unwrap();
    let stall = archive.stall_sealer();
    fleet.append(&mut archive, &fleet.frames[..80]);
    assert_eq!(archive.stats().segments_waiting_seal, 1);
    // The sealed file cannot be written (a directory where it goes, as a full disk or a
    // read-only directory would refuse it).
    let wal = files_with(tmp.path(), ".wal")[0].clone();
    let blocker = wal.with_extension("seg.tmp");
    std::fs::create_dir(&blocker).unwrap();
    drop(stall);
    let e = archive.wait_for_sealer().unwrap_err();
    assert!(e.to_string().contains("sealing failed"), "{e}");
    assert!(e.to_string().contains(".seg.tmp"), "{e}");
    let stats = archive.stats();
    assert!(stats.write_errors > 0, "{stats:?}");
    assert_eq!(stats.segments_waiting_seal, 1, "{stats:?}");
    // Appends go on, and everything stays readable, the frozen segment as it is.
    fleet.append(&mut archive, &fleet.frames[80..120]);
    assert_eq!(frames_back(&archive), sent(&fleet.frames[..120]));
    // The cause goes away: the next try seals it, nothing lost or doubled.
    std::fs::remove_dir(&blocker).unwrap();
    archive.wait_for_sealer().unwrap();
    let stats = archive.stats();
    assert_eq!(stats.segments_waiting_seal, 0, "{stats:?}");
    assert!(!wal.exists());
    assert_eq!(files_with(tmp.path(), ".wal").len(), 1);
    assert!(stats.segments_sealed >= 1, "{stats:?}");
    assert_eq!(sealed_count(tmp.path()) as u64, stats.segments_sealed);
    assert_eq!(frames_back(&archive), sent(&fleet.frames[..120]));
}
