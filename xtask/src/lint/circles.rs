//! The import-circle guard of `cargo xtask lint`: no crate of the workspace has modules that
//! use each other, directly or through other modules.
//!
//! Each library and binary target's module tree is read from its root file (`mod foo;` as
//! `foo.rs` or `foo/mod.rs`, `#[path]`, inline `mod foo { … }`), test code left out
//! (`#[cfg(test)]` modules and items). A module's references are the paths of its `use`
//! declarations (grouped trees flattened) and the paths in its code and in macro invocations
//! that start with `crate`, `super`, `self`, a child module or a name the module imports. A
//! reference resolves to the deepest module its path names, through the names modules import
//! (a `pub use` re-export, or a private `use` a child reaches with `super::Name`), so an item
//! re-exported by a parent counts as the child's that defines it.
//!
//! The rule: a reference from module M to module N counts at the level of their lowest
//! common ancestor, as an edge between the two children of that ancestor that hold M and N;
//! references between a module and one of its ancestors (a child using its parent's own
//! items, a parent using its children) are no edge. At each level the strongly connected
//! components of those edges with more than one module are circles, and each is refused with
//! one line naming it and the reference behind each of its edges.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque, hash_map::Entry},
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use proc_macro2::{TokenStream, TokenTree};
use syn::{ext::IdentExt as _, visit::Visit};

/// Circles still let through, each as its crate and the modules it joins: none. An entry
/// here must name a circle that exists (it goes when its circle does); any other circle fails.
const TOLERATED: &[(&str, &[&str])] = &[];

/// Checks every library and binary target of the workspace's members; fails naming each
/// circle, one per line.
pub(super) fn check_workspace(workspace_root: &Path) -> anyhow::Result<()> {
    let mut found = Vec::new();
    for target in workspace_targets(workspace_root)? {
        found.extend(
            circles(&target.label, &target.package_dir, &target.root)
                .with_context(|| format!("reading the module tree of {}", target.label))?,
        );
    }
    let mut problems: Vec<String> = found
        .iter()
        .filter(|c| !TOLERATED.iter().any(|t| c.is(t)))
        .map(|c| c.line.clone())
        .collect();
    for (label, modules) in TOLERATED {
        if !found.iter().any(|c| c.is(&(label, modules))) {
            problems.push(format!(
                "{label}: the tolerated circle {} is gone or has changed: update TOLERATED in \
                 xtask/src/lint/circles.rs",
                modules.join(", ")
            ));
        }
    }
    if !problems.is_empty() {
        bail!(
            "import circles among modules (move what both sides use to a module below them):\n{}",
            problems.join("\n")
        );
    }
    Ok(())
}

/// An import circle: the crate, its modules (sorted), and its line in the lint's message.
pub(super) struct Circle {
    pub label: String,
    pub modules: Vec<String>,
    pub line: String,
}

impl Circle {
    /// Whether this is the circle `(crate, modules)` of [`TOLERATED`].
    fn is(&self, (label, modules): &(&str, &[&str])) -> bool {
        self.label == *label && self.modules.iter().eq(modules.iter())
    }
}

/// A crate to read: how messages name it, its package's folder and its root source file.
struct Target {
    label: String,
    package_dir: PathBuf,
    root: PathBuf,
}

/// The workspace members' library and binary targets, as `cargo metadata` lists them.
fn workspace_targets(workspace_root: &Path) -> anyhow::Result<Vec<Target>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root)
        .args(["metadata", "--no-deps", "--format-version", "1"]);
    let metadata: serde_json::Value = serde_json::from_str(&crate::cargo::output(&mut cmd)?)
        .context("parsing cargo metadata's output")?;
    let mut targets = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        let name = package["name"].as_str().unwrap_or_default();
        let package_dir = Path::new(package["manifest_path"].as_str().unwrap_or_default())
            .parent()
            .unwrap_or(workspace_root)
            .to_path_buf();
        for target in package["targets"].as_array().into_iter().flatten() {
            let kinds: Vec<&str> = target["kind"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k.as_str())
                .collect();
            let Some(root) = target["src_path"].as_str() else {
                continue;
            };
            let label = if kinds.contains(&"bin") {
                format!(
                    "{name} (bin {})",
                    target["name"].as_str().unwrap_or_default()
                )
            } else if kinds
                .iter()
                .any(|k| ["lib", "rlib", "dylib", "cdylib", "staticlib", "proc-macro"].contains(k))
            {
                name.to_owned()
            } else {
                continue; // tests, examples, benches, build scripts
            };
            targets.push(Target {
                label,
                package_dir: package_dir.clone(),
                root: PathBuf::from(root),
            });
        }
    }
    Ok(targets)
}

