//! The engine over an in-memory store: plans at fleet scale stay outside the
//! run record, and two engines (replicas) over one store agree on one plan
//! and release each device once.

use super::runs::outcome_of;
use super::*;
use drover_model::model::Empty;
use drover_model::model::{Intent, JobKind, JobState};
use drover_rules::records::{
    Delivery, DeviceRecord, PLAN_CHUNK, PlanHeader, RunStatus, TargetSelector, TaskRunSpec,
    device_key, plan_header_key, plan_key,
};
use drover_rules::rollout::Outcome;
use drover_store::store::mem::MemKv;

async fn db_with_devices(count: usize, canaries: usize) -> Db {
    let db = Db::new(Arc::new(MemKv::default()));
    for i in 0..count {
        let mut device = DeviceRecord::new(DeviceId::new(format!("dev-{i:05}")).expect("valid"));
        device.groups.insert("fleet".into());
        device.agent_present = true;
        device.capabilities = vec!["systemUpgradeV1".into()];
        if i < canaries {
            device.labels.insert("canary".into(), "true".into());
        }
        db.put(&device_key(&device.id), &device, 0)
            .await
            .expect("put device");
    }
    db
}

async fn new_run(db: &Db, name: &str) -> TaskRunRecord {
    let run = TaskRunRecord {
        name: name.into(),
        uid: JobId::random(),
        created_at: Timestamp::now(),
        spec: TaskRunSpec {
            allowed_groups: vec!["fleet".into()],
            target_selector: TargetSelector::default(),
            deadline_seconds: 3600,
            system_upgrade_v1: Empty {},
        },
        status: RunStatus::planning(),
        owner: None,
    };
    db.put(&run_key(name), &run, 0).await.expect("put run");
    run
}

fn engine(db: &Db) -> Engine {
    Engine::new(db.clone(), Arc::new(Notify::new()), None)
}

async fn run_of(db: &Db, name: &str) -> TaskRunRecord {
    db.get::<TaskRunRecord>(&run_key(name))
        .await
        .expect("get")
        .expect("run")
        .1
}

/// Plans the run `name` and releases what its first pass releases, as
/// `engine` at `now`; the run as stored then.
async fn plan_and_release(engine: &Engine, db: &Db, name: &str, now: Timestamp) -> TaskRunRecord {
    engine.pass_all(now).await.expect("plan");
    engine.pass_all(now).await.expect("release");
    run_of(db, name).await
}

#[tokio::test]
async fn the_status_of_a_run_with_20000_targets_stays_bounded() {
    let db = db_with_devices(20_000, 0).await;
    new_run(&db, "big").await;
    let engine = engine(&db);
    let now = Timestamp::now();
    engine.pass_all(now).await.expect("plan");
    let run = run_of(&db, "big").await;
    assert_eq!(run.status.phase, Phase::Running);
    assert_eq!(run.status.targets, 20_000);
    assert_eq!(run.status.plan_chunks, 40, "500 targets per chunk");
    engine.pass_all(now).await.expect("release");
    let run = run_of(&db, "big").await;
    assert_eq!(run.status.released, 20_000);
    let stored = postcard::to_stdvec(&run).expect("encode").len();
    let rendered = serde_json::to_string(&crate::api::convert::task_run(&run))
        .expect("a run serializes")
        .len();
    assert!(stored < 1024, "the run record is {stored} bytes");
    assert!(
        rendered < 2048,
        "the run as the API shows it is {rendered} bytes"
    );
    for index in 0..run.status.plan_chunks {
        let (_, chunk) = db
            .get::<Vec<PlanTarget>>(&plan_key(run.uid, index))
            .await
            .expect("get")
            .expect("chunk");
        assert!(chunk.len() <= PLAN_CHUNK);
    }
    assert_eq!(engine.load_plan(&run).await.expect("plan").len(), 20_000);
}

