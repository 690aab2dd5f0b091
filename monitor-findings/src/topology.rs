//! Which switch each port hangs off (`[findings] topology`, read at start), so that a fabric
//! fault names the switch all its ports share. Two formats (docs/findings.md):
//!
//! - Slurm's `topology.conf`: `SwitchName=leaf1 Nodes=node[01-16]`, `SwitchName=spine
//!   Switches=leaf[1-2]` (every port of a node hangs off its switch);
//! - a plain file of ports, one a line: `HOST DEVICE/PORT SWITCH SWITCH_PORT`
//!   (`node01 mlx5_0/1 leaf1 17`).
//!
//! The format is told by the first line that is not blank or a comment: `Key=Value` words
//! make it Slurm's. Anything malformed is refused with the file, the line and what is wrong.
//!
//! Ports the file does not cover take their switch from the agents' LLDP neighbours
//! (`railscope_ib_port_neighbor_info`, RoCE where lldpd runs: [`Topology::set_neighbours`]);
//! a switch of the file's `Switches=` tree is the parent of a leaf LLDP names alike.

use std::{
    collections::{HashMap, HashSet},
    path::Path,
};

use super::hostlist;

/// A port as the rules name it: node, device, port.
pub(crate) type PortKey = (String, String, u32);

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("topology {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("topology {path}:{line}: {what}")]
    Line {
        path: String,
        line: usize,
        what: String,
    },
    #[error("topology {path}: {what}")]
    File { path: String, what: String },
}

#[derive(Debug, Default, PartialEq)]
pub struct Topology {
    /// node → the switch all its ports hang off (Slurm's format).
    node_switch: HashMap<String, String>,
    /// port → (switch, the switch's port) (the plain format).
    port_switch: HashMap<PortKey, (String, String)>,
    /// switch → the switch above it (Slurm's `Switches=`).
    parent: HashMap<String, String>,
    /// port → (switch, the switch's port), as the agents' LLDP neighbours say now.
    neighbours: HashMap<PortKey, (String, String)>,
}

impl Topology {
    pub fn load(path: &Path) -> Result<Self, TopologyError> {
        let text = std::fs::read_to_string(path).map_err(|source| TopologyError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses `text`, read from `path` (named in errors).
    pub fn parse(text: &str, path: &str) -> Result<Self, TopologyError> {
        let lines: Vec<(usize, &str)> = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.split('#').next().unwrap_or("").trim()))
            .filter(|(_, l)| !l.is_empty())
            .collect();
        let Some((_, first)) = lines.first() else {
            return Err(TopologyError::File {
                path: path.into(),
                what: "no switch or port in it".into(),
            });
        };
        let at = |line: usize| {
            move |what: String| TopologyError::Line {
                path: path.into(),
                line,
                what,
            }
        };
        let mut t = Topology::default();
        if first.split_whitespace().any(|w| w.contains('=')) {
            t.parse_slurm(&lines, at)?;
        } else {
            t.parse_ports(&lines, at)?;
        }
        Ok(t)
    }

