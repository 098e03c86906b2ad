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

/// `crate::NAME` references in `text`.
fn crate_refs(text: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        let name: String = text[at + "crate::".len()..]
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
