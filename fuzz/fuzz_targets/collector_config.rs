//! `/etc/railscope/collector.toml` as the collector reads it: parsing, layering, the memory
//! bounds' check, the error message (file, line, key) and the settings printed by
//! `--check-config`. (The key file it names is not read here.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use monitor_collector::settings::{CollectorSettings, limits};
use monitor_config::{ConfigFile, Sources};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = ConfigFile::from_text("/etc/railscope/collector.toml", text);
    match Sources::from_file(file, CollectorSettings::default()) {
        Ok(sources) => {
            if let Err(e) = limits(&sources) {
                let _ = e.to_string();
            }
            let _ = toml::to_string(&sources.merged());
        }
        Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
    }
});
