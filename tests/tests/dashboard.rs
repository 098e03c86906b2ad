//! The dashboard (issue 17) in a real browser: headless Chromium driven
//! through chromedriver against a control plane with agents in simulate
//! mode. It logs in with the operator token, sees the fleet and searches
//! it, watches a run go to Complete live without reloading, cancels a run,
//! and sees the alert for a failed canary. A screenshot of each page is
//! written to `target/test-artefacts/dashboard/` (with `DROVER_BLESS=1`,
//! the run page's also to `docs/dashboard.png`, which the README shows).

use drover_tests::{
    AgentProcess, ControlPlane, eventually, free_port, hold_config, http_client, within,
};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// chromedriver on a free port, stopped when dropped with the browsers it
/// started: they are in its process group, and outlive a killed
/// chromedriver otherwise (a test that panics never closes its browser).
struct Driver {
    child: Child,
    url: String,
}

impl Driver {
    async fn start() -> Self {
        let port = free_port();
        let child = Command::new("chromedriver")
            .process_group(0)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (the test command installs chromium-driver)");
        let url = format!("http://127.0.0.1:{port}");
        let http = http_client();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(response) = http.get(format!("{url}/status")).send().await
                && response.status().is_success()
            {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Self { child, url }
    }

    async fn browser(&self) -> Client {
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,900"]
            }),
        );
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&self.url)
            .await
            .expect("a Chromium session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

fn artefacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-artefacts/dashboard");
    std::fs::create_dir_all(&dir).expect("artefact directory");
    dir
}

async fn screenshot(browser: &Client, name: &str) {
    let png = browser.screenshot().await.expect("screenshot");
    std::fs::write(artefacts().join(format!("{name}.png")), &png).expect("write screenshot");
    if name == "run" && std::env::var_os("DROVER_BLESS").is_some() {
        std::fs::write(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/dashboard.png"),
            &png,
        )
        .expect("write docs/dashboard.png");
    }
}