/// The import circles of the crate whose root file is `root`, each line starting with
/// `label` and naming files from `package_dir`.
pub(super) fn circles(label: &str, package_dir: &Path, root: &Path) -> anyhow::Result<Vec<Circle>> {
    let tree = Tree::read(root)?;
    let mut lines = Vec::new();
    for edges in tree.edges_by_level().values() {
        for component in strongly_connected(edges) {
            if component.len() < 2 {
                continue;
            }
            let cycle = shortest_cycle(edges, &component);
            let names: Vec<String> = cycle
                .iter()
                .chain(cycle.first())
                .map(|&m| tree.name(m))
                .collect();
            let witnesses: Vec<String> = cycle
                .iter()
                .zip(cycle.iter().cycle().skip(1))
                .map(|(from, to)| {
                    let r = &edges[from][to];
                    format!(
                        "{}:{} uses {}",
                        r.file
                            .strip_prefix(package_dir)
                            .unwrap_or(&r.file)
                            .display(),
                        r.line,
                        r.written
                    )
                })
                .collect();
            let mut line = format!(
                "{label}: import circle {} ({})",
                names.join(" → "),
                witnesses.join("; ")
            );
            let rest: Vec<String> = component
                .iter()
                .filter(|m| !cycle.contains(m))
                .map(|&m| tree.name(m))
                .collect();
            if !rest.is_empty() {
                let _ = write!(line, "; the circle also takes in {}", rest.join(", "));
            }
            let mut modules: Vec<String> = component.iter().map(|&m| tree.name(m)).collect();
            modules.sort();
            lines.push(Circle {
                label: label.to_owned(),
                modules,
                line,
            });
        }
    }
    Ok(lines)
}

/// One module of the tree.
struct Module {
    /// Its path from the crate root (empty for the root).
    path: Vec<String>,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    /// The names its `use` declarations bring in, with the path each names (as written).
    imports: HashMap<String, Vec<String>>,
    /// The paths it uses, as written.
    refs: Vec<Reference>,
}

impl Module {
    fn new(path: Vec<String>, parent: Option<usize>) -> Self {
        Self {
            path,
            parent,
            children: BTreeMap::new(),
            imports: HashMap::new(),
            refs: Vec::new(),
        }
    }
}

/// A path a module uses, where it is written.
#[derive(Clone)]
struct Reference {
    segments: Vec<String>,
    file: PathBuf,
    line: usize,
    /// The path as the message shows it.
    written: String,
}

struct Tree {
    modules: Vec<Module>,
}

/// The edges of one level: from a child of the level's module to others, each with the first
/// reference that makes it.
type Edges = BTreeMap<usize, BTreeMap<usize, Reference>>;

impl Tree {
    /// The module tree of the crate whose root file is `root`.
    fn read(root: &Path) -> anyhow::Result<Self> {
        let mut tree = Tree {
            modules: vec![Module::new(Vec::new(), None)],
        };
        let dir = root.parent().unwrap_or(Path::new("")).to_path_buf();
        tree.read_file(root, &dir, 0)?;
        Ok(tree)
    }

