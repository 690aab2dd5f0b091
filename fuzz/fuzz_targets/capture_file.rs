//! A capture file as `railscope report` reads it: header, records, frames (with the key the
//! header carries), trailer; then the flap analysis, both report forms and each port's SVG timeline over what was read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use railscope_capture::{
    Rules, Timelines, analyse,
    report::{Report, load_capture},
};

fuzz_target!(|data: &[u8]| {
    let mut timelines = Timelines::default();
    let Ok(source) = load_capture("fuzz.rscap", data, &mut timelines) else {
        return;
    };
    timelines.finish();
    let rules = Rules::default();
    let ports = analyse(&timelines, &rules);
    let report = Report {
        sources: vec![source],
        rules,
        ports,
    };
    let _ = report.to_text();
    let _ = report.to_json();
    for port in &report.ports {
        if let Some(timeline) = timelines.ports.get(&port.port) {
            let _ = railscope_capture::svg::port_timeline(port, timeline);
        }
    }
});