/// Waits until the text of the first element matching `css` satisfies `ok`.
async fn wait_text(browser: &Client, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = String::new();
    loop {
        if let Ok(element) = browser.find(Locator::Css(css)).await
            && let Ok(text) = element.text().await
        {
            if ok(&text) {
                return text;
            }
            last = text;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {css} still says {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn rows(browser: &Client, css: &str) -> usize {
    browser
        .find_all(Locator::Css(css))
        .await
        .map(|found| found.len())
        .unwrap_or(0)
}

async fn go(browser: &Client, cp: &ControlPlane, page: &str) {
    browser
        .goto(&format!("{}/ui/{page}", cp.api))
        .await
        .expect("navigate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_logs_in_shows_the_fleet_follows_a_run_live_cancels_and_alerts() {
    let cp = ControlPlane::start(&[]);
    // live: a run watched live; away: a run canceled while its device is
    // away; canary: a canary whose preflight fails.
    let devices = [
        ("web-1", "live", json!({})),
        ("web-2", "live", json!({})),
        ("web-away", "away", json!({})),
        ("web-canary", "canary", json!({"canary": "true"})),
        ("web-after", "canary", json!({})),
    ];
    for (device, group, labels) in &devices {
        cp.apply_device(device, &[group], labels.clone()).await;
    }
    let dir = cp.dir.path();
    let hold = dir.join("web-1/hold");
    let reached = dir.join("web-1/reached");
    std::fs::create_dir_all(dir.join("web-1")).expect("dir");
    std::fs::write(&hold, "").expect("hold");
    let start = |device: &str, extra: &str| agent(&cp, device, extra);
    let _web1 = start("web-1", &hold_config(&hold, &reached));
    let _web2 = start("web-2", "");
    let mut away = start("web-away", "");
    let mut canary = start("web-canary", "");
    canary.fail_preflight();
    let _after = start("web-after", "");
    cp.wait_for_agents(&["web-1", "web-2", "web-away", "web-canary", "web-after"])
        .await;
    away.kill9();

    let driver = Driver::start().await;
    let browser = driver.browser().await;

    // Not logged in: the login page; a wrong token is refused, the right one
    // sets an HttpOnly session cookie the page's JavaScript cannot read.
    go(&browser, &cp, "").await;
    browser
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css("#token"))
        .await
        .expect("login page");
    screenshot(&browser, "login").await;
    let token = browser.find(Locator::Css("#token")).await.expect("token");
    token.send_keys("not-the-token").await.expect("type");
    click(&browser, "#login").await;
    wait_text(&browser, "#login-error", "a wrong token", |t| {
        t.contains("not a valid operator token of this control plane")
    })
    .await;
    token.clear().await.expect("clear");
    token.send_keys(&cp.token).await.expect("type");
    click(&browser, "#login").await;

    // The fleet, every device, and a search narrowed on the server.
    wait_text(&browser, "#fleet-count", "the fleet", |t| {
        t.contains("of 5 devices")
    })
    .await;
    let script = browser
        .execute("return document.cookie", vec![])
        .await
        .expect("script");
    assert_eq!(script, json!(""), "the session cookie is HttpOnly");
    let row = wait_text(&browser, "tr[data-device='web-2']", "web-2's row", |t| {
        t.contains("online")
    })
    .await;
    assert!(row.contains("live"), "{row}");
    screenshot(&browser, "fleet").await;
    browser
        .find(Locator::Css("#fleet-search"))
        .await
        .expect("search")
        .send_keys("canary")
        .await
        .expect("type");
    wait_text(&browser, "#fleet-count", "the search", |t| {
        t.contains("of 2 devices")
    })
    .await;
    assert_eq!(rows(&browser, "tbody tr").await, 2);

    // A run watched live: the page is not reloaded, the phase changes.
    cp.apply_upgrade_run("live-run", "live", 600).await;
    wait_for(&reached, "web-1's job to start").await;
    go(&browser, &cp, "#/runs/live-run").await;
    wait_text(&browser, "#run-phase", "the run running", |t| {
        t == "Running"
    })
    .await;
    browser
        .execute("window.notReloaded = true; return true", vec![])
        .await
        .expect("mark the page");
    screenshot(&browser, "run").await;
    std::fs::remove_file(&hold).expect("release web-1");
    wait_text(&browser, "#run-phase", "the run to complete live", |t| {
        t == "Complete"
    })
    .await;
    let still = browser
        .execute("return window.notReloaded === true", vec![])
        .await
        .expect("script");
    assert_eq!(
        still,
        json!(true),
        "the page followed the run without reloading"
    );
    wait_text(&browser, "#run-progress", "the counts", |t| {
        t.contains("2 of 2 succeeded")
    })
    .await;
    go(&browser, &cp, "#/runs").await;
    wait_text(
        &browser,
        "tr[data-run='live-run'] .phase",
        "the runs list",
        |t| t == "Complete",
    )
    .await;
    screenshot(&browser, "runs").await;

    // Cancel a run from its page (the button asks twice).
    cp.apply_upgrade_run("cancel-me", "away", 600).await;
    go(&browser, &cp, "#/runs/cancel-me").await;
    wait_text(&browser, "#run-phase", "the run released", |t| {
        t == "Running"
    })
    .await;
    click(&browser, "#cancel-run").await;
    wait_text(&browser, "#cancel-run", "the button to ask again", |t| {
        t.starts_with("Confirm")
    })
    .await;
    click(&browser, "#cancel-run").await;
    wait_text(&browser, "#run-phase", "the run canceling", |t| {
        t == "Canceling"
    })
    .await;
    let run = cp.get("/taskruns/cancel-me").await;
    assert_eq!(run["status"]["phase"], "Canceling", "{run}");
    away.restart();
    wait_text(&browser, "#run-phase", "the canceled run to end", |t| {
        t == "Failed"
    })
    .await;
    wait_text(&browser, "#run-reason", "the reason", |t| {
        t == "An operator canceled it. (Canceled)"
    })
    .await;

    // A failed canary raises an alert, counted in the header.
    cp.apply_upgrade_run("canary-run", "canary", 600).await;
    let ended = cp
        .wait_run_finished("canary-run", Duration::from_secs(60))
        .await;
    assert_eq!(ended["status"]["reason"], "CanaryFailed", "{ended}");
    // The run page says why in words with the code beside, and the failed
    // step's error, which is also the job's, once.
    go(&browser, &cp, "#/runs/canary-run").await;
    wait_text(&browser, "#run-reason", "the canary's reason", |t| {
        t == "A canary failed, so nothing more was released. (CanaryFailed)"
    })
    .await;
    let row = wait_text(
        &browser,
        "tr[data-device='web-canary']",
        "the canary's row",
        |t| t.contains("preflight"),
    )
    .await;
    let targets = cp.targets("canary-run").await;
    let status = &targets
        .iter()
        .find(|t| t["device"] == "web-canary")
        .expect("the canary's target")["status"];
    let step_error = status["steps"][0]["error"]
        .as_str()
        .expect("the failed step's error");
    assert!(
        status["error"]
            .as_str()
            .is_some_and(|e| e.contains(step_error)),
        "{status}"
    );
    assert_eq!(row.matches(step_error).count(), 1, "{row}");
    go(&browser, &cp, "#/alerts").await;
    let alert = wait_text(
        &browser,
        "tr[data-alert='CanaryFailed']",
        "the alert",
        |t| t.contains("taskrun/canary-run"),
    )
    .await;
    assert!(alert.contains("web-canary"), "{alert}");
    wait_text(&browser, "#alert-count", "the alert count", |t| {
        !t.is_empty()
    })
    .await;
    screenshot(&browser, "alerts").await;

    // The other pages render.
    for (page, css) in [("#/deployments", "main h2"), ("#/schedules", "main h2")] {
        go(&browser, &cp, page).await;
        wait_text(&browser, css, page, |t| !t.is_empty()).await;
        screenshot(&browser, page.trim_start_matches("#/")).await;
    }
    // Logging out ends the session.
    // A find while the page navigates fails ("aborted by navigation"):
    // asked again until the login page is there.
    click(&browser, "#logout").await;
    drover_tests::eventually(
        Duration::from_secs(10),
        "back at the login page",
        || async { browser.find(Locator::Css("#token")).await.ok() },
    )
    .await;
    browser.close().await.expect("close");
}

/// Clicks the element `css`, finding it again if a live update redrew the
/// page between finding and clicking.
async fn click(browser: &Client, css: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let clicked = match browser.find(Locator::Css(css)).await {
            Ok(element) => element.click().await.is_ok(),
            Err(_) => false,
        };
        if clicked {
            return;
        }
        assert!(Instant::now() < deadline, "cannot click {css}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_for(path: &Path, what: &str) {
    drover_tests::eventually(Duration::from_secs(60), what, || async {
        path.exists().then_some(())
    })
    .await
}

/// Without the session's CSRF token, a request that changes something is
/// refused even with a valid session cookie; with it, it goes through. A
/// page on another site can make the browser send the cookie, but cannot
/// read the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_cookie_without_its_csrf_token_changes_nothing() {
    let cp = ControlPlane::start(&[]);
    // A schedule: something that stays as it is until an action changes it.
    cp.apply(json!({
        "apiVersion": drover_tests::API_VERSION, "kind": "TaskSchedule",
        "metadata": {"name": "csrf-nightly"},
        "spec": {"schedule": {"daily": "03:00"},
                 "template": {"spec": {"allowedGroups": ["g"], "deadlineSeconds": 600, "systemUpgradeV1": {}}}}
    }))
    .await;
    let http = http_client();
    let login = http
        .post(format!("{}/ui/login", cp.api))
        .json(&json!({"token": cp.token}))
        .send()
        .await
        .expect("login");
    assert_eq!(login.status(), 200);
    let cookie = login.headers()["set-cookie"]
        .to_str()
        .expect("cookie")
        .to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().expect("pair").to_owned();
    // Reads work with the cookie alone.
    let read = http
        .get(format!("{}/api/v1/taskschedules/csrf-nightly", cp.api))
        .header("cookie", &session)
        .send()
        .await
        .expect("read");
    assert_eq!(read.status(), 200);
    let suspend = format!("{}/api/v1/taskschedules/csrf-nightly/suspend", cp.api);
    let refused = http
        .post(&suspend)
        .header("cookie", &session)
        .json(&json!({"suspend": true}))
        .send()
        .await
        .expect("post");
    assert_eq!(refused.status(), 403);
    let schedule = cp.get("/taskschedules/csrf-nightly").await;
    assert_eq!(schedule["spec"]["suspend"], false, "nothing changed");
    let csrf = cp.session_csrf(&session).await;
    let allowed = http
        .post(&suspend)
        .header("cookie", &session)
        .header("x-drover-csrf", &csrf)
        .json(&json!({"suspend": true}))
        .send()
        .await
        .expect("post");
    assert_eq!(allowed.status(), 200, "{:?}", allowed.text().await);
    let schedule = cp.get("/taskschedules/csrf-nightly").await;
    assert_eq!(schedule["spec"]["suspend"], true, "suspended");
    // A forged or expired session is no session.
    let forged = http
        .get(format!("{}/api/v1/taskruns", cp.api))
        .header("cookie", "drover_session=9999999999.00")
        .send()
        .await
        .expect("read");
    assert_eq!(forged.status(), 401);
}

/// Logging in and out as a stranger would try it. Five wrong tokens from
/// one address are each refused and logged with the address; a sixth
/// wrong one waits (429 with Retry-After), while the right token still
/// logs in from that address (a stranger's guesses lock out no operator:
/// issue 53) and the bearer token keeps working. Each login is its own session; a logout needs the
/// session's CSRF token, and it ends that session at the server (its
/// cookie, sent again, is refused) and no other. Every answer carries
/// nosniff and no-referrer, and no HSTS over plain http.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_are_limited_and_logged_and_a_logout_ends_its_session_at_the_server() {
    let cp = ControlPlane::start(&[]);
    let http = http_client();
    let login = |token: String| {
        let http = http.clone();
        let url = format!("{}/ui/login", cp.api);
        async move {
            http.post(url)
                .json(&json!({ "token": token }))
                .send()
                .await
                .expect("login")
        }
    };
    let session_of = |response: &reqwest::Response| {
        response.headers()["set-cookie"]
            .to_str()
            .expect("cookie")
            .split(';')
            .next()
            .expect("pair")
            .to_owned()
    };
    let first = login(cp.token.clone()).await;
    assert_eq!(first.status(), 200);
    for header in [
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
    ] {
        assert_eq!(
            first
                .headers()
                .get(header.0)
                .map(|v| v.to_str().unwrap_or("")),
            Some(header.1),
            "{:?}",
            first.headers()
        );
    }
    assert!(first.headers().get("strict-transport-security").is_none());
    let (one, two) = (
        session_of(&first),
        session_of(&login(cp.token.clone()).await),
    );
    assert_ne!(one, two, "each login is its own session");
    let read = |session: String| {
        let http = http.clone();
        let url = format!("{}/api/v1/taskruns", cp.api);
        async move {
            http.get(url)
                .header("cookie", session)
                .send()
                .await
                .expect("read")
                .status()
        }
    };
    assert_eq!(read(one.clone()).await, 200);

    // A logout without the CSRF token (another site's form) ends nothing.
    let logout = format!("{}/ui/logout", cp.api);
    let refused = http
        .post(&logout)
        .header("cookie", &one)
        .send()
        .await
        .expect("logout");
    assert_eq!(refused.status(), 403);
    assert_eq!(read(one.clone()).await, 200, "still logged in");
    let csrf = cp.session_csrf(&one).await;
    let out = http
        .post(&logout)
        .header("cookie", &one)
        .header("x-drover-csrf", &csrf)
        .send()
        .await
        .expect("logout");
    assert_eq!(out.status(), 200);
    // The browser would forget the cookie; one kept and sent again is refused.
    assert_eq!(
        read(one.clone()).await,
        401,
        "the logged-out session is over"
    );
    assert_eq!(read(two.clone()).await, 200, "the other session goes on");

    // Wrong tokens: five refused and logged, then the address waits.
    for _ in 0..5 {
        assert_eq!(login("not-the-token".into()).await.status(), 401);
    }
    let limited = login("not-the-token".into()).await;
    assert_eq!(limited.status(), 429);
    let retry: u64 = limited.headers()["retry-after"]
        .to_str()
        .expect("retry-after")
        .parse()
        .expect("seconds");
    assert!((1..=60).contains(&retry), "retry after {retry} s");
    let log = cp.log();
    assert_eq!(
        log.matches("dashboard login with a wrong or revoked operator token")
            .count(),
        5,
        "{log}"
    );
    assert!(log.contains("peer=127.0.0.1"), "{log}");
    assert_eq!(
        login(cp.token.clone()).await.status(),
        200,
        "the right token from the same address"
    );
    // And in the audit log (issue 35), without the token tried.
    let audit = cp.get("/audit").await;
    let refused: Vec<&Value> = audit
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["verb"] == "login" && e["outcome"] == "refused")
        .collect();
    assert_eq!(refused.len(), 5, "{audit}");
    assert!(
        refused
            .iter()
            .all(|e| e["peer"] == "127.0.0.1" && e["via"] == "dashboard")
    );
    assert!(!audit.to_string().contains("not-the-token"));
    // The CLI's bearer token is not a login and is not limited.
    assert_eq!(cp.get("/taskruns").await, json!([]));
}

/// An agent for `device` in its directory under the control plane's.
fn agent(cp: &ControlPlane, device: &str, extra: &str) -> AgentProcess {
    AgentProcess::start(
        &cp.dir.path().join(device),
        device,
        &cp.agent_url,
        &cp.device_token(device),
        extra,
    )
}

/// An agent in upgrade mode in `sandbox` (real apt and dpkg), as `device`.
fn upgrading_agent(
    cp: &ControlPlane,
    sandbox: &drover_tests::debroot::Sandbox,
    device: &str,
) -> AgentProcess {
    AgentProcess::start_with(
        &sandbox.dir.path().join("agent"),
        device,
        &cp.agent_url,
        &cp.device_token(device),
        "",
        &format!(
            "mode = \"upgrade\"\nroot = {}\nmin_free_mib = 10",
            drover_tests::toml_string(&sandbox.root.display().to_string())
        ),
        "",
    )
}

/// Logs `browser` in with the operator token and waits for the fleet page.
async fn log_in(browser: &Client, cp: &ControlPlane) {
    go(browser, cp, "").await;
    let token = browser
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css("#token"))
        .await
        .expect("login page");
    token.send_keys(&cp.token).await.expect("type");
    click(browser, "#login").await;
    wait_text(browser, "#fleet-count", "the fleet", |t| {
        t.contains("devices")
    })
    .await;
}

/// The STATE cell of `device`'s row in `drover describe taskrun RUN`.
fn cli_state(cp: &ControlPlane, run: &str, device: &str) -> String {
    let out = cp.cli(&["describe", "taskrun", run]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    // DEVICE, CANARY (empty: no canaries here), STATE, …
    let row = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(device))
        .unwrap_or_else(|| panic!("no row for {device}: {text}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    match cells.get(2..6) {
        Some(["(after", "the", "run", "ended)"]) => format!("{} (after the run ended)", cells[1]),
        _ => cells[1].to_owned(),
    }
}

/// The value of the metric line that starts with `series`, 0 when absent.
fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Issue 29: one job shows one state name everywhere. One run with an
/// undelivered job (its device is away), a running one (held at its first
/// step) and a finished one: the API's target page, `drover describe`, the
/// dashboard's run and fleet pages and `/metrics` all name each the same.
/// Then the run's deadline passes: the away job expires, and the held one,
/// let go, succeeds after the run ended, which every place says as such
/// while the run's header keeps the counts it ended with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_the_dashboard_and_the_metrics_name_each_jobs_state_alike() {
    let cp = ControlPlane::start(&[]);
    let dir = cp.dir.path();
    for device in ["st-away", "st-held", "st-done"] {
        cp.apply_device(device, &["states"], json!({})).await;
    }
    let hold = dir.join("st-held/hold");
    let reached = dir.join("st-held/reached");
    std::fs::create_dir_all(dir.join("st-held")).expect("dir");
    std::fs::write(&hold, "").expect("hold");
    let start = |device: &str, extra: &str| agent(&cp, device, extra);
    let mut away = start("st-away", "");
    let _held = start("st-held", &hold_config(&hold, &reached));
    let _done = start("st-done", "");
    cp.wait_for_agents(&["st-away", "st-held", "st-done"]).await;
    away.kill9();
    let driver = Driver::start().await;
    let browser = driver.browser().await;
    log_in(&browser, &cp).await;

    // A deadline long enough to read every place, short enough to end
    // while st-held is still held.
    cp.apply_upgrade_run("states", "states", 45).await;
    wait_for(&reached, "st-held's job to start").await;
    let expected = [
        ("st-away", "undelivered"),
        ("st-held", "running"),
        ("st-done", "succeeded"),
    ];
    let api_states = || async {
        let targets = cp.targets("states").await;
        let state = |device: &str| {
            targets
                .iter()
                .find(|t| t["device"] == device)
                .and_then(|t| t["state"].as_str())
                .map(str::to_owned)
        };
        expected
            .iter()
            .all(|(device, want)| state(device).as_deref() == Some(*want))
            .then_some(targets)
    };
    let Some(targets) = within(Duration::from_secs(30), api_states).await else {
        panic!(
            "the API's states never became {expected:?}: {}\n{}",
            cp.get("/taskruns/states/targets").await,
            cp.log()
        );
    };
    let done = targets
        .iter()
        .find(|t| t["device"] == "st-done")
        .expect("st-done");
    assert_eq!(done["stateLabel"], "Succeeded", "{done}");
    assert_eq!(done["afterRunEnded"], false, "{done}");
    // Issue 56: why the undelivered job waits, the same in the API, the
    // CLI and the run page; a running or finished one does not wait.
    let away = targets
        .iter()
        .find(|t| t["device"] == "st-away")
        .expect("st-away");
    assert_eq!(away["waiting"]["code"], "Offline", "{away}");
    let offline = "device offline, last heard from ";
    assert!(
        away["waiting"]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with(offline)),
        "{away}"
    );
    assert!(done.get("waiting").is_none(), "{done}");
    let described =
        String::from_utf8_lossy(&cp.cli(&["describe", "taskrun", "states"]).stdout).into_owned();
    assert!(
        described
            .lines()
            .any(|l| l.trim_start().starts_with("st-away") && l.contains(offline)),
        "{described}"
    );

    for (device, want) in expected {
        assert_eq!(
            cli_state(&cp, "states", device),
            want,
            "the CLI's state of {device}"
        );
    }

    go(&browser, &cp, "#/runs/states").await;
    for (device, want) in expected {
        let css = format!("tr[data-device='{device}'] td.state");
        wait_text(&browser, &css, "the run page's state", |t| t == want).await;
    }
    wait_text(
        &browser,
        "tr[data-device='st-away'] td.waiting",
        "why st-away's job waits",
        |t| t.starts_with(offline),
    )
    .await;
    go(&browser, &cp, "").await;
    for (device, want) in [("st-away", "undelivered"), ("st-held", "running")] {
        let css = format!("tr[data-device='{device}']");
        let row = wait_text(&browser, &css, "the fleet's current job", |t| {
            t.contains(want)
        })
        .await;
        assert!(row.contains("states"), "{row}");
    }

    // The gauge is refreshed by the delivery core's sweep: waited for.
    let kind = "kind=\"systemUpgradeV1\"}";
    eventually(Duration::from_secs(30), "the metrics' states", || async {
        let text = cp.metrics().await;
        let counts = [
            metric(
                &text,
                &format!("drover_jobs_undecided{{state=\"undelivered\",{kind}"),
            ),
            metric(
                &text,
                &format!("drover_jobs_undecided{{state=\"running\",{kind}"),
            ),
            metric(
                &text,
                &format!("drover_jobs_finished_total{{state=\"succeeded\",{kind}"),
            ),
        ];
        (counts == [1, 1, 1]).then_some(())
    })
    .await;

    // The deadline passes: the run ends with the counts it had.
    let ended = cp
        .wait_run_finished("states", Duration::from_secs(90))
        .await;
    assert_eq!(ended["status"]["reason"], "DeadlineExceeded", "{ended}");
    assert_eq!(ended["status"]["succeeded"], 1, "{ended}");
    std::fs::remove_file(&hold).expect("let st-held go");
    let late = [
        ("st-away", "expired", false),
        ("st-held", "succeeded", true),
        ("st-done", "succeeded", false),
    ];
    eventually(Duration::from_secs(60), "the late outcomes", || async {
        let targets = cp.targets("states").await;
        late.iter()
            .all(|(device, state, after)| {
                targets.iter().any(|t| {
                    t["device"] == *device && t["state"] == *state && t["afterRunEnded"] == *after
                })
            })
            .then_some(())
    })
    .await;
    let run = cp.get("/taskruns/states").await;
    assert_eq!(
        run["status"]["succeeded"], 1,
        "the header keeps its counts: {run}"
    );
    assert_eq!(cli_state(&cp, "states", "st-away"), "expired");
    assert_eq!(
        cli_state(&cp, "states", "st-held"),
        "succeeded (after the run ended)"
    );
    assert_eq!(cli_state(&cp, "states", "st-done"), "succeeded");
    go(&browser, &cp, "#/runs/states").await;
    for (device, want) in [
        ("st-away", "expired"),
        ("st-held", "succeeded after the run ended"),
        ("st-done", "succeeded"),
    ] {
        let css = format!("tr[data-device='{device}'] td.state");
        wait_text(&browser, &css, "the run page's late state", |t| t == want).await;
    }
    wait_text(&browser, "#run-progress", "the header's counts", |t| {
        t.contains("1 of 3 succeeded")
    })
    .await;
    // What the finished job did: the API's one line, on the run page too.
    let done_result = cp
        .targets("states")
        .await
        .iter()
        .find(|t| t["device"] == "st-done")
        .and_then(|t| t["resultText"].as_str().map(str::to_owned))
        .expect("st-done's result line");
    wait_text(
        &browser,
        "tr[data-device='st-done'] td.result",
        "the run page's result",
        |t| t == done_result,
    )
    .await;
    wait_text(&browser, "#run-deadline", "the deadline in words", |t| {
        t == "45 seconds after the start"
    })
    .await;
    wait_text(&browser, "#run-reason", "the deadline's reason", |t| {
        t == "The deadline passed before every target finished. (DeadlineExceeded)"
    })
    .await;
    let described = cp.cli(&["describe", "taskrun", "states"]);
    let described = String::from_utf8_lossy(&described.stdout).into_owned();
    assert!(
        described.contains(
            "reason: The deadline passed before every target finished. (DeadlineExceeded)"
        ),
        "{described}"
    );
    screenshot(&browser, "states").await;
    let text = cp.metrics().await;
    assert_eq!(
        metric(
            &text,
            &format!("drover_jobs_finished_total{{state=\"succeeded\",{kind}")
        ),
        2,
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            &format!("drover_jobs_finished_total{{state=\"expired\",{kind}")
        ),
        1,
        "{text}"
    );
    browser.close().await.expect("close");
}