    /// Reads the file `file` as module `module`, whose out-of-line children are in `dir`.
    fn read_file(&mut self, file: &Path, dir: &Path, module: usize) -> anyhow::Result<()> {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let parsed =
            syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))?;
        self.read_items(&parsed.items, file, dir, false, module)
    }

    /// Reads `items` (of `file`; inside an inline module when `inline`) as module `module`,
    /// whose out-of-line children are in `dir`, then its child modules.
    fn read_items(
        &mut self,
        items: &[syn::Item],
        file: &Path,
        dir: &Path,
        inline: bool,
        module: usize,
    ) -> anyhow::Result<()> {
        let mut collector = Collector {
            file,
            refs: Vec::new(),
            imports: HashMap::new(),
        };
        for item in items {
            collector.visit_item(item);
        }
        let Collector { refs, imports, .. } = collector;
        self.modules[module].refs.extend(refs);
        self.modules[module].imports.extend(imports);
        for item in items {
            let syn::Item::Mod(m) = item else { continue };
            if is_test_only(&m.attrs) {
                continue;
            }
            let name = m.ident.unraw().to_string();
            let mut path = self.modules[module].path.clone();
            path.push(name.clone());
            let child = self.modules.len();
            self.modules.push(Module::new(path, Some(module)));
            self.modules[module].children.insert(name.clone(), child);
            let path_attr = path_attribute(&m.attrs);
            match &m.content {
                Some((_, items)) => {
                    let child_dir = match &path_attr {
                        Some(p) => dir.join(p),
                        None => dir.join(&name),
                    };
                    self.read_items(items, file, &child_dir, true, child)?;
                }
                None => {
                    let (child_file, child_dir) = match path_attr {
                        Some(p) => {
                            let base = if inline {
                                dir.to_path_buf()
                            } else {
                                file.parent().unwrap_or(Path::new("")).to_path_buf()
                            };
                            let child_file = base.join(p);
                            let child_dir =
                                child_file.parent().unwrap_or(Path::new("")).to_path_buf();
                            (child_file, child_dir)
                        }
                        None => {
                            let flat = dir.join(format!("{name}.rs"));
                            if flat.exists() {
                                (flat, dir.join(&name))
                            } else {
                                (dir.join(&name).join("mod.rs"), dir.join(&name))
                            }
                        }
                    };
                    self.read_file(&child_file, &child_dir, child)?;
                }
            }
        }
        Ok(())
    }

    /// `a::b` for messages (`crate` for the root).
    fn name(&self, module: usize) -> String {
        let path = &self.modules[module].path;
        if path.is_empty() {
            "crate".to_owned()
        } else {
            path.join("::")
        }
    }

    /// The absolute path (from the crate root) that `segments`, written in `module`, names;
    /// `None` for a path outside the crate (another crate, `std`, a local name).
    fn absolute(&self, module: usize, segments: &[String], depth: u32) -> Option<Vec<String>> {
        let (first, rest) = segments.split_first()?;
        let mut base = match first.as_str() {
            "crate" | "$crate" => Vec::new(),
            "self" => self.modules[module].path.clone(),
            "super" => {
                let mut base = self.modules[module].path.clone();
                base.pop()?;
                base
            }
            _ if self.modules[module].children.contains_key(first) => {
                let mut base = self.modules[module].path.clone();
                base.push(first.clone());
                base
            }
            _ => {
                let imported = self.modules[module].imports.get(first)?;
                if depth > 16 || imported.as_slice() == segments {
                    return None;
                }
                let mut base = self.absolute(module, imported, depth + 1)?;
                base.extend(rest.iter().cloned());
                return Some(base);
            }
        };
        // `super::super::x`, `self::super::x`.
        let mut rest = rest;
        while rest.first().is_some_and(|s| s == "super") {
            base.pop()?;
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The module an absolute path leads to: the deepest module it names, or, when it goes on
    /// through a name that module imports, where that name leads.
    fn target(&self, absolute: &[String], depth: u32) -> usize {
        let mut module = 0;
        for (i, segment) in absolute.iter().enumerate() {
            if let Some(&child) = self.modules[module].children.get(segment) {
                module = child;
                continue;
            }
            if depth < 16
                && let Some(imported) = self.modules[module].imports.get(segment)
                && let Some(mut through) = self.absolute(module, imported, depth + 1)
            {
                through.extend(absolute[i + 1..].iter().cloned());
                return self.target(&through, depth + 1);
            }
            break;
        }
        module
    }

    /// Whether `ancestor` is `module` or one of its ancestors.
    fn is_ancestor(&self, ancestor: usize, mut module: usize) -> bool {
        loop {
            if module == ancestor {
                return true;
            }
            match self.modules[module].parent {
                Some(parent) => module = parent,
                None => return false,
            }
        }
    }

    /// The edges at each level, by the module whose children they join.
    fn edges_by_level(&self) -> BTreeMap<usize, Edges> {
        let mut levels: BTreeMap<usize, Edges> = BTreeMap::new();
        for (from, module) in self.modules.iter().enumerate() {
            for reference in &module.refs {
                let Some(absolute) = self.absolute(from, &reference.segments, 0) else {
                    continue;
                };
                let to = self.target(&absolute, 0);
                if self.is_ancestor(from, to) || self.is_ancestor(to, from) {
                    continue;
                }
                // The lowest common ancestor's two children on the way to each side.
                let from_chain = self.chain(from);
                let to_chain = self.chain(to);
                let common = from_chain
                    .iter()
                    .zip(&to_chain)
                    .take_while(|(a, b)| a == b)
                    .count();
                let (parent, a, b) = (from_chain[common - 1], from_chain[common], to_chain[common]);
                levels
                    .entry(parent)
                    .or_default()
                    .entry(a)
                    .or_default()
                    .entry(b)
                    .or_insert_with(|| reference.clone());
            }
        }
        levels
    }

    /// The root, …, `module`.
    fn chain(&self, mut module: usize) -> Vec<usize> {
        let mut chain = vec![module];
        while let Some(parent) = self.modules[module].parent {
            chain.push(parent);
            module = parent;
        }
        chain.reverse();
        chain
    }
}

/// Tarjan's strongly connected components of `edges`.
fn strongly_connected(edges: &Edges) -> Vec<Vec<usize>> {
    struct State<'a> {
        edges: &'a Edges,
        index: HashMap<usize, usize>,
        low: HashMap<usize, usize>,
        stack: Vec<usize>,
        on_stack: BTreeSet<usize>,
        components: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State, v: usize) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in s.edges.get(&v).into_iter().flat_map(BTreeMap::keys) {
            if !s.index.contains_key(&w) {
                visit(s, w);
                let low = s.low[&v].min(s.low[&w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(&w) {
                let low = s.low[&v].min(s.index[&w]);
                s.low.insert(v, low);
            }
        }
        if s.low[&v] == s.index[&v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(&w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            component.sort_unstable();
            s.components.push(component);
        }
    }
    let mut s = State {
        edges,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        components: Vec::new(),
    };
    let nodes: BTreeSet<usize> = edges
        .iter()
        .flat_map(|(from, to)| std::iter::once(*from).chain(to.keys().copied()))
        .collect();
    for v in nodes {
        if !s.index.contains_key(&v) {
            visit(&mut s, v);
        }
    }
    s.components.sort();
    s.components
}

/// The shortest cycle through the component's first module, staying in the component.
fn shortest_cycle(edges: &Edges, component: &[usize]) -> Vec<usize> {
    let start = component[0];
    let mut came_from: HashMap<usize, usize> = HashMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in edges.get(&v).into_iter().flat_map(BTreeMap::keys) {
            if !component.contains(&w) {
                continue;
            }
            if w == start {
                let mut cycle = vec![v];
                while let Some(&p) = came_from.get(cycle.last().expect("not empty")) {
                    cycle.push(p);
                }
                cycle.reverse();
                return cycle;
            }
            if let Entry::Vacant(entry) = came_from.entry(w) {
                entry.insert(v);
                queue.push_back(w);
            }
        }
    }
    component.to_vec() // unreachable for a strongly connected component
}

/// Gathers a module's references and imports from its items (not its child modules').
struct Collector<'a> {
    file: &'a Path,
    refs: Vec<Reference>,
    imports: HashMap<String, Vec<String>>,
}

impl Collector<'_> {
    fn push(&mut self, segments: Vec<String>, line: usize) {
        let written = segments.join("::");
        self.refs.push(Reference {
            segments,
            file: self.file.to_path_buf(),
            line,
            written,
        });
    }

    /// Flattens a `use` tree into references, and records the names it brings in.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.unraw().to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.unraw().to_string();
                self.import(prefix, name.clone(), name, line_of(&n.ident));
            }
            syn::UseTree::Rename(r) => {
                let name = r.ident.unraw().to_string();
                self.import(
                    prefix,
                    name,
                    r.rename.unraw().to_string(),
                    line_of(&r.ident),
                );
            }
            syn::UseTree::Glob(g) => {
                let line = g.star_token.span.start().line;
                self.push(prefix.clone(), line);
            }
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    fn import(&mut self, prefix: &[String], name: String, binding: String, line: usize) {
        let mut segments = prefix.to_vec();
        if name != "self" {
            segments.push(name);
        }
        if binding != "_" {
            let binding = if binding == "self" {
                segments.last().cloned().unwrap_or_default()
            } else {
                binding
            };
            self.imports.insert(binding, segments.clone());
        }
        self.push(segments, line);
    }

    /// Paths in a macro's tokens: each run `a::b::c` that does not continue another path
    /// or follow a `.` (a method's turbofish).
    fn tokens(&mut self, tokens: TokenStream) {
        let flat = flatten(tokens);
        let is_sep = |j: usize| {
            flat.get(j).is_some_and(|t| t.is_punct(':'))
                && flat.get(j + 1).is_some_and(|t| t.is_punct(':'))
        };
        let mut i = 0;
        while i < flat.len() {
            let Flat::Ident(first, line) = &flat[i] else {
                i += 1;
                continue;
            };
            let continues = i >= 2 && is_sep(i - 2);
            let after_dot = i >= 1 && flat[i - 1].is_punct('.');
            let mut segments = vec![first.clone()];
            if first == "crate" && i >= 1 && flat[i - 1].is_punct('$') {
                segments[0] = "$crate".to_owned();
            }
            let line = *line;
            let mut j = i + 1;
            while is_sep(j) {
                let Some(Flat::Ident(segment, _)) = flat.get(j + 2) else {
                    break;
                };
                segments.push(segment.clone());
                j += 3;
            }
            if segments.len() > 1 && !continues && !after_dot {
                self.push(segments, line);
            }
            i = j;
        }
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if item_attrs(item).is_some_and(is_test_only) {
            return;
        }
        match item {
            // Child modules are modules of their own.
            syn::Item::Mod(_) => {}
            syn::Item::Use(u) => {
                let mut prefix = Vec::new();
                self.use_tree(&mut prefix, &u.tree);
            }
            _ => syn::visit::visit_item(self, item),
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Const(c) => &c.attrs,
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Type(t) => &t.attrs,
            syn::ImplItem::Macro(m) => &m.attrs,
            _ => return syn::visit::visit_impl_item(self, item),
        };
        if !is_test_only(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            let segments = path
                .segments
                .iter()
                .map(|s| s.ident.unraw().to_string())
                .collect();
            self.push(segments, line_of(&path.segments[0].ident));
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.tokens(mac.tokens.clone());
    }
}

