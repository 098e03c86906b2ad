//! The man pages and shell completions the packages install are generated
//! from the CLI definitions the binaries parse, and committed under
//! docs/man and docs/completions (packaging needs no generator then); the
//! operators' API's OpenAPI document, generated from the API's types, is
//! kept as docs/openapi.json for clients in other languages. This test
//! fails when any is stale; regenerate them with
//! `DROVER_BLESS=1 cargo test -p drover-tests --test docs`.

use clap::CommandFactory;
use clap_complete::Shell;
use std::path::{Path, PathBuf};

/// Every generated file, by its path under docs/.
fn generated() -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    for (command, section) in [
        (drover::cli::Cli::command(), "1"),
        (drover_agent::cli::Cli::command(), "8"),
    ] {
        let name = command.get_name().to_owned();
        let man = |command: clap::Command| {
            let mut page = Vec::new();
            clap_mangen::Man::new(command)
                .section(section)
                .date("2026-12-01")
                .source(format!("drover {}", env!("CARGO_PKG_VERSION")))
                .manual("Drover")
                .render(&mut page)
                .expect("man page");
            page
        };
        files.push((
            PathBuf::from(format!("man/{name}.{section}")),
            man(command.clone()),
        ));
        // A page for every subcommand, at every depth (drover-packages-upload):
        // a parent's page names its subcommands' pages.
        let mut todo: Vec<(String, clap::Command)> = command
            .get_subcommands()
            .filter(|c| !c.is_hide_set())
            .map(|c| (format!("{name}-{}", c.get_name()), c.clone()))
            .collect();
        while let Some((full, subcommand)) = todo.pop() {
            for child in subcommand.get_subcommands().filter(|c| !c.is_hide_set()) {
                todo.push((format!("{full}-{}", child.get_name()), child.clone()));
            }
            let page = man(subcommand.name(full.clone()));
            files.push((PathBuf::from(format!("man/{full}.{section}")), page));
        }
        for (shell, file) in [
            (Shell::Bash, name.clone()),
            (Shell::Zsh, format!("_{name}")),
            (Shell::Fish, format!("{name}.fish")),
        ] {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command.clone(), &name, &mut script);
            files.push((PathBuf::from(format!("completions/{file}")), script));
        }
    }
    files.push((
        PathBuf::from("openapi.json"),
        drover_server::api::openapi::document().into_bytes(),
    ));
    files
}

#[test]
fn man_pages_and_completions_match_the_cli() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
    let bless = std::env::var_os("DROVER_BLESS").is_some();
    let mut stale = Vec::new();
    for (path, content) in generated() {
        let path = docs.join(path);
        if bless {
            std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
            std::fs::write(&path, &content).expect("write");
        } else if std::fs::read(&path).ok().as_deref() != Some(content.as_slice()) {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "stale or missing (regenerate with DROVER_BLESS=1 cargo test -p drover-tests --test docs): {stale:?}"
    );
    // Every page a page names (drover-runs-watch(1)) is one that ships.
    let files = generated();
    let shipped: Vec<String> = files
        .iter()
        .filter_map(|(path, _)| path.strip_prefix("man").ok())
        .map(|p| p.display().to_string())
        .collect();
    for (path, content) in &files {
        let text = String::from_utf8_lossy(content);
        for (at, _) in text.match_indices("drover") {
            let rest = &text[at..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '\\'))
                .unwrap_or(rest.len());
            let name = rest[..end].replace("\\-", "-");
            if let Some(section) = rest[end..].strip_prefix('(').and_then(|r| r.get(..1))
                && rest[end..].get(2..3) == Some(")")
            {
                // clap's own `help` subcommand is listed, not paged.
                if name.ends_with("-help") {
                    continue;
                }
                let page = format!("{name}.{section}");
                assert!(
                    shipped.contains(&page),
                    "{} names {page}, which is not generated",
                    path.display()
                );
            }
        }
    }
    // The agent's unit names its man page; the page exists.
    let unit = std::fs::read_to_string(docs.join("../systemd/drover-agent.service")).expect("unit");
    assert!(unit.contains("man:drover-agent(8)"));
    assert!(docs.join("man/drover-agent.8").exists());
}

