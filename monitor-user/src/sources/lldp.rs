//! The switch port each RoCE port is cabled to, from the node's own lldpd: the collector
//! uses it as its fabric topology for nodes its topology file does not cover
//! (docs/findings.md, "Fabric faults").
//!
//! Where lldpd runs (its socket, `/run/lldpd.socket` by default, exists), a thread runs
//! `lldpcli -u SOCKET -f json0 show neighbors` (killed after [`QUERY_TIMEOUT`]) at start,
//! every [`RETRY_EVERY`] while no port has a neighbour yet (lldpd hears a switch only at its
//! next LLDPDU, up to 30 s after it starts), then every [`QUERY_EVERY`]: cabling changes by
//! hand, not by the second. Each RDMA port whose link layer is Ethernet is matched to its
//! netdev ([`rdma_netdevs`]) and that netdev's neighbour, and sent as
//! `railscope_ib_port_neighbor_info{device, port, netdev, switch, switch_port} 1` with every
//! flush (like `railscope_agent_info`: about a byte a flush per port).
//!
//! `json0` is lldpcli's JSON whose shape does not depend on the data (every list a list even
//! of one, unlike `json`). The switch is the neighbour's chassis name (LLDP's system name,
//! what an operator calls the switch), else its chassis id; its port is the port id when
//! its subtype is an interface name or a local name (`swp17`, `Ethernet17`: what switches
//! send), else the port description, else the port id as sent.

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use monitor_wire::{Kind, Labels, Series, names::metric};
use serde::Deserialize;

/// lldpd's control socket where Debian's and upstream's lldpd put it.
pub const DEFAULT_SOCKET: &str = "/run/lldpd.socket";
/// How long one `lldpcli` may run before it is killed.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// Between two queries once a neighbour is known (or lldpd is absent).
pub const QUERY_EVERY: Duration = Duration::from_secs(300);
/// Between two queries while no port has a neighbour yet.
pub const RETRY_EVERY: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum LldpError {
    #[error("{source_name}: not lldpcli's json0 output: {error}")]
    Malformed {
        source_name: String,
        error: serde_json::Error,
    },
    #[error("{source_name}: {what}")]
    Run { source_name: String, what: String },
}

/// One LLDP neighbour of a local interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Neighbour {
    /// The local interface (netdev) it was heard on.
    pub interface: String,
    /// The switch: its chassis name, else its chassis id.
    pub switch: String,
    /// The switch's port (see the module's documentation).
    pub switch_port: String,
}

/// `lldpcli -f json0 show neighbors`, as far as it is read.
#[derive(Deserialize)]
struct Output {
    lldp: Vec<Section>,
}

#[derive(Deserialize)]
struct Section {
    #[serde(default)]
    interface: Vec<Interface>,
}

#[derive(Deserialize)]
struct Interface {
    name: String,
    #[serde(default)]
    chassis: Vec<Chassis>,
    #[serde(default)]
    port: Vec<Port>,
}

#[derive(Deserialize)]
struct Chassis {
    #[serde(default)]
    id: Vec<Typed>,
    #[serde(default)]
    name: Vec<Text>,
}

#[derive(Deserialize)]
struct Port {
    #[serde(default)]
    id: Vec<Typed>,
    #[serde(default)]
    descr: Vec<Text>,
}

#[derive(Deserialize)]
struct Typed {
    #[serde(rename = "type")]
    subtype: String,
    value: String,
}

#[derive(Deserialize)]
struct Text {
    value: String,
}

