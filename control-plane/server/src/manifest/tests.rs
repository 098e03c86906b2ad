//! Manifests: what parses, what is refused and how it is said.

use super::*;

/// The example of the fleet-tasks seed, unchanged.
pub const SEED_EXAMPLE: &str = r#"{
    "apiVersion": "fleet.nationtech.io/v1alpha1",
    "kind": "TaskRun",
    "metadata": {"name": "upgrade-device-1"},
    "spec": {
        "allowedGroups": ["production"],
        "targetSelector": {"matchLabels": {"device-id": "device-1"}},
        "deadlineSeconds": 21600,
        "systemUpgradeV1": {}
    }
}"#;

fn check(edit: &dyn Fn(&mut serde_json::Value), expected: Result<(), &str>) {
    let mut value: serde_json::Value = serde_json::from_str(SEED_EXAMPLE).expect("json");
    edit(&mut value);
    match (parse(value), expected) {
        (Ok(_), Ok(())) => {}
        (Err(e), Err(fragment)) => assert!(e.contains(fragment), "{e}"),
        (got, expected) => panic!("got {got:?}, expected {expected:?}"),
    }
}

#[test]
fn the_seed_example_applies_and_bad_specs_are_refused() {
    check(&|_| {}, Ok(()));
    check(
        &|v| v["spec"]["allowedGroups"] = serde_json::json!([]),
        Err("at least one group"),
    );
    check(
        &|v| v["spec"]["targetSelector"]["matchExpressions"] = serde_json::json!([{"key": "a"}]),
        Err("fails closed"),
    );
    check(
        &|v| v["spec"]["systemUpgradeV1"] = serde_json::json!({"packages": ["x"]}),
        Err("unknown field"),
    );
    check(
        &|v| v["spec"]["command"] = serde_json::json!("reboot"),
        Err("unknown field"),
    );
    check(
        &|v| v["spec"]["deadlineSeconds"] = serde_json::json!(0),
        Err("deadlineSeconds"),
    );
    check(
        &|v| {
            v["spec"]
                .as_object_mut()
                .expect("object")
                .remove("systemUpgradeV1");
        },
        Err("needs a workload"),
    );
    check(
        &|v| v["apiVersion"] = serde_json::json!("v1"),
        Err("apiVersion must be"),
    );
    check(
        &|v| v["kind"] = serde_json::json!("Pod"),
        Err("unknown kind"),
    );
    check(
        &|v| v["metadata"]["name"] = serde_json::json!("Bad_Name"),
        Err("metadata.name"),
    );
}

fn deployment() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": API_VERSION, "kind": "Deployment",
        "metadata": {"name": "night-upgrade"},
        "spec": {
            "targets": {"filter": {"matchLabels": {"site": "sofia"}, "groups": ["production"]}},
            "systemUpgradeV1": {},
            "maxConcurrency": 100,
            "maintenanceWindow": {"start": "22:00", "end": "05:00", "timeZone": "Europe/Sofia"},
            "retries": 2,
            "retryBackoffSeconds": 600,
            "deadlineSeconds": 604800
        }
    })
}

#[test]
fn deployments_parse_and_render_back() {
    let manifest = parse(deployment()).expect("deployment");
    let Manifest::Deployment { name, spec } = manifest else {
        panic!("{manifest:?}")
    };
    assert_eq!(name, "night-upgrade");
    let window = spec.maintenance_window.clone().expect("window");
    assert_eq!((window.start_minute, window.end_minute), (22 * 60, 5 * 60));
    let record = drover_rules::deployment::DeploymentRecord {
        name,
        uid: drover_model::JobId::random(),
        created_at: jiff::Timestamp::UNIX_EPOCH,
        spec,
        add_requests: 0,
        status: drover_rules::deployment::DeploymentStatus::planning(),
    };
    let rendered =
        serde_json::to_value(crate::api::convert::deployment(&record)).expect("serializes");
    assert_eq!(
        rendered["spec"],
        deployment()["spec"],
        "what was applied reads back"
    );

    // Software conditions read back too, in dpkg's spelling of the relation.
    let mut with_software = deployment();
    with_software["spec"]["targets"]["filter"]["softwarePresent"] = serde_json::json!([
        {"name": "openssl", "versionCmp": {"op": "<<", "version": "3.0.11-1~deb12u2"}}
    ]);
    with_software["spec"]["targets"]["filter"]["softwareAbsent"] =
        serde_json::json!([{"name": "telnetd"}]);
    let Manifest::Deployment { spec, .. } = parse(with_software.clone()).expect("parses") else {
        panic!("a deployment")
    };
    let record = drover_rules::deployment::DeploymentRecord { spec, ..record };
    assert_eq!(
        serde_json::to_value(crate::api::convert::deployment(&record)).expect("serializes")["spec"],
        with_software["spec"]
    );

    // A failure threshold and a release rate read back as written.
    for threshold in [
        serde_json::json!({"failed": 5}),
        serde_json::json!({"failed": 5, "minEnded": 20}),
        serde_json::json!({"percent": 10, "minEnded": 40}),
    ] {
        let mut safe = deployment();
        safe["spec"]["failureThreshold"] = threshold.clone();
        safe["spec"]["maxReleasesPerMinute"] = 50.into();
        let Manifest::Deployment { spec, .. } = parse(safe.clone()).expect("parses") else {
            panic!("a deployment")
        };
        assert!(spec.failure_threshold.is_some() && spec.max_releases_per_minute == Some(50));
        let record = drover_rules::deployment::DeploymentRecord {
            spec,
            ..record.clone()
        };
        assert_eq!(
            serde_json::to_value(crate::api::convert::deployment(&record)).expect("serializes")["spec"],
            safe["spec"],
            "{threshold}"
        );
    }
}