#[tokio::test]
async fn two_engines_over_one_store_agree_on_one_plan_and_release_once() {
    let db = db_with_devices(30, 2).await;
    new_run(&db, "shared").await;
    let (a, b) = (engine(&db), engine(&db));
    let now = Timestamp::now();
    // Interleaved passes, as two replicas would run them.
    for _ in 0..3 {
        a.pass_all(now).await.expect("a");
        b.pass_all(now).await.expect("b");
    }
    let run = run_of(&db, "shared").await;
    assert_eq!(
        (run.status.phase, run.status.targets, run.status.canaries),
        (Phase::Running, 30, 2)
    );
    // Only the canaries are out, each released once.
    let jobs = db.list::<JobDelivery>("jobs/").await.expect("jobs");
    assert_eq!(jobs.len(), 2);
    assert!(
        jobs.iter()
            .all(|(_, revision, job)| job.intent.job_id == run.uid && *revision > 0)
    );
    let revisions: Vec<u64> = jobs.iter().map(|(_, r, _)| *r).collect();
    a.pass_all(now).await.expect("a");
    b.pass_all(now).await.expect("b");
    let again: Vec<u64> = db
        .list::<JobDelivery>("jobs/")
        .await
        .expect("jobs")
        .iter()
        .map(|(_, r, _)| *r)
        .collect();
    assert_eq!(revisions, again, "no intent was written twice");
}

#[tokio::test]
async fn a_stale_claim_of_a_dead_planner_is_taken_over() {
    let db = db_with_devices(5, 0).await;
    let run = new_run(&db, "orphan").await;
    let dead = PlanHeader {
        planner: "dead-replica".into(),
        claimed_at: Timestamp::now() - jiff::SignedDuration::from_mins(5),
        targets: 99,
        canaries: 0,
        chunks: 1,
        complete: false,
    };
    db.put(&plan_header_key(run.uid), &dead, 0)
        .await
        .expect("claim");
    engine(&db).pass_all(Timestamp::now()).await.expect("plan");
    let run = run_of(&db, "orphan").await;
    assert_eq!((run.status.phase, run.status.targets), (Phase::Running, 5));
    // A fresh claim of another planner is respected.
    let run = new_run(&db, "claimed").await;
    let live = PlanHeader {
        claimed_at: Timestamp::now(),
        ..dead
    };
    db.put(&plan_header_key(run.uid), &live, 0)
        .await
        .expect("claim");
    engine(&db).pass_all(Timestamp::now()).await.expect("pass");
    assert_eq!(run_of(&db, "claimed").await.status.phase, Phase::Planning);
}

/// A store whose device listing fails, as an unreachable group source would.
struct DevicesUnreadable(MemKv);

impl drover_contract::kv::KvStore for DevicesUnreadable {
    fn get<'a>(
        &'a self,
        key: &'a str,
    ) -> drover_contract::BoxFuture<
        'a,
        Result<Option<drover_contract::kv::Entry>, drover_contract::kv::KvError>,
    > {
        self.0.get(key)
    }
    fn list<'a>(
        &'a self,
        prefix: &'a str,
    ) -> drover_contract::BoxFuture<
        'a,
        Result<Vec<(String, drover_contract::kv::Entry)>, drover_contract::kv::KvError>,
    > {
        if prefix == "devices/" {
            return Box::pin(async {
                Err(drover_contract::kv::KvError::Db(
                    "group source unavailable".into(),
                ))
            });
        }
        self.0.list(prefix)
    }
    fn commit(
        &self,
        ops: Vec<drover_contract::kv::Op>,
    ) -> drover_contract::BoxFuture<
        '_,
        Result<drover_contract::kv::OpResults, drover_contract::kv::KvError>,
    > {
        self.0.commit(ops)
    }
    fn changes(&self) -> tokio::sync::broadcast::Receiver<drover_contract::kv::Change> {
        self.0.changes()
    }
}