/// The neighbours in `text`, lldpcli's `json0` output read from `source_name` (named in the
/// error). An interface with neither a chassis nor a port is skipped; the first neighbour of
/// an interface is taken (a switch port has one).
pub fn parse_neighbours(text: &str, source_name: &str) -> Result<Vec<Neighbour>, LldpError> {
    let output: Output = serde_json::from_str(text).map_err(|error| LldpError::Malformed {
        source_name: source_name.into(),
        error,
    })?;
    let mut out: Vec<Neighbour> = Vec::new();
    for interface in output.lldp.into_iter().flat_map(|s| s.interface) {
        if out.iter().any(|n| n.interface == interface.name) {
            continue;
        }
        let chassis = interface.chassis.first();
        let switch = chassis
            .and_then(|c| c.name.first().map(|n| n.value.clone()))
            .or_else(|| chassis.and_then(|c| c.id.first().map(|i| i.value.clone())));
        let port = interface.port.first();
        let switch_port = port.and_then(|p| {
            let id = p.id.first();
            id.filter(|i| i.subtype == "ifname" || i.subtype == "local")
                .map(|i| i.value.clone())
                .or_else(|| p.descr.first().map(|d| d.value.clone()))
                .or_else(|| id.map(|i| i.value.clone()))
        });
        if let (Some(switch), Some(switch_port)) = (switch, switch_port)
            && !switch.is_empty()
        {
            out.push(Neighbour {
                interface: interface.name,
                switch,
                switch_port,
            });
        }
    }
    Ok(out)
}

/// An RDMA port and its netdev.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PortNetdev {
    pub device: String,
    pub port: u32,
    pub netdev: String,
}

/// Every RDMA port under `root` (`/sys`) whose link layer is Ethernet, with its netdev:
/// `ports/P/gid_attrs/ndevs/0` (the default GID's netdev), else the device's `parent`
/// (rxe), else the one entry of `device/net/`. A port whose netdev cannot be told is left
/// out (logged at debug).
pub fn rdma_netdevs(root: &Path) -> Vec<PortNetdev> {
    let read = |p: PathBuf| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    let list = |p: PathBuf| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(p)
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let mut out = Vec::new();
    for device in list(root.join("class/infiniband")) {
        let dir = root.join("class/infiniband").join(&device);
        for port in list(dir.join("ports")) {
            let Ok(number) = port.parse::<u32>() else {
                continue;
            };
            let port_dir = dir.join("ports").join(&port);
            if read(port_dir.join("link_layer")).as_deref() != Some("Ethernet") {
                continue;
            }
            let netdev = read(port_dir.join("gid_attrs/ndevs/0"))
                .or_else(|| read(dir.join("parent")))
                .or_else(|| match &list(dir.join("device/net"))[..] {
                    [one] => Some(one.clone()),
                    _ => None,
                });
            match netdev {
                Some(netdev) => out.push(PortNetdev {
                    device: device.clone(),
                    port: number,
                    netdev,
                }),
                None => tracing::debug!("{}: no netdev found", port_dir.display()),
            }
        }
    }
    out
}

/// The `railscope_ib_port_neighbor_info` series of each port whose netdev has a neighbour.
pub fn neighbour_series(ports: &[PortNetdev], neighbours: &[Neighbour]) -> Vec<Series> {
    ports
        .iter()
        .filter_map(|p| {
            let n = neighbours.iter().find(|n| n.interface == p.netdev)?;
            Some(Series {
                name: metric::IB_PORT_NEIGHBOR_INFO.into(),
                labels: Labels::new([
                    ("device", p.device.as_str()),
                    ("port", p.port.to_string().as_str()),
                    ("netdev", p.netdev.as_str()),
                    ("switch", n.switch.as_str()),
                    ("switch_port", n.switch_port.as_str()),
                ]),
                kind: Kind::Gauge,
            })
        })
        .collect()
}

/// Runs `lldpcli -u SOCKET -f json0 show neighbors`, killed after `timeout`, and parses what
/// it printed.
pub fn query(
    lldpcli: &Path,
    socket: &Path,
    timeout: Duration,
) -> Result<Vec<Neighbour>, LldpError> {
    let source_name = format!(
        "{} -u {} -f json0 show neighbors",
        lldpcli.display(),
        socket.display()
    );
    let run = |what: String| LldpError::Run {
        source_name: source_name.clone(),
        what,
    };
    let mut child = Command::new(lldpcli)
        .arg("-u")
        .arg(socket)
        .args(["-f", "json0", "show", "neighbors"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| run(format!("cannot run: {e}")))?;
    // Read on threads of their own, so that a full pipe never holds the child up.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(pipe) = pipe {
                let _ = pipe.take(16 << 20).read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < timeout => thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(run(format!("no answer within {timeout:?}: killed")));
            }
            Err(e) => return Err(run(format!("cannot wait for it: {e}"))),
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    if !status.success() {
        let err = String::from_utf8_lossy(&stderr);
        let last = err.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
        return Err(run(format!("{status}: {}", last.trim())));
    }
    parse_neighbours(&String::from_utf8_lossy(&stdout), &source_name)
}