#[test]
fn secrets_parse_and_bad_ones_are_refused() {
    let secret = |name: &str, data: serde_json::Value| {
        serde_json::json!({
            "apiVersion": API_VERSION, "kind": "Secret",
            "metadata": {"name": name}, "spec": {"data": data}
        })
    };
    let Manifest::Secret { name, data } = parse(secret(
        "kiosk",
        serde_json::json!({"token": "x", "ca.pem": "y"}),
    ))
    .expect("ok") else {
        panic!("a secret")
    };
    assert_eq!((name.as_str(), data.len()), ("kiosk", 2));
    let cases = [
        (
            secret("../etc", serde_json::json!({"a": "b"})),
            "metadata.name",
        ),
        (secret("kiosk", serde_json::json!({})), "1 to 16 keys"),
        (secret("kiosk", serde_json::json!({"a/b": "c"})), "key"),
        (secret("kiosk", serde_json::json!({".hidden": "c"})), "key"),
        (
            secret("kiosk", serde_json::json!({"big": "x".repeat(5000)})),
            "over the limit",
        ),
        (
            secret("kiosk", serde_json::json!({"n": 1})),
            "invalid Secret spec",
        ),
    ];
    for (manifest, expected) in cases {
        let error = parse(manifest.clone()).expect_err(&manifest.to_string());
        assert!(error.contains(expected), "{manifest}: {error}");
    }
}

