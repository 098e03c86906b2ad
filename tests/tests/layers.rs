//! The control plane's layers hold (issue 29): four crates, each knowing
//! only those below it (Cargo itself refuses a circle between crates);
//! inside each crate the top-level modules form no circle; no production
//! file is over 600 lines; and the rules reach no runtime, store or HTTP
//! library, not even through a shared crate. Read from the sources, so a change that breaks
//! a rule fails here with the files that break it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const LAYERS: [(&str, &str); 5] = [
    ("rules", "drover-rules"),
    ("api", "drover-api"),
    ("store", "drover-store"),
    ("server", "drover-server"),
    ("cli", "drover"),
];

fn control_plane() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../control-plane")
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

fn is_test_file(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// A file's production part: everything before its first `#[cfg(test)]`.
fn production(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read source");
    match text.find("#[cfg(test)]") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

/// The top-level module a file of `src` belongs to (None for lib.rs/main.rs).
fn top_module(src: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.trim_end_matches(".rs");
    (name != "lib" && name != "main").then(|| name.to_owned())
}

/// `crate::NAME` references in `text`'s code (comments left out: a doc
/// link to another module is no dependency on it).
fn crate_refs(text: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let code: String = text
        .lines()
        .map(|line| match line.trim_start().starts_with("//") {
            true => "",
            false => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    for (at, _) in code.match_indices("crate::") {
        let name: String = code[at + "crate::".len()..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if !name.is_empty() {
            refs.insert(name);
        }
    }
    refs
}

/// The circles (strongly connected parts of more than one module).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_owned()];
        while let Some(next) = todo.pop() {
            for dep in graph.get(&next).into_iter().flatten() {
                if seen.insert(dep.clone()) {
                    todo.push(dep.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut found: Vec<BTreeSet<String>> = Vec::new();
    for (module, from_it) in &reached {
        let circle: BTreeSet<String> = from_it
            .iter()
            .filter(|other| reached[*other].contains(*module))
            .cloned()
            .collect();
        if circle.len() > 1 && !found.contains(&circle) {
            found.push(circle);
        }
    }
    found
}

#[test]
fn the_control_planes_layers_have_no_circles_and_no_long_files() {
    let mut long = Vec::new();
    let mut circled = Vec::new();
    for (dir, crate_name) in LAYERS {
        let src = control_plane().join(dir).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        assert!(!files.is_empty(), "no sources under {}", src.display());
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in files.iter().filter(|f| !is_test_file(f)) {
            let text = production(file);
            let lines = text.lines().count();
            if lines > 600 {
                long.push(format!("{} ({lines} lines)", file.display()));
            }
            if let Some(module) = top_module(&src, file) {
                graph.entry(module).or_default().extend(crate_refs(&text));
            }
        }
        let modules: BTreeSet<String> = graph.keys().cloned().collect();
        for (module, deps) in graph.iter_mut() {
            deps.retain(|d| modules.contains(d) && d != module);
        }
        for circle in circles(&graph) {
            circled.push(format!("{crate_name}: {circle:?}"));
        }
    }
    assert!(long.is_empty(), "production files over 600 lines: {long:?}");
    assert!(circled.is_empty(), "module circles: {circled:?}");
}

/// The names in a Cargo.toml's `[dependencies]` table.
fn dependencies(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).expect("a Cargo.toml");
    let Some(table) = text.split("\n[dependencies]").nth(1) else {
        return Vec::new();
    };
    let table = table.split("\n[").next().unwrap_or("");
    table
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split(['.', ' ', '=']).next())
        .map(str::to_string)
        .collect()
}

/// The workspace's own crates, by name, with their folders (from the root
/// Cargo.toml's `name = { path = "..." }` lines).
fn workspace_crates() -> BTreeMap<String, PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join("Cargo.toml")).expect("root Cargo.toml");
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(" = { path = \"")?;
            let path = rest.split('"').next()?;
            Some((name.trim().to_string(), root.join(path)))
        })
        .collect()
}

#[test]
fn the_rules_reach_no_runtime_store_or_http_library() {
    let crates = workspace_crates();
    // Everything the rules depend on, following the workspace's own crates
    // down: a runtime reached through a shared crate counts as well.
    let mut reached = BTreeMap::new();
    let mut todo = vec![("drover-rules".to_string(), control_plane().join("rules"))];
    while let Some((name, dir)) = todo.pop() {
        for dep in dependencies(&dir.join("Cargo.toml")) {
            if let Some(dep_dir) = crates.get(&dep) {
                todo.push((dep.clone(), dep_dir.clone()));
            }
            reached.entry(dep).or_insert_with(|| name.clone());
        }
    }
    assert!(reached.contains_key("drover-model"), "{reached:?}");
    for banned in [
        "tokio",
        "redb",
        "axum",
        "hyper",
        "reqwest",
        "agent-core",
        "drover-contract",
        "drover-store",
        "drover-server",
        "async-nats",
        "rumqttc",
        "tokio-tungstenite",
        "sled",
    ] {
        assert!(
            !reached.contains_key(banned),
            "the rules reach {banned} through {}",
            reached[banned]
        );
    }
    let clippy = std::fs::read_to_string(control_plane().join("rules/clippy.toml"))
        .expect("rules' clippy.toml");
    for clock in [
        "jiff::Timestamp::now",
        "std::time::SystemTime::now",
        "std::time::Instant::now",
    ] {
        assert!(
            clippy.contains(clock),
            "the rules' clippy.toml allows {clock}"
        );
    }
}

#[test]
fn a_circle_is_found_when_there_is_one() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(m, deps)| (m.to_owned(), deps.into_iter().map(str::to_owned).collect()))
    .collect();
    let found = circles(&graph);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0],
        ["a", "b", "c"].into_iter().map(str::to_owned).collect()
    );
}

