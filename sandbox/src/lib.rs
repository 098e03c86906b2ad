//! Disposable Debian roots for the apt tests and `drover demo --upgrade`.
//! One minbase root is made per machine with debootstrap and cached; each
//! user copies it, points apt at a local flat repository built with dpkg-deb,
//! and throws the copy away. Nothing here touches the host's packages: every
//! apt and dpkg call runs chrooted into the copy. Failures panic with the
//! tool's output: this is test and demo scaffolding, not agent code.
// Test and demo scaffolding: a set-up step that fails panics with its
// reason, as a test does (the workspace denies expect elsewhere).
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Where the pristine root and debootstrap's package cache live.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("DROVER_TEST_ROOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/drover-test-roots"))
}

/// The host's Debian mirror (from its apt sources), so debootstrap uses the
/// archive this machine can reach.
pub fn mirror() -> String {
    let sources =
        std::fs::read_to_string("/etc/apt/sources.list.d/debian.sources").unwrap_or_default();
    let from_deb822 = sources
        .lines()
        .filter_map(|l| l.strip_prefix("URIs:"))
        .flat_map(str::split_whitespace)
        .find(|u| !u.contains("security"));
    if let Some(uri) = from_deb822 {
        return uri.to_owned();
    }
    let list = std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    list.lines()
        .filter(|l| l.starts_with("deb "))
        .flat_map(|l| l.split_whitespace().skip(1).find(|w| w.starts_with("http")))
        .find(|u| !u.contains("security"))
        .map(str::to_owned)
        .unwrap_or_else(|| "http://deb.debian.org/debian".to_owned())
}

/// The host's Debian codename, which is the suite the root is made of.
pub fn suite() -> String {
    std::fs::read_to_string("/etc/os-release")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|s| s.trim_matches('"').to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "bookworm".to_owned())
}