#[test]
fn bad_deployments_are_refused_with_what_is_wrong() {
    type Edit = fn(&mut serde_json::Value);
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "a threshold with both a count and a percentage",
            |v| v["spec"]["failureThreshold"] = serde_json::json!({"failed": 1, "percent": 5}),
            "exactly one of `failed: N`",
        ),
        (
            "a threshold with neither",
            |v| v["spec"]["failureThreshold"] = serde_json::json!({"minEnded": 5}),
            "exactly one of `failed: N`",
        ),
        (
            "a percentage without minEnded",
            |v| v["spec"]["failureThreshold"] = serde_json::json!({"percent": 5}),
            "needs minEnded",
        ),
        (
            "a percentage over 100",
            |v| v["spec"]["failureThreshold"] = serde_json::json!({"percent": 101, "minEnded": 1}),
            "between 1 and 100",
        ),
        (
            "a zero count",
            |v| v["spec"]["failureThreshold"] = serde_json::json!({"failed": 0}),
            "failed must be between 1 and 20000",
        ),
        (
            "an unknown threshold field",
            |v| v["spec"]["failureThreshold"] = serde_json::json!({"failures": 3}),
            "unknown field",
        ),
        (
            "a zero release rate",
            |v| v["spec"]["maxReleasesPerMinute"] = 0.into(),
            "maxReleasesPerMinute must be between 1 and 20000",
        ),
        (
            "two targetings",
            |v| v["spec"]["targets"]["all"] = true.into(),
            "exactly one of",
        ),
        (
            "no targeting",
            |v| v["spec"]["targets"] = serde_json::json!({}),
            "exactly one of",
        ),
        (
            "an empty filter",
            |v| v["spec"]["targets"] = serde_json::json!({"filter": {}}),
            "filter is empty",
        ),
        (
            "a bad label",
            |v| v["spec"]["targets"]["filter"]["matchLabels"] = serde_json::json!({"a b": "c"}),
            "matchLabels",
        ),
        (
            "a bad device id",
            |v| v["spec"]["targets"] = serde_json::json!({"devices": ["Not Valid"]}),
            "spec.targets.devices",
        ),
        (
            "a device twice",
            |v| v["spec"]["targets"] = serde_json::json!({"devices": ["a", "a"]}),
            "twice",
        ),
        (
            "no devices",
            |v| v["spec"]["targets"] = serde_json::json!({"devices": []}),
            "1 to 20000",
        ),
        (
            "a software condition's relation",
            |v| {
                v["spec"]["targets"]["filter"]["softwarePresent"] = serde_json::json!([{"name": "openssl", "versionCmp": {"op": "=>", "version": "3"}}]);
            },
            "is not one of",
        ),
        (
            "a software condition's version",
            |v| {
                v["spec"]["targets"]["filter"]["softwareAbsent"] = serde_json::json!([{"name": "openssl", "versionCmp": {"op": "<", "version": "x y"}}]);
            },
            "not a Debian version",
        ),
        (
            "a software condition's package name",
            |v| {
                v["spec"]["targets"]["filter"]["softwarePresent"] =
                    serde_json::json!([{"name": "OpenSSL"}]);
            },
            "not a Debian package name",
        ),
        (
            "two jobs",
            |v| v["spec"]["inventoryRefreshV1"] = serde_json::json!({}),
            "exactly one job",
        ),
        (
            "no job",
            |v| {
                v["spec"]
                    .as_object_mut()
                    .expect("spec")
                    .remove("systemUpgradeV1");
            },
            "exactly one job",
        ),
        (
            "upgrade parameters",
            |v| v["spec"]["systemUpgradeV1"] = serde_json::json!({"packages": ["x"]}),
            "unknown field",
        ),
        (
            "two jobs",
            |v| v["spec"]["packageInstallV1"] = serde_json::json!({"package": "x"}),
            "exactly one job",
        ),
        (
            "a package without its id",
            |v| {
                v["spec"]
                    .as_object_mut()
                    .expect("spec")
                    .remove("systemUpgradeV1");
                v["spec"]["packageInstallV1"] = serde_json::json!({"package": ""});
            },
            "must name a package",
        ),
        (
            "package install options",
            |v| {
                v["spec"]
                    .as_object_mut()
                    .expect("spec")
                    .remove("systemUpgradeV1");
                v["spec"]["packageInstallV1"] =
                    serde_json::json!({"package": "x_1_all", "force": true});
            },
            "unknown field",
        ),
        (
            "zero concurrency",
            |v| v["spec"]["maxConcurrency"] = 0.into(),
            "maxConcurrency",
        ),
        (
            "too much concurrency",
            |v| v["spec"]["maxConcurrency"] = 20_001.into(),
            "maxConcurrency",
        ),
        (
            "too many retries",
            |v| v["spec"]["retries"] = 21.into(),
            "retries",
        ),
        (
            "a zero backoff",
            |v| v["spec"]["retryBackoffSeconds"] = 0.into(),
            "retryBackoffSeconds",
        ),
        (
            "no deadline",
            |v| v["spec"]["deadlineSeconds"] = 0.into(),
            "deadlineSeconds",
        ),
        (
            "a window hour 24",
            |v| v["spec"]["maintenanceWindow"]["start"] = "24:00".into(),
            "HH:MM",
        ),
        (
            "a window in words",
            |v| v["spec"]["maintenanceWindow"]["end"] = "late".into(),
            "HH:MM",
        ),
        (
            "an empty window",
            |v| v["spec"]["maintenanceWindow"]["end"] = "22:00".into(),
            "empty",
        ),
        (
            "an unknown zone",
            |v| v["spec"]["maintenanceWindow"]["timeZone"] = "Mars/Olympus".into(),
            "time zone database",
        ),
        (
            "an unknown field",
            |v| v["spec"]["canaryFirst"] = true.into(),
            "unknown field",
        ),
        (
            "a bad name",
            |v| v["metadata"]["name"] = "Night_Upgrade".into(),
            "metadata.name",
        ),
    ];
    for (what, edit, fragment) in cases {
        let mut value = deployment();
        edit(&mut value);
        match parse(value) {
            Ok(m) => panic!("{what}: accepted {m:?}"),
            Err(e) => assert!(e.contains(fragment), "{what}: {e}"),
        }
    }
}