#[tokio::test]
async fn a_group_source_error_retries_planning_instead_of_no_targets() {
    let db = Db::new(Arc::new(DevicesUnreadable(MemKv::default())));
    new_run(&db, "patient").await;
    let engine = engine(&db);
    for _ in 0..3 {
        engine
            .pass_all(Timestamp::now())
            .await
            .expect("the pass itself goes on");
    }
    let run = run_of(&db, "patient").await;
    assert_eq!(
        run.status.phase,
        Phase::Planning,
        "still planning, not NoTargets"
    );
    assert_eq!(run.status.reason, None);
}

/// Success before the deadline is judged by when the control plane received
/// the result, never by the device's clock (A12).
#[test]
fn success_is_judged_by_the_control_planes_receive_time() {
    let t = |s: i64| Timestamp::from_second(1_800_000_000 + s).expect("time");
    let deadline = t(100);
    let job = |device_done: i64, received: Option<i64>| {
        let device = DeviceId::new("dev-1").expect("valid");
        let job_id = JobId::random();
        JobDelivery {
            intent: Intent {
                job_id,
                device_id: device.clone(),
                kind: JobKind::system_upgrade(),
                attempt: 1,
                created_at: t(0),
                expires_at: deadline,
                timeout_seconds: 1500,
            },
            run: Some("r".into()),
            delivery: Delivery::Acked { at: t(1) },
            status: Some(drover_model::JobStatus {
                job_id,
                device_id: device,
                attempt: 1,
                kind: "systemUpgradeV1".into(),
                state: JobState::Succeeded,
                steps: Vec::new(),
                error: None,
                output: None,
                accepted_at: t(device_done),
                started_at: Some(t(device_done)),
                finished_at: Some(t(device_done)),
                boot_id: "b".into(),
                completion_heartbeat_at: Some(t(device_done)),
                seq: 3,
                failure: None,
                reason: Vec::new(),
            }),
            created_at: t(0),
            terminal_received_at: received.map(t),
            cancel_requested_at: None,
        }
    };
    // (device's completion time, control plane's receive time, succeeded?)
    let cases = [
        (50, Some(60), true),
        // A slow device clock claims 50, but the result arrived at 150.
        (50, Some(150), false),
        // A fast device clock claims 3700; the result arrived in time.
        (3700, Some(60), true),
        (100, Some(100), true),
        // Stored before the receive time was kept: the device's time, as then.
        (50, None, true),
        (150, None, false),
    ];
    for (done, received, succeeded) in cases {
        let outcome = outcome_of(Some(job(done, received)), deadline);
        assert_eq!(
            outcome == Outcome::Succeeded,
            succeeded,
            "{done} {received:?}: {outcome:?}"
        );
    }
}

/// The names of every stored run.
async fn run_names(db: &Db) -> Vec<String> {
    db.list::<TaskRunRecord>("runs/")
        .await
        .expect("runs")
        .into_iter()
        .map(|(_, _, r)| r.name)
        .collect()
}

/// A daily 03:00 schedule named nightly over the fleet group, created at
/// `created`, keeping `ok` completed and `failed` failed runs.
fn nightly(created: &str, ok: u32, failed: u32) -> drover_rules::schedule::TaskScheduleRecord {
    use drover_rules::schedule::{Cadence, ScheduleSpec, TaskScheduleRecord};
    TaskScheduleRecord {
        name: "nightly".into(),
        created_at: created.parse().expect("time"),
        spec: ScheduleSpec {
            schedule: Cadence::Daily("03:00".into()),
            suspend: false,
            template: TaskRunSpec {
                allowed_groups: vec!["fleet".into()],
                target_selector: TargetSelector::default(),
                deadline_seconds: 3600,
                system_upgrade_v1: Empty {},
            },
            successful_runs_history_limit: ok,
            failed_runs_history_limit: failed,
        },
        status: Default::default(),
    }
}

