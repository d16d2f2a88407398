//! Every import inside `dlock-runtime` points down (ARCHITECTURE.md, "Layers"): no module
//! reaches, directly or through others, a module that reaches it back; a child that names its
//! parent counts as well as one that names a sibling.
//!
//! The graph is read from the source with `syn` (every `cfg` on: each feature's code is seen;
//! `#[cfg(test)]` modules and items left out, as in the library build). An edge goes from a
//! module to the module where a name it uses is defined: every path of its `use` items and of
//! its code that starts at `crate`, `super`, `self` or a child module is followed through the
//! modules it names and through the re-exports (`pub use`) on its way, to the module that
//! defines the last name. Paths that a macro generates or takes as tokens are not seen.
//! `scripts/module-cycles` checks the same rule on cargo-modules' graph (rust-analyzer's name
//! resolution), for developers who have it installed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A module's path from the crate root: `["backend", "redis"]` is `crate::backend::redis`.
type ModPath = Vec<String>;

/// What one module holds that name resolution needs.
#[derive(Default)]
struct Module {
    /// The modules declared in it (not `#[cfg(test)]`).
    children: BTreeSet<String>,
    /// The names its items define (types, functions, traits, constants, macros...).
    defined: BTreeSet<String>,
    /// Names its `use` items bring in: the name, and the path it stands for (as written).
    imports: Vec<(String, Vec<String>)>,
    /// Its glob imports: the path before `*` (as written).
    globs: Vec<Vec<String>>,
    /// Every path it uses that may lead into the crate (as written): its imports' paths and
    /// the paths in its code.
    uses: Vec<Vec<String>>,
}

/// The module tree of the crate whose root file is `root`.
struct Crate {
    modules: BTreeMap<ModPath, Module>,
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Meta>()
                .is_ok_and(|meta| meta.path().is_ident("test"))
    })
}

/// Collects the paths of the code of one module, without descending into its inline modules
/// (each is a module of its own) or its `#[cfg(test)]` items.
#[derive(Default)]
struct Paths {
    found: Vec<Vec<String>>,
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}

    fn visit_item_use(&mut self, _: &'ast syn::ItemUse) {
        // Read with the module's imports.
    }

    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !item_is_test(item) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs: &[syn::Attribute] = match item {
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Const(c) => &c.attrs,
            syn::ImplItem::Type(t) => &t.attrs,
            _ => &[],
        };
        if !is_cfg_test(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    /// `pub(in crate::a)` names where an item may be seen, not what it uses.
    fn visit_vis_restricted(&mut self, _: &'ast syn::VisRestricted) {}

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            self.found
                .push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, path);
    }
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
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
        _ => &[],
    }
}

fn item_is_test(item: &syn::Item) -> bool {
    is_cfg_test(item_attrs(item))
}

/// The names (and the paths they stand for) and the globs of one `use` tree under `prefix`.
fn flatten_use(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    named: &mut Vec<(String, Vec<String>)>,
    globs: &mut Vec<Vec<String>>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten_use(&p.tree, prefix, named, globs);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut path = prefix.clone();
            let name = n.ident.to_string();
            if name == "self" {
                // `use a::b::{self}` brings in `b`.
                if let Some(last) = path.last().cloned() {
                    named.push((last, path));
                }
            } else {
                path.push(name.clone());
                named.push((name, path));
            }
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            path.push(r.ident.to_string());
            named.push((r.rename.to_string(), path));
        }
        syn::UseTree::Glob(_) => globs.push(prefix.clone()),
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                flatten_use(tree, prefix, named, globs);
            }
        }
    }
}

impl Crate {
    fn read(root: &Path) -> Crate {
        let mut krate = Crate {
            modules: BTreeMap::new(),
        };
        let file = parse(root);
        let dir = root.parent().expect("the root file's folder").to_owned();
        krate.add(Vec::new(), &file.items, &dir);
        krate
    }