    fn parse_slurm<F, E>(&mut self, lines: &[(usize, &str)], at: F) -> Result<(), TopologyError>
    where
        F: Fn(usize) -> E,
        E: Fn(String) -> TopologyError,
    {
        let mut switches: HashMap<String, usize> = HashMap::new();
        let mut node_line: HashMap<String, usize> = HashMap::new();
        // (child, parent, line) of every `Switches=`, checked once every switch is known.
        let mut links: Vec<(String, String, usize)> = Vec::new();
        for &(n, line) in lines {
            let err = at(n);
            let (mut name, mut nodes, mut children) = (None, None, None);
            for word in line.split_whitespace() {
                let (key, value) = word.split_once('=').ok_or_else(|| {
                    err(format!(
                        "{word:?} is not Key=Value (Slurm's topology.conf format)"
                    ))
                })?;
                if value.is_empty() {
                    return Err(err(format!("{key} has no value")));
                }
                match key.to_ascii_lowercase().as_str() {
                    "switchname" => name = Some(value),
                    "nodes" => nodes = Some(value),
                    "switches" => children = Some(value),
                    "linkspeed" => {}
                    _ => {
                        return Err(err(format!(
                            "unknown key {key:?} (SwitchName, Nodes, Switches, LinkSpeed)"
                        )));
                    }
                }
            }
            let name = name.ok_or_else(|| err("no SwitchName=".into()))?;
            if name.contains(['[', ']', ',']) {
                return Err(err(format!("SwitchName={name} is not one name")));
            }
            if let Some(prev) = switches.insert(name.into(), n) {
                return Err(err(format!(
                    "switch {name} is already defined on line {prev}"
                )));
            }
            if let Some(nodes) = nodes {
                for node in hostlist::expand(nodes).map_err(|e| err(format!("Nodes: {e}")))? {
                    if let Some(prev) = node_line.get(&node) {
                        return Err(err(format!(
                            "node {node} is already under switch {} (line {prev})",
                            self.node_switch[&node]
                        )));
                    }
                    node_line.insert(node.clone(), n);
                    self.node_switch.insert(node, name.into());
                }
            }
            if let Some(children) = children {
                for child in
                    hostlist::expand(children).map_err(|e| err(format!("Switches: {e}")))?
                {
                    links.push((child, name.into(), n));
                }
            }
        }
        for (child, parent, n) in links {
            let err = at(n);
            if !switches.contains_key(&child) {
                return Err(err(format!(
                    "Switches= names {child}, which no SwitchName= defines"
                )));
            }
            if child == parent {
                return Err(err(format!("switch {child} lists itself")));
            }
            if let Some(prev) = self.parent.insert(child.clone(), parent) {
                return Err(err(format!(
                    "switch {child} is already under switch {prev}"
                )));
            }
        }
        for (switch, &n) in &switches {
            let mut seen = HashSet::from([switch.as_str()]);
            let mut s = switch.as_str();
            while let Some(p) = self.parent.get(s) {
                if !seen.insert(p) {
                    return Err(at(n)(format!(
                        "switch {switch} is below itself (a loop through {p})"
                    )));
                }
                s = p;
            }
        }
        Ok(())
    }

    fn parse_ports<F, E>(&mut self, lines: &[(usize, &str)], at: F) -> Result<(), TopologyError>
    where
        F: Fn(usize) -> E,
        E: Fn(String) -> TopologyError,
    {
        let mut port_line: HashMap<PortKey, usize> = HashMap::new();
        for &(n, line) in lines {
            let err = at(n);
            let words: Vec<&str> = line.split_whitespace().collect();
            let [host, port, switch, switch_port] = words[..] else {
                return Err(err(format!(
                    "{} words, expected 4: HOST DEVICE/PORT SWITCH SWITCH_PORT",
                    words.len()
                )));
            };
            let (device, number) = port
                .split_once('/')
                .and_then(|(d, p)| Some((d, p.parse::<u32>().ok()?)))
                .filter(|(d, _)| !d.is_empty())
                .ok_or_else(|| {
                    err(format!(
                        "{port:?} is not DEVICE/PORT (the port as railscope names it: mlx5_0/1)"
                    ))
                })?;
            let key = (host.to_owned(), device.to_owned(), number);
            if let Some(prev) = port_line.insert(key.clone(), n) {
                return Err(err(format!(
                    "{host} {port} is already listed on line {prev}"
                )));
            }
            self.port_switch
                .insert(key, (switch.to_owned(), switch_port.to_owned()));
        }
        Ok(())
    }

    /// Replaces the ports' LLDP neighbours: port → (switch, the switch's port).
    pub fn set_neighbours(&mut self, neighbours: HashMap<PortKey, (String, String)>) {
        self.neighbours = neighbours;
    }

    /// The switch `port` hangs off, if known: the file's port line, else the file's switch
    /// of its node, else its LLDP neighbour.
    pub fn switch_of(&self, port: &PortKey) -> Option<&str> {
        self.port_switch
            .get(port)
            .map(|(s, _)| s.as_str())
            .or_else(|| self.node_switch.get(&port.0).map(String::as_str))
            .or_else(|| self.neighbours.get(port).map(|(s, _)| s.as_str()))
    }

