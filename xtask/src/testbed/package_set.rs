//! Which versions of a kernel's headers, kbuild and source packages siw is built from, chosen
//! from what the archive offers now, as apt would.
//!
//! Debian moves the packages of one kernel at different times: in one transition the archive
//! held `linux-kbuild-6.1` 6.1.192-3 and 6.1.176-1 while `linux-image-amd64` still depended
//! on the image 6.1.192-2, so asking for every package at the image's exact version failed.
//! Instead, each package's version is chosen by the relations apt itself would follow:
//!
//! - `linux-headers-<kver>`: the image's own version if the archive has it, else the newest
//!   (Debian keeps one kernel ABI, so every headers version of `<kver>` builds modules the
//!   image loads);
//! - each `linux-headers-*` and `linux-kbuild-*` package those headers depend on: the newest
//!   version that satisfies the dependency's relation (`= V`, `>= V`, ...);
//! - when a headers version's dependencies cannot all be satisfied (the set is incomplete),
//!   the next headers version is tried, and the newest complete set wins;
//! - `linux-source-<series>`: the image's own version, else the newest of the same upstream
//!   release (siw's code must be the running kernel's, whatever Debian revision carries it).
//!
//! The choice is a pure function of `apt-cache show`'s answers, so it is tested on answers
//! recorded from the archive (`fixtures/apt-cache/`).

use std::cmp::Reverse;
use std::fmt;

use debversion::Version;

/// One version of one package, as a stanza of `apt-cache show` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Stanza {
    pub package: String,
    pub version: Version,
    /// `Depends:`, one entry per comma-separated group, each a list of alternatives.
    pub depends: Vec<Vec<Relation>>,
}

/// `name (op version)` in a `Depends:` field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Relation {
    pub package: String,
    pub constraint: Option<(Op, Version)>,
}

/// A version relation of a Debian dependency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    Earlier,
    EarlierOrEqual,
    Equal,
    LaterOrEqual,
    Later,
}

impl Op {
    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "<<" => Op::Earlier,
            "<=" | "<" => Op::EarlierOrEqual,
            "=" => Op::Equal,
            ">=" | ">" => Op::LaterOrEqual,
            ">>" => Op::Later,
            _ => return None,
        })
    }

    fn holds(self, have: &Version, want: &Version) -> bool {
        match self {
            Op::Earlier => have < want,
            Op::EarlierOrEqual => have <= want,
            Op::Equal => have == want,
            Op::LaterOrEqual => have >= want,
            Op::Later => have > want,
        }
    }
}

impl fmt::Display for Relation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = |op| match op {
            Op::Earlier => "<<",
            Op::EarlierOrEqual => "<=",
            Op::Equal => "=",
            Op::LaterOrEqual => ">=",
            Op::Later => ">>",
        };
        match &self.constraint {
            Some((o, v)) => write!(f, "{} ({} {v})", self.package, op(*o)),
            None => write!(f, "{}", self.package),
        }
    }
}

/// Every stanza of an `apt-cache show` answer (several packages, several versions each).
/// A version listed by two archives (e.g. bookworm and bookworm-security) is kept once.
pub(super) fn parse_apt_cache_show(text: &str) -> Result<Vec<Stanza>, String> {
    let mut stanzas: Vec<Stanza> = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let field = |name: &str| {
            block
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        let Some(package) = field("Package") else {
            continue;
        };
        let version = field("Version").ok_or(format!("{package}: a stanza without Version"))?;
        let version: Version = version
            .parse()
            .map_err(|e| format!("{package}: version {version:?}: {e}"))?;
        let depends = match field("Depends") {
            Some(d) => parse_depends(d).map_err(|e| format!("{package} {version}: {e}"))?,
            None => Vec::new(),
        };
        let stanza = Stanza {
            package: package.to_owned(),
            version,
            depends,
        };
        if !stanzas.contains(&stanza) {
            stanzas.push(stanza);
        }
    }
    Ok(stanzas)
}

fn parse_depends(field: &str) -> Result<Vec<Vec<Relation>>, String> {
    field
        .split(',')
        .map(|group| group.split('|').map(parse_relation).collect())
        .collect()
}