    /// Adds the module at `path` whose items are `items`; its child modules' files are in
    /// `dir`.
    fn add(&mut self, path: ModPath, items: &[syn::Item], dir: &Path) {
        let mut module = Module::default();
        for item in items {
            if item_is_test(item) {
                continue;
            }
            match item {
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    module.children.insert(name.clone());
                    let mut child = path.clone();
                    child.push(name.clone());
                    match &m.content {
                        Some((_, items)) => self.add(child, items, &dir.join(&name)),
                        None => {
                            let flat = dir.join(format!("{name}.rs"));
                            let (file, child_dir) = if flat.exists() {
                                (flat, dir.join(&name))
                            } else {
                                (dir.join(&name).join("mod.rs"), dir.join(&name))
                            };
                            let parsed = parse(&file);
                            self.add(child, &parsed.items, &child_dir);
                        }
                    }
                }
                syn::Item::Use(u) => {
                    let mut named = Vec::new();
                    flatten_use(&u.tree, &mut Vec::new(), &mut named, &mut module.globs);
                    module.imports.extend(named);
                }
                syn::Item::Const(i) => drop(module.defined.insert(i.ident.to_string())),
                syn::Item::Enum(i) => drop(module.defined.insert(i.ident.to_string())),
                syn::Item::Fn(i) => drop(module.defined.insert(i.sig.ident.to_string())),
                syn::Item::Static(i) => drop(module.defined.insert(i.ident.to_string())),
                syn::Item::Struct(i) => drop(module.defined.insert(i.ident.to_string())),
                syn::Item::Trait(i) => drop(module.defined.insert(i.ident.to_string())),
                syn::Item::Type(i) => drop(module.defined.insert(i.ident.to_string())),
                syn::Item::Union(i) => drop(module.defined.insert(i.ident.to_string())),
                syn::Item::Macro(i) => {
                    if let Some(name) = &i.ident {
                        module.defined.insert(name.to_string());
                    }
                }
                _ => {}
            }
        }
        let mut paths = Paths::default();
        for item in items {
            paths.visit_item(item);
        }
        module.uses = module.imports.iter().map(|(_, p)| p.clone()).collect();
        module.uses.extend(module.globs.iter().cloned());
        module.uses.extend(paths.found);
        self.modules.insert(path, module);
    }

    /// Where the first segment of `path`, written in module `from`, starts; and the segments
    /// left. `None` for paths that do not start in this crate (other crates, local names).
    fn start<'p>(&self, from: &ModPath, path: &'p [String]) -> Option<(ModPath, &'p [String])> {
        let (first, rest) = path.split_first()?;
        match first.as_str() {
            "crate" => Some((Vec::new(), rest)),
            "self" => Some((from.clone(), rest)),
            "super" => {
                let mut at = from.clone();
                at.pop()?;
                let mut rest = rest;
                while rest.first().is_some_and(|s| s == "super") {
                    at.pop()?;
                    rest = &rest[1..];
                }
                Some((at, rest))
            }
            name if self.modules[from].children.contains(name) => {
                let mut at = from.clone();
                at.push(name.to_owned());
                Some((at, rest))
            }
            _ => None,
        }
    }

    /// The module that defines what `path` (written in module `from`) names: through the
    /// modules it names, then through the re-exports of the module it reached. `depth` bounds
    /// the re-exports followed (a loop of them would be a compile error anyway).
    fn resolve(&self, from: &ModPath, path: &[String], depth: usize) -> Option<ModPath> {
        let (mut at, mut rest) = self.start(from, path)?;
        while let Some((next, tail)) = rest.split_first() {
            let module = self.modules.get(&at)?;
            if module.children.contains(next) {
                at.push(next.clone());
                rest = tail;
                continue;
            }
            if module.defined.contains(next) || depth == 0 {
                return Some(at);
            }
            // A name `at` imports: where that import leads (its own path from `at`), plus
            // whatever follows the name (an enum variant, an associated item: no module).
            if let Some((_, target)) = module.imports.iter().find(|(name, _)| name == next) {
                return Some(self.resolve(&at, target, depth - 1).unwrap_or(at));
            }
            for glob in &module.globs {
                let mut through = glob.clone();
                through.push(next.clone());
                if let Some(found) = self.resolve(&at, &through, depth - 1)
                    && self
                        .modules
                        .get(&found)
                        .is_some_and(|m| m.defined.contains(next) || m.children.contains(next))
                {
                    return Some(found);
                }
            }
            return Some(at);
        }
        Some(at)
    }

    /// The edges of the graph: module → the modules it uses (not itself).
    fn edges(&self) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
        let mut edges = BTreeMap::new();
        for (from, module) in &self.modules {
            let targets: &mut BTreeSet<ModPath> = edges.entry(from.clone()).or_default();
            for path in &module.uses {
                if let Some(to) = self.resolve(from, path, 16)
                    && &to != from
                {
                    targets.insert(to);
                }
            }
        }
        edges
    }
}

