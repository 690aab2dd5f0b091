//! The collector's ingest of datagrams (`NodeTable::ingest`: node name from the header, MAC,
//! decode, per-node accounting, bounds), two datagrams per input, each as received or
//! sealed with the cluster key. Frame times are accepted whatever they are (the limits below),
//! so the fuzzer is not stopped by the clock check.
#![no_main]

use std::{net::SocketAddr, time::Duration};

use libfuzzer_sys::fuzz_target;
use monitor_collector::{Limits, nodes::NodeTable};
use monitor_wire::{Key, seal_for_fuzzing};

const YEAR: u64 = 365 * 86_400;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let key = Key::from_bytes([7; 32]);
    let limits = Limits {
        max_nodes: 4,
        max_series_per_node: 1_000,
        max_series: 2_000,
        max_frame_age: Duration::from_secs(300 * YEAR),
        max_frame_ahead: Duration::from_secs(300 * YEAR),
        node_ttl: Duration::from_secs(301 * YEAR),
        ..Limits::default()
    };
    let table = NodeTable::new(key.clone(), limits);
    let from: SocketAddr = "192.0.2.1:40000".parse().unwrap();
    let now = 292 * YEAR * 1_000_000_000 / 2;
    // The first datagram's length, then both datagrams (fuzz/seeds and the example
    // monitor-wire/examples/frame_fuzz_seeds.rs make inputs of this layout).
    let Some((len, datagrams)) = rest.split_first_chunk::<2>() else {
        return;
    };
    let split = usize::from(u16::from_le_bytes(*len)).min(datagrams.len());
    let (first, second) = datagrams.split_at(split);
    for (i, datagram) in [first, second].into_iter().enumerate() {
        let mut bytes = datagram.to_vec();
        if flags & (1 << i) != 0 {
            seal_for_fuzzing(&mut bytes, &key);
        }
        let _ = table.ingest(&bytes, from, now);
    }
});
