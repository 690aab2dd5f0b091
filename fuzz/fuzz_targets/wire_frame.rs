//! The frame decoder as a receiver (`railscope listen`, the query engine) runs it: two
//! datagrams into one `ReceiverState`, each either as received or sealed with the key so the
//! parser behind the MAC is reached. It must never panic, and the decoder's memory budget
//! bounds every allocation (libFuzzer's -malloc_limit_mb catches one that is not).
#![no_main]

use libfuzzer_sys::fuzz_target;
use monitor_wire::{Key, ReceiverState, decode, seal_for_fuzzing};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let key = Key::from_bytes([7; 32]);
    // The first datagram's length, then both datagrams (fuzz/seeds and the example
    // monitor-wire/examples/frame_fuzz_seeds.rs make inputs of this layout).
    let Some((len, datagrams)) = rest.split_first_chunk::<2>() else {
        return;
    };
    let split = usize::from(u16::from_le_bytes(*len)).min(datagrams.len());
    let (first, second) = datagrams.split_at(split);
    let mut state = ReceiverState::default();
    for (i, datagram) in [first, second].into_iter().enumerate() {
        let mut bytes = datagram.to_vec();
        if flags & (1 << i) != 0 {
            seal_for_fuzzing(&mut bytes, &key);
        }
        if let Ok(frame) = decode(&bytes, &key, &mut state) {
            let _ = frame.sample_count();
        }
        // The same datagram again: a replay the state must refuse or account.
        let _ = decode(&bytes, &key, &mut state);
    }
});
