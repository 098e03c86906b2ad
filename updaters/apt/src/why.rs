//! Why apt or dpkg failed, in their own words: the lines of a failed call's
//! output an operator would look for on the device (issue 56), for the
//! job's status. apt says why in `E:` lines and in the block after "The
//! following packages have unmet dependencies:"; dpkg says it in
//! "dpkg: error processing package …" and the indented lines under it.
//! When none of those is there, the last lines of what the call printed.

use drover_model::reason::{bounded_reason, last_lines};

/// Lines that begin a block whose indented lines belong to it.
const BLOCK_HEADS: &[&str] = &[
    "The following packages have unmet dependencies:",
    "dpkg: error processing ",
    "dpkg: dependency problems prevent ",
    "Errors were encountered while processing:",
];

/// Lines kept alone.
const LINE_HEADS: &[&str] = &["E: ", "dpkg: error: ", "dpkg-deb: error: "];

/// How many last lines stand in when nothing says why.
const TAIL_LINES: usize = 10;

/// A maintainer script's own last words come just before dpkg's "error
/// processing package" on the same stream: at most this many of them.
const SCRIPT_LINES: usize = 3;

/// Progress apt and dpkg print, never a script's reason.
const PROGRESS: &[&str] = &[
    "Setting up ",
    "Unpacking ",
    "Preparing to unpack ",
    "Selecting previously unselected ",
    "(Reading database",
    "Processing triggers ",
    "Reading package lists",
    "Building dependency tree",
    "Reading state information",
];

/// The lines of a failed apt or dpkg call's output that say why, stdout's
/// first (apt prints its resolver's account there) then stderr's: at most
/// [`drover_model::reason::MAX_REASON_LINES`], cleaned. Falls back to the
/// last lines of stderr, else of stdout.
pub fn apt_reason(stdout: &str, stderr: &str) -> Vec<String> {
    let mut picked: Vec<&str> = Vec::new();
    for text in [stdout, stderr] {
        pick(text, &mut picked);
    }
    if picked.is_empty() {
        let text = if stderr.trim().is_empty() {
            stdout
        } else {
            stderr
        };
        return last_lines(text, TAIL_LINES);
    }
    // The same line said twice (apt repeats an E: line on both streams
    // in some versions) is shown once.
    picked.dedup();
    bounded_reason(picked)
}

fn pick<'a>(text: &'a str, picked: &mut Vec<&'a str>) {
    let mut in_block = false;
    // Lines not picked since the last picked one, the newest last.
    let mut before: std::collections::VecDeque<&'a str> = Default::default();
    for line in text.lines() {
        let indented = line.starts_with(' ') || line.starts_with('\t');
        if in_block && indented && !line.trim().is_empty() {
            picked.push(line);
            continue;
        }
        in_block = false;
        if BLOCK_HEADS.iter().any(|head| line.starts_with(head)) {
            if line.starts_with("dpkg: error processing ") {
                picked.extend(before.drain(..));
            }
            before.clear();
            picked.push(line);
            in_block = true;
        } else if LINE_HEADS.iter().any(|head| line.starts_with(head)) {
            before.clear();
            picked.push(line);
        } else if !line.trim().is_empty() && !PROGRESS.iter().any(|p| line.starts_with(p)) {
            if before.len() == SCRIPT_LINES {
                before.pop_front();
            }
            before.push_back(line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// apt-get install of a package whose dependency no archive has, as
    /// apt 2.6 (bookworm) says it.
    const UNMET_STDOUT: &str = "Reading package lists...
Building dependency tree...
Reading state information...
Some packages could not be installed. This may mean that you have
requested an impossible situation or if you are using the unstable
distribution that some required packages have not yet been created
or been moved out of Incoming.
The following information may help to resolve the situation:

The following packages have unmet dependencies:
 site-tool : Depends: libsite2 (>= 2.0) but it is not installable
             Recommends: site-data but it is not going to be installed
";
    const UNMET_STDERR: &str = "E: Unable to correct problems, you have held broken packages.\n";

    #[test]
    fn unmet_dependencies_are_named_with_apts_error() {
        assert_eq!(
            apt_reason(UNMET_STDOUT, UNMET_STDERR),
            vec![
                "The following packages have unmet dependencies:",
                " site-tool : Depends: libsite2 (>= 2.0) but it is not installable",
                "             Recommends: site-data but it is not going to be installed",
                "E: Unable to correct problems, you have held broken packages.",
            ]
        );
    }

    /// A maintainer script that failed during full-upgrade: its own last
    /// words, then dpkg's.
    #[test]
    fn dpkgs_error_for_a_package_is_kept_with_its_detail() {
        let stdout = "Reading package lists...
Setting up site-tool (2.0) ...
";
        let stderr = "site check: /etc/site.conf is missing
dpkg: error processing package site-tool (--configure):
 installed site-tool package post-installation script subprocess returned error exit status 1
Errors were encountered while processing:
 site-tool
E: Sub-process /usr/bin/dpkg returned an error code (1)
";
        assert_eq!(
            apt_reason(stdout, stderr),
            vec![
                "site check: /etc/site.conf is missing",
                "dpkg: error processing package site-tool (--configure):",
                " installed site-tool package post-installation script subprocess returned error exit status 1",
                "Errors were encountered while processing:",
                " site-tool",
                "E: Sub-process /usr/bin/dpkg returned an error code (1)",
            ]
        );
    }

    #[test]
    fn without_a_known_line_the_last_lines_stand_in() {
        let stderr: String = (1..=30).map(|i| format!("line {i}\n")).collect();
        let reason = apt_reason("ignored\n", &stderr);
        assert_eq!(reason.len(), TAIL_LINES);
        assert_eq!(reason.last().map(String::as_str), Some("line 30"));
        assert_eq!(apt_reason("only stdout\n", " \n"), vec!["only stdout"]);
        assert!(apt_reason("", "").is_empty());
    }

    #[test]
    fn a_flood_of_errors_is_bounded_and_cleaned() {
        let stderr: String = (0..500)
            .map(|i| format!("E: \u{1b}[31mfailure {i}\u{1b}[0m\u{7}\n"))
            .collect();
        let reason = apt_reason("", &stderr);
        assert_eq!(reason.len(), drover_model::reason::MAX_REASON_LINES);
        assert_eq!(reason[0], "E: failure 0");
        let binary =
            String::from_utf8_lossy(&[0xff, 0x00, 0x1b, b'E', b':', b' ', 0x80]).into_owned();
        for line in apt_reason("", &binary) {
            assert!(!line.chars().any(char::is_control), "{line:?}");
        }
    }
}