/// The README and the docs book link only to files that exist, and every
/// chapter under docs/ is in the book's SUMMARY.md (the test command builds
/// the book with mdBook).
#[test]
fn every_link_in_the_readme_and_the_book_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let docs = root.join("docs");
    let mut pages = vec![
        root.join("README.md"),
        root.join("ARCHITECTURE.md"),
        root.join("CHANGELOG.md"),
    ];
    let mut chapters = Vec::new();
    // The book's chapters: docs/*.md and the design notes and decision
    // records under docs/internals/ and docs/decisions/.
    for dir in ["", "internals", "decisions"] {
        for entry in std::fs::read_dir(docs.join(dir)).expect("docs") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "md") {
                let name = path.file_name().expect("name").to_string_lossy();
                chapters.push(if dir.is_empty() {
                    name.into_owned()
                } else {
                    format!("{dir}/{name}")
                });
                pages.push(path);
            }
        }
    }
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("page");
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].split('#').next().unwrap_or("");
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let resolved = page.parent().expect("dir").join(target);
            if !resolved.exists() {
                broken.push(format!("{}: {target}", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing: {broken:#?}");
    let summary = std::fs::read_to_string(docs.join("SUMMARY.md")).expect("SUMMARY.md");
    let missing: Vec<&String> = chapters
        .iter()
        .filter(|c| *c != "SUMMARY.md" && !summary.contains(&format!("]({c})")))
        .collect();
    assert!(missing.is_empty(), "chapters not in the book: {missing:?}");
}

/// The `drover` and `drover-agent` command lines in the `sh` blocks of a
/// markdown file: continuation lines joined, comments, heredoc bodies and
/// `sudo` left out, cut at a redirection or pipe, `…` (more flags) dropped.
fn commands_in(text: &str) -> Vec<Vec<String>> {
    let mut commands = Vec::new();
    let mut in_block = false;
    let mut heredoc: Option<String> = None;
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if !in_block {
            in_block = trimmed == "```sh" || trimmed == "```bash";
            if in_block {
                // An export holds for the block it is in.
                commands.push(vec!["block".to_owned()]);
            }
            continue;
        }
        if trimmed == "```" {
            in_block = false;
            pending.clear();
            continue;
        }
        if let Some(end) = &heredoc {
            if trimmed == end {
                heredoc = None;
            }
            continue;
        }
        if let Some((_, word)) = line.split_once("<<") {
            heredoc = Some(
                word.trim()
                    .trim_matches(|c| c == '\'' || c == '"')
                    .to_owned(),
            );
        }
        let code = match line.find(" #") {
            Some(at) => &line[..at],
            None if trimmed.starts_with('#') => "",
            None => line,
        };
        pending.push_str(code.trim_end().trim_end_matches('\\'));
        pending.push(' ');
        if code.trim_end().ends_with('\\') {
            continue;
        }
        let command = std::mem::take(&mut pending);
        let command = command.trim();
        // `export DROVER_X=…` before a command gives it that flag's value.
        if let Some(assignment) = command.strip_prefix("export ")
            && let Some((name, _)) = assignment.split_once('=')
        {
            commands.push(vec!["export".to_owned(), name.to_owned()]);
            continue;
        }
        let command = command.strip_prefix("sudo ").unwrap_or(command);
        if !(command.starts_with("drover ") || command.starts_with("drover-agent ")) {
            continue;
        }
        let words: Vec<String> = command
            .split_whitespace()
            .take_while(|w| !matches!(*w, ">" | "|" | "2>" | ">>" | "&&" | ";"))
            .filter(|w| *w != "…")
            .map(|w| w.trim_matches('"').trim_matches('`').to_owned())
            .collect();
        commands.push(words);
    }
    commands
}

/// Every `drover` and `drover-agent` command the README and the book show
/// is one these binaries accept: a renamed subcommand or a dropped flag
/// fails here, not in a reader's shell. (The README's first run is also
/// run end to end: tests/tests/operator.rs.)
#[test]
fn every_command_in_the_readme_and_the_book_parses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut pages = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    let mut checked = 0;
    let mut refused = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("page");
        let mut exported = Vec::new();
        for mut words in commands_in(&text) {
            match words[0].as_str() {
                "block" => {
                    exported.clear();
                    continue;
                }
                "export" => {
                    exported.push(words[1].clone());
                    continue;
                }
                _ => {}
            }
            let command = if words[0] == "drover" {
                drover::cli::Cli::command()
            } else {
                drover_agent::cli::Cli::command()
            };
            // The flag an exported variable stands for, given on the line.
            let mut path = vec![command.clone()];
            while let Some(sub) = path
                .last()
                .and_then(|c| {
                    c.get_subcommands()
                        .find(|s| words.iter().any(|w| w == s.get_name()))
                })
                .cloned()
            {
                path.push(sub);
            }
            for name in &exported {
                let flag = path.iter().flat_map(|c| c.get_arguments()).find_map(|a| {
                    (a.get_env().and_then(|e| e.to_str()) == Some(name.as_str()))
                        .then(|| a.get_long().map(str::to_owned))
                        .flatten()
                });
                if let Some(flag) = flag {
                    words.push(format!("--{flag}"));
                    words.push("exported".into());
                }
            }
            let parsed = command.try_get_matches_from(&words);
            checked += 1;
            if let Err(e) = parsed
                && !matches!(
                    e.kind(),
                    clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
                )
            {
                refused.push(format!(
                    "{}: {}: {}",
                    page.display(),
                    words.join(" "),
                    e.to_string().lines().next().unwrap_or("")
                ));
            }
        }
    }
    assert!(checked > 40, "only {checked} commands found");
    assert!(refused.is_empty(), "commands the CLI refuses: {refused:#?}");
}
