//! Asking an operator before a command that cannot be undone (moving a
//! database aside, replacing a CA): at a terminal the question is asked,
//! anywhere else (a script, CI, a pipe) the command refuses unless it was
//! given `--yes`, so nothing irreversible happens because nobody answered.

use std::io::{BufRead, IsTerminal, Write};

/// Ok when the operator agreed (or passed `--yes`); Err with the sentence
/// to print when not.
pub fn confirm(question: &str, yes: bool) -> Result<(), String> {
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(format!(
            "{question}\nnot asked: stdin is not a terminal; run it again with --yes to confirm"
        ));
    }
    let mut stderr = std::io::stderr().lock();
    let _ = write!(stderr, "{question} [y/N] ");
    let _ = stderr.flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| format!("cannot read the answer: {e}"))?;
    match answer.trim() {
        "y" | "Y" | "yes" | "Yes" | "YES" => Ok(()),
        _ => Err("not confirmed: nothing was changed".into()),
    }
}