/// Two replicas over one store, with an injected clock: one run per tick,
/// skipped ticks while it is active, one catch-up after a long downtime.
#[tokio::test]
async fn two_replicas_create_one_run_per_tick_and_catch_up_once() {
    use drover_rules::schedule::TaskScheduleRecord;
    let t = |text: &str| text.parse::<Timestamp>().expect("time");
    let db = Db::new(Arc::new(MemKv::default()));
    let schedule = nightly("2026-12-02T00:00:00Z", 3, 1);
    db.put(
        &drover_rules::records::schedule_key("nightly"),
        &schedule,
        0,
    )
    .await
    .expect("schedule");
    let (a, b) = (engine(&db), engine(&db));
    let runs = || run_names(&db);
    let status = || async {
        db.get::<TaskScheduleRecord>(&drover_rules::records::schedule_key("nightly"))
            .await
            .expect("get")
            .expect("schedule")
            .1
            .status
    };
    // Both replicas look at the same tick.
    let now = t("2026-12-02T03:00:30Z");
    let created_a = a.schedules(now).await.expect("a");
    let created_b = b.schedules(now).await.expect("b");
    assert_eq!(created_a.len() + created_b.len(), 1, "one run per tick");
    assert_eq!(runs().await, vec!["nightly-202612020300"]);
    // The audit log says the schedule made it, once (issue 35).
    let audit = db
        .list::<drover_rules::records::AuditRecord>(crate::audit::AUDIT_PREFIX)
        .await
        .expect("audit");
    let made: Vec<_> = audit
        .iter()
        .map(|(_, _, e)| (e.who.as_str(), e.verb.as_str(), e.name.as_deref()))
        .collect();
    assert_eq!(
        made,
        vec![("schedule/nightly", "create", Some("nightly-202612020300"))]
    );
    // The run is still planning (active): the next ticks are skipped.
    a.schedules(t("2026-12-04T03:10:00Z")).await.expect("a");
    b.schedules(t("2026-12-04T03:10:00Z")).await.expect("b");
    assert_eq!(runs().await.len(), 1);
    assert_eq!(status().await.skipped, 2);
    // The run finishes; a month with no control plane; one catch-up run.
    let (revision, mut run) = db
        .get::<TaskRunRecord>(&run_key("nightly-202612020300"))
        .await
        .expect("get")
        .expect("run");
    run.status.phase = Phase::Complete;
    db.put(&run_key(&run.name), &run, revision)
        .await
        .expect("finish");
    let later = t("2027-01-05T12:00:00Z");
    b.schedules(later).await.expect("b");
    a.schedules(later).await.expect("a");
    assert_eq!(
        runs().await,
        vec!["nightly-202612020300", "nightly-202701050300"],
        "one catch-up, for the latest tick"
    );
    let status = status().await;
    assert_eq!(status.active_run.as_deref(), Some("nightly-202701050300"));
    assert_eq!(
        status.skipped,
        2 + 31,
        "32 ticks missed, the latest caught up"
    );
}