/// A token of a macro's flattened stream.
enum Flat {
    Ident(String, usize),
    Punct(char),
    Other,
}

impl Flat {
    fn is_punct(&self, c: char) -> bool {
        matches!(self, Flat::Punct(p) if *p == c)
    }
}

fn flatten(tokens: TokenStream) -> Vec<Flat> {
    let mut flat = Vec::new();
    for token in tokens {
        match token {
            TokenTree::Ident(i) => {
                flat.push(Flat::Ident(i.unraw().to_string(), i.span().start().line))
            }
            TokenTree::Punct(p) => flat.push(Flat::Punct(p.as_char())),
            TokenTree::Group(g) => {
                // A group ends any path before it and after it.
                flat.push(Flat::Other);
                flat.extend(flatten(g.stream()));
                flat.push(Flat::Other);
            }
            TokenTree::Literal(_) => flat.push(Flat::Other),
        }
    }
    flat
}

fn line_of(ident: &syn::Ident) -> usize {
    ident.span().start().line
}

fn item_attrs(item: &syn::Item) -> Option<&[syn::Attribute]> {
    Some(match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => return None,
    })
}

/// `#[cfg(test)]`, or `#[cfg(all(test, …))]`: code only the unit tests build.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        if !attr.path().is_ident("cfg") {
            return false;
        }
        let Ok(meta) = attr.parse_args::<syn::Meta>() else {
            return false;
        };
        match &meta {
            syn::Meta::Path(p) => p.is_ident("test"),
            syn::Meta::List(list) if list.path.is_ident("all") => list
                .parse_args_with(
                    syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
                )
                .is_ok_and(|all| all.iter().any(|m| m.path().is_ident("test"))),
            _ => false,
        }
    })
}

