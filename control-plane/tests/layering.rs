//! The house, drawn from the code's imports: no import cycle between the files of the control
//! plane or of the egress gateway, nor between their modules (two sibling modules importing from
//! each other, whichever files do it), and each of the control plane's top-level modules
//! importing only from the layers below it (the table in `src/lib.rs`).
//!
//! The graph is read with `syn` from the module tree under `lib.rs` (test-only modules left out):
//! every path that starts with `crate`, `super` or `self`, in a `use`, anywhere in code, in a
//! macro's body or in an attribute (`#[openapi(paths(crate::routes::meta::health))]`, a
//! `#[utoipa::path(..., body = crate::error::ErrorBody)]`, `#[serde(with = "crate::x")]`), is an
//! arrow to the file that defines the longest module prefix of it. A name the crate root
//! re-exports (`crate::AppState` for `pub use state::{AppState, app}` in `lib.rs`) is an arrow to
//! what it names: the root is no layer. A module of another crate the root re-exports
//! (`pub use sandbox_engine as engine`, `pub use sandbox_common::{ids, ...}`) is a module of the
//! control plane's, in the layer its name has: `crate::engine::…` is an arrow to `engine`. A module
//! reaching into its own children is structure, not an arrow.
//!
//! The engine crate (`engine/`) is drawn too, for cycles; it cannot import the control plane.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The control plane's layers, lowest first. A module may import from its own layer's peers
/// and from any layer before it; the cycle check keeps peers from importing each other both ways.
const LAYERS: &[&[&str]] = &[
    &[
        "ids",
        "secret",
        "text",
        "time",
        "api",
        "archive",
        "shared_file",
        "endpoint",
        "backoff",
        "background",
        "layout",
    ],
    &["config"],
    &["engine", "coordination"],
    &["runtime", "telemetry"],
    &["egress", "snapshots"],
    &["sandbox"],
    &["pool"],
    &["sessions"],
    &["workspace", "processes", "reaper"],
    &["fleet"],
    &["admission", "error", "auth"],
    &["ops"],
    &["routes"],
    &["mcp", "e2b", "opensandbox"],
    &["state", "serve"],
];

/// A module path (`["pool", "refill"]`) and the file that holds it.
struct Module {
    path: Vec<String>,
    file: PathBuf,
}

/// Walks the module tree from `lib.rs`, following `mod x;` declarations that are not
/// `#[cfg(test)]`.
fn modules(src: &Path) -> Vec<Module> {
    let mut out = Vec::new();
    walk(src, &src.join("lib.rs"), Vec::new(), &mut out);
    out
}

fn walk(src: &Path, file: &Path, path: Vec<String>, out: &mut Vec<Module>) {
    let ast = parse(file);
    out.push(Module {
        path: path.clone(),
        file: file.to_path_buf(),
    });
    let dir = module_dir(src, &path);
    for item in &ast.items {
        if let syn::Item::Mod(m) = item {
            if is_test_only(&m.attrs) {
                continue;
            }
            let name = m.ident.to_string();
            let mut child = path.clone();
            child.push(name.clone());
            match &m.content {
                // An inline module lives in this file: its paths resolve here.
                Some(_) => out.push(Module {
                    path: child,
                    file: file.to_path_buf(),
                }),
                None => {
                    let flat = dir.join(format!("{name}.rs"));
                    let nested = dir.join(&name).join("mod.rs");
                    let f = if flat.exists() { flat } else { nested };
                    walk(src, &f, child, out);
                }
            }
        }
    }
}