fn parse(file: &Path) -> syn::File {
    let text = std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("cannot parse {}: {e}", file.display()))
}

fn shown(path: &ModPath) -> String {
    if path.is_empty() {
        "crate".to_owned()
    } else {
        format!("crate::{}", path.join("::"))
    }
}

/// A cycle of `edges` as the modules along it (first repeated last), if there is one.
fn find_cycle(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Option<Vec<ModPath>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &ModPath,
        edges: &BTreeMap<ModPath, BTreeSet<ModPath>>,
        marks: &mut BTreeMap<ModPath, Mark>,
        stack: &mut Vec<ModPath>,
    ) -> Option<Vec<ModPath>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = stack.iter().position(|n| n == node).unwrap_or(0);
                let mut cycle = stack[from..].to_vec();
                cycle.push(node.clone());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.clone(), Mark::Open);
        stack.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, marks, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        marks.insert(node.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in edges.keys() {
        if let Some(cycle) = visit(node, edges, &mut marks, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

fn runtime_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dlock-runtime/src/lib.rs")
}

#[test]
fn no_module_of_the_runtime_imports_one_that_imports_it_back() {
    let krate = Crate::read(&runtime_root());
    let edges = krate.edges();
    let count: usize = edges.values().map(BTreeSet::len).sum();
    // The reading itself: a tree of this size with imports between its modules.
    assert!(
        krate.modules.len() > 60 && count > 200,
        "read only {} modules and {count} imports from {}",
        krate.modules.len(),
        runtime_root().display()
    );
    // Every loop, one after the other: each found is cut at its last edge before the next look.
    let mut left = edges.clone();
    let mut cycles = Vec::new();
    while let Some(cycle) = find_cycle(&left) {
        if let [.., from, to] = &cycle[..]
            && let Some(targets) = left.get_mut(from)
        {
            targets.remove(to);
        }
        cycles.push(cycle.iter().map(shown).collect::<Vec<_>>().join(" -> "));
    }
    assert!(
        cycles.is_empty(),
        "import cycles inside dlock-runtime:\n{}",
        cycles.join("\n")
    );
    println!(
        "dlock-runtime: {} modules, {count} imports between them, no cycle",
        krate.modules.len()
    );
}

/// The checker finds the loops it is for, in a crate written for the test: a child that
/// imports its parent's re-export of a sibling's item is no cycle (the edge goes to the
/// sibling); one that imports an item its parent defines is.
#[test]
fn the_checker_sees_a_cycle_through_a_parent_and_not_through_a_re_export() {
    let dir = std::env::temp_dir().join(format!("dlock-module-cycles-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("a")).expect("temp dir");
    let write = |file: &str, text: &str| std::fs::write(dir.join(file), text).expect("write");
    write("lib.rs", "mod a;\nmod b;\n");
    write(
        "a/mod.rs",
        "mod one;\nmod two;\npub use two::Two;\nfn f() { one::g(); }\n",
    );
    write("a/one.rs", "use super::Two;\npub fn g() {}\n");
    write("a/two.rs", "pub struct Two;\n");
    write("b.rs", "pub fn h() { crate::a::Two; }\n");
    let edges = Crate::read(&dir.join("lib.rs")).edges();
    let edge = |from: &[&str], to: &[&str]| {
        let (from, to): (ModPath, ModPath) = (
            from.iter().map(|s| s.to_string()).collect(),
            to.iter().map(|s| s.to_string()).collect(),
        );
        edges[&from].contains(&to)
    };
    assert!(edge(&["a", "one"], &["a", "two"]), "{edges:?}");
    assert!(!edge(&["a", "one"], &["a"]), "{edges:?}");
    assert!(edge(&["a"], &["a", "one"]), "{edges:?}");
    assert!(edge(&["b"], &["a", "two"]), "{edges:?}");
    assert_eq!(find_cycle(&edges), None);

    // `one` now uses a function its parent defines, and the parent uses `one`.
    write("a/one.rs", "use super::Two;\npub fn g() { super::f(); }\n");
    let cycle = find_cycle(&Crate::read(&dir.join("lib.rs")).edges())
        .map(|c| c.iter().map(shown).collect::<Vec<_>>());
    std::fs::remove_dir_all(&dir).expect("remove the temp dir");
    assert_eq!(
        cycle,
        Some(vec![
            "crate::a".into(),
            "crate::a::one".into(),
            "crate::a".into()
        ])
    );
}