    /// The switch's own port that `port` is cabled to (the plain format, or LLDP).
    pub fn switch_port_of(&self, port: &PortKey) -> Option<&str> {
        self.port_switch
            .get(port)
            .or_else(|| {
                (!self.node_switch.contains_key(&port.0))
                    .then(|| self.neighbours.get(port))
                    .flatten()
            })
            .map(|(_, p)| p.as_str())
    }

    /// The lowest switch every one of `ports` hangs below: their leaf if they share it, else
    /// the first switch up the tree above all of them. None if a port is unknown or the
    /// ports share no switch.
    pub fn lowest_common_switch<'a>(
        &self,
        ports: impl IntoIterator<Item = &'a PortKey>,
    ) -> Option<String> {
        let mut common: Option<Vec<&str>> = None;
        for port in ports {
            let mut chain = vec![self.switch_of(port)?];
            while let Some(p) = self.parent.get(*chain.last().expect("one at least")) {
                chain.push(p);
            }
            common = Some(match common {
                None => chain,
                Some(c) => c.into_iter().filter(|s| chain.contains(s)).collect(),
            });
        }
        common?.first().map(|s| (*s).to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(node: &str, device: &str) -> PortKey {
        (node.into(), device.into(), 1)
    }

    const SLURM: &str = "# two leaves under a spine\n\
        SwitchName=s1 Nodes=node[01-16] LinkSpeed=400\n\
        switchname=s2 nodes=node[17-32]\n\
        SwitchName=spine Switches=s[1-2]\n";

    #[test]
    fn slurm_topology_names_the_leaf_ports_share_or_the_spine_above_them() {
        let t = Topology::parse(SLURM, "topology.conf").unwrap();
        assert_eq!(t.switch_of(&port("node07", "mlx5_3")), Some("s1"));
        assert_eq!(t.switch_of(&port("node32", "mlx5_0")), Some("s2"));
        assert_eq!(t.switch_of(&port("node33", "mlx5_0")), None);
        let leaf: Vec<PortKey> = (1..=16)
            .map(|i| port(&format!("node{i:02}"), "mlx5_0"))
            .collect();
        assert_eq!(t.lowest_common_switch(&leaf).as_deref(), Some("s1"));
        let both = [port("node01", "mlx5_0"), port("node20", "mlx5_0")];
        assert_eq!(t.lowest_common_switch(&both).as_deref(), Some("spine"));
        let unknown = [port("node01", "mlx5_0"), port("gpu99", "mlx5_0")];
        assert_eq!(t.lowest_common_switch(&unknown), None);
    }

    #[test]
    fn a_plain_port_file_names_the_switch_and_its_port() {
        let t = Topology::parse(
            "node01 mlx5_0/1 leaf1 17\nnode02 mlx5_0/1 leaf1 18\n\nnode02 mlx5_1/1 leaf2 3 # rail 2\n",
            "ports.txt",
        )
        .unwrap();
        let p = port("node02", "mlx5_0");
        assert_eq!(t.switch_of(&p), Some("leaf1"));
        assert_eq!(t.switch_port_of(&p), Some("18"));
        let leaf1 = [port("node01", "mlx5_0"), p];
        assert_eq!(t.lowest_common_switch(&leaf1).as_deref(), Some("leaf1"));
        let rails = [port("node02", "mlx5_0"), port("node02", "mlx5_1")];
        assert_eq!(t.lowest_common_switch(&rails), None);
    }

    #[test]
    fn lldp_neighbours_name_the_switch_of_ports_the_file_does_not_cover() {
        let mut t = Topology::parse(SLURM, "topology.conf").unwrap();
        t.set_neighbours(HashMap::from([
            // Covered by the file: the file wins.
            (
                port("node01", "mlx5_0"),
                ("roce-leaf9".into(), "swp1".into()),
            ),
            (port("gpu01", "mlx5_0"), ("s2".into(), "swp17".into())),
            (
                port("gpu02", "mlx5_0"),
                ("roce-leaf9".into(), "swp18".into()),
            ),
        ]));
        assert_eq!(t.switch_of(&port("node01", "mlx5_0")), Some("s1"));
        assert_eq!(t.switch_port_of(&port("node01", "mlx5_0")), None);
        assert_eq!(t.switch_of(&port("gpu02", "mlx5_0")), Some("roce-leaf9"));
        assert_eq!(t.switch_port_of(&port("gpu02", "mlx5_0")), Some("swp18"));
        // A leaf LLDP names as the file does sits below the file's spine.
        let both = [port("node01", "mlx5_0"), port("gpu01", "mlx5_0")];
        assert_eq!(t.lowest_common_switch(&both).as_deref(), Some("spine"));
        let apart = [port("gpu01", "mlx5_0"), port("gpu02", "mlx5_0")];
        assert_eq!(t.lowest_common_switch(&apart), None);
        // Without a file at all.
        let mut t = Topology::default();
        t.set_neighbours(HashMap::from([
            (
                port("gpu02", "mlx5_0"),
                ("roce-leaf9".into(), "swp18".into()),
            ),
            (
                port("gpu03", "mlx5_0"),
                ("roce-leaf9".into(), "swp19".into()),
            ),
        ]));
        let leaf = [port("gpu02", "mlx5_0"), port("gpu03", "mlx5_0")];
        assert_eq!(t.lowest_common_switch(&leaf).as_deref(), Some("roce-leaf9"));
    }

    #[test]
    fn a_malformed_file_is_refused_with_its_name_line_and_what_is_wrong() {
        for (text, expect) in [
            ("", "topology t: no switch or port in it"),
            (
                "SwitchName=s1 Nodes=n[1-4\n",
                "topology t:1: Nodes: unclosed '['",
            ),
            (
                "SwitchName=s1 Nodes=n[4-1]\n",
                "topology t:1: Nodes: range \"4-1\"",
            ),
            (
                "SwitchName=s1 Nodes=n1\nNodes=n2\n",
                "topology t:2: no SwitchName=",
            ),
            (
                "SwitchName=s1 Ports=n1\n",
                "topology t:1: unknown key \"Ports\"",
            ),
            (
                "SwitchName=s1 n1\n",
                "topology t:1: \"n1\" is not Key=Value",
            ),
            ("SwitchName=s1 Nodes=\n", "topology t:1: Nodes has no value"),
            (
                "SwitchName=s1 Nodes=n[1-2]\nSwitchName=s2 Nodes=n2\n",
                "topology t:2: node n2 is already under switch s1 (line 1)",
            ),
            (
                "SwitchName=s1 Nodes=n1\n\nSwitchName=s1 Nodes=n2\n",
                "topology t:3: switch s1 is already defined on line 1",
            ),
            (
                "SwitchName=top Switches=s[1-2]\nSwitchName=s1 Nodes=n1\n",
                "topology t:1: Switches= names s2, which no SwitchName= defines",
            ),
            (
                "SwitchName=a Switches=b\nSwitchName=b Switches=a\n",
                "is below itself",
            ),
            (
                "SwitchName=a Switches=c\nSwitchName=b Switches=c\nSwitchName=c\n",
                "topology t:2: switch c is already under switch a",
            ),
            (
                "node01 mlx5_0/1 leaf1\n",
                "topology t:1: 3 words, expected 4",
            ),
            (
                "# ports\nnode01 mlx5_0 leaf1 17\n",
                "topology t:2: \"mlx5_0\" is not DEVICE/PORT",
            ),
            (
                "node01 mlx5_0/x leaf1 17\n",
                "topology t:1: \"mlx5_0/x\" is not DEVICE/PORT",
            ),
            (
                "node01 mlx5_0/1 leaf1 17\nnode01 mlx5_0/1 leaf2 1\n",
                "topology t:2: node01 mlx5_0/1 is already listed on line 1",
            ),
        ] {
            let e = Topology::parse(text, "t").unwrap_err().to_string();
            assert!(e.starts_with(expect) || e.contains(expect), "{text:?}: {e}");
        }
        let e = Topology::load(Path::new("/nonexistent/topology.conf"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("topology /nonexistent/topology.conf: "),
            "{e}"
        );
    }
}
