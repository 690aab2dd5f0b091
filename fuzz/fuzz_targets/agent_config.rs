//! `/etc/railscope/agent.toml` as the agent reads it: parsing, layering under no flags,
//! checking every value (`agent_options`), the error message (file, line, key) and the
//! settings printed by `--check-config`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use monitor_config::{ConfigFile, Sources};
use monitor_user::settings::{AgentSettings, agent_options};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = ConfigFile::from_text("/etc/railscope/agent.toml", text);
    match Sources::from_file(file, AgentSettings::default()) {
        Ok(sources) => {
            if let Err(e) = agent_options(&sources) {
                let _ = e.to_string();
            }
            let _ = toml::to_string(&sources.merged());
        }
        Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
    }
});