/// The value of a `#[path = "…"]` attribute.
fn path_attribute(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|attr| match &attr.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The circles of a throwaway crate made of `files` (paths under the crate's folder).
    fn circles_of(files: &[(&str, &str)]) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        circles("throwaway", dir.path(), &dir.path().join("src/lib.rs"))
            .unwrap()
            .into_iter()
            .map(|c| c.line)
            .collect()
    }

    #[test]
    fn a_circle_between_two_modules_is_refused_with_both_references() {
        let found = circles_of(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            ("src/a.rs", "use crate::b::B;\npub struct A;\n"),
            (
                "src/b.rs",
                "pub struct B;\n\nfn f() -> crate::a::A {\n    todo!()\n}\n",
            ),
        ]);
        assert_eq!(
            found,
            [
                "throwaway: import circle a → b → a (src/a.rs:1 uses crate::b::B; src/b.rs:3 uses \
              crate::a::A)"
            ]
        );
    }

    #[test]
    fn modules_that_use_one_another_one_way_pass() {
        // Children use their parent's items and each other one way; the parent uses its
        // children; the tests use everything.
        let found = circles_of(&[
            (
                "src/lib.rs",
                "mod net;\nmod store;\npub struct Config;\n\n#[cfg(test)]\nmod tests;\n",
            ),
            (
                "src/net/mod.rs",
                "mod x;\nmod y;\npub struct Thing;\nfn f() { x::go(); y::go(); }\n",
            ),
            (
                "src/net/x.rs",
                "use super::{Thing, y::Y};\nuse crate::{Config, store};\n",
            ),
            (
                "src/net/y.rs",
                "pub struct Y;\nfn f(_: super::Thing, _: crate::Config) {}\n",
            ),
            (
                "src/store.rs",
                "pub fn get() {}\n#[cfg(test)]\nuse crate::net::Thing;\n",
            ),
            ("src/tests.rs", "use crate::{net::Thing, store};\n"),
        ]);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn grouped_uses_macros_and_re_exports_make_edges() {
        let found = circles_of(&[
            ("src/lib.rs", "mod net;\n"),
            // The parent re-exports x's item: y's `super::X` is a use of x.
            ("src/net/mod.rs", "mod x;\nmod y;\npub use x::X;\n"),
            (
                "src/net/x.rs",
                "use crate::{net::{y::{self, Y}}};\npub struct X;\n",
            ),
            (
                "src/net/y.rs",
                "pub struct Y;\nfn f() {\n    println!(\"{}\", super::X);\n}\n",
            ),
        ]);
        assert_eq!(
            found,
            [
                "throwaway: import circle net::x → net::y → net::x (src/net/x.rs:1 uses \
              crate::net::y; src/net/y.rs:3 uses super::X)"
            ]
        );
    }

    #[test]
    fn a_circle_through_nested_modules_counts_between_their_top_siblings() {
        // a::p uses b::q, b::r uses a::s: a and b use each other, through three modules on
        // each side (inline modules among them).
        let found = circles_of(&[
            ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("src/a.rs", "mod p;\npub mod s {\n    pub struct S;\n}\n"),
            ("src/a/p.rs", "fn f() { crate::c::go(); }\n"),
            ("src/c.rs", "pub fn go() { let _ = crate::b::Q; }\n"),
            ("src/b/mod.rs", "mod r;\npub struct Q;\n"),
            ("src/b/r.rs", "use crate::a::s::S;\n"),
        ]);
        assert_eq!(
            found,
            [
                "throwaway: import circle a → c → b → a (src/a/p.rs:1 uses crate::c::go; src/c.rs:1 \
              uses crate::b::Q; src/b/r.rs:1 uses crate::a::s::S)"
            ]
        );
    }
}
