//! The fleet in-process, over fake engines behind a fake [`Connector`]: routing by id prefix,
//! health thresholds and the 503 of a down engine, drain, the engines file (added, removed,
//! drained engines, a bad file kept out, the watcher), and the warm pool's spread.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::discovery::{BACKSTOP_POLL, EnginesFile, Watch};
use super::*;
use crate::coordination::activity::LocalActivity;
use crate::coordination::lock::LocalLocks;
use crate::engine::EngineError;
use crate::engine::fake::FakeEngine;

/// Hands out one fake engine per name; a name in `unreachable` cannot be connected to.
#[derive(Default)]
struct Fakes {
    engines: Mutex<HashMap<String, FakeEngine>>,
    unreachable: Mutex<HashSet<String>>,
}

impl Fakes {
    fn engine(&self, name: &str) -> FakeEngine {
        self.engines
            .lock()
            .expect("fakes")
            .entry(name.to_string())
            .or_default()
            .clone()
    }
}

#[async_trait::async_trait]
impl Connector for Fakes {
    async fn connect(&self, spec: &EngineSpec) -> Result<Arc<dyn ContainerEngine>, EngineError> {
        if self.unreachable.lock().expect("fakes").contains(&spec.name) {
            return Err(EngineError::Unavailable("connection refused".into()));
        }
        Ok(Arc::new(self.engine(&spec.name)))
    }
}