/// Issue 31: the fleet page shows the fleet's patch status at a glance (a
/// bar, a segment per state as wide as its share, the same counts as
/// `GET /patch-status`), each device's latest assessment in its row, and
/// filters the list by patch state. One device is assessed (a Deployment
/// asks its agent, in simulate mode: apt only reads the host's lists), the
/// other has no agent and was never assessed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_page_shows_the_patch_status_and_filters_by_it() {
    let cp = ControlPlane::start(&[]);
    cp.apply_device("patched-1", &["lab"], json!({})).await;
    cp.apply_device("unassessed-1", &["lab"], json!({})).await;
    let _agent = agent(&cp, "patched-1", "");
    cp.wait_for_agents(&["patched-1"]).await;
    cp.apply(json!({
        "apiVersion": drover_tests::API_VERSION, "kind": "Deployment",
        "metadata": {"name": "assess-lab"},
        "spec": {"targets": {"devices": ["patched-1"]}, "patchAssessmentV1": {},
                 "maxConcurrency": 1, "deadlineSeconds": 600}
    }))
    .await;
    let patch = eventually(Duration::from_secs(120), "the assessment kept", || async {
        let device = cp.get("/devices/patched-1").await;
        (!device["patch"].is_null()).then(|| device["patch"].clone())
    })
    .await;
    let fleet = cp.get("/patch-status").await;
    assert_eq!(fleet["devices"], 2, "{fleet}");
    assert_eq!(fleet["neverAssessed"], 1, "{fleet}");
    // What the host's lists say decides which state the assessed one is in.
    let assessed_state = if patch["upgradable"] == 0 {
        "up_to_date"
    } else {
        "updates"
    };

    let driver = Driver::start().await;
    let browser = driver.browser().await;
    log_in(&browser, &cp).await;
    wait_text(
        &browser,
        "tr[data-device='patched-1'] td.patch-cell",
        "the assessed row",
        |t| t == patch["summary"].as_str().unwrap_or("?"),
    )
    .await;
    wait_text(
        &browser,
        "tr[data-device='unassessed-1'] td.patch-cell",
        "the other row",
        |t| t == "not assessed",
    )
    .await;
    // The bar's segments carry the API's counts, widest for the most.
    let counts: Vec<(String, u64)> = {
        let mut counts = Vec::new();
        for segment in browser
            .find_all(Locator::Css("#patch-bar .seg"))
            .await
            .expect("segments")
        {
            let filter = segment
                .attr("data-patch")
                .await
                .ok()
                .flatten()
                .unwrap_or_default();
            let count = segment
                .attr("data-count")
                .await
                .ok()
                .flatten()
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            counts.push((filter, count));
        }
        counts
    };
    let expected_assessed = if assessed_state == "up_to_date" {
        ("up_to_date".to_owned(), 1)
    } else if patch["security"] != 0 {
        ("security".to_owned(), 1)
    } else {
        ("updates".to_owned(), 1)
    };
    assert!(counts.contains(&expected_assessed), "{counts:?} {patch}");
    assert!(
        counts.contains(&("not_assessed".to_owned(), 1)),
        "{counts:?}"
    );
    assert_eq!(counts.iter().map(|(_, c)| c).sum::<u64>(), 2, "{counts:?}");
    screenshot(&browser, "fleet-patch").await;
    // A click on a legend entry filters the list by it.
    click(&browser, ".patch-legend button[data-patch='not_assessed']").await;
    wait_text(&browser, "#fleet-count", "the filtered fleet", |t| {
        t.contains("of 1 devices")
    })
    .await;
    assert_eq!(rows(&browser, "tr[data-device='unassessed-1']").await, 1);
    assert_eq!(rows(&browser, "tr[data-device='patched-1']").await, 0);
    // The API refuses a patch state it does not know.
    assert_eq!(cp.get_status("/devices/page?patch=bogus").await, 400);
    browser.close().await.expect("close");
}

