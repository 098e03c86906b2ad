//! A failed job's reason in the words of the program that failed: a few
//! lines of its output (apt's `E:` lines and the unmet dependencies it
//! names, dpkg's error for a package), carried in the job's status beside
//! the one-line error. The agent picks them; both sides bound and clean
//! them, so a status from any peer shows as plain text of a known size.

/// At most this many lines.
pub const MAX_REASON_LINES: usize = 40;
/// Each line at most this many bytes (cut on a character boundary).
pub const MAX_REASON_LINE_BYTES: usize = 300;

/// `line` as plain text: terminal escape sequences removed, a tab made a
/// space, any other control character dropped, trailing blanks trimmed,
/// bounded to [`MAX_REASON_LINE_BYTES`].
pub fn clean_line(line: &str) -> String {
    crate::bounded(plain(line), MAX_REASON_LINE_BYTES)
}

/// `line` as plain text, whole: what [`clean_line`] does but the bound.
pub fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            // ESC [ … final byte (CSI), or ESC and one more character.
            '\u{1b}' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for c in chars.by_ref() {
                        if ('\u{40}'..='\u{7e}').contains(&c) {
                            break;
                        }
                    }
                } else {
                    chars.next();
                }
            }
            '\t' => out.push(' '),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out.truncate(out.trim_end().len());
    out
}

/// `lines` cleaned ([`clean_line`]), blank ones dropped, at most
/// [`MAX_REASON_LINES`] (the first ones: what is picked as a reason comes
/// in the order it was said; a tail is picked by [`last_lines`]).
pub fn bounded_reason<I, S>(lines: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    lines
        .into_iter()
        .map(|l| clean_line(l.as_ref()))
        .filter(|l| !l.trim().is_empty())
        .take(MAX_REASON_LINES)
        .collect()
}

/// The last `count` non-blank lines of `text`, cleaned.
pub fn last_lines(text: &str, count: usize) -> Vec<String> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    bounded_reason(&lines[lines.len().saturating_sub(count.min(MAX_REASON_LINES))..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_loses_escapes_and_control_characters_and_is_bounded() {
        assert_eq!(
            clean_line("\u{1b}[31mE:\u{1b}[0m held\tbroken\u{7}  \r"),
            "E: held broken"
        );
        assert_eq!(clean_line("a\u{1b}Mb"), "ab");
        let long = clean_line(&"é".repeat(1000));
        assert!(long.len() <= MAX_REASON_LINE_BYTES, "{}", long.len());
        assert!(long.ends_with("[truncated]"));
    }

    #[test]
    fn a_reason_is_bounded_in_lines_and_blank_lines_are_dropped() {
        let many: Vec<String> = (0..100).map(|i| format!("line {i}")).collect();
        let reason = bounded_reason(&many);
        assert_eq!(reason.len(), MAX_REASON_LINES);
        assert_eq!(reason[0], "line 0");
        assert_eq!(bounded_reason(["", " \t", "x"]), vec!["x".to_owned()]);
        assert_eq!(last_lines("a\n\nb\nc\n", 2), vec!["b", "c"]);
        assert_eq!(last_lines("", 5), Vec::<String>::new());
    }
}