/// The neighbour series the LLDP thread found last, read by the pipeline at each flush.
#[derive(Clone, Default)]
pub struct NeighbourSeries(Arc<Mutex<Arc<Vec<Series>>>>);

impl NeighbourSeries {
    pub fn current(&self) -> Arc<Vec<Series>> {
        self.0.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn set(&self, series: Vec<Series>) {
        if let Ok(mut held) = self.0.lock() {
            *held = Arc::new(series);
        }
    }

    /// Starts the thread that asks lldpd (through `lldpcli`, found on the PATH) behind
    /// `socket` for the neighbours of the RDMA ports under `sysfs_root`. A failure of lldpd
    /// or lldpcli is logged when it changes and costs only these series.
    pub fn spawn(sysfs_root: PathBuf, socket: PathBuf) -> Self {
        let shared = Self::default();
        let series = shared.clone();
        let spawned = thread::Builder::new()
            .name("railscope-lldp".into())
            .spawn(move || {
                let mut last_problem = String::new();
                loop {
                    let (found, problem) = match poll_once(&sysfs_root, &socket) {
                        Ok(found) => (found, String::new()),
                        Err(problem) => (Vec::new(), problem),
                    };
                    if problem != last_problem {
                        if problem.is_empty() {
                            tracing::info!("LLDP: lldpd answers again");
                        } else {
                            tracing::info!("LLDP neighbours not sent: {problem}");
                        }
                        last_problem = problem;
                    }
                    let wait = if found.is_empty() && last_problem.is_empty() {
                        RETRY_EVERY
                    } else {
                        QUERY_EVERY
                    };
                    if found != *series.current() {
                        tracing::info!("LLDP: {} RDMA ports with a switch neighbour", found.len());
                    }
                    series.set(found);
                    thread::sleep(wait);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("LLDP neighbours off: cannot start their thread: {e}");
        }
        shared
    }
}

/// One query: the neighbour series, or why there are none.
fn poll_once(sysfs_root: &Path, socket: &Path) -> Result<Vec<Series>, String> {
    let ports = rdma_netdevs(sysfs_root);
    if ports.is_empty() {
        return Ok(Vec::new());
    }
    if !socket.exists() {
        return Err(format!(
            "lldpd is not running here ({} absent)",
            socket.display()
        ));
    }
    let neighbours =
        query(Path::new("lldpcli"), socket, QUERY_TIMEOUT).map_err(|e| e.to_string())?;
    Ok(neighbour_series(&ports, &neighbours))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lldpcli -f json0 show neighbors` of Debian's lldpd 1.0.16, captured from two lldpd
    /// in network namespaces joined by veth pairs (tests/fixtures/lldp/README.md).
    const HOST: &str = include_str!("../../tests/fixtures/lldp/host-two-ports.json");
    const SWITCH: &str = include_str!("../../tests/fixtures/lldp/switch-view-mac-port-id.json");
    const NONE: &str = include_str!("../../tests/fixtures/lldp/no-neighbours.json");

    fn neighbour(interface: &str, switch: &str, switch_port: &str) -> Neighbour {
        Neighbour {
            interface: interface.into(),
            switch: switch.into(),
            switch_port: switch_port.into(),
        }
    }

    #[test]
    fn real_lldpcli_output_names_the_switch_and_its_port_for_each_interface() {
        assert_eq!(
            parse_neighbours(HOST, "host").unwrap(),
            [
                neighbour("enp1s0f0np0", "leaf1", "swp17"),
                neighbour("enp1s0f1np1", "leaf1", "swp18"),
            ]
        );
        // A port id sent as a MAC address (lldpd's default): the description names the port.
        assert_eq!(
            parse_neighbours(SWITCH, "switch").unwrap(),
            [
                neighbour("swp17", "node01", "enp1s0f0np0"),
                neighbour("swp18", "node01", "enp1s0f1np1"),
            ]
        );
        assert_eq!(parse_neighbours(NONE, "none").unwrap(), []);
    }

    #[test]
    fn malformed_output_is_one_line_naming_its_source() {
        for text in [
            "",
            "lldpcli: unknown command",
            // lldpcli's `json` format (not json0): objects where json0 has lists.
            r#"{"lldp": {"interface": {"eth0": {}}}}"#,
            &HOST[..HOST.len() / 2],
        ] {
            let e = parse_neighbours(text, "lldpcli -u /run/lldpd.socket -f json0 show neighbors")
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(
                    "lldpcli -u /run/lldpd.socket -f json0 show neighbors: not lldpcli's json0 output: "
                ),
                "{text:?}: {e}"
            );
            assert!(!e.contains('\n'), "{e}");
        }
    }

    /// A sysfs tree: `(device, port, link_layer, how the netdev is found)`.
    fn sysfs(ports: &[(&str, u32, &str, &str, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!(
            "railscope-lldp-{}-{}",
            std::process::id(),
            ports.len()
        ));
        let _ = std::fs::remove_dir_all(&root);
        for (device, port, layer, how, netdev) in ports {
            let dir = root.join("class/infiniband").join(device);
            let port_dir = dir.join("ports").join(port.to_string());
            std::fs::create_dir_all(&port_dir).unwrap();
            std::fs::write(port_dir.join("link_layer"), format!("{layer}\n")).unwrap();
            match *how {
                "gid" => {
                    std::fs::create_dir_all(port_dir.join("gid_attrs/ndevs")).unwrap();
                    std::fs::write(port_dir.join("gid_attrs/ndevs/0"), format!("{netdev}\n"))
                        .unwrap();
                }
                "parent" => std::fs::write(dir.join("parent"), format!("{netdev}\n")).unwrap(),
                "pci" => std::fs::create_dir_all(dir.join("device/net").join(netdev)).unwrap(),
                _ => {}
            }
        }
        root
    }

    #[test]
    fn each_roce_port_is_matched_to_its_netdev_and_that_netdev_s_neighbour() {
        let root = sysfs(&[
            ("mlx5_0", 1, "Ethernet", "gid", "enp1s0f0np0"),
            ("mlx5_1", 1, "Ethernet", "pci", "enp1s0f1np1"),
            ("rxe0", 1, "Ethernet", "parent", "eth0"),
            // InfiniBand: its IPoIB netdev is not cabled to an Ethernet switch.
            ("mlx5_2", 1, "InfiniBand", "pci", "ibp3s0"),
        ]);
        let ports = rdma_netdevs(&root);
        let names: Vec<(&str, u32, &str)> = ports
            .iter()
            .map(|p| (p.device.as_str(), p.port, p.netdev.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("mlx5_0", 1, "enp1s0f0np0"),
                ("mlx5_1", 1, "enp1s0f1np1"),
                ("rxe0", 1, "eth0")
            ]
        );
        let series = neighbour_series(&ports, &parse_neighbours(HOST, "host").unwrap());
        assert_eq!(series.len(), 2, "eth0 has no neighbour: {series:?}");
        assert_eq!(&*series[1].name, "railscope_ib_port_neighbor_info");
        let labels: Vec<(&str, &str)> = series[1].labels.iter().collect();
        assert_eq!(
            labels,
            [
                ("device", "mlx5_1"),
                ("netdev", "enp1s0f1np1"),
                ("port", "1"),
                ("switch", "leaf1"),
                ("switch_port", "swp18"),
            ]
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn lldpd_absent_or_lldpcli_failing_is_said_in_one_line() {
        let e = query(
            Path::new("/nonexistent/lldpcli"),
            Path::new("/run/lldpd.socket"),
            QUERY_TIMEOUT,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with(
                "/nonexistent/lldpcli -u /run/lldpd.socket -f json0 show neighbors: cannot run: "
            ),
            "{e}"
        );
    }
}