/// Issue 31: a page per device. A real device (upgrade mode, a disposable
/// Debian root) upgrades one package through a task run, then a security
/// update is published and the device assesses on its own. Its page, reached
/// from the fleet list, shows its patch status, the pending packages (the
/// security update marked, with how long it has waited), the last upgrade's
/// report (from → to), its job history and its alert, which the page
/// acknowledges (by whom, when).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_device_page_shows_pending_updates_the_last_upgrade_history_and_alerts() {
    use drover_tests::debroot::{Pkg, Sandbox};
    let sandbox = Sandbox::new();
    sandbox.publish(&[
        Pkg::new("drover-page-app", "1.0"),
        Pkg::new("drover-page-lib", "1.0"),
    ]);
    sandbox.install(&["drover-page-app", "drover-page-lib"]);
    sandbox.publish(&[
        Pkg::new("drover-page-app", "2.0"),
        Pkg::new("drover-page-lib", "1.0"),
    ]);
    let cp = ControlPlane::start(&["--security-alert-days", "0"]);
    cp.apply_device("page-1", &["fleet"], json!({})).await;
    let agent = upgrading_agent(&cp, &sandbox, "page-1");
    cp.wait_for_agents(&["page-1"]).await;
    cp.apply_upgrade_run("page-upgrade", "fleet", 3600).await;
    let run = cp
        .wait_run_finished("page-upgrade", Duration::from_secs(240))
        .await;
    assert_eq!(run["status"]["phase"], "Complete", "{run}\n{}", agent.log());
    sandbox.publish_security(&[Pkg::new("drover-page-lib", "1.1")]);
    agent.assess();
    let patch = eventually(Duration::from_secs(60), "the assessment kept", || async {
        let device = cp.get("/devices/page-1").await;
        (device["patch"]["security"] == 1).then(|| device["patch"].clone())
    })
    .await;
    let summary = patch["summary"].as_str().expect("a summary").to_owned();

    let driver = Driver::start().await;
    let browser = driver.browser().await;
    log_in(&browser, &cp).await;
    click(&browser, "tr[data-device='page-1'] a").await;
    wait_text(&browser, "#device-patch", "the patch status", |t| {
        t.starts_with(&summary)
    })
    .await;
    let lib = wait_text(
        &browser,
        "tr[data-package='drover-page-lib']",
        "the pending security update",
        |t| t.contains("1.0") && t.contains("1.1") && t.contains("security"),
    )
    .await;
    // Waiting since the assessment that first saw it: seconds, not "–".
    assert!(lib.contains("second"), "{lib}");
    wait_text(&browser, "#last-upgrade", "the last upgrade", |t| {
        t.contains("page-upgrade") && t.contains("upgraded drover-page-app 1.0 → 2.0")
    })
    .await;
    assert_eq!(rows(&browser, "#device-jobs tbody tr").await, 1);
    wait_text(&browser, "#device-jobs tbody tr", "the job history", |t| {
        t.contains("systemUpgradeV1") && t.contains("page-upgrade") && t.contains("succeeded")
    })
    .await;
    let alert = "#device-alerts tr[data-alert='SecurityUpdatesWaiting'] td.ack button";
    wait_text(&browser, alert, "the device's alert", |t| {
        t == "Acknowledge"
    })
    .await;
    screenshot(&browser, "device").await;
    click(&browser, alert).await;
    click(&browser, alert).await;
    wait_text(
        &browser,
        "#device-alerts tr[data-alert='SecurityUpdatesWaiting'] td.ack",
        "the acknowledgement",
        |t| t.starts_with("acknowledged by "),
    )
    .await;
    let acked = cp.get("/alerts").await;
    assert!(
        acked["items"].as_array().into_iter().flatten().any(|a| {
            a["kind"] == "SecurityUpdatesWaiting"
                && a["resource"] == "device/page-1"
                && a["acknowledged"]["by"].is_string()
        }),
        "{acked}"
    );
    // Issue 56: the run deleted, the device's history keeps its job. The
    // page still shows the last upgrade with its report, and the job
    // with its run named as deleted (not linked), never "No upgrade has
    // succeeded on this device yet".
    let out = cp.cli(&["delete", "taskrun", "page-upgrade"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    go(&browser, &cp, "#/runs").await;
    go(&browser, &cp, "#/devices/page-1").await;
    wait_text(&browser, "#last-upgrade", "the kept last upgrade", |t| {
        t.contains("page-upgrade (deleted)") && t.contains("upgraded drover-page-app 1.0 → 2.0")
    })
    .await;
    wait_text(&browser, "#device-jobs tbody tr", "the kept job", |t| {
        t.contains("systemUpgradeV1")
            && t.contains("page-upgrade (deleted)")
            && t.contains("succeeded")
    })
    .await;
    assert_eq!(
        rows(&browser, "#device-jobs tbody tr a").await,
        0,
        "a deleted run is not linked"
    );
    browser.close().await.expect("close");
}

/// Issue 56: a real dpkg failure in a disposable Debian root; the run
/// page and the device page show dpkg's and apt's own words on why, under
/// the job's one-line error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_and_device_pages_show_a_failed_jobs_reason_in_dpkgs_words() {
    use drover_tests::debroot::{Pkg, Sandbox};
    let sandbox = Sandbox::new();
    sandbox.publish(&[Pkg::new("drover-page-tool", "1.0")]);
    sandbox.install(&["drover-page-tool"]);
    sandbox.publish(&[
        Pkg::new("drover-page-tool", "2.0").postinst("echo 'no site.conf' >&2\nexit 1")
    ]);
    let cp = ControlPlane::start(&[]);
    cp.apply_device("why-1", &["fleet"], json!({})).await;
    let agent = upgrading_agent(&cp, &sandbox, "why-1");
    cp.wait_for_agents(&["why-1"]).await;
    cp.apply_upgrade_run("why-upgrade", "fleet", 3600).await;
    let run = cp
        .wait_run_finished("why-upgrade", Duration::from_secs(240))
        .await;
    assert_eq!(run["status"]["phase"], "Failed", "{run}\n{}", agent.log());
    let said = "dpkg: error processing package drover-page-tool (--configure):";

    let driver = Driver::start().await;
    let browser = driver.browser().await;
    log_in(&browser, &cp).await;
    go(&browser, &cp, "#/runs/why-upgrade").await;
    let reason = wait_text(
        &browser,
        "tr[data-device='why-1'] pre.reason",
        "the failed job's reason on the run page",
        |t| t.contains(said),
    )
    .await;
    assert!(
        reason
            .lines()
            .any(|l| l == "E: Sub-process /usr/bin/dpkg returned an error code (1)"),
        "{reason}"
    );
    screenshot(&browser, "run-reason").await;
    go(&browser, &cp, "#/devices/why-1").await;
    wait_text(
        &browser,
        "#device-jobs tbody tr pre.reason",
        "the failed job's reason in the device's history",
        |t| t.contains(said),
    )
    .await;
    // Issue 56, item 3: the job's whole output, fetched from the device
    // when asked: the full upgrade's call with its exit status, and the
    // maintainer script's own words.
    click(&browser, "#device-jobs tbody tr button[data-output]").await;
    let output = wait_text(
        &browser,
        "#job-output-text",
        "the job's output from the device",
        |t| t.contains("; exit 100]"),
    )
    .await;
    assert!(
        output.contains("step full-upgrade") && output.contains("no site.conf"),
        "{output}"
    );
    screenshot(&browser, "device-output").await;
    // A deployment outside its window: the row says when it opens.
    let now = jiff::Timestamp::now();
    let hhmm = |t: jiff::Timestamp| t.strftime("%H:%M").to_string();
    let start = hhmm(now + jiff::SignedDuration::from_hours(2));
    cp.apply(json!({
        "apiVersion": drover_tests::API_VERSION, "kind": "Deployment",
        "metadata": {"name": "why-window"},
        "spec": {
            "targets": {"filter": {"groups": ["fleet"]}},
            "systemUpgradeV1": {},
            "maxConcurrency": 1,
            "deadlineSeconds": 86400,
            "maintenanceWindow": {"start": start,
                "end": hhmm(now + jiff::SignedDuration::from_hours(3)), "timeZone": "UTC"}
        }
    }))
    .await;
    go(&browser, &cp, "#/deployments/why-window").await;
    wait_text(
        &browser,
        "tr[data-device='why-1'] td.waiting",
        "why the device waits",
        |t| {
            t.starts_with("maintenance window closed; opens ")
                && t.contains(&format!(" {start} UTC ("))
        },
    )
    .await;
    browser.close().await.expect("close");
}