/// A schedule's history limits, on two replicas: the newest runs of each
/// outcome stay, older ones go with their plans, the run still going and a
/// run applied by hand are never touched.
#[tokio::test]
async fn schedules_delete_finished_runs_past_their_history_limits() {
    let t = |text: &str| text.parse::<Timestamp>().expect("time");
    let db = Db::new(Arc::new(MemKv::default()));
    let schedule = nightly("2026-12-01T00:00:00Z", 2, 1);
    db.put(
        &drover_rules::records::schedule_key("nightly"),
        &schedule,
        0,
    )
    .await
    .expect("schedule");
    // A finished run applied by hand: not the schedule's to delete.
    let mut by_hand = new_run(&db, "nightly-by-hand").await;
    let revision = db
        .get::<TaskRunRecord>(&run_key(&by_hand.name))
        .await
        .expect("get")
        .expect("run")
        .0;
    by_hand.status.phase = Phase::Complete;
    db.put(&run_key(&by_hand.name), &by_hand, revision)
        .await
        .expect("finish");
    let (a, b) = (engine(&db), engine(&db));
    let runs = || run_names(&db);
    // Days 1-6 each make a run; days 2, 4 and 6 fail, the others complete. Each
    // run gets a one-chunk plan, to see it deleted with the run.
    for day in 1..=6u32 {
        let now = t(&format!("2026-12-{day:02}T03:00:30Z"));
        let replica = if day % 2 == 0 { &a } else { &b };
        let created = replica.schedules(now).await.expect("pass");
        let name = format!("nightly-202612{day:02}0300");
        assert_eq!(created, std::slice::from_ref(&name));
        let (revision, mut run) = db
            .get::<TaskRunRecord>(&run_key(&name))
            .await
            .expect("get")
            .expect("run");
        assert_eq!(
            run.owner.as_deref(),
            Some("nightly"),
            "owned by its schedule"
        );
        run.status.phase = if day % 2 == 0 {
            Phase::Failed
        } else {
            Phase::Complete
        };
        run.status.plan_chunks = 1;
        run.created_at = now;
        db.put(&run_key(&name), &run, revision)
            .await
            .expect("finish");
        db.put(
            &plan_key(run.uid, 0),
            &vec![drover_rules::records::PlanTarget {
                device: DeviceId::new("dev-00000").expect("id"),
                canary: false,
            }],
            0,
        )
        .await
        .expect("plan");
    }
    // Day 7's run is still going when both replicas look.
    a.schedules(t("2026-12-07T03:00:30Z")).await.expect("a");
    b.schedules(t("2026-12-07T03:00:40Z")).await.expect("b");
    let mut left = runs().await;
    left.sort();
    assert_eq!(
        left,
        [
            "nightly-202612030300", // the two newest complete
            "nightly-202612050300",
            "nightly-202612060300", // the newest failed
            "nightly-202612070300", // still going
            "nightly-by-hand",
        ]
    );
    // The deleted runs' plans went with them.
    let plans = db
        .list::<Vec<drover_rules::records::PlanTarget>>("plans/")
        .await;
    let chunks = plans.map(|p| p.len()).unwrap_or(0);
    assert_eq!(chunks, 3, "the plans of the three finished runs kept");
}

/// Changes a stored record as another writer would (compare-and-set).
async fn change<T: drover_store::stored::Record + Clone>(
    db: &Db,
    key: &str,
    mut edit: impl FnMut(&mut T),
) {
    db.update::<T, _>(key, |current| {
        let mut record = current.expect("stored");
        edit(&mut record);
        Some(record)
    })
    .await
    .expect("update");
}

/// Run passes `engine` made while routing what its feed holds now.
async fn passes_for(
    engine: &Engine,
    feed: &mut broadcast::Receiver<drover_contract::kv::Change>,
    turn: u64,
) -> u64 {
    use std::sync::atomic::Ordering::Relaxed;
    let before = engine.stats.run_passes.load(Relaxed);
    engine
        .turn(feed, turn, true, Timestamp::now())
        .await
        .expect("turn");
    engine.stats.run_passes.load(Relaxed) - before
}

#[tokio::test]
async fn a_replicas_counts_or_a_device_change_cause_no_pass_a_run_does_not_need() {
    // No canaries: the first release sends every intent.
    let db = db_with_devices(30, 0).await;
    new_run(&db, "wave").await;
    let (a, b) = (engine(&db), engine(&db));
    let mut feed = db.changes();
    let run = plan_and_release(&a, &db, "wave", Timestamp::now()).await;
    assert_eq!(run.status.released, 30);
    // b follows the store: the plan, the intents and a's counts.
    assert_eq!(passes_for(&b, &mut feed, 1).await, 1);
    assert_eq!(passes_for(&b, &mut feed, 2).await, 0, "nothing new");

    // Another replica stores its pass's counts: the same phase, new
    // numbers. Results come as jobs' changes; this write alone is no work.
    change::<TaskRunRecord>(&db, &run_key("wave"), |run| {
        run.status.latest_error = Some("dev-00001: a replica's pass".into());
    })
    .await;
    assert_eq!(
        passes_for(&b, &mut feed, 3).await,
        0,
        "a counts-only write of the run made a pass"
    );

    // Every target is out: a device's record changing cannot alter this run.
    change::<DeviceRecord>(
        &db,
        &device_key(&DeviceId::new("dev-00003").expect("id")),
        |d| {
            d.labels.insert("site".into(), "sofia".into());
        },
    )
    .await;
    assert_eq!(
        passes_for(&b, &mut feed, 4).await,
        0,
        "a device change made a pass over a run with nothing left to release"
    );

    // A new phase is passed over at once: the operator cancels.
    change::<TaskRunRecord>(&db, &run_key("wave"), |run| {
        run.status.phase = Phase::Canceling;
    })
    .await;
    assert_eq!(passes_for(&b, &mut feed, 5).await, 1, "the cancel");
}