/// The crates `cargo tree -e normal` lists for `package` (each once).
fn normal_tree(package: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new(cargo)
        .current_dir(&root)
        .args(["tree", "--offline", "--locked", "-e", "normal"])
        .args(["--prefix", "none", "--format", "{p}", "-p", package])
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The server knows no transport: the wiring of transports, listeners and
/// the store lives in the binary's crate, which links all three (the
/// positive control: the same query finds them there).
#[test]
fn the_server_links_no_transport_and_the_binary_wires_them() {
    let transports = ["transport-websocket", "transport-nats", "transport-mqtt"];
    let server = normal_tree("drover-server");
    assert!(server.contains("drover-contract"), "{server:?}");
    for transport in transports {
        assert!(
            !server.contains(transport),
            "drover-server links {transport}"
        );
    }
    let binary = normal_tree("drover");
    for transport in transports {
        assert!(binary.contains(transport), "drover lacks {transport}");
    }
}

/// The API's types are data: they reach serde, jiff and utoipa's derive,
/// and nothing of Drover's or a runtime's, so a client in any program can
/// take them.
#[test]
fn the_api_types_reach_no_runtime_and_no_drover_crate() {
    let tree = normal_tree("drover-api");
    assert!(tree.contains("utoipa"), "{tree:?}");
    for banned in [
        "tokio",
        "axum",
        "hyper",
        "reqwest",
        "redb",
        "drover-rules",
        "drover-model",
    ] {
        assert!(!tree.contains(banned), "drover-api reaches {banned}");
    }
}

/// `pub use` lines of `text` that re-export another workspace crate's item
/// (`pub use drover_rules::records;`): `crates` are the crates' names as
/// paths spell them (`drover_rules`).
fn reexports(text: &str, crates: &[String]) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|line| {
            line.strip_prefix("pub use ").is_some_and(|path| {
                crates
                    .iter()
                    .any(|c| path.starts_with(&format!("{c}::")) || path == format!("{c};"))
            })
        })
        .map(str::to_owned)
        .collect()
}