/// Issue 56's end-to-end case in the browser: a package whose dependency
/// no archive has, installed by a real apt in a disposable Debian root,
/// fails; the device page shows apt's own words on why (the unmet
/// dependency and its `E:` line) under the job's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_device_page_shows_an_unmet_dependency_in_apts_words() {
    let sandbox = drover_tests::debroot::Sandbox::new();
    let cp = ControlPlane::start(&[]);
    drover_tests::upload_needy_package(&cp);
    cp.apply_device("needy-1", &["fleet"], json!({})).await;
    let agent = upgrading_agent(&cp, &sandbox, "needy-1");
    cp.wait_for_agents(&["needy-1"]).await;
    cp.apply(drover_tests::install_deployment(
        "needy",
        "fleet",
        drover_tests::NEEDY_PACKAGE,
    ))
    .await;
    let said = drover_tests::NEEDY_UNMET;
    eventually(Duration::from_secs(120), "the install to fail", || async {
        let jobs = cp.get("/devices/needy-1/jobs").await;
        (jobs["items"][0]["state"] == "failed").then_some(())
    })
    .await;

    let driver = Driver::start().await;
    let browser = driver.browser().await;
    log_in(&browser, &cp).await;
    go(&browser, &cp, "#/devices/needy-1").await;
    let reason = wait_text(
        &browser,
        "#device-jobs tbody tr pre.reason",
        "apt's reason in the device's history",
        |t| t.contains(said),
    )
    .await;
    assert!(
        reason.lines().any(|l| l.starts_with("E: ")),
        "{reason}\n{}",
        agent.log()
    );
    screenshot(&browser, "device-unmet-dependency").await;
    browser.close().await.expect("close");
}