#[tokio::test]
async fn a_device_change_passes_over_a_run_that_still_releases() {
    // Two canaries out, 28 targets waiting: a regrouped device may be revoked.
    let db = db_with_devices(30, 2).await;
    new_run(&db, "canaries").await;
    let engine = engine(&db);
    let mut feed = db.changes();
    let run = plan_and_release(&engine, &db, "canaries", Timestamp::now()).await;
    assert_eq!(run.status.released, 2);
    passes_for(&engine, &mut feed, 1).await;
    assert_eq!(passes_for(&engine, &mut feed, 2).await, 0, "nothing new");
    change::<DeviceRecord>(
        &db,
        &device_key(&DeviceId::new("dev-00020").expect("id")),
        |d| {
            d.groups.remove("fleet");
        },
    )
    .await;
    assert_eq!(passes_for(&engine, &mut feed, 3).await, 1);
}

/// Stores `device`'s job of `run` as succeeded, received at `at`, as the
/// intake would.
async fn succeed(db: &Db, run: &TaskRunRecord, device: &str, at: Timestamp) {
    settle(db, run, device, JobState::Succeeded, None, at).await;
}

/// Stores `device`'s job of `run` as ended in `state`, received at `at`.
async fn settle(
    db: &Db,
    run: &TaskRunRecord,
    device: &str,
    state: JobState,
    error: Option<&str>,
    at: Timestamp,
) {
    let device = DeviceId::new(device).expect("id");
    change::<JobDelivery>(
        db,
        &drover_rules::records::job_key(&device, run.uid),
        |job| {
            job.status = Some(drover_model::JobStatus {
                job_id: run.uid,
                device_id: device.clone(),
                attempt: 1,
                kind: "systemUpgradeV1".into(),
                state,
                steps: Vec::new(),
                error: error.map(str::to_owned),
                output: None,
                accepted_at: at,
                started_at: Some(at),
                finished_at: Some(at),
                boot_id: "b".into(),
                completion_heartbeat_at: Some(at),
                seq: 3,
                failure: None,
                reason: Vec::new(),
            });
            job.terminal_received_at = Some(at);
        },
    )
    .await;
}

/// One replica passes over a run while its lease lasts; another keeps its
/// view but writes nothing, and takes over once the lease runs out (the
/// holder died).
#[tokio::test]
async fn one_replica_passes_over_a_run_until_its_lease_runs_out() {
    let db = db_with_devices(30, 2).await;
    new_run(&db, "leased").await;
    let (a, b) = (engine(&db), engine(&db));
    let t0 = Timestamp::now();
    let run = plan_and_release(&a, &db, "leased", t0).await;
    assert_eq!(run.status.released, 2, "the canaries");
    let lease = || async {
        db.get::<drover_rules::deployment::Lease>(&drover_rules::records::run_lease_key(run.uid))
            .await
            .expect("get")
            .expect("a lease")
            .1
    };
    assert_eq!(lease().await.holder, a.id);

    // The canaries succeed; a is gone. b passes, but a's lease still holds.
    let t1 = t0 + jiff::SignedDuration::from_secs(1);
    succeed(&db, &run, "dev-00000", t1).await;
    succeed(&db, &run, "dev-00001", t1).await;
    let before = db
        .get::<TaskRunRecord>(&run_key("leased"))
        .await
        .expect("get");
    b.pass_all(t1).await.expect("b");
    assert_eq!(
        db.list::<JobDelivery>("jobs/").await.expect("jobs").len(),
        2,
        "b released while a held the run"
    );
    assert_eq!(
        db.get::<TaskRunRecord>(&run_key("leased"))
            .await
            .expect("get"),
        before,
        "b wrote the run while a held it"
    );

    // a's lease ran out: b takes the run over and releases the rest.
    let t2 = t0 + runs::RUN_LEASE + jiff::SignedDuration::from_secs(1);
    b.pass_all(t2).await.expect("b");
    assert_eq!(lease().await.holder, b.id);
    assert_eq!(run_of(&db, "leased").await.status.released, 30);
    assert_eq!(
        db.list::<JobDelivery>("jobs/").await.expect("jobs").len(),
        30
    );
}