fn read(file: &Path) -> String {
    std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

fn parse(file: &Path) -> syn::File {
    syn::parse_file(&read(file)).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

fn module_dir(src: &Path, path: &[String]) -> PathBuf {
    path.iter().fold(src.to_path_buf(), |d, s| d.join(s))
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// Collects the absolute module paths a file refers to, skipping `#[cfg(test)]` items.
struct Refs<'a> {
    /// The module the visitor is in (inline modules push onto it).
    here: Vec<String>,
    /// (the module a path is in, the path made absolute).
    found: &'a mut Vec<(Vec<String>, Vec<String>)>,
}

impl Refs<'_> {
    /// `crate::a::b`, `super::c`, `self::d` made absolute; other paths (external crates, locals,
    /// a child module named without `self::`) are left out.
    fn absolute(&self, segs: &[String]) -> Option<Vec<String>> {
        let mut base = match segs.first()?.as_str() {
            // The doors' composition names the service crate's modules by it.
            "crate" | "sandbox_service" => Vec::new(),
            "super" | "self" => self.here.clone(),
            _ => return None,
        };
        let mut rest = segs;
        if rest[0] == "crate" || rest[0] == "sandbox_service" {
            rest = &rest[1..];
        } else {
            while let Some(first) = rest.first() {
                match first.as_str() {
                    "super" => {
                        base.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                rest = &rest[1..];
            }
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.leaf(prefix, &n.ident),
            syn::UseTree::Rename(r) => self.leaf(prefix, &r.ident),
            syn::UseTree::Glob(_) => self.push(prefix),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.tree(prefix, t);
                }
            }
        }
    }

    fn leaf(&mut self, prefix: &[String], ident: &syn::Ident) {
        let mut segs = prefix.to_vec();
        // `use super::{self, x}`: `self` names the prefix itself.
        if ident != "self" {
            segs.push(ident.to_string());
        }
        self.push(&segs);
    }

    fn push(&mut self, segs: &[String]) {
        if let Some(abs) = self.absolute(segs) {
            self.found.push((self.here.clone(), abs));
        }
    }
}

impl<'ast> Visit<'ast> for Refs<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Trait(t) => &t.attrs,
            syn::Item::Type(t) => &t.attrs,
            syn::Item::Macro(m) => &m.attrs,
            _ => &[],
        };
        if is_test_only(attrs) {
            return;
        }
        match item {
            syn::Item::Use(u) => self.tree(&mut Vec::new(), &u.tree),
            syn::Item::Mod(m) if m.content.is_some() => {
                self.here.push(m.ident.to_string());
                syn::visit::visit_item_mod(self, m);
                self.here.pop();
            }
            _ => syn::visit::visit_item(self, item),
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segs: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.push(&segs);
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        // Macro bodies are tokens: read the `crate::…` paths in them too.
        self.tokens(mac.tokens.clone(), false);
    }

    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        // Doc comments name items for rustdoc's links, not for the compiler.
        if attr.path().is_ident("doc") {
            return;
        }
        match &attr.meta {
            // `#[openapi(paths(crate::routes::x::f))]`, `#[serde(with = "crate::x")]`: tokens,
            // string literals included (serde's attributes name functions in strings).
            syn::Meta::List(list) => self.tokens(list.tokens.clone(), true),
            _ => syn::visit::visit_attribute(self, attr),
        }
    }
}

impl Refs<'_> {
    /// The `crate::…`, `super::…` and `self::…` paths in a token stream; with `strings`, also
    /// those spelled inside string literals.
    fn tokens(&mut self, stream: proc_macro2::TokenStream, strings: bool) {
        fn flat(stream: proc_macro2::TokenStream, strings: bool, out: &mut Vec<String>) {
            for t in stream {
                match t {
                    proc_macro2::TokenTree::Group(g) => {
                        // A group ends any path before it.
                        out.push(String::new());
                        flat(g.stream(), strings, out);
                        out.push(String::new());
                    }
                    proc_macro2::TokenTree::Literal(l) if strings => {
                        out.push(String::new());
                        let path = syn::parse_str::<syn::LitStr>(&l.to_string())
                            .ok()
                            .and_then(|s| syn::parse_str::<syn::Path>(&s.value()).ok());
                        if let Some(path) = path {
                            for (i, seg) in path.segments.iter().enumerate() {
                                if i > 0 {
                                    out.extend([":".to_string(), ":".to_string()]);
                                }
                                out.push(seg.ident.to_string());
                            }
                        }
                        out.push(String::new());
                    }
                    other => out.push(other.to_string()),
                }
            }
        }
        let mut tokens = Vec::new();
        flat(stream, strings, &mut tokens);
        let mut i = 0;
        while i < tokens.len() {
            let starts = matches!(
                tokens[i].as_str(),
                "crate" | "super" | "self" | "sandbox_service"
            ) && tokens.get(i + 1).is_some_and(|t| t == ":");
            if starts {
                let mut segs = vec![tokens[i].clone()];
                let mut j = i + 1;
                while tokens.get(j).is_some_and(|t| t == ":")
                    && tokens.get(j + 1).is_some_and(|t| t == ":")
                    && tokens.get(j + 2).is_some_and(|t| !t.is_empty())
                {
                    segs.push(tokens[j + 2].clone());
                    j += 3;
                }
                self.push(&segs);
                i = j;
            } else {
                i += 1;
            }
        }
    }
}