#[test]
fn devices_carry_groups_and_labels() {
    let value = serde_json::json!({
        "apiVersion": API_VERSION, "kind": "Device",
        "metadata": {"name": "pi-1", "labels": {"canary": "true"}},
        "spec": {"groups": ["production"], "timeZone": "Europe/Sofia"}
    });
    match parse(value).expect("device") {
        Manifest::Device { id, labels, spec } => {
            assert_eq!(id.as_str(), "pi-1");
            assert_eq!(labels.get("canary").map(String::as_str), Some("true"));
            assert_eq!(spec.groups, vec!["production"]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn schedules_take_history_limits_and_render_them_back() {
    let schedule = |limits: serde_json::Value| {
        let mut spec = serde_json::json!({
            "schedule": {"daily": "03:00"},
            "template": {"spec": {"allowedGroups": ["production"], "deadlineSeconds": 600, "systemUpgradeV1": {}}},
        });
        if let (Some(spec), serde_json::Value::Object(limits)) = (spec.as_object_mut(), limits) {
            spec.extend(limits);
        }
        parse(serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": "TaskSchedule",
            "metadata": {"name": "nightly"},
            "spec": spec,
        }))
    };
    let spec_of = |parsed: Result<Manifest, String>| match parsed {
        Ok(Manifest::TaskSchedule { spec, .. }) => spec,
        other => panic!("a schedule: {other:?}"),
    };
    // Kubernetes CronJobs' defaults.
    let defaults = spec_of(schedule(serde_json::json!({})));
    assert_eq!(
        (
            defaults.successful_runs_history_limit,
            defaults.failed_runs_history_limit
        ),
        (3, 1)
    );
    let set = spec_of(schedule(serde_json::json!({
        "successfulRunsHistoryLimit": 10,
        "failedRunsHistoryLimit": 0,
    })));
    assert_eq!(
        (
            set.successful_runs_history_limit,
            set.failed_runs_history_limit
        ),
        (10, 0)
    );
    let record = drover_rules::schedule::TaskScheduleRecord {
        name: "nightly".into(),
        created_at: "2026-12-01T00:00:00Z".parse().expect("time"),
        spec: set,
        status: Default::default(),
    };
    let rendered = serde_json::to_value(crate::api::convert::task_schedule(
        &record,
        record.created_at,
    ))
    .expect("serializes");
    assert_eq!(rendered["spec"]["successfulRunsHistoryLimit"], 10);
    assert_eq!(rendered["spec"]["failedRunsHistoryLimit"], 0);
    let err = schedule(serde_json::json!({"failedRunsHistoryLimit": 5000})).expect_err("refused");
    assert!(
        err.contains("spec.failedRunsHistoryLimit 5000 is more than 1000"),
        "{err}"
    );
    let err = schedule(serde_json::json!({"successfulRunsHistoryLimit": -1})).expect_err("refused");
    assert!(err.contains("invalid TaskSchedule spec"), "{err}");
}

#[test]
fn a_scheduled_run_names_its_schedule_and_a_hand_made_one_does_not() {
    let Manifest::TaskRun { name, spec } =
        parse(serde_json::from_str(SEED_EXAMPLE).expect("json")).expect("parses")
    else {
        panic!("a run")
    };
    let mut run = drover_rules::records::TaskRunRecord {
        name,
        uid: drover_model::JobId::random(),
        created_at: "2026-12-01T00:00:00Z".parse().expect("time"),
        spec,
        status: drover_rules::records::RunStatus::planning(),
        owner: None,
    };
    assert!(
        rendered_run(&run)["metadata"]
            .get("ownerReferences")
            .is_none()
    );
    run.owner = Some("nightly".into());
    assert_eq!(
        rendered_run(&run)["metadata"]["ownerReferences"],
        serde_json::json!([{"kind": "TaskSchedule", "name": "nightly"}])
    );
    // An operator cannot claim a schedule's run as one.
    check(
        &|v| {
            v["metadata"]["ownerReferences"] =
                serde_json::json!([{"kind": "TaskSchedule", "name": "x"}])
        },
        Err("unknown field `ownerReferences`"),
    );
}

/// A run as the API shows it, as JSON.
fn rendered_run(run: &drover_rules::records::TaskRunRecord) -> serde_json::Value {
    serde_json::to_value(crate::api::convert::task_run(run)).expect("a run serializes")
}