/// A replica that stops gives its runs' leases back: another takes a run
/// over on its next pass, not once the lease ran out (a rolling restart
/// would otherwise hold each run for up to RUN_LEASE).
#[tokio::test]
async fn a_replica_that_stops_gives_its_runs_leases_back() {
    let db = db_with_devices(30, 2).await;
    new_run(&db, "handed").await;
    let (a, b) = (Arc::new(engine(&db)), engine(&db));
    let (_ready, intake_ready) = tokio::sync::watch::channel(true);
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(a.clone().run(
        Duration::from_millis(50),
        intake_ready,
        shutdown.clone(),
    ));
    let uid = eventually_released(&db, "handed", 2).await;
    let key = drover_rules::records::run_lease_key(uid);
    let lease = || async {
        db.get::<drover_rules::deployment::Lease>(&key)
            .await
            .expect("get")
            .expect("a lease")
            .1
    };
    assert_eq!(lease().await.holder, a.id);

    shutdown.cancel();
    running.await.expect("a stopped");
    // The canaries succeed; b passes at once and carries on the run.
    let run = run_of(&db, "handed").await;
    let now = Timestamp::now();
    succeed(&db, &run, "dev-00000", now).await;
    succeed(&db, &run, "dev-00001", now).await;
    b.pass_all(now).await.expect("b");
    assert_eq!(lease().await.holder, b.id, "a kept the lease as it stopped");
    assert_eq!(run_of(&db, "handed").await.status.released, 30);
}