fn parse_relation(text: &str) -> Result<Relation, String> {
    let text = text.trim();
    let (name, rest) = match text.split_once('(') {
        Some((name, rest)) => (name.trim(), Some(rest)),
        None => (text, None),
    };
    // `name:any` and `name:amd64` name the same package for a download.
    let package = name.split(':').next().unwrap_or(name).to_owned();
    let constraint = match rest {
        None => None,
        Some(rest) => {
            let inner = rest
                .strip_suffix(')')
                .ok_or(format!("unclosed relation {text:?}"))?;
            let inner = inner.trim();
            let split = inner
                .find(|c: char| !"<=>".contains(c))
                .ok_or(format!("relation {text:?} has no version"))?;
            let op = Op::parse(&inner[..split]).ok_or(format!("bad operator in {text:?}"))?;
            let version = inner[split..].trim();
            let version = version
                .parse()
                .map_err(|e| format!("relation {text:?}: {e}"))?;
            Some((op, version))
        }
    };
    Ok(Relation {
        package,
        constraint,
    })
}

/// A package at the version chosen for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Pick {
    pub package: String,
    pub version: Version,
}

impl Pick {
    /// `package=version`, as `apt-get download` takes it.
    pub(super) fn pinned(&self) -> String {
        format!("{}={}", self.package, self.version)
    }
}

impl fmt::Display for Pick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.package, self.version)
    }
}

/// What siw is built from: the headers, the packages they need, and the source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct BuildSet {
    pub headers: Pick,
    /// The `linux-headers-*-common` and `linux-kbuild-*` packages the headers depend on.
    pub dependencies: Vec<Pick>,
    pub source: Pick,
}

impl BuildSet {
    pub(super) fn picks(&self) -> impl Iterator<Item = &Pick> {
        std::iter::once(&self.headers)
            .chain(&self.dependencies)
            .chain(std::iter::once(&self.source))
    }
}

/// The packages whose answers [`choose`] needs, besides the dependencies of the headers.
pub(super) fn wanted(kver: &str, series: &str) -> [String; 2] {
    [
        format!("linux-headers-{kver}"),
        format!("linux-source-{series}"),
    ]
}

/// Whether a headers package's dependency is one siw's build downloads (the compiler
/// package is the host's gcc, installed apart).
pub(super) fn is_build_dependency(package: &str) -> bool {
    package.starts_with("linux-headers-") || package.starts_with("linux-kbuild-")
}

/// Chooses the build set for kernel release `kver` of series `series` whose image package
/// is at `image`, from `stanzas` (the answers for [`wanted`] and the headers' dependencies).
/// The error names what the archive lacks.
pub(super) fn choose(
    kver: &str,
    series: &str,
    image: &Version,
    stanzas: &[Stanza],
) -> Result<BuildSet, String> {
    let [headers_name, source_name] = wanted(kver, series);
    let versions_of = |package: &str| -> Vec<&Stanza> {
        let mut v: Vec<&Stanza> = stanzas.iter().filter(|s| s.package == package).collect();
        v.sort_by(|a, b| b.version.cmp(&a.version));
        v
    };
    let listed = |package: &str| {
        let v: Vec<String> = versions_of(package)
            .iter()
            .map(|s| s.version.to_string())
            .collect();
        if v.is_empty() {
            "none".to_owned()
        } else {
            v.join(", ")
        }
    };
    let source = {
        let mut candidates = versions_of(&source_name);
        candidates.retain(|s| s.version.upstream_version == image.upstream_version);
        // The image's own version first, then the newest.
        candidates.sort_by_key(|s| Reverse(s.version == *image));
        candidates.first().map(|s| Pick {
            package: s.package.clone(),
            version: s.version.clone(),
        })
    }
    .ok_or_else(|| {
        format!(
            "the archive has no {source_name} of upstream {} (it has: {}), for the image {image}",
            image.upstream_version,
            listed(&source_name)
        )
    })?;
    let mut headers = versions_of(&headers_name);
    if headers.is_empty() {
        return Err(format!("the archive has no {headers_name}"));
    }
    headers.sort_by_key(|s| Reverse(s.version == *image));
    let mut incomplete = Vec::new();
    for h in headers {
        match satisfy(h, &versions_of) {
            Ok(dependencies) => {
                return Ok(BuildSet {
                    headers: Pick {
                        package: h.package.clone(),
                        version: h.version.clone(),
                    },
                    dependencies,
                    source,
                });
            }
            Err(relation) => {
                let name = &relation.package;
                incomplete.push(format!(
                    "{headers_name} {} needs {relation} (the archive has: {})",
                    h.version,
                    listed(name)
                ));
            }
        }
    }
    Err(format!(
        "no complete set of headers for {kver}: {}",
        incomplete.join("; ")
    ))
}

