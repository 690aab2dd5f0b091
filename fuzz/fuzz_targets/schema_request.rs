//! The agent's decoders of what a collector sends back (a datagram arriving on the agent's
//! socket): schema requests, acknowledgements and their timings, as received or sealed with
//! the key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use monitor_wire::{Key, decode_ack, decode_schema_request, decode_timing, seal_for_fuzzing};

fuzz_target!(|data: &[u8]| {
    // The layout of the frame targets' inputs: flags, a length (unused here), the datagram.
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let Some((_, datagram)) = rest.split_first_chunk::<2>() else {
        return;
    };
    let key = Key::from_bytes([7; 32]);
    let mut bytes = datagram.to_vec();
    if flags & 1 != 0 {
        seal_for_fuzzing(&mut bytes, &key);
    }
    let _ = decode_schema_request(&bytes, &key);
    if let Ok(ack) = decode_ack(&bytes, &key) {
        // What the spool asks of it: every range above the floor, in order.
        let mut from = ack.floor;
        for &(start, end) in &ack.held {
            assert!(start > from && end > start);
            from = end;
        }
        let _ = ack.holds(from);
    }
    if let Ok(timing) = decode_timing(&bytes, &key) {
        // What the clock filter takes as t2 and t3: never answered before received.
        assert!(timing.sent_ns >= timing.received_ns);
    }
});
