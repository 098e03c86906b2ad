//! The man pages and shell completions the packages install are generated
//! from the CLI definitions the binaries parse, and committed under
//! docs/man and docs/completions (packaging needs no generator then). This
//! test fails when they are stale; regenerate them with
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
        for subcommand in command.get_subcommands().filter(|c| !c.is_hide_set()) {
            let full = format!("{name}-{}", subcommand.get_name());
            let page = man(subcommand.clone().name(full.clone()));
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
    // The agent's unit names its man page; the page exists.
    let unit = std::fs::read_to_string(docs.join("../systemd/drover-agent.service")).expect("unit");
    assert!(unit.contains("man:drover-agent(8)"));
    assert!(docs.join("man/drover-agent.8").exists());
}