/// Waits until the run `name` has released `count` jobs; its uid.
async fn eventually_released(db: &Db, name: &str, count: u32) -> JobId {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some((_, run)) = db.get::<TaskRunRecord>(&run_key(name)).await.expect("get")
            && run.status.released == count
        {
            return run.uid;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never released {count}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A pass over a run whose results only add up reads the run's tally, not
/// every target; a failure still makes a pass that names it, and the end
/// is still seen.
#[tokio::test]
async fn a_pass_that_only_counts_results_reads_the_tally_and_a_failure_is_still_named() {
    use std::sync::atomic::Ordering::Relaxed;
    let db = db_with_devices(30, 0).await;
    new_run(&db, "counted").await;
    let engine = engine(&db);
    let mut feed = db.changes();
    let now = Timestamp::now();
    let run = plan_and_release(&engine, &db, "counted", now).await;
    assert_eq!(run.status.released, 30);
    passes_for(&engine, &mut feed, 1).await;
    let full = || engine.stats.run_full_passes.load(Relaxed);

    // Ten results: counted without a look at every target.
    let before = full();
    for i in 0..10 {
        succeed(&db, &run, &format!("dev-{i:05}"), now).await;
    }
    assert_eq!(passes_for(&engine, &mut feed, 2).await, 1);
    assert_eq!(
        full(),
        before,
        "a pass that only counted looked at every target"
    );
    let status = run_of(&db, "counted").await.status;
    assert_eq!((status.succeeded, status.failed), (10, 0));

    // A failure: the pass looks at every target and names it.
    settle(
        &db,
        &run,
        "dev-00017",
        JobState::Failed,
        Some("dpkg was interrupted"),
        now,
    )
    .await;
    passes_for(&engine, &mut feed, 3).await;
    assert_eq!(full(), before + 1);
    let status = run_of(&db, "counted").await.status;
    assert_eq!((status.succeeded, status.failed), (10, 1));
    assert_eq!(
        status.latest_error.as_deref(),
        Some("dev-00017: dpkg was interrupted")
    );

    // The rest succeed: the run ends (TargetsFailed, for dev-00017).
    for i in (10..30).filter(|&i| i != 17) {
        succeed(&db, &run, &format!("dev-{i:05}"), now).await;
    }
    passes_for(&engine, &mut feed, 4).await;
    let status = run_of(&db, "counted").await.status;
    assert_eq!(
        (status.phase, status.reason.as_deref(), status.succeeded),
        (Phase::Failed, Some("TargetsFailed"), 29)
    );
}

/// Issue 56: deleting a finished run keeps each decided job in its
/// device's history (once, however often the delete runs) and an
/// undecided one not at all; retention then trims the history.
#[tokio::test]
async fn a_deleted_runs_decided_jobs_stay_in_their_devices_history() {
    use drover_rules::history::{HistoryRecord, Retention, device_history_prefix};
    let db = db_with_devices(3, 1).await;
    let engine = engine(&db);
    let now = Timestamp::now();
    new_run(&db, "weekly").await;
    let run = plan_and_release(&engine, &db, "weekly", now).await;
    succeed(&db, &run, "dev-00000", now).await;
    engine.pass_all(now).await.expect("release the rest");
    assert_eq!(run_of(&db, "weekly").await.status.released, 3);
    settle(
        &db,
        &run,
        "dev-00001",
        JobState::Failed,
        Some("apt-get failed"),
        now,
    )
    .await;
    // dev-00002's job is released and undecided.
    let history = |device: &str| {
        let db = db.clone();
        let prefix = device_history_prefix(&DeviceId::new(device).expect("id"));
        async move {
            db.list::<HistoryRecord>(&prefix)
                .await
                .expect("list")
                .into_iter()
                .map(|(_, _, r)| r)
                .collect::<Vec<_>>()
        }
    };
    assert!(
        history("dev-00000").await.is_empty(),
        "nothing kept before the delete"
    );
    let jobs = db.list::<JobDelivery>("jobs/").await.expect("jobs");
    assert_eq!(jobs.len(), 3);
    let all: Vec<JobDelivery> = jobs.into_iter().map(|(_, _, j)| j).collect();

    assert_eq!(engine.delete_finished_run(&run).await.expect("delete"), 3);
    assert!(
        db.list::<JobDelivery>("jobs/")
            .await
            .expect("jobs")
            .is_empty()
    );
    let ok = history("dev-00000").await;
    assert_eq!(ok.len(), 1);
    assert_eq!(
        (ok[0].state.as_str(), ok[0].run.as_deref()),
        ("succeeded", Some("weekly"))
    );
    let failed = history("dev-00001").await;
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].error.as_deref(), Some("apt-get failed"));
    assert!(
        history("dev-00002").await.is_empty(),
        "an undecided job is not kept"
    );

    // A delete cut short and run again keeps each job once.
    let kept = crate::history::archive(&db, &all, Retention::default(), now)
        .await
        .expect("again");
    assert_eq!(kept, 0);
    assert_eq!(history("dev-00000").await, ok);

    // Past its age, the hourly sweep deletes it; within, it stays.
    let day = Retention {
        per_device: 100,
        max_age: jiff::SignedDuration::from_hours(24),
    };
    assert_eq!(
        crate::history::prune_once(&db, day, now)
            .await
            .expect("prune"),
        0
    );
    let later = now + jiff::SignedDuration::from_hours(25);
    assert_eq!(
        crate::history::prune_once(&db, day, later)
            .await
            .expect("prune"),
        2
    );
    assert!(history("dev-00000").await.is_empty());
}
