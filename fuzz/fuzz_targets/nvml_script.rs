//! The NVML stand-in's script parser (`nvml-standin.json`), and reading every step of what
//! it accepted.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nvml_standin::script::Script;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(trace) = Script::parse(text) {
        for gpu in &trace.gpus {
            for step in 0..4 {
                let _ = gpu.at(step);
            }
            let _ = gpu.at(u64::MAX);
        }
    }
});