/// Logs `browser` in with `token` and waits for the header to say who.
async fn log_in_as(browser: &Client, cp: &ControlPlane, token: &str, who: &str) {
    go(browser, cp, "login").await;
    let field = browser
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css("#token"))
        .await
        .expect("login page");
    field.send_keys(token).await.expect("type");
    click(browser, "#login").await;
    wait_text(browser, "#whoami", "who is signed in", |t| t == who).await;
}

/// Issue 35 in the browser: the header says who is signed in; a viewer's
/// pages have no button that changes something, and its session is refused
/// a change at the API (403 naming the role) even with the CSRF token; an
/// operator's pages have them and they work; the audit page lists both;
/// revoking the operator ends its open session; an admin's pages have them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_who_you_are_and_only_what_your_role_may_do() {
    let cp = ControlPlane::start(&[]);
    cp.apply(json!({
        "apiVersion": drover_tests::API_VERSION, "kind": "TaskSchedule",
        "metadata": {"name": "roles-nightly"},
        "spec": {"schedule": {"daily": "03:00"},
                 "template": {"spec": {"allowedGroups": ["g"], "deadlineSeconds": 600, "systemUpgradeV1": {}}}}
    }))
    .await;
    let viewer = cp.add_operator("vera", "viewer");
    let operator = cp.add_operator("otto", "operator");

    let driver = Driver::start().await;
    let browser = driver.browser().await;
    log_in_as(&browser, &cp, &viewer, "vera (viewer)").await;
    go(&browser, &cp, "#/schedules").await;
    wait_text(
        &browser,
        "[data-schedule='roles-nightly']",
        "the schedule",
        |t| t.contains("roles-nightly"),
    )
    .await;
    assert_eq!(
        rows(&browser, "[data-suspend]").await,
        0,
        "a viewer sees no Suspend button"
    );
    screenshot(&browser, "viewer-schedules").await;
    // The viewer's own session, CSRF token and all, is refused the change.
    let http = http_client();
    let (session, csrf) = cp.dashboard_session(&viewer).await;
    let refused = http
        .post(format!(
            "{}/api/v1/taskschedules/roles-nightly/suspend",
            cp.api
        ))
        .header("cookie", &session)
        .header("x-drover-csrf", &csrf)
        .json(&json!({"suspend": true}))
        .send()
        .await
        .expect("post");
    assert_eq!(refused.status(), 403);
    let body: Value = refused.json().await.expect("json");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("needs the operator role")),
        "{body}"
    );
    click(&browser, "#logout").await;

    log_in_as(&browser, &cp, &operator, "otto (operator)").await;
    go(&browser, &cp, "#/schedules").await;
    wait_text(
        &browser,
        "[data-suspend='roles-nightly']",
        "the Suspend button",
        |t| t == "Suspend",
    )
    .await;
    click(&browser, "[data-suspend='roles-nightly']").await;
    eventually(
        Duration::from_secs(10),
        "the schedule suspended",
        || async {
            (cp.get("/taskschedules/roles-nightly").await["spec"]["suspend"] == true).then_some(())
        },
    )
    .await;
    go(&browser, &cp, "#/audit").await;
    wait_text(
        &browser,
        "[data-who='operator/otto'][data-audit='suspend']",
        "otto's suspend in the audit log",
        |t| {
            t.contains("TaskSchedule/roles-nightly")
                && t.contains("applied 200")
                && t.contains("dashboard")
        },
    )
    .await;
    wait_text(
        &browser,
        "[data-who='operator/vera'][data-audit='login']",
        "vera's dashboard login in the audit log",
        |t| t.contains("dashboard") && t.contains("applied 200"),
    )
    .await;
    wait_text(
        &browser,
        "[data-who='operator/vera'][data-outcome='refused']",
        "vera's refused suspend in the audit log",
        |t| t.contains("needs the operator role"),
    )
    .await;
    screenshot(&browser, "audit").await;

    // Revoked: the open session ends (the page goes back to the login).
    let out = cp.cli(&["operators", "revoke", "otto"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    go(&browser, &cp, "").await;
    browser
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css("#token"))
        .await
        .expect("back at the login page");
    // An admin (the bootstrap token) sees and may use what an operator may.
    log_in_as(&browser, &cp, &cp.token, "admin (admin)").await;
    go(&browser, &cp, "#/schedules").await;
    wait_text(
        &browser,
        "[data-suspend='roles-nightly']",
        "the Resume button",
        |t| t == "Resume",
    )
    .await;
    browser.close().await.expect("close");
}