/// The names each module imports (`use a::b::C;` in module `m`: `m` + `C` → `a::b::C`), so a
/// path through the crate root's re-exports resolves to what it names. Globs are left out.
struct Uses<'a> {
    here: Vec<String>,
    modules: &'a BTreeSet<Vec<String>>,
    found: &'a mut BTreeMap<Vec<String>, Vec<String>>,
    /// The crate root's `pub use` of another crate's path: alias → that path.
    external: &'a mut BTreeMap<String, Vec<String>>,
    /// Whether the `use` being read is `pub`.
    public: bool,
}

impl Uses<'_> {
    fn tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.name(prefix, &n.ident, &n.ident),
            syn::UseTree::Rename(r) => self.name(prefix, &r.ident, &r.rename),
            syn::UseTree::Glob(_) => {}
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.tree(prefix, t);
                }
            }
        }
    }

    fn name(&mut self, prefix: &[String], ident: &syn::Ident, alias: &syn::Ident) {
        let mut segs = prefix.to_vec();
        if ident != "self" {
            segs.push(ident.to_string());
        }
        let alias = if ident == "self" && alias == "self" {
            match prefix.last() {
                Some(last) => last.clone(),
                None => return,
            }
        } else {
            alias.to_string()
        };
        // `pub use sandbox_service::{…};` in the doors' root: the service's modules.
        if self.here.is_empty()
            && self.public
            && segs.first().is_some_and(|f| f == "sandbox_service")
        {
            self.external.insert(alias, segs);
            return;
        }
        let mut found = Vec::new();
        let mut refs = Refs {
            here: self.here.clone(),
            found: &mut found,
        };
        refs.push(&segs);
        let target = match found.pop() {
            Some((_, t)) => t,
            // `use child::X;` (a path relative to this module, without `self::`).
            None if segs.first().is_some_and(|f| {
                let mut child = self.here.clone();
                child.push(f.clone());
                self.modules.contains(&child)
            }) =>
            {
                let mut t = self.here.clone();
                t.extend(segs);
                t
            }
            // `pub use other_crate::module;` in the root: that module, under its alias.
            None if self.here.is_empty() && self.public => {
                self.external.insert(alias, segs);
                return;
            }
            None => return,
        };
        let mut key = self.here.clone();
        key.push(alias);
        if key != target {
            self.found.insert(key, target);
        }
    }
}

impl<'ast> Visit<'ast> for Uses<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        match item {
            syn::Item::Use(u) if !is_test_only(&u.attrs) => {
                self.public = matches!(u.vis, syn::Visibility::Public(_));
                self.tree(&mut Vec::new(), &u.tree);
            }
            syn::Item::Mod(m) if m.content.is_some() && !is_test_only(&m.attrs) => {
                self.here.push(m.ident.to_string());
                syn::visit::visit_item_mod(self, m);
                self.here.pop();
            }
            // Only a module's own `use` items: not those inside functions.
            _ => {}
        }
    }
}

