use super::*;

const JOB: &str = "1d506e04-bd16-40dc-8bed-daf97f196bb1";

/// A finished call directory as the wrapper leaves it.
fn call(dir: &Path, name: &str, started: i64, exit: Option<i32>, out: &str, err: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::create_dir_all(&path).expect("dir");
    std::fs::write(path.join("argv"), "apt-get\n-y\nfull-upgrade").expect("argv");
    std::fs::write(path.join("started"), started.to_string()).expect("started");
    std::fs::write(path.join("out"), out).expect("out");
    std::fs::write(path.join("err"), err).expect("err");
    if let Some(exit) = exit {
        std::fs::write(path.join("exit"), format!("{exit}\n")).expect("exit");
    }
    path
}

#[test]
fn a_long_stream_keeps_its_end_from_a_line_start_and_says_what_went() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("out");
    let text: String = (0..2000)
        .map(|i| format!("line {i:04} of apt's output\n"))
        .collect();
    std::fs::write(&path, &text).expect("write");
    assert!(bound_stream(&path, 4096).expect("bound"));
    let kept = std::fs::read_to_string(&path).expect("read");
    assert!(kept.len() as u64 <= 4096, "{}", kept.len());
    let mut lines = kept.lines();
    let first = lines.next().expect("marker");
    assert!(
        first.starts_with("[drover: the first ")
            && first.ends_with(" bytes of this output were dropped]"),
        "{first}"
    );
    let second = lines.next().expect("a whole line");
    assert!(
        second.starts_with("line ") && second.ends_with(" of apt's output"),
        "{second}"
    );
    assert!(kept.ends_with("line 1999 of apt's output\n"));
    // The dropped count adds up: what went plus what stayed is the whole.
    let dropped: usize = first
        .trim_start_matches("[drover: the first ")
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a count");
    assert_eq!(dropped + (kept.len() - first.len() - 1), text.len());
    // Cut once: a second bound changes nothing. The positive control: a
    // short stream is never cut.
    assert!(!bound_stream(&path, 4096).expect("again"));
    let short = dir.path().join("err");
    std::fs::write(&short, "E: one line\n").expect("write");
    assert!(!bound_stream(&short, 4096).expect("short"));
    assert_eq!(
        std::fs::read_to_string(&short).expect("read"),
        "E: one line\n"
    );
}

#[test]
fn pruning_drops_the_oldest_finished_calls_until_the_total_fits_and_never_a_running_one() {
    let dir = tempfile::tempdir().expect("tmp");
    let big = "x".repeat(10_000);
    let old = call(
        dir.path(),
        &format!("{JOB}-preflight-1-check"),
        100,
        Some(0),
        &big,
        "",
    );
    let running = call(
        dir.path(),
        &format!("{JOB}-full-upgrade-1-full-upgrade"),
        200,
        None,
        &big,
        "",
    );
    let newer = call(
        dir.path(),
        &format!("{JOB}-confirm-1-check"),
        300,
        Some(0),
        &big,
        "",
    );
    // Ages by modification time: the old one oldest, the running one next.
    let at = |secs: u64| SystemTime::now() - Duration::from_secs(secs);
    for (path, ago) in [(&old, 300), (&running, 200), (&newer, 100)] {
        let file = std::fs::File::open(path).expect("open");
        file.set_modified(at(ago)).expect("touch");
    }
    // Everything fits: nothing goes (the positive control).
    prune(dir.path(), MAX_AGE, 1_000_000);
    assert!(old.exists() && running.exists() && newer.exists());
    // Room for about two: the oldest finished goes first.
    prune(dir.path(), MAX_AGE, 25_000);
    assert!(!old.exists());
    assert!(running.exists() && newer.exists());
    // Room for none: the running call stays whatever its size.
    prune(dir.path(), MAX_AGE, 0);
    assert!(running.exists());
    assert!(!newer.exists());
    // Past the age, even a running call's directory goes (a week-old
    // unfinished call is a leftover).
    prune(dir.path(), Duration::from_secs(150), u64::MAX);
    assert!(!running.exists());
}

#[test]
fn a_jobs_calls_read_back_in_order_with_their_step_try_and_exit() {
    let dir = tempfile::tempdir().expect("tmp");
    let other = "2e506e04-bd16-40dc-8bed-daf97f196bb2";
    call(
        dir.path(),
        &format!("{JOB}-full-upgrade-2-full-upgrade"),
        300,
        Some(100),
        "Reading package lists...\n",
        "E: Sub-process /usr/bin/dpkg returned an error code (1)\n",
    );
    call(
        dir.path(),
        &format!("{JOB}-update-lists-1-update"),
        100,
        Some(0),
        "Hit:1 file:/repo ./ InRelease\n",
        "",
    );
    let lost = call(
        dir.path(),
        &format!("{JOB}-full-upgrade-1-full-upgrade"),
        200,
        None,
        "Unpacking …\n",
        "",
    );
    std::fs::rename(&lost, lost.with_extension("lost-250")).expect("lost");
    call(
        dir.path(),
        &format!("{other}-preflight-1-check"),
        400,
        Some(0),
        "",
        "",
    );
    std::fs::create_dir_all(dir.path().join("not-a-call")).expect("junk");

    let calls = job_calls(dir.path(), JOB);
    let seen: Vec<(&str, u32, &str, Option<i32>, bool)> = calls
        .iter()
        .map(|c| (c.step.as_str(), c.tries, c.purpose.as_str(), c.exit, c.lost))
        .collect();
    assert_eq!(
        seen,
        [
            ("update-lists", 1, "update", Some(0), false),
            ("full-upgrade", 1, "full-upgrade", None, true),
            ("full-upgrade", 2, "full-upgrade", Some(100), false),
        ]
    );
    assert_eq!(calls[0].argv, ["apt-get", "-y", "full-upgrade"]);
    assert!(calls[2].stderr.contains("returned an error code (1)"));
    assert_eq!(calls[0].started, Timestamp::from_second(100).ok());
    // The job whose latest call started last comes first.
    assert_eq!(jobs(dir.path()), [other, JOB]);
    assert!(job_calls(dir.path(), "no-such-job").is_empty());
}
