//! The link facts of a port: its `state`, `phys_state`, `rate` and `link_layer` files, as
//! values and as parsed from the kernel's text.

/// A port state as sysfs prints it, "4: ACTIVE": the code, and the name the kernel gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodedState {
    pub code: u32,
    pub name: String,
}

impl CodedState {
    /// `state` is ACTIVE: the port passes traffic.
    pub fn is_active(&self) -> bool {
        self.code == 4
    }
}

/// The `link_layer` of a port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    InfiniBand,
    /// RoCE.
    Ethernet,
    /// What the kernel prints when the driver does not say.
    Unknown,
    Other(String),
}

impl LinkLayer {
    pub fn as_str(&self) -> &str {
        match self {
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
            LinkLayer::Unknown => "Unknown",
            LinkLayer::Other(s) => s,
        }
    }
}

/// The `rate` of a port, "400 Gb/sec (4X NDR)".
#[derive(Clone, Debug, PartialEq)]
pub struct LinkRate {
    /// Total data rate of the port, all lanes together.
    pub gbps: f64,
    /// Active lanes (1, 2, 4, 8, 12); `None` when the file does not say.
    pub width_lanes: Option<u32>,
    /// Lane speed name (SDR, DDR, QDR, FDR10, FDR, EDR, HDR, NDR, XDR), when printed.
    pub speed: Option<String>,
}

/// What the port attributes say about one port's link, as of the last scan. A field is `None`
/// when its file could not be read or parsed (see [`IbSysfs::problems`](super::IbSysfs::problems)).
#[derive(Clone, Debug, PartialEq)]
pub struct PortLink {
    pub device: String,
    pub port: u32,
    pub state: Option<CodedState>,
    pub phys_state: Option<CodedState>,
    pub rate: Option<LinkRate>,
    pub link_layer: Option<LinkLayer>,
}

/// `state` names by code (`ib_port_state`); index 0 unused.
pub(super) const STATE_NAMES: [&str; 6] = ["", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"];
/// `phys_state` names by code; index 0 is what the kernel prints for "no state change".
pub(super) const PHYS_STATE_NAMES: [&str; 8] = [
    "",
    "Sleep",
    "Polling",
    "Disabled",
    "PortConfigurationTraining",
    "LinkUp",
    "LinkErrorRecovery",
    "PhyTest",
];

/// Parses "4: ACTIVE". `None` unless the text starts with a number followed by a colon.
pub fn parse_coded(text: &str) -> Option<CodedState> {
    let (code, name) = text.split_once(':')?;
    Some(CodedState {
        code: code.trim().parse().ok()?,
        name: name.trim().to_string(),
    })
}

/// Parses "400 Gb/sec (4X NDR)", "2.5 Gb/sec (1X SDR)" or "10 Gb/sec (4X)", as the kernel's
/// `rate_show` prints it, and "0 GB/sec", what MLNX_OFED's driver prints for a port without a
/// link (an empty cage): a rate of 0 and no width. On error, returns what could be used anyway
/// (the rate alone when the width is missing or garbled).
pub fn parse_rate(text: &str) -> Result<LinkRate, Option<LinkRate>> {
    let text = text.trim();
    let (number, rest, bytes) = match text.split_once("Gb/sec") {
        Some((number, rest)) => (number, rest, false),
        None => {
            let (number, rest) = text.split_once("GB/sec").ok_or(None)?;
            (number, rest, true)
        }
    };
    let gbps: f64 = number.trim().parse().map_err(|_| None)?;
    if !gbps.is_finite() || gbps < 0.0 {
        return Err(None);
    }
    let partial = LinkRate {
        gbps,
        width_lanes: None,
        speed: None,
    };
    if gbps == 0.0 && rest.trim().is_empty() {
        // No link: nothing to say about lanes.
        return Ok(partial);
    }
    if bytes {
        // Only the no-link form uses "GB/sec"; a rate in it would be ambiguous.
        return Err(None);
    }
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'));
    let Some(inner) = inner else {
        return Err(Some(partial));
    };
    let mut words = inner.split_whitespace();
    let width = words
        .next()
        .and_then(|w| w.strip_suffix('X').or_else(|| w.strip_suffix('x')))
        .and_then(|w| w.parse::<u32>().ok())
        .filter(|&w| w > 0);
    let Some(width) = width else {
        return Err(Some(partial));
    };
    let speed = words.next().map(str::to_string);
    if words.next().is_some() {
        return Err(Some(partial));
    }
    Ok(LinkRate {
        width_lanes: Some(width),
        speed,
        ..partial
    })
}

/// Parses `link_layer`; anything but the kernel's three words is `Other`.
pub fn parse_link_layer(text: &str) -> LinkLayer {
    match text.trim() {
        "InfiniBand" => LinkLayer::InfiniBand,
        "Ethernet" => LinkLayer::Ethernet,
        "Unknown" => LinkLayer::Unknown,
        other => LinkLayer::Other(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_strings() {
        let ok = |s: &str| parse_rate(s).unwrap();
        assert_eq!(
            ok("2.5 Gb/sec (1X SDR)"),
            LinkRate {
                gbps: 2.5,
                width_lanes: Some(1),
                speed: Some("SDR".into())
            }
        );
        assert_eq!(ok("56 Gb/sec (4X FDR)").width_lanes, Some(4));
        assert_eq!(ok("600 Gb/sec (12X HDR)").width_lanes, Some(12));
        assert_eq!(ok("10 Gb/sec (4X)").speed, None);
        assert_eq!(ok("  400 Gb/sec (4X NDR)\n").gbps, 400.0);
        // MLNX_OFED's port without a link: a rate of 0, not a problem.
        assert_eq!(
            ok("0 GB/sec\n"),
            LinkRate {
                gbps: 0.0,
                width_lanes: None,
                speed: None
            }
        );
        assert_eq!(ok("0 Gb/sec").gbps, 0.0);
        assert!(matches!(parse_rate("100 GB/sec"), Err(None)));
        assert!(matches!(parse_rate("0 GB/sec (4X)"), Err(None)));
        assert!(matches!(parse_rate("100 Gb/sec"), Err(Some(_))));
        assert!(matches!(parse_rate("N/A"), Err(None)));
        assert!(matches!(parse_rate(""), Err(None)));
        assert!(matches!(parse_rate("NaN Gb/sec (4X NDR)"), Err(None)));
        assert!(matches!(
            parse_rate("100 Gb/sec (weird)"),
            Err(Some(LinkRate {
                gbps: 100.0,
                width_lanes: None,
                ..
            }))
        ));
    }

    #[test]
    fn state_strings() {
        assert_eq!(
            parse_coded("5: LinkUp"),
            Some(CodedState {
                code: 5,
                name: "LinkUp".into()
            })
        );
        assert_eq!(parse_coded("1: DOWN").map(|s| s.is_active()), Some(false));
        assert_eq!(parse_coded("ACTIVE"), None);
        assert_eq!(parse_coded("x: ACTIVE"), None);
        assert_eq!(parse_coded(""), None);
    }
}