/// Names show where code lives: no crate of the workspace re-exports
/// another's items under its own paths (the old-path re-exports that hid
/// the layers when reading: `crate::records` in the server for
/// `drover_rules::records`), so each use names the crate it comes from.
#[test]
fn no_crate_re_exports_another_crates_items() {
    let crates = workspace_crates();
    let idents: Vec<String> = crates.keys().map(|n| n.replace('-', "_")).collect();
    // The reading finds one when there is one (a positive control).
    assert_eq!(
        reexports(
            "pub use drover_rules::records;\npub use self::x::Y;",
            &idents
        ),
        vec!["pub use drover_rules::records;".to_owned()]
    );
    let mut found = Vec::new();
    for (name, dir) in &crates {
        let mut files = Vec::new();
        rust_files(&dir.join("src"), &mut files);
        for file in files {
            let text = std::fs::read_to_string(&file).expect("read source");
            for line in reexports(&text, &idents) {
                found.push(format!("{name}: {}: {line}", file.display()));
            }
        }
    }
    assert!(found.is_empty(), "re-exports of another crate: {found:#?}");
}

/// The functions of a parsed file longer than `max` lines, with their
/// lengths: free functions, methods and trait defaults, but none under a
/// `#[cfg(test)]` item.
fn long_functions(source: &str, max: usize) -> Vec<(String, String)> {
    use syn::visit::Visit;
    struct Finder {
        max: usize,
        found: Vec<(String, String)>,
    }
    fn is_test(attrs: &[syn::Attribute]) -> bool {
        attrs.iter().any(|a| {
            a.path().is_ident("test")
                || (a.path().is_ident("cfg")
                    && a.parse_args::<syn::Ident>().is_ok_and(|i| i == "test"))
        })
    }
    impl Finder {
        fn check(&mut self, name: &syn::Ident, from: proc_macro2::Span, to: proc_macro2::Span) {
            let lines = to.end().line.saturating_sub(from.start().line) + 1;
            if lines > self.max {
                self.found
                    .push((name.to_string(), format!("{lines} lines")));
            }
        }
    }
    impl<'a> Visit<'a> for Finder {
        fn visit_item_mod(&mut self, item: &'a syn::ItemMod) {
            if !is_test(&item.attrs) {
                syn::visit::visit_item_mod(self, item);
            }
        }
        fn visit_item_fn(&mut self, item: &'a syn::ItemFn) {
            if !is_test(&item.attrs) {
                let end = item.block.brace_token.span.close();
                self.check(&item.sig.ident, item.sig.fn_token.span, end);
                syn::visit::visit_item_fn(self, item);
            }
        }
        fn visit_impl_item_fn(&mut self, item: &'a syn::ImplItemFn) {
            if !is_test(&item.attrs) {
                let end = item.block.brace_token.span.close();
                self.check(&item.sig.ident, item.sig.fn_token.span, end);
                syn::visit::visit_impl_item_fn(self, item);
            }
        }
        fn visit_trait_item_fn(&mut self, item: &'a syn::TraitItemFn) {
            if let Some(block) = &item.default {
                let end = block.brace_token.span.close();
                self.check(&item.sig.ident, item.sig.fn_token.span, end);
            }
            syn::visit::visit_trait_item_fn(self, item);
        }
    }
    let file = syn::parse_file(source).expect("a Rust file syn parses");
    let mut finder = Finder {
        max,
        found: Vec::new(),
    };
    finder.visit_file(&file);
    finder.found
}

/// Every production file of `dir`'s `src` (test files left out).
fn production_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let src = dir.join("src");
    if src.is_dir() {
        rust_files(&src, &mut files);
    }
    files.retain(|f| !is_test_file(f));
    files
}