/// A fleet over fake engines, its engines file and the fakes.
struct Setup {
    fleet: Arc<Fleet>,
    fakes: Arc<Fakes>,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

fn engine(name: &str, extra: Value) -> Value {
    let mut e = json!({"name": name, "endpoint": format!("unix:///fake/{name}.sock")});
    if let (Some(e), Some(extra)) = (e.as_object_mut(), extra.as_object()) {
        e.extend(extra.clone());
    }
    e
}

/// Replaces the file whole, as an operator's tooling should.
fn write(path: &Path, engines: &[Value]) {
    write_raw(path, json!({ "engines": engines }).to_string().as_bytes());
}

fn write_raw(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

impl Setup {
    fn new(engines: &[Value], extra: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("engines.json");
        write(&path, engines);
        let file = path.display().to_string();
        let mut settings = vec![("ENGINES_FILE", file.as_str())];
        settings.extend_from_slice(extra);
        let config = crate::config::for_tests("key", &settings);
        let fakes = Arc::new(Fakes::default());
        let fleet = Fleet::from_file(
            config.clone(),
            Arc::new(LocalLocks::default()),
            Arc::new(LocalActivity::new(config.reaper.running_session_max_idle)),
            Arc::new(Metrics::default()),
            None,
            fakes.clone(),
        );
        Self {
            fleet,
            fakes,
            path,
            _dir: dir,
        }
    }

    fn named(names: &[&str], extra: &[(&str, &str)]) -> Self {
        let engines: Vec<Value> = names.iter().map(|n| engine(n, json!({}))).collect();
        Self::new(&engines, extra)
    }

    fn cell(&self, name: &str) -> Arc<Cell> {
        self.fleet
            .cells()
            .into_iter()
            .find(|c| c.name() == name)
            .unwrap_or_else(|| panic!("no engine {name}"))
    }

    fn names(&self) -> Vec<String> {
        self.fleet.cells().iter().map(|c| c.name()).collect()
    }

    fn state(&self, name: &str) -> EngineState {
        self.cell(name).state()
    }

    /// Marks an engine up as its health check would, without one running.
    fn bring_up(&self, name: &str) {
        let cell = self.cell(name);
        let link = cell.link().expect("a fleet engine");
        link.connect(Arc::new(self.fakes.engine(name)));
        link.set_up(true);
        cell.saw_info(vec!["runc".into(), "runsc".into()], Vec::new());
    }

    fn targets(&self, name: &str) -> u32 {
        let cell = self.cell(name);
        cell.pool().targets().iter().map(|(_, n)| n).sum()
    }
}

/// Waits (real time) until `ready` holds; the bound only ends a test that would hang.
async fn until(what: &str, ready: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn request(image: &str) -> StartSessionRequest {
    serde_json::from_value(json!({ "base_image": image })).expect("request")
}

/// An id as the engine `prefix` would hand it out.
fn id_on(prefix: &str) -> String {
    format!("{prefix}.{}", "0123456789abcdef".repeat(4))
}

#[tokio::test]
async fn ids_carry_their_engine_and_route_back_to_it() {
    let s = Setup::named(&["a", "b", "c"], &[]);
    s.fleet.start();
    until("every engine up", || {
        ["a", "b", "c"]
            .iter()
            .all(|n| s.state(n) == EngineState::Up)
    })
    .await;
    let mut engines = HashSet::new();
    for _ in 0..12 {
        let id = s.fleet.create(&request("img:1")).await.expect("created");
        let (prefix, raw) = id.split_once('.').expect("an engine prefix");
        assert_eq!(s.fleet.cell_of(&id).expect("routed").name(), prefix);
        // The engine holds it under its own id, and only that engine's stack finds it.
        assert!(s.fakes.engine(prefix).status(raw).is_some(), "{id}");
        let sid = crate::ids::SessionId::parse(&id).expect("a session id");
        s.fleet
            .at(&id)
            .expect("sessions")
            .ensure_running(&sid)
            .await
            .expect("found");
        engines.insert(prefix.to_string());
    }
    assert!(engines.len() > 1, "every session on {engines:?}");
    // An engine not in the fleet, and an unprefixed id without a default engine: 404.
    for id in [id_on("zz"), "0123456789abcdef".repeat(4)] {
        assert!(
            matches!(s.fleet.cell_of(&id), Err(FleetError::UnknownEngine)),
            "{id}"
        );
    }
    assert!(s.fleet.default_cell().is_none());
}

#[tokio::test(start_paused = true)]
async fn an_engine_goes_down_only_after_enough_failed_checks_and_its_sessions_answer_503() {
    let s = Setup::named(
        &["a", "b"],
        &[("ENGINE_DOWN_AFTER", "3"), ("ENGINE_UP_AFTER", "2")],
    );
    s.fleet.start();
    // Checks at 0 s, 1 s, 2 s, ...: two answered ones bring an engine up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(s.state("b"), EngineState::Down, "up after one check");
    tokio::time::sleep(HEALTH_EVERY).await;
    assert_eq!(s.state("b"), EngineState::Up);
    let id = id_on("b");
    assert!(s.fleet.cell_of(&id).is_ok());

    s.fakes.engine("b").fail_on("ping");
    for missed in 1..3 {
        tokio::time::sleep(HEALTH_EVERY).await;
        assert_eq!(
            s.state("b"),
            EngineState::Up,
            "down after {missed} missed checks"
        );
    }
    tokio::time::sleep(HEALTH_EVERY).await;
    assert_eq!(s.state("b"), EngineState::Down);
    assert!(matches!(s.fleet.cell_of(&id), Err(FleetError::EngineDown(e)) if e == "b"));
    assert!(matches!(s.fleet.at(&id), Err(FleetError::EngineDown(_))));
    // Its stack's calls fail at once rather than reach the engine.
    let on_b = s.cell("b");
    assert!(matches!(
        on_b.engine().ping().await,
        Err(EngineError::Unavailable(_))
    ));
    // No new session goes there.
    for _ in 0..5 {
        assert_eq!(
            s.fleet.place(&request("img:1")).expect("placed").name(),
            "a"
        );
    }
    assert_eq!(s.state("a"), EngineState::Up);
    let statuses = s.fleet.statuses();
    assert_eq!(statuses[1].state, EngineState::Down);
    assert_eq!(
        s.fleet.metrics().fleet.up.get_or_create(&labels("b")).get(),
        0
    );

    // Back after two answered checks (it is connected again: the outage dropped its client).
    s.fakes.engine("b").heal();
    tokio::time::sleep(HEALTH_EVERY).await;
    assert_eq!(s.state("b"), EngineState::Down);
    tokio::time::sleep(HEALTH_EVERY).await;
    assert_eq!(s.state("b"), EngineState::Up);
    assert!(s.fleet.at(&id).is_ok());
}

fn labels(engine: &str) -> EngineLabels {
    EngineLabels {
        engine: engine.to_string(),
    }
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_engine_stays_down_and_joins_when_it_answers() {
    let s = Setup::named(&["a", "b"], &[]);
    s.fakes
        .unreachable
        .lock()
        .expect("fakes")
        .insert("b".into());
    s.fleet.start();
    tokio::time::sleep(HEALTH_EVERY * 3).await;
    assert_eq!(s.state("a"), EngineState::Up);
    assert_eq!(s.state("b"), EngineState::Down);
    assert!(s.fakes.engine("b").calls().is_empty());
    for _ in 0..5 {
        assert_eq!(
            s.fleet.place(&request("img:1")).expect("placed").name(),
            "a"
        );
    }
    s.fakes.unreachable.lock().expect("fakes").clear();
    tokio::time::sleep(HEALTH_EVERY * 2).await;
    assert_eq!(s.state("b"), EngineState::Up);
}

#[tokio::test]
async fn a_drained_engine_takes_no_new_sessions_and_keeps_its_own() {
    let s = Setup::named(&["a", "b"], &[]);
    s.bring_up("a");
    s.bring_up("b");
    write(
        &s.path,
        &[engine("a", json!({"drain": true})), engine("b", json!({}))],
    );
    s.fleet.reload();
    assert_eq!(s.state("a"), EngineState::Draining);
    for _ in 0..10 {
        assert_eq!(
            s.fleet.place(&request("img:1")).expect("placed").name(),
            "b"
        );
    }
    // Its sessions still route; a fork or a session from its snapshot does not go there.
    let on_a = id_on("a");
    assert_eq!(s.fleet.cell_of(&on_a).expect("routed").name(), "a");
    assert!(matches!(
        s.fleet.at_for_new(&on_a, 1),
        Err(FleetError::EngineDraining(e)) if e == "a"
    ));
    // Both drained: a create is refused, saying why.
    write(
        &s.path,
        &[
            engine("a", json!({"drain": true})),
            engine("b", json!({"drain": true})),
        ],
    );
    s.fleet.reload();
    match s.fleet.place(&request("img:1")) {
        Err(FleetError::NoEngine(why)) => {
            assert!(
                why.contains("a is draining") && why.contains("b is draining"),
                "{why}"
            )
        }
        other => panic!("placed on a drained fleet: {:?}", other.map(|c| c.name())),
    }
}

#[tokio::test]
async fn a_rewritten_file_adds_and_removes_engines_and_a_bad_one_is_kept_out() {
    let s = Setup::named(&["a", "b"], &[]);
    let metrics = s.fleet.metrics().clone();
    assert_eq!(metrics.fleet.file_valid.get(), 1);
    s.bring_up("a");
    let a = s.cell("a");
    // Unchanged content: nothing happens.
    s.fleet.reload();
    assert!(Arc::ptr_eq(&a, &s.cell("a")));

    // `c` added, `b` removed, `a`'s capacity changed in place.
    write(
        &s.path,
        &[
            engine("a", json!({"max_sessions": 3})),
            engine("c", json!({})),
        ],
    );
    s.fleet.reload();
    assert_eq!(s.names(), ["a", "c"]);
    assert!(Arc::ptr_eq(&a, &s.cell("a")), "a kept its cell");
    assert_eq!(s.fleet.statuses()[0].max_sessions, Some(3));
    assert_eq!(
        s.state("c"),
        EngineState::Down,
        "c is up before it answered"
    );
    assert!(matches!(
        s.fleet.cell_of(&id_on("b")),
        Err(FleetError::UnknownEngine)
    ));

    // Bad files change nothing, and each is counted once.
    let errors = metrics.fleet.file_errors.get();
    for bad in [
        &b"{\"engines\": [{\"name\": \"a\", \"endpoint\": \"nowhere\"}]}"[..],
        b"not json",
    ] {
        write_raw(&s.path, bad);
        s.fleet.reload();
        s.fleet.reload();
        assert_eq!(s.names(), ["a", "c"]);
        assert_eq!(metrics.fleet.file_valid.get(), 0);
    }
    assert_eq!(metrics.fleet.file_errors.get(), errors + 2);
    // So is a file gone missing, once until it is back.
    std::fs::remove_file(&s.path).expect("remove");
    s.fleet.reload();
    s.fleet.reload();
    assert_eq!(metrics.fleet.file_errors.get(), errors + 3);
    assert_eq!(s.names(), ["a", "c"]);

    // A good file again; a changed endpoint gets a new cell.
    write(
        &s.path,
        &[
            engine("a", json!({"endpoint": "unix:///elsewhere.sock"})),
            engine("c", json!({})),
        ],
    );
    s.fleet.reload();
    assert_eq!(metrics.fleet.file_valid.get(), 1);
    assert_eq!(s.names(), ["a", "c"]);
    assert!(!Arc::ptr_eq(&a, &s.cell("a")), "a reconnected");
}

/// Whether `watch` says the file changed well before its backstop poll would: only the watcher
/// can have said it.
async fn noticed(watch: &mut Watch) -> bool {
    tokio::select! {
        () = watch.changed() => true,
        () = tokio::time::sleep(BACKSTOP_POLL / 2) => false,
    }
}

#[tokio::test]
async fn the_watcher_sees_a_renamed_file_and_a_configmap_swap() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A ConfigMap as the kubelet mounts it: the file is a symlink through `..data`, which is
    // swapped to a new version's directory.
    for (version, name) in [("..v1", "a"), ("..v2", "b")] {
        let v = dir.path().join(version);
        std::fs::create_dir(&v).expect("mkdir");
        write(&v.join("engines.json"), &[engine(name, json!({}))]);
    }
    std::os::unix::fs::symlink("..v1", dir.path().join("..data")).expect("symlink");
    let path = dir.path().join("engines.json");
    std::os::unix::fs::symlink("..data/engines.json", &path).expect("symlink");
    let file = EnginesFile::new(path.clone(), Arc::new(Metrics::default()));

    let mut watch = Watch::start(&path);
    // The first look is at once.
    watch.changed().await;
    assert!(file.changed().is_none());
    let tmp = dir.path().join("..data_tmp");
    std::os::unix::fs::symlink("..v2", &tmp).expect("symlink");
    std::fs::rename(&tmp, dir.path().join("..data")).expect("swap");
    assert!(noticed(&mut watch).await, "the symlink swap was missed");
    let specs = file.changed().expect("the new version");
    assert_eq!(specs[0].name, "b");

    let plain = dir.path().join("plain.json");
    std::fs::write(&plain, "{}").expect("write");
    let mut watch = Watch::start(&plain);
    watch.changed().await;
    write_raw(&plain, b"{\"engines\": []}");
    assert!(noticed(&mut watch).await, "the rename was missed");
}

#[tokio::test]
async fn a_started_fleet_applies_a_new_file_and_checks_the_engine_it_adds() {
    let s = Setup::named(&["a"], &[]);
    s.fleet.start();
    until("a up", || s.state("a") == EngineState::Up).await;
    write(&s.path, &[engine("a", json!({})), engine("b", json!({}))]);
    until("b added and up", || {
        s.fleet.cells().len() == 2 && s.state("b") == EngineState::Up
    })
    .await;
    write(&s.path, &[engine("b", json!({}))]);
    until("a removed", || s.names() == ["b"]).await;
}

#[tokio::test]
async fn a_warm_pool_is_spread_over_the_engines_that_can_take_it() {
    let s = Setup::new(
        &[
            engine("a", json!({"max_sessions": 2})),
            engine("b", json!({"max_sessions": 2})),
            engine("c", json!({})),
        ],
        &[("WARM_POOL", "img:1=4")],
    );
    // Nothing is built on an engine before the spread gives it a share.
    assert_eq!(["a", "b", "c"].map(|n| s.targets(n)), [0, 0, 0]);
    s.bring_up("a");
    s.bring_up("b");
    s.fleet.spread_pools();
    // `c` is down: the others' caps hold the pool.
    assert_eq!(["a", "b", "c"].map(|n| s.targets(n)), [2, 2, 0]);
    s.bring_up("c");
    s.fleet.spread_pools();
    let shares = ["a", "b", "c"].map(|n| s.targets(n));
    assert_eq!(shares.iter().sum::<u32>(), 4, "{shares:?}");
    assert!(shares[0] <= 2 && shares[1] <= 2, "{shares:?}");
    // A drained engine and a down one get no share; the pool goes where it can.
    write(
        &s.path,
        &[
            engine("a", json!({"max_sessions": 2, "drain": true})),
            engine("b", json!({"max_sessions": 2})),
            engine("c", json!({})),
        ],
    );
    s.fleet.reload();
    s.cell("b").link().expect("link").set_up(false);
    s.fleet.spread_pools();
    assert_eq!(["a", "b", "c"].map(|n| s.targets(n)), [0, 0, 4]);
}

#[tokio::test]
async fn the_inventory_lists_every_engines_sessions_with_its_engine_and_metadata() {
    let s = Setup::named(&["a", "b"], &[]);
    s.fleet.start();
    until("every engine up", || {
        ["a", "b"].iter().all(|n| s.state(n) == EngineState::Up)
    })
    .await;
    let mut made = HashSet::new();
    for i in 0..10 {
        let req: StartSessionRequest = serde_json::from_value(
            json!({ "base_image": "img:1", "metadata": {"i": i.to_string()} }),
        )
        .expect("request");
        made.insert(s.fleet.create(&req).await.expect("created"));
    }
    let listed = s.fleet.inventory().await.expect("listed");
    let ids: HashSet<String> = listed.iter().map(|l| l.info.session_id.clone()).collect();
    assert_eq!(ids, made);
    let engines: HashSet<&str> = listed.iter().map(|l| l.info.engine.as_str()).collect();
    assert_eq!(
        engines,
        HashSet::from(["a", "b"]),
        "both engines hold sessions"
    );
    for l in &listed {
        let (prefix, _) = l.info.session_id.split_once('.').expect("prefixed");
        assert_eq!(l.info.engine, prefix, "{l:?}");
        assert!(l.info.metadata.contains_key("i"), "{l:?}");
    }
}