/// Issue 53, findings 12 and 16. A device's own assessment names a pending
/// package `evil<U+202E>gpj.exe`: the device page shows the override
/// escaped as the CLI does (`\u{202e}`), never raw. And the Audit page
/// holds every entry of the last seven days, a page at a time (it showed
/// the newest 200): after 260 changes it counts them all and pages to the
/// oldest. Positive control: the package's row and the newest entries are
/// there to read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_text_is_shown_escaped_and_the_audit_page_holds_seven_days() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let cp = ControlPlane::start(&[]);
    cp.apply_device("bidi-1", &["fleet"], json!({})).await;
    let mut ws = drover_tests::agent_ws(&cp, "bidi-1", &cp.device_token("bidi-1"))
        .await
        .expect("the device connects");
    ws.send(Message::text(
        json!({"type": "hello", "deviceId": "bidi-1", "agentVersion": "hand", "bootId": "b-1",
               "capabilities": ["systemUpgradeV1"], "jobs": []})
        .to_string(),
    ))
    .await
    .expect("hello");
    let status = json!({"jobId": "00000000-0000-4000-8000-0000000000b1", "deviceId": "bidi-1",
        "attempt": 1, "kind": "patchAssessmentV1", "state": "Succeeded", "steps": [], "error": null,
        "output": {"assessment": {"upgradable": 1, "security": 0, "keptBack": 0,
            "securityArchive": true, "rebootPending": null, "runningKernel": "6.1.0-28-amd64",
            "newestKernel": null, "omitted": 0,
            "pending": [{"name": "evil\u{202E}gpj.exe", "from": "1.0", "to": "1.1", "security": false}]}},
        "acceptedAt": "2026-12-01T00:00:00Z", "startedAt": "2026-12-01T00:00:00Z",
        "finishedAt": "2026-12-01T00:00:01Z", "bootId": "b-1", "completionHeartbeatAt": null, "seq": 1});
    ws.send(Message::text(
        json!({"type": "result", "outboxId": 1, "status": status}).to_string(),
    ))
    .await
    .expect("result");
    eventually(Duration::from_secs(20), "the assessment kept", || async {
        (cp.get("/devices/bidi-1").await["patch"]["upgradable"] == 1).then_some(())
    })
    .await;
    for i in 0..260 {
        cp.apply_device("bidi-1", &["fleet"], json!({"n": i.to_string()}))
            .await;
    }

    let driver = Driver::start().await;
    let browser = driver.browser().await;
    log_in(&browser, &cp).await;
    go(&browser, &cp, "#/devices/bidi-1").await;
    let row = wait_text(
        &browser,
        "tr[data-package^='evil']",
        "the pending package",
        |t| t.contains("gpj.exe"),
    )
    .await;
    assert!(
        row.contains("evil\\u{202e}gpj.exe") && !row.contains('\u{202E}'),
        "the override shown raw: {row:?}"
    );

    go(&browser, &cp, "#/audit").await;
    let count = wait_text(&browser, "#audit-count", "the audit log's count", |t| {
        t.contains("entries")
    })
    .await;
    let total: usize = count
        .split(" of ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a count: {count}"));
    assert!(total >= 261, "every entry of the 7 days counted: {count}");
    assert_eq!(rows(&browser, "tr[data-audit]").await, 50, "a page");
    // The newest first: the last label's apply.
    for _ in 0..total.div_ceil(50) - 1 {
        click(&browser, "#audit-older").await;
    }
    wait_text(&browser, "#audit-count", "the oldest page", |t| {
        t.starts_with(&format!("{}–{total} of {total}", (total - 1) / 50 * 50 + 1))
    })
    .await;
    browser.close().await.expect("close");
    drop(ws);
}