/// The cached pristine root, made on first use (about a minute). Concurrent
/// tests wait on a lock while one of them makes it.
pub fn pristine() -> PathBuf {
    let cache = cache_dir();
    std::fs::create_dir_all(cache.join("debs")).expect("cache dir");
    let suite = suite();
    let root = cache.join(format!("{suite}-minbase"));
    let ready = cache.join(format!("{suite}-minbase.ready"));
    let lock = std::fs::File::create(cache.join("lock")).expect("lock file");
    lock.lock().expect("lock the root cache");
    if !ready.exists() {
        let _ = std::fs::remove_dir_all(&root);
        let out = Command::new("debootstrap")
            .args(["--variant=minbase", "--cache-dir"])
            .arg(cache.join("debs"))
            .arg(&suite)
            .arg(&root)
            .arg(mirror())
            .output()
            .expect("debootstrap is installed (the README's test command installs it)");
        assert!(
            out.status.success(),
            "debootstrap failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(&ready, "").expect("mark ready");
    }
    drop(lock);
    root
}

/// A fake package for the local repository.
#[derive(Debug, Clone, Default)]
pub struct Pkg {
    pub name: String,
    pub version: String,
    pub preinst: Option<String>,
    pub postinst: Option<String>,
    /// Files the package ships (absolute paths inside the root).
    pub files: Vec<(String, String)>,
    /// Which of `files` are conffiles.
    pub conffiles: Vec<String>,
    /// The control file's Depends field, if any.
    pub depends: Option<String>,
}

impl Pkg {
    pub fn new(name: &str, version: &str) -> Self {
        Self {
            name: name.to_owned(),
            version: version.to_owned(),
            files: vec![(
                format!("/usr/share/doc/{name}/version"),
                format!("{version}\n"),
            )],
            ..Self::default()
        }
    }

    pub fn preinst(mut self, script: &str) -> Self {
        self.preinst = Some(script.to_owned());
        self
    }

    pub fn postinst(mut self, script: &str) -> Self {
        self.postinst = Some(script.to_owned());
        self
    }

    /// Ships a file (an absolute path inside the root).
    pub fn file(mut self, path: &str, content: &str) -> Self {
        self.files.push((path.to_owned(), content.to_owned()));
        self
    }

    pub fn depends(mut self, depends: &str) -> Self {
        self.depends = Some(depends.to_owned());
        self
    }

    pub fn conffile(mut self, path: &str, content: &str) -> Self {
        self.files.push((path.to_owned(), content.to_owned()));
        self.conffiles.push(path.to_owned());
        self
    }

    /// Builds the .deb into `out` (its build tree under `work`); its path.
    pub fn build(&self, work: &Path, out: &Path) -> PathBuf {
        let tree = work.join(format!("{}_{}", self.name, self.version));
        let _ = std::fs::remove_dir_all(&tree);
        let debian = tree.join("DEBIAN");
        std::fs::create_dir_all(&debian).expect("DEBIAN");
        let depends = self
            .depends
            .as_ref()
            .map(|d| format!("Depends: {d}\n"))
            .unwrap_or_default();
        std::fs::write(
            debian.join("control"),
            format!(
                "Package: {}\nVersion: {}\nArchitecture: all\nMaintainer: Drover tests <tests@drover.invalid>\n\
                 Priority: optional\nSection: misc\n{depends}Description: Drover test package\n",
                self.name, self.version
            ),
        )
        .expect("control");
        for (path, content) in &self.files {
            let target = tree.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(target.parent().expect("parent")).expect("mkdir");
            std::fs::write(target, content).expect("file");
        }
        if !self.conffiles.is_empty() {
            std::fs::write(debian.join("conffiles"), self.conffiles.join("\n") + "\n")
                .expect("conffiles");
        }
        for (name, script) in [("preinst", &self.preinst), ("postinst", &self.postinst)] {
            if let Some(body) = script {
                let path = debian.join(name);
                std::fs::write(&path, format!("#!/bin/sh\nset -e\n{body}\nexit 0\n"))
                    .expect("script");
                run(Command::new("chmod").arg("0755").arg(&path));
            }
        }
        let deb = out.join(format!("{}_{}_all.deb", self.name, self.version));
        run(Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zgzip", "--build"])
            .arg(&tree)
            .arg(&deb));
        deb
    }
}

fn run(command: &mut Command) -> Output {
    let out = command.output().expect("run a host tool");
    assert!(
        out.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// One disposable copy of the pristine root with its own repository.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    /// The repository, seen from the host; `/srv/repo` inside the root.
    pub repo: PathBuf,
}

impl Sandbox {
    pub fn new() -> Self {
        let pristine = pristine();
        let dir = tempfile::Builder::new()
            .prefix("drover-sandbox-")
            .tempdir_in(cache_dir())
            .expect("sandbox dir");
        let root = dir.path().join("root");
        run(Command::new("cp").arg("-a").arg(&pristine).arg(&root));
        let repo = root.join("srv/repo");
        std::fs::create_dir_all(&repo).expect("repo dir");
        std::fs::write(
            root.join("etc/apt/sources.list"),
            "deb [trusted=yes] file:/srv/repo ./\n",
        )
        .expect("sources");
        if let Ok(entries) = std::fs::read_dir(root.join("etc/apt/sources.list.d")) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        std::fs::write(
            root.join("etc/apt/apt.conf.d/99drover-tests"),
            "Acquire::Languages \"none\";\n",
        )
        .expect("apt conf");
        Self { dir, root, repo }
    }

    /// Builds the packages into the repository and re-indexes it.
    pub fn publish(&self, packages: &[Pkg]) {
        self.publish_to(
            &self.repo,
            "Origin: drover-tests\nLabel: drover-tests\n",
            packages,
        );
    }

    /// Builds the packages into a second repository, `/srv/security`, whose
    /// Release names a security suite as Debian's does (label
    /// `…-Security`, suite `…-security`), and adds it to the sources.
    pub fn publish_security(&self, packages: &[Pkg]) {
        let repo = self.root.join("srv/security");
        std::fs::create_dir_all(&repo).expect("security repo dir");
        let sources = self.root.join("etc/apt/sources.list.d/security.list");
        std::fs::write(&sources, "deb [trusted=yes] file:/srv/security ./\n")
            .expect("security sources");
        self.publish_to(
            &repo,
            "Origin: drover-tests\nLabel: drover-tests-Security\nSuite: drover-security\n\
             Codename: drover-security\n",
            packages,
        );
    }

    fn publish_to(&self, repo: &Path, release_fields: &str, packages: &[Pkg]) {
        let work = self.dir.path().join("build");
        std::fs::create_dir_all(&work).expect("build dir");
        for package in packages {
            package.build(&work, repo);
        }
        let index = run(Command::new("dpkg-scanpackages")
            .args(["-m", "."])
            .current_dir(repo)
            .stderr(Stdio::null()));
        std::fs::write(repo.join("Packages"), &index.stdout).expect("Packages");
        let sha = run(Command::new("sha256sum").arg("Packages").current_dir(repo));
        let hash = String::from_utf8_lossy(&sha.stdout)
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned();
        std::fs::write(
            repo.join("Release"),
            format!(
                "{release_fields}Date: {}\nSHA256:\n {hash} {} Packages\n",
                jiff::Timestamp::now().strftime("%a, %d %b %Y %H:%M:%S UTC"),
                index.stdout.len()
            ),
        )
        .expect("Release");
    }

    /// Runs a command chrooted into the root.
    pub fn chroot(&self, args: &[&str]) -> Output {
        Command::new("chroot")
            .arg(&self.root)
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .output()
            .expect("chroot")
    }

    /// Installs packages from the repository (test set-up).
    pub fn install(&self, names: &[&str]) {
        for args in [
            vec!["apt-get", "-q", "update"],
            [vec!["apt-get", "-y", "-q", "install"], names.to_vec()].concat(),
        ] {
            let out = self.chroot(&args);
            assert!(
                out.status.success(),
                "{args:?} failed:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// `version status` of an installed package (`2.0 ii `), or None.
    pub fn package(&self, name: &str) -> Option<String> {
        let out = self.chroot(&[
            "dpkg-query",
            "-W",
            "-f",
            "${Version} ${db:Status-Abbrev}",
            name,
        ]);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// A path inside the root.
    pub fn path(&self, inside: &str) -> PathBuf {
        self.root.join(inside.trim_start_matches('/'))
    }
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}
