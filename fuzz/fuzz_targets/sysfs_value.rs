//! The values the IB source parses from sysfs files: counters, `state`/`phys_state`
//! ("4: ACTIVE"), `rate` ("100 Gb/sec (4X EDR)") and `link_layer`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use monitor_user::sources::ib_sysfs::{parse_coded, parse_counter, parse_link_layer, parse_rate};

fuzz_target!(|data: &[u8]| {
    let _ = parse_counter(data);
    let text = String::from_utf8_lossy(data);
    let _ = parse_coded(&text);
    let _ = parse_rate(&text);
    let _ = parse_link_layer(&text);
});