/// What was long or circled when the rule came to every crate: each is to
/// be split, and the test fails when one here no longer breaks the rule
/// (take it off the list) as when anything not here does. The list only
/// shrinks.
const NOT_YET: &[&str] = &[];

/// Small files and short functions in every crate of the workspace: no
/// production file over 600 lines, no function over 150, and no circle
/// among a crate's top-level modules (but for [`NOT_YET`]).
#[test]
fn every_crate_has_short_files_short_functions_and_no_module_circles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let shown = |file: &Path| {
        let file = file.canonicalize().unwrap_or_else(|_| file.to_path_buf());
        let root = root.canonicalize().unwrap_or_else(|_| root.clone());
        file.strip_prefix(&root)
            .map_or_else(|_| file.display().to_string(), |f| f.display().to_string())
    };
    const MAX_FUNCTION: usize = 150;
    let mut long_files = Vec::new();
    let mut long_functions_found = Vec::new();
    let mut circled = Vec::new();
    for (name, dir) in &members() {
        let src = dir.join("src");
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for file in production_files(dir) {
            let text = std::fs::read_to_string(&file).expect("read source");
            let lines = production(&file).lines().count();
            if lines > 600 {
                long_files.push((shown(&file), format!("{lines} lines")));
            }
            for (function, lines) in long_functions(&text, MAX_FUNCTION) {
                long_functions_found.push((format!("{}: {function}", shown(&file)), lines));
            }
            if let Some(module) = top_module(&src, &file) {
                graph
                    .entry(module)
                    .or_default()
                    .extend(crate_refs(&production(&file)));
            }
        }
        let modules: BTreeSet<String> = graph.keys().cloned().collect();
        for (module, deps) in graph.iter_mut() {
            deps.retain(|d| modules.contains(d) && d != module);
        }
        for circle in circles(&graph) {
            let modules: Vec<String> = circle.into_iter().collect();
            circled.push((format!("{name}: {}", modules.join(", ")), String::new()));
        }
    }
    let broken: Vec<(String, String)> = long_files
        .into_iter()
        .chain(long_functions_found)
        .chain(circled)
        .collect();
    let new: Vec<&(String, String)> = broken
        .iter()
        .filter(|(what, _)| !NOT_YET.contains(&what.as_str()))
        .collect();
    let mended: Vec<&&str> = NOT_YET
        .iter()
        .filter(|known| !broken.iter().any(|(what, _)| what == *known))
        .collect();
    assert!(
        new.is_empty(),
        "over 600 lines (a file), over {MAX_FUNCTION} lines (a function) or in a module \
         circle: {new:#?}"
    );
    assert!(
        mended.is_empty(),
        "these keep the rule now: take them off NOT_YET: {mended:?}"
    );
}

/// Every member of the workspace (the root Cargo.toml's `members`), by its
/// package name, with its folder.
fn members() -> BTreeMap<String, PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(root.join("Cargo.toml")).expect("root Cargo.toml");
    let list = text
        .split("members = [")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .expect("the workspace's members");
    let members: BTreeMap<String, PathBuf> = list
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|m| {
            let dir = root.join(m);
            let manifest =
                std::fs::read_to_string(dir.join("Cargo.toml")).expect("a member's Cargo.toml");
            let name = manifest
                .lines()
                .find_map(|l| l.strip_prefix("name = \""))
                .and_then(|l| l.split('"').next())
                .expect("a package name")
                .to_owned();
            (name, dir)
        })
        .collect();
    assert!(members.len() >= 15, "{members:?}");
    members
}

#[test]
fn a_long_function_is_found_and_a_test_one_is_not() {
    let body = "    let x = 1;\n".repeat(10);
    let source = format!(
        "fn long() {{\n{body}}}\nfn short() {{}}\n#[cfg(test)]\nmod tests {{\n    fn long_test() {{\n{body}    }}\n}}\n"
    );
    assert_eq!(
        long_functions(&source, 5),
        vec![("long".to_owned(), "12 lines".to_owned())]
    );
}