/// Devices that enrolled their own key and wait (issue 55): the fleet page
/// lists them, and an admin accepts one there (confirmed, in the audit log
/// as the dashboard's); the device then joins and connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_page_lists_devices_waiting_to_join_and_an_admin_accepts_one() {
    let cp = ControlPlane::start(&[]);
    let out = cp.cli(&[
        "enrollment-tokens",
        "create",
        "by-hand",
        "--groups",
        "kiosk",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let transport = format!(
        "kind = \"websocket\"\nserver_url = {}\nenrollment_token = {}\nheartbeat_seconds = 1\nbackoff_max_seconds = 1\n",
        drover_tests::toml_string(&cp.agent_url),
        drover_tests::toml_string(&token)
    );
    let _agent = AgentProcess::start_full(
        &cp.dir.path().join("dash-1"),
        "dash-1",
        &transport,
        "",
        "mode = \"simulate\"\nmin_free_mib = 10",
        "",
    );
    eventually(Duration::from_secs(30), "the device to wait", || async {
        let keys = cp.get("/device-keys?state=pending").await;
        (keys.as_array().map_or(0, Vec::len) == 1).then_some(())
    })
    .await;
    let driver = Driver::start().await;
    let browser = driver.browser().await;
    log_in(&browser, &cp).await;
    wait_text(&browser, "#pending-devices", "the waiting devices", |t| {
        t.contains("Waiting to join (1)")
    })
    .await;
    assert_eq!(rows(&browser, "tr[data-pending='dash-1']").await, 1);
    screenshot(&browser, "fleet-pending").await;
    click(&browser, "#accept-dash-1").await;
    wait_text(&browser, "#accept-dash-1", "the confirmation", |t| {
        t.contains("Confirm")
    })
    .await;
    click(&browser, "#accept-dash-1").await;
    cp.wait_for_agents(&["dash-1"]).await;
    assert_eq!(cp.get("/devices/dash-1").await["groups"], json!(["kiosk"]));
    eventually(
        Duration::from_secs(30),
        "the waiting list to empty",
        || async { (rows(&browser, "tr[data-pending]").await == 0).then_some(()) },
    )
    .await;
    let audit = cp.get("/audit").await;
    let accepted = audit
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["verb"] == "accept")
        .cloned()
        .unwrap_or_default();
    assert_eq!(accepted["via"], "dashboard", "{accepted}");
    assert_eq!(accepted["outcome"], "applied", "{accepted}");
    browser.close().await.expect("close");
}