/// The newest version of each build dependency of `headers` that satisfies its relation, or
/// the first relation nothing satisfies.
fn satisfy<'a>(
    headers: &'a Stanza,
    versions_of: &dyn Fn(&str) -> Vec<&'a Stanza>,
) -> Result<Vec<Pick>, &'a Relation> {
    let mut picks = Vec::new();
    for group in &headers.depends {
        if !group.iter().any(|r| is_build_dependency(&r.package)) {
            continue;
        }
        let found = group.iter().find_map(|r| {
            versions_of(&r.package)
                .into_iter()
                .find(|s| match &r.constraint {
                    Some((op, want)) => op.holds(&s.version, want),
                    None => true,
                })
        });
        match found {
            Some(s) => picks.push(Pick {
                package: s.package.clone(),
                version: s.version.clone(),
            }),
            None => return Err(&group[0]),
        }
    }
    picks.sort_by(|a, b| a.package.cmp(&b.package));
    Ok(picks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        s.parse().unwrap()
    }

    fn answers(name: &str) -> Vec<Stanza> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/testbed/fixtures/apt-cache")
            .join(name);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        parse_apt_cache_show(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn picked(set: &BuildSet) -> Vec<String> {
        set.picks().map(Pick::pinned).collect()
    }

    #[test]
    fn relations_of_a_headers_package() {
        let d = parse_depends(
            "linux-headers-6.1.0-56-common (= 6.1.192-2), linux-kbuild-6.1 (>= 6.1.192-2), \
             linux-compiler-gcc-12-x86, gcc-12:any | gcc (<< 5)",
        )
        .unwrap();
        assert_eq!(d.len(), 4);
        assert_eq!(
            d[0][0].to_string(),
            "linux-headers-6.1.0-56-common (= 6.1.192-2)"
        );
        assert_eq!(d[1][0].constraint, Some((Op::LaterOrEqual, v("6.1.192-2"))));
        assert_eq!(d[2][0].constraint, None);
        assert_eq!(d[3][0].package, "gcc-12");
        assert_eq!(d[3][1].constraint, Some((Op::Earlier, v("5"))));
        assert!(parse_relation("x (>= )").is_err());
        assert!(parse_relation("x (~ 1)").is_err());
        assert!(parse_relation("x (= 1").is_err());
    }

    /// The archive as recorded in the transition: the image and headers at 6.1.192-2,
    /// `linux-kbuild-6.1` only at 6.1.192-3 and 6.1.176-1 (the old code asked for
    /// `linux-kbuild-6.1=6.1.192-2` and failed).
    #[test]
    fn a_kbuild_moved_past_the_image_is_taken_at_a_version_the_headers_accept() {
        let stanzas = answers("6.1.192-transition.txt");
        let set = choose("6.1.0-56-amd64", "6.1", &v("6.1.192-2"), &stanzas).unwrap();
        assert_eq!(
            picked(&set),
            [
                "linux-headers-6.1.0-56-amd64=6.1.192-2",
                "linux-headers-6.1.0-56-common=6.1.192-2",
                "linux-kbuild-6.1=6.1.192-3",
                "linux-source-6.1=6.1.192-2",
            ]
        );
    }

    /// The recorded answers, moved on as Debian moves them: headers 6.1.192-3 published,
    /// the common package of 6.1.192-2 gone. Added stanzas are the recorded ones' shape.
    fn moved_on() -> Vec<Stanza> {
        let mut stanzas = answers("6.1.192-transition.txt");
        stanzas.retain(|s| {
            !(s.package == "linux-headers-6.1.0-56-common" && s.version == v("6.1.192-2"))
        });
        let added = "Package: linux-headers-6.1.0-56-amd64\nVersion: 6.1.192-3\nDepends: \
                     linux-headers-6.1.0-56-common (= 6.1.192-3), linux-kbuild-6.1 (>= 6.1.192-3), \
                     linux-compiler-gcc-12-x86\n\nPackage: linux-headers-6.1.0-56-common\n\
                     Version: 6.1.192-3\n";
        stanzas.extend(parse_apt_cache_show(added).unwrap());
        stanzas
    }

    /// The headers at the image's version lack their common package: the next headers
    /// version whose dependencies are all there is the set; the source stays the image's.
    #[test]
    fn an_incomplete_set_falls_back_to_the_newest_complete_one() {
        let mut stanzas = moved_on();
        let set = choose("6.1.0-56-amd64", "6.1", &v("6.1.192-2"), &stanzas).unwrap();
        assert_eq!(
            picked(&set),
            [
                "linux-headers-6.1.0-56-amd64=6.1.192-3",
                "linux-headers-6.1.0-56-common=6.1.192-3",
                "linux-kbuild-6.1=6.1.192-3",
                "linux-source-6.1=6.1.192-2",
            ]
        );
        // Nothing complete: the error names each headers version and what it misses.
        stanzas.retain(|s| s.package != "linux-kbuild-6.1" || s.version < v("6.1.192-2"));
        let e = choose("6.1.0-56-amd64", "6.1", &v("6.1.192-2"), &stanzas).unwrap_err();
        assert_eq!(
            e,
            "no complete set of headers for 6.1.0-56-amd64: linux-headers-6.1.0-56-amd64 \
             6.1.192-2 needs linux-headers-6.1.0-56-common (= 6.1.192-2) (the archive has: \
             6.1.192-3); linux-headers-6.1.0-56-amd64 6.1.192-3 needs linux-kbuild-6.1 (>= \
             6.1.192-3) (the archive has: 6.1.176-1)"
        );
    }

    /// The source at the image's version gone: the newest of the same upstream release;
    /// none of it: refused, never another release's code.
    #[test]
    fn the_source_is_the_images_upstream_release_or_nothing() {
        let mut stanzas = answers("6.1.192-transition.txt");
        stanzas.retain(|s| s.package != "linux-source-6.1" || s.version != v("6.1.192-2"));
        let set = choose("6.1.0-56-amd64", "6.1", &v("6.1.192-2"), &stanzas).unwrap();
        assert_eq!(set.source.pinned(), "linux-source-6.1=6.1.192-3");
        stanzas
            .retain(|s| s.package != "linux-source-6.1" || s.version.upstream_version != "6.1.192");
        let e = choose("6.1.0-56-amd64", "6.1", &v("6.1.192-2"), &stanzas).unwrap_err();
        assert_eq!(
            e,
            "the archive has no linux-source-6.1 of upstream 6.1.192 (it has: 6.1.190-1, \
             6.1.187-1, 6.1.176-1, 6.1.170-3), for the image 6.1.192-2"
        );
    }

    /// The 6.12 line as recorded: every package at the image's version, kbuild named after
    /// the release and unversioned in the headers' dependencies, the image among them
    /// (not downloaded for the build).
    #[test]
    fn a_settled_archive_gives_the_images_version() {
        let stanzas = answers("6.12.117-settled.txt");
        let image = v("6.12.117-1~deb12u1");
        let set = choose("6.12.117+deb12-amd64", "6.12", &image, &stanzas).unwrap();
        assert_eq!(
            picked(&set),
            [
                "linux-headers-6.12.117+deb12-amd64=6.12.117-1~deb12u1",
                "linux-headers-6.12.117+deb12-common=6.12.117-1~deb12u1",
                "linux-kbuild-6.12.117+deb12=6.12.117-1~deb12u1",
                "linux-source-6.12=6.12.117-1~deb12u1",
            ]
        );
    }

    #[test]
    fn a_version_listed_by_two_archives_is_one_stanza() {
        let text =
            "Package: a\nVersion: 1-1\n\nPackage: a\nVersion: 1-1\n\nPackage: a\nVersion: 1-2\n";
        assert_eq!(parse_apt_cache_show(text).unwrap().len(), 2);
        assert!(
            parse_apt_cache_show("Package: a\n")
                .unwrap_err()
                .contains("without Version")
        );
    }
}