/// File → files it imports, with each module resolved to the file that defines it.
struct Graph {
    /// Module path → file.
    files: BTreeMap<Vec<String>, PathBuf>,
    edges: BTreeMap<PathBuf, BTreeSet<PathBuf>>,
    /// Module → the sibling modules it imports from (what its own or its descendants' paths
    /// reach in the sibling or below it).
    siblings: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
    /// Top-level module → top-level modules it imports.
    top: BTreeMap<String, BTreeSet<String>>,
}

fn graph(src: &Path) -> Graph {
    let mods = modules(src);
    let mut files: BTreeMap<Vec<String>, PathBuf> = mods
        .iter()
        .map(|m| (m.path.clone(), m.file.clone()))
        .collect();
    let roots: Vec<&Module> = mods
        .iter()
        .filter(|m| files[&m.path] == m.file && is_file_root(m, &mods))
        .collect();
    let asts: Vec<syn::File> = roots.iter().map(|m| parse(&m.file)).collect();

    // What each module's `use` items name, for paths that go through them.
    let names: BTreeSet<Vec<String>> = files.keys().cloned().collect();
    let mut aliases = BTreeMap::new();
    let mut external = BTreeMap::new();
    for (m, ast) in roots.iter().zip(&asts) {
        Uses {
            here: m.path.clone(),
            modules: &names,
            found: &mut aliases,
            external: &mut external,
            public: false,
        }
        .visit_file(ast);
    }
    // Another crate's modules the root re-exports are modules of this one (a file of their own
    // that imports nothing of it).
    for (alias, path) in external {
        files.insert(vec![alias], PathBuf::from(format!("<{}>", path.join("::"))));
    }
    // The longest prefix of `target` that is a module, through the imports it passes.
    let resolve = |mut target: Vec<String>| -> Option<Vec<String>> {
        for _ in 0..16 {
            let module = (0..=target.len())
                .rev()
                .map(|n| target[..n].to_vec())
                .find(|p| files.contains_key(p))?;
            // Only the crate root's: it is no layer, so what it passes on is the layer of what
            // it names. A module's own re-exports are its interface, and count as it.
            let Some(alias) = target
                .get(module.len())
                .filter(|_| module.is_empty())
                .and_then(|next| aliases.get(&vec![next.clone()]))
            else {
                return Some(module);
            };
            let mut next = alias.clone();
            next.extend(target[module.len() + 1..].iter().cloned());
            target = next;
        }
        None
    };

    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    let mut siblings: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, ast) in roots.iter().zip(&asts) {
        let mut found = Vec::new();
        Refs {
            here: m.path.clone(),
            found: &mut found,
        }
        .visit_file(ast);
        for (here, target) in found {
            let Some(module) = resolve(target) else {
                continue;
            };
            // Into one's own children (or itself) is structure, not an arrow.
            if module.starts_with(&m.path) || module.starts_with(&here) {
                continue;
            }
            let to = files[&module].clone();
            if to != m.file {
                edges.entry(m.file.clone()).or_default().insert(to);
            }
            // The two siblings under the deepest module both are in.
            let common = here.iter().zip(&module).take_while(|(a, b)| a == b).count();
            if here.len() > common && module.len() > common {
                siblings
                    .entry(here[..=common].to_vec())
                    .or_default()
                    .insert(module[..=common].to_vec());
            }
            if let (Some(a), Some(b)) = (here.first(), module.first())
                && a != b
            {
                top.entry(a.clone()).or_default().insert(b.clone());
            }
        }
    }
    Graph {
        files,
        edges,
        siblings,
        top,
    }
}

/// The module whose file this is (not an inline module inside it).
fn is_file_root(m: &Module, mods: &[Module]) -> bool {
    !mods
        .iter()
        .any(|o| o.file == m.file && o.path.len() < m.path.len())
}

