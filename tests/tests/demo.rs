//! The README's demo, run as a user would: it ends with a Complete run, and
//! the canary finishes before any other device starts.

use drover_tests::bin;
use std::process::Command;

#[test]
fn the_demo_completes_with_the_canary_first() {
    let out = Command::new(bin("drover"))
        .arg("demo")
        .env("DROVER_AGENT_BIN", bin("drover-agent"))
        .output()
        .expect("run drover demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "demo failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("run demo-upgrade is Complete"), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    let position = |needle: &str| lines.iter().position(|l| l.contains(needle));
    let canary_done = position("device-1 (canary): succeeded").expect("canary succeeded line");
    for other in ["device-2:", "device-3:"] {
        let first = position(other).unwrap_or_else(|| panic!("no event for {other}\n{stdout}"));
        assert!(
            canary_done < first,
            "{other} moved before the canary finished:\n{stdout}"
        );
    }
    assert!(stdout.contains("\"phase\": \"Complete\""), "{stdout}");
    assert!(
        stdout.contains("full-upgrade"),
        "each device's steps are printed:\n{stdout}"
    );
}

#[test]
fn the_upgrade_demo_upgrades_each_disposable_root() {
    let out = Command::new(bin("drover"))
        .args(["demo", "--upgrade"])
        .env("DROVER_AGENT_BIN", bin("drover-agent"))
        .output()
        .expect("run drover demo --upgrade");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "demo failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("run demo-upgrade is Complete"), "{stdout}");
    for device in ["device-1", "device-2", "device-3"] {
        let line =
            format!("{device} root now has: drover-demo-tool 2.0 ii, drover-demo-conf 2.0 ii");
        assert!(stdout.contains(&line), "{line}\n{stdout}");
    }
    assert!(stdout.contains("upgrade: 2 upgraded"), "{stdout}");
}