/// Every cycle's nodes (strongly connected components of more than one node).
fn cycles<N: Ord + Clone>(edges: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    // Tarjan's algorithm, small enough to write out.
    struct T<'a, N> {
        edges: &'a BTreeMap<N, BTreeSet<N>>,
        index: BTreeMap<&'a N, usize>,
        low: BTreeMap<&'a N, usize>,
        stack: Vec<&'a N>,
        on: BTreeSet<&'a N>,
        out: Vec<Vec<N>>,
    }
    impl<'a, N: Ord + Clone> T<'a, N> {
        fn go(&mut self, v: &'a N) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on.insert(v);
            if let Some(ws) = self.edges.get(v) {
                for w in ws {
                    if !self.index.contains_key(w) {
                        self.go(w);
                        let l = self.low[w].min(self.low[v]);
                        self.low.insert(v, l);
                    } else if self.on.contains(w) {
                        let l = self.index[w].min(self.low[v]);
                        self.low.insert(v, l);
                    }
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    comp.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            t.go(v);
        }
    }
    t.out
}

fn crate_src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("src")
}

fn assert_acyclic(name: &str) -> Graph {
    let src = crate_src(name);
    let g = graph(&src);
    assert!(
        g.files.len() > 10,
        "{name}: only {} modules found",
        g.files.len()
    );
    let files: Vec<Vec<String>> = cycles(&g.edges)
        .into_iter()
        .map(|c| {
            c.iter()
                .map(|f| f.strip_prefix(&src).unwrap_or(f).display().to_string())
                .collect()
        })
        .collect();
    assert!(files.is_empty(), "{name}: import cycles: {files:#?}");
    let modules: Vec<Vec<String>> = cycles(&g.siblings)
        .into_iter()
        .map(|c| c.iter().map(|m| m.join("::")).collect())
        .collect();
    assert!(
        modules.is_empty(),
        "{name}: modules importing from each other: {modules:#?}"
    );
    g
}

#[test]
fn the_control_plane_has_no_import_cycle() {
    assert_acyclic("service");
    assert_acyclic("control-plane");
}

#[test]
fn the_gateway_has_no_import_cycle() {
    assert_acyclic("egress-gateway");
}

#[test]
fn the_engine_crate_has_no_import_cycle() {
    assert_acyclic("engine");
}

#[test]
fn each_control_plane_module_imports_only_from_the_layers_below() {
    // The service's modules, then the doors' (which see the service's through the root's
    // re-exports, in their layers).
    for name in ["service", "control-plane"] {
        let g = graph(&crate_src(name));
        let layer = |m: &str| LAYERS.iter().position(|l| l.contains(&m));
        let mut wrong = Vec::new();
        for module in g.files.keys().filter(|p| p.len() == 1) {
            assert!(
                layer(&module[0]).is_some(),
                "{name}: `{}` is in no layer: add it to LAYERS and to the table in lib.rs",
                module[0]
            );
        }
        for (from, tos) in &g.top {
            for to in tos {
                let (Some(a), Some(b)) = (layer(from), layer(to)) else {
                    continue;
                };
                if b > a {
                    wrong.push(format!("{from} (layer {a}) → {to} (layer {b})"));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "{name}: imports up the layers: {wrong:#?}"
        );
    }
}

/// The doors: what a client's request comes in through.
const DOORS: &[&str] = &["routes", "mcp", "e2b", "opensandbox"];

/// What a door reaches of the service: the operations, and what their requests, answers and
/// errors are made of.
const DOOR_REACH: &[&str] = &[
    "ops",
    "api",
    "error",
    "auth",
    "config",
    "telemetry",
    "ids",
    "time",
    "text",
    "layout",
    "secret",
];

#[test]
fn doors_reach_the_service_through_its_operations() {
    let g = graph(&crate_src("control-plane"));
    let service: BTreeSet<String> = graph(&crate_src("service"))
        .files
        .keys()
        .filter(|p| p.len() == 1)
        .map(|p| p[0].clone())
        .chain(
            [
                "ids",
                "secret",
                "time",
                "archive",
                "shared_file",
                "endpoint",
                "engine",
                "layout",
            ]
            .map(String::from),
        )
        .collect();
    let mut reached = BTreeSet::new();
    for door in DOORS {
        for to in g.top.get(*door).into_iter().flatten() {
            if service.contains(to) && !DOOR_REACH.contains(&to.as_str()) {
                reached.insert((door.to_string(), to.clone()));
            }
        }
    }
    assert!(
        reached.is_empty(),
        "doors reaching the service past its operations: {reached:#?} (add an operation instead)"
    );
    // Never the helper's channel or its messages: those are the service's alone.
    for door in DOORS {
        assert!(
            !g.top.get(*door).is_some_and(|t| t.contains("runtime")),
            "{door} reaches the session runtime"
        );
    }
    for m in modules(&crate_src("control-plane")) {
        let text = read(&m.file);
        assert!(
            !text.contains("sandbox_protocol::message"),
            "{} speaks the helper's messages",
            m.file.display()
        );
    }
}

#[test]
fn config_imports_nothing_of_the_crate_but_leaves() {
    let g = graph(&crate_src("service"));
    let above: Vec<&String> = g
        .top
        .get("config")
        .into_iter()
        .flatten()
        .filter(|m| !LAYERS[0].contains(&m.as_str()))
        .collect();
    assert!(above.is_empty(), "config imports {above:?}");
}

/// Counts `impl … for? Name` blocks.
struct ImplsOf {
    name: &'static str,
    found: usize,
}

impl<'ast> Visit<'ast> for ImplsOf {
    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        if let syn::Type::Path(p) = &*i.self_ty
            && p.path.segments.last().is_some_and(|s| s.ident == self.name)
        {
            self.found += 1;
        }
        syn::visit::visit_item_impl(self, i);
    }
}

#[test]
fn sessions_are_implemented_only_in_the_sessions_module() {
    let src = crate_src("service");
    let mut outside = Vec::new();
    for m in modules(&src) {
        if m.path.first().is_some_and(|p| p == "sessions") {
            continue;
        }
        let ast = parse(&m.file);
        let mut impls = ImplsOf {
            name: "Sessions",
            found: 0,
        };
        impls.visit_file(&ast);
        if impls.found > 0 {
            outside.push(m.file.display().to_string());
        }
    }
    outside.dedup();
    assert!(
        outside.is_empty(),
        "`impl Sessions` outside sessions/: {outside:?}"
    );
}

#[test]
fn the_graph_sees_known_arrows() {
    // The reader itself: if it stopped seeing paths, every check above would pass vacuously.
    let doors = graph(&crate_src("control-plane"));
    let has = |a: &str, b: &str| doors.top.get(a).is_some_and(|t| t.contains(b));
    // Through the root's re-exports of the service, and the composition's own paths into it.
    assert!(has("routes", "ops"));
    assert!(has("e2b", "ops"));
    assert!(has("serve", "fleet"));
    let g = graph(&crate_src("service"));
    let has = |a: &str, b: &str| g.top.get(a).is_some_and(|t| t.contains(b));
    assert!(has("sessions", "pool"));
    assert!(has("pool", "sandbox"));
    assert!(has("sandbox", "egress"));
    // Through the root's re-exports of the engine and leaves crates.
    assert!(has("sandbox", "engine"));
    assert!(has("fleet", "engine"));
    assert!(has("config", "ids"));
    assert!(has("config", "endpoint"));
}

#[test]
fn the_helper_path_speaks_only_typed_messages() {
    // Requests are built from `sandbox-protocol`'s types and answers read into them: no
    // `json!` literal or untyped `Value` where the control plane talks to the helper.
    let src = crate_src("service");
    let mut untyped = Vec::new();
    for m in modules(&src) {
        if m.path.first().is_none_or(|p| p != "runtime") {
            continue;
        }
        let text = read(&m.file);
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if code.contains("json!") || code.contains("serde_json::Value") {
                untyped.push(format!("{}:{}", m.file.display(), n + 1));
            }
        }
    }
    assert!(
        untyped.is_empty(),
        "untyped JSON on the helper path: {untyped:#?}"
    );
}
