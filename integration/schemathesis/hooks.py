"""Schemathesis hooks for daiv-sandbox (loaded through SCHEMATHESIS_HOOKS by run.sh).

They keep generated requests on this machine and inside the document's promises, without
changing what the service accepts:

- `POST /session/`: a `base_image` the service would take is replaced by the local image (a
  generated name would be pulled from a registry); `egress` objects become a policy that reaches
  only a `.test` host (or are dropped); `memory_bytes` and `cpus` the service would take are
  bounded (Docker refuses more CPUs than the host has). Values the service refuses are left
  alone, so negative cases stay negative.
- Seeds: the archives (any bytes, as far as the document can say) become a small valid tar, so
  seeds succeed once and then answer 409; corrupt archives are the cargo-fuzz targets' job. In
  the stateful phase a seed with an archive has nothing else (see there).
- `PUT /egress/`: an object body becomes the `.test` policy.
- Integral floats (`127.0`) become integers: JSON Schema counts them as integers, serde's
  integer fields do not, and no client of ours writes them.
- A valid process `workdir` becomes `/workspace` (the document cannot know which directories
  exist; a missing one is a 422).
- A watch's absolute `path` becomes one that does not exist (a 404 before the body): a watch of
  a directory that exists answers until its client goes, which a generated case never does.
- A process's event stream never follows (`follow=true` stays open until the process ends, and
  the live process, `cat`, never does); its other parameters stay.
- Runs: a valid `timeout` is bounded to a few seconds (0, "none", too); the service's default
  command timeout is set by run.sh. Process polls wait at most one second.
  A valid session deadline (`POST .../timeout/`) is at least an hour away, so the deadline
  watch never removes the live session under later cases; a session's 404 on any route (its
  deadline came anyway, or a stop) makes the next case get a live one again.
- Operations under `/session/{session_id}/` whose generated id is not a container id (every
  case of the fuzzing and coverage phases) mostly get a live session instead, and process
  routes a live process of it, so those phases reach the handlers instead of a 404. Each worker
  (run.sh runs those phases with API_FUZZ_WORKERS, 1 by default) has a live session of its own, and an id schemathesis
  takes from its pool there becomes it too, so two workers never share a session. The stateful
  phase follows the document's links and keeps its own ids; where it starts a scenario from a
  session route with a generated id, that too gets the live session, except a seed, which gets
  a new session (a session takes one seed; the live one's went long ago), as does a seed whose
  id schemathesis took from its own pool of ids seen earlier (mostly seeded already too).
- Snapshots, forks and pause: a valid fork `count` (1 to the service's default
  `DAIV_SANDBOX_FORK_MAX_COUNT`, 16) is bounded to DAIV_FUZZ_FORK_COUNT (1; run.sh's long form
  says 2), so no case builds 16 sessions on a small machine; 0, 17 and the rest stay refused.
  `/snapshots/{snapshot_id}/` operations whose generated id is not a snapshot id sometimes get a
  live snapshot instead (one the hooks recorded, else one taken of the live session), as session
  ids do. `POST /session/` keeps a generated `snapshot_id` (a 404, documented), except that a
  share of them become a snapshot the hooks know about, so sessions from a snapshot are made
  too; a valid `base_image` beside it is the local image, which every snapshot here comes from.
  In the stateful phase a generated one never stays (a root create must make a session): it
  goes when an image is there, else becomes a known snapshot if there is one.
  A paused session needs nothing: any request thaws it, force removal too.
- The stateful phase starts scenarios (its "roots") where the document's links start: create,
  seed, process start, snapshot, fork; a scenario follows each link once (`_steer_stateful`).
  Schemathesis 4's dependency analysis takes the create body's optional `snapshot_id` for a key
  of a resource named `Snapshot`, which no response is called (they are `SnapshotCreated` and
  `SnapshotInfo`), decides a create "is guaranteed to fail with random data" and leaves it out
  of the roots; its links were then reached only through a snapshot's `create` link. The hooks
  put it back.
- `GET /sessions/`: a valid case has no `next` (a cursor only the service can make; see there).
- Every session seen is force-removed when schemathesis exits (atexit): those created, those a
  fork returned (each of its `session_ids`), and those made from a snapshot. Then every snapshot
  a 201 returned is deleted, and whatever `GET /snapshots/` still lists (a snapshot whose answer
  was lost). Beyond DAIV_FUZZ_KEEP_SESSIONS / DAIV_FUZZ_KEEP_SNAPSHOTS, idle ones go during the
  run. Whatever is still left is removed, and counted as a leak, by run.sh (see
  service.sh's sweep_deployment for what counts).
"""

from __future__ import annotations

import atexit
import io
import os
import random
import re
import signal
import sys
import tarfile
import threading
import time

import requests
import schemathesis

API = os.environ["DAIV_FUZZ_API"].rstrip("/")
KEY = os.environ["DAIV_FUZZ_KEY"]
IMAGE = os.environ.get("DAIV_FUZZ_IMAGE", "daiv-sandbox-busybox:local")
# At most this many sessions created by the fuzzer are kept; beyond that, the least recently
# used are removed once no request has named them for AGE seconds (a stateful scenario's steps
# follow one another within seconds; removing a session a scenario still uses would be reported
# as "created resource not found").
KEEP = int(os.environ.get("DAIV_FUZZ_KEEP_SESSIONS", "8"))
AGE = float(os.environ.get("DAIV_FUZZ_SESSION_IDLE", "60"))
# Share of `egress` objects kept (as the `.test` policy) rather than dropped: egress sessions
# start a gateway and a network each.
EGRESS_SHARE = float(os.environ.get("DAIV_FUZZ_EGRESS_SHARE", "0.15"))
# Share of fuzzing-phase cases sent to a live session rather than the generated id.
LIVE_SHARE = float(os.environ.get("DAIV_FUZZ_LIVE_SHARE", "0.9"))
# A valid fork count (1..FORK_MAX, the service's default cap) becomes at most this many forks.
FORK_COUNT = int(os.environ.get("DAIV_FUZZ_FORK_COUNT", "1"))
FORK_MAX = int(os.environ.get("DAIV_FUZZ_FORK_MAX", "16"))
# Share of `/snapshots/{snapshot_id}/` cases sent to a live snapshot rather than the generated id,
# and of generated `snapshot_id`s in `POST /session/` bodies replaced by a known snapshot.
SNAPSHOT_SHARE = float(os.environ.get("DAIV_FUZZ_SNAPSHOT_SHARE", "0.5"))
FROM_SNAPSHOT_SHARE = float(os.environ.get("DAIV_FUZZ_FROM_SNAPSHOT_SHARE", "0.3"))
# Snapshots kept at most (each holds an image and a volume); older idle ones are deleted.
KEEP_SNAPSHOTS = int(os.environ.get("DAIV_FUZZ_KEEP_SNAPSHOTS", "8"))

SAFE_EGRESS = {
    "policy": {
        "default": "deny",
        "rules": [{"host": "api.upstream.test", "methods": ["GET"]}],
    }
}
CONTAINER_ID = re.compile(r"^[0-9a-f]{64}$")
PROCESS_ID = re.compile(r"^p[0-9]+-[0-9a-f]+$")
SNAPSHOT_ID = re.compile(r"^[0-9a-f]{32}$")
MIN_MEMORY = 6 * 1024 * 1024
MAX_MEMORY = 256 * 1024 * 1024
MAX_TIMEOUT = 7 * 24 * 3600

def _tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for name, data in (("README.md", b"# fuzz\nhello\n"), ("src/main.py", b"print('hi')\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


ARCHIVE = _tar()

_http = requests.Session()
_http.headers["X-API-Key"] = KEY
_lock = threading.Lock()
_seen: list[str] = []  # every session id handed out, oldest first
_used: dict[str, float] = {}  # when a request last named each session
_removed: set[str] = set()
# Each worker thread's live session and process (run.sh may run the first phases with several:
# one's force close or snapshot must not pull the session from under the other's cases).
_live: dict[int, dict[str, str | None]] = {}
_snapshots: list[str] = []  # every snapshot id handed out, oldest first
_snap_used: dict[str, float] = {}
_snap_removed: set[str] = set()


def _forget(session_id: str) -> None:
    try:
        _http.delete(f"{API}/session/{session_id}/", params={"force": "true"}, timeout=60)
    except requests.RequestException:
        pass  # run.sh removes (and reports) what is left
    _removed.add(session_id)


def _forget_snapshot(snapshot_id: str) -> None:
    try:
        _http.delete(f"{API}/snapshots/{snapshot_id}/", timeout=60)
    except requests.RequestException:
        pass  # run.sh removes (and reports) what is left
    with _lock:
        _snap_removed.add(snapshot_id)


def _record_snapshot(snapshot_id: str) -> None:
    """Remembers a new snapshot; deletes the oldest idle ones beyond KEEP_SNAPSHOTS."""
    with _lock:
        if snapshot_id in _snap_used:
            return
        _snapshots.append(snapshot_id)
        _snap_used[snapshot_id] = now = time.monotonic()
        alive = [s for s in _snapshots if s not in _snap_removed]
        alive.sort(key=lambda s: _snap_used[s])
        old = [s for s in alive[: max(0, len(alive) - KEEP_SNAPSHOTS)] if now - _snap_used[s] > AGE]
    for s in old:
        _forget_snapshot(s)


def _record(session_id: str) -> None:
    """Remembers a new session; removes the oldest beyond KEEP."""
    with _lock:
        if session_id in _seen:
            return
        _seen.append(session_id)
        _used[session_id] = now = time.monotonic()
        lives = {live["session"] for live in _live.values()}
        alive = [s for s in _seen if s not in _removed and s not in lives]
        alive.sort(key=lambda s: _used[s])
        old = [s for s in alive[: max(0, len(alive) - KEEP)] if now - _used[s] > AGE]
    for s in old:
        _forget(s)


def _record_sessions(body: object) -> None:
    """The sessions a fork made (`session_ids`)."""
    ids = body.get("session_ids") if isinstance(body, dict) else None
    for s in ids if isinstance(ids, list) else []:
        if isinstance(s, str):
            _record(s)


@atexit.register
def _cleanup() -> None:
    # Sessions first: a snapshot's payload goes with its DELETE only once nothing uses it.
    for s in list(_seen):
        if s not in _removed:
            _forget(s)
    for s in list(_snapshots):
        if s not in _snap_removed:
            _forget_snapshot(s)
    # Any the hooks never saw the 201 of (a lost answer).
    try:
        r = _http.get(f"{API}/snapshots/", timeout=60)
        listed = r.json().get("snapshots", []) if r.status_code == 200 else []
    except (requests.RequestException, ValueError, AttributeError):
        listed = []
    for snap in listed:
        if isinstance(snap, dict) and isinstance(snap.get("snapshot_id"), str):
            _forget_snapshot(snap["snapshot_id"])


# A stopped run (SIGTERM) cleans up too: exiting runs the atexit handler.
try:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
except ValueError:  # not the main thread
    pass


def _mine() -> dict[str, str | None]:
    """This worker's live session and process (the caller holds `_lock`)."""
    return _live.setdefault(threading.get_ident(), {"session": None, "process": None})


def _live_session() -> str | None:
    with _lock:
        sid = _mine()["session"]
    if sid is not None:
        return sid
    r = _http.post(f"{API}/session/", json={"base_image": IMAGE}, timeout=120)
    if r.status_code != 200:
        return None
    sid = r.json()["session_id"]
    with _lock:
        _mine().update(session=sid, process=None)
    _record(sid)
    return sid


def _fresh_session() -> str | None:
    """A new session of the local image, recorded like any other (removed at the end)."""
    try:
        r = _http.post(f"{API}/session/", json={"base_image": IMAGE}, timeout=120)
    except requests.RequestException:
        return None
    if r.status_code != 200:
        return None
    sid = r.json()["session_id"]
    _record(sid)
    return sid


def _live_process(sid: str) -> str | None:
    with _lock:
        pid = _mine()["process"]
    if pid is not None:
        return pid
    r = _http.post(f"{API}/session/{sid}/processes/", json={"command": "cat >/dev/null"}, timeout=60)
    if r.status_code != 201:
        return None
    pid = r.json()["process_id"]
    with _lock:
        live = _mine()
        if live["session"] == sid:
            live["process"] = pid
    return pid


def _live_snapshot() -> str | None:
    """The newest snapshot the hooks know is there, else one taken of the live session."""
    with _lock:
        alive = [s for s in _snapshots if s not in _snap_removed]
    if alive:
        return alive[-1]
    sid = _live_session()
    if sid is None:
        return None
    try:
        r = _http.post(f"{API}/session/{sid}/snapshot/", json={}, timeout=120)
    except requests.RequestException:
        return None
    if r.status_code != 201:
        return None
    snap = r.json()["snapshot_id"]
    _record_snapshot(snap)
    return snap


def _accepted_image(v: object) -> bool:
    """What the service's own check lets through (then it would pull the image)."""
    if not isinstance(v, str):
        return False
    v = v.strip()
    return 0 < len(v) <= 512 and not any(c.isspace() or ord(c) < 32 or 0x7F <= ord(c) <= 0x9F for c in v)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _start_body(body: dict, stateful: bool) -> None:
    image = _accepted_image(body.get("base_image"))
    if image:
        body["base_image"] = IMAGE
    if isinstance(body.get("egress"), dict):
        if random.random() < EGRESS_SHARE:
            body["egress"] = SAFE_EGRESS
        else:
            del body["egress"]
    m = body.get("memory_bytes")
    if _is_int(m) and m >= MIN_MEMORY:
        body["memory_bytes"] = min(m, MAX_MEMORY)
    c = body.get("cpus")
    if _is_number(c) and 0.01 <= c <= 1024:
        body["cpus"] = min(float(c), 1.0)
    # A generated snapshot id is a 404; some become one of ours (still a string, still valid).
    # In the stateful phase a create is where a scenario starts (a root, at most twice in one):
    # a 404 there leaves the scenario without a session, so a generated id beside an image goes
    # (the body stays valid: the image alone) and one alone becomes ours if there is one. A
    # snapshot's `create` link puts a real id here, which is one of ours and stays.
    snap = body.get("snapshot_id")
    if isinstance(snap, str):
        with _lock:
            alive = [s for s in _snapshots if s not in _snap_removed]
        if snap in alive:
            pass
        elif stateful and image:
            del body["snapshot_id"]
        elif alive and (stateful or random.random() < FROM_SNAPSHOT_SHARE):
            body["snapshot_id"] = random.choice(alive)


def _fork_body(body: dict) -> None:
    n = body.get("count")
    if _is_int(n) and 1 <= n <= FORK_MAX:
        body["count"] = min(n, FORK_COUNT)


def _run_body(body: dict) -> None:
    t = body.get("timeout")
    if _is_int(t) and 0 <= t <= MAX_TIMEOUT:
        body["timeout"] = min(max(t, 1), 3)


WORKDIR = re.compile(r"^(/(?!\.\.(/|$))[^/\x00\n\r]*)+$")


def _integral(v):
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**64:
        return int(v)
    if isinstance(v, dict):
        return {k: _integral(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_integral(x) for x in v]
    return v


# The only roots of the stateful phase, if set (labels, comma-separated; run.sh's smoke form says
# `POST /session/`: every scenario then starts as a client does, and none spends the short budget
# forking or snapshotting the hooks' live session from a root).
ROOTS = [r.strip() for r in os.environ.get("DAIV_FUZZ_STATEFUL_ROOTS", "").split(",") if r.strip()]


def _steer_stateful() -> None:
    """Where the stateful phase's scenarios start, and how often one follows a link.

    Neither has a setting in schemathesis (the pinned 4.x), so the hooks change two of its
    internals, and fail here if a new schemathesis moved them rather than let the stateful phase
    quietly lose its roots or its spread (run.sh's link check would say so too, later).

    Roots: `specs.openapi.stateful.classify_root_transitions(operations, transitions, graph)`
    sorts the operations with links (create, seed, process start, snapshot, fork) into
    `reliable` roots and `fallback` ones, used only when there is no reliable one. Wrapped: every
    one is reliable (`POST /session/` is a fallback, see the module docs), or only those
    DAIV_FUZZ_STATEFUL_ROOTS names.

    Spread: a scenario follows links from one operation to another at most
    `generation.stateful.control.MAX_OPERATIONS_PER_SOURCE_CAP` times (2; more only with more
    steps than operations). Hypothesis opens a run with its simplest choices (the first rule
    allowed, in name order) and mutates scenarios by repeating their choices: with 2, scenarios
    spent their steps on a create's first links twice each (close, delete, edit, fork, ...), and
    a 600 s run followed those 40 to 60 times and others 0 to 3 times. With 1 each scenario takes
    twice as many distinct links. A link followed twice (a double click) is left to the other
    phases, which send hundreds of requests to one live session.
    """
    from schemathesis.generation.stateful import control
    from schemathesis.specs.openapi import stateful

    classify = getattr(stateful, "classify_root_transitions", None)
    if classify is None or not hasattr(control, "MAX_OPERATIONS_PER_SOURCE_CAP"):
        raise RuntimeError(
            "hooks.py: schemathesis.specs.openapi.stateful.classify_root_transitions or "
            "schemathesis.generation.stateful.control.MAX_OPERATIONS_PER_SOURCE_CAP is gone "
            "(schemathesis changed from the pin?)"
        )
    control.MAX_OPERATIONS_PER_SOURCE_CAP = 1
    if getattr(classify, "_daiv_roots", False):
        return  # wrapped already (the module imported twice)

    def roots(operations, transitions, graph):
        found = classify(operations, transitions, graph)
        kept = found.reliable | found.fallback
        if ROOTS:
            kept &= set(ROOTS)
            if not kept:
                raise RuntimeError(f"hooks.py: none of DAIV_FUZZ_STATEFUL_ROOTS {ROOTS} can start a scenario")
        found.reliable.clear()
        found.reliable.update(kept)
        found.fallback.clear()
        return found

    roots._daiv_roots = True  # type: ignore[attr-defined]
    stateful.classify_root_transitions = roots


_steer_stateful()


def _phase(case) -> str | None:
    """`examples`, `coverage`, `fuzzing` or `stateful` (the metadata as generated: `case.meta`
    would revalidate the case)."""
    meta = getattr(case, "_meta", None)
    phase = getattr(meta, "phase", None)
    name = getattr(phase, "name", None)
    return None if name is None else str(name)


def _positive(case) -> bool:
    """Generated as valid data (the metadata as generated, as `_phase`)."""
    generation = getattr(getattr(case, "_meta", None), "generation", None)
    return str(getattr(generation, "mode", "")) == "positive"


def _reused(case, name: str) -> bool:
    """Whether schemathesis filled path parameter `name` with a value it saw earlier in the run
    (its resource pool, or a value of the same name), rather than generating it or taking it
    from a link."""
    meta = getattr(case, "_meta", None)
    for draw in getattr(meta, "pool_draws", None) or ():
        if str(getattr(draw, "location", "")) == "path" and getattr(draw, "parameter_name", None) == name:
            return True
    for draw in getattr(meta, "semantic_draws", None) or ():
        if list(getattr(draw, "path", None) or ()) == [name]:
            return True
    return False


@schemathesis.hook
def before_call(context, case, kwargs):
    if isinstance(case.body, (dict, list, float)):
        case.body = _integral(case.body)
    path = case.operation.path
    method = case.method.upper()
    params = case.path_parameters or {}
    real = isinstance(params.get("session_id"), str) and bool(CONTAINER_ID.match(params["session_id"]))
    generated = "session_id" in params and not real
    # Outside the stateful phase a real id is one schemathesis took from its pool (a session some
    # create answered), possibly the other worker's: two workers on one session is a race those
    # phases do not mean to run (a pause beside a process start answers 503), so it always
    # becomes this worker's live session.
    with _lock:
        pooled = real and _phase(case) != "stateful" and params["session_id"] != _mine()["session"]
    # A session takes one seed (then 409): the live one was seeded long ago, and so, mostly, was
    # a session schemathesis reuses on its own (an id it saw in an earlier request), so a seed
    # that starts a stateful scenario gets a new session, whose 204 its links follow.
    fresh = (
        method == "POST"
        and path.rstrip("/").endswith("/seed")
        and _phase(case) == "stateful"
        and (generated or _reused(case, "session_id"))
    )
    if generated or fresh or pooled:
        if pooled or random.random() < LIVE_SHARE:
            sid = _fresh_session() if fresh else _live_session()
            if sid is not None:
                params["session_id"] = sid
                if "process_id" in params and not (
                    isinstance(params["process_id"], str) and PROCESS_ID.match(params["process_id"])
                ):
                    pid = _live_process(sid)
                    if pid is not None:
                        params["process_id"] = pid
    if "snapshot_id" in params and not (
        isinstance(params["snapshot_id"], str) and SNAPSHOT_ID.match(params["snapshot_id"])
    ):
        if random.random() < SNAPSHOT_SHARE:
            snap = _live_snapshot()
            if snap is not None:
                params["snapshot_id"] = snap
    sid = params.get("session_id")
    if isinstance(sid, str):
        with _lock:
            if sid in _used:
                _used[sid] = time.monotonic()
    snap = params.get("snapshot_id")
    if isinstance(snap, str):
        with _lock:
            if snap in _snap_used:
                _snap_used[snap] = time.monotonic()
    body = case.body if isinstance(case.body, dict) else None
    if body is not None and method == "POST" and path.rstrip("/") == "/session":
        _start_body(body, _phase(case) == "stateful")
    elif body is not None and method == "POST" and path.rstrip("/") == "/session/{session_id}":
        _run_body(body)
    elif body is not None and method == "POST" and path.rstrip("/") == "/session/{session_id}/fork":
        _fork_body(body)
    elif method == "PUT" and path.rstrip("/").endswith("/egress") and body is not None:
        # Only `.test` hosts, whatever was generated; non-objects stay invalid.
        case.body = dict(SAFE_EGRESS)
    elif body is not None and method == "POST" and path.rstrip("/").endswith("/timeout"):
        # A valid deadline stays valid but an hour away at least: the deadline watch would
        # otherwise remove (or pause) the live session under the cases that follow.
        t = body.get("timeout_seconds")
        if _is_int(t) and 1 <= t <= 2592000:
            body["timeout_seconds"] = max(t, 3600)
    elif body is not None and method == "POST" and path.rstrip("/").endswith("/processes"):
        w = body.get("workdir")
        if isinstance(w, str) and WORKDIR.match(w):
            body["workdir"] = "/workspace"
    elif body is not None and method == "POST" and path.rstrip("/").endswith("/seed"):
        archives = [f for f in ("repo_archive", "skills_archive") if f in body]
        for field in archives:
            body[field] = ARCHIVE
        # In the stateful phase a seed's 204 is where its links start; the other parts generated
        # beside the archives (names with control characters: not multipart the service can
        # parse, a 422) made half of them fail. There they go; the other phases keep them.
        if archives and _phase(case) == "stateful":
            for field in set(body) - set(archives):
                del body[field]
    # `GET /sessions/`'s `next` is an opaque cursor the service signs (HMAC): any other string is
    # a 422 no schema can describe, so positive acceptance cannot hold for a generated one. A
    # valid case leaves it out rather than the check going for the whole listing: its filters and
    # `limit` keep it. Invalid cases keep theirs (refused either way); no-5xx and response
    # conformance see both. (A cursor handed out, for the same filters, as a valid `next` was
    # tried: in a full run the listing answered 2 cursors and no later case had their filters.)
    if method == "GET" and path.rstrip("/") == "/sessions" and isinstance(case.query, dict):
        if "next" in case.query and _positive(case):
            del case.query["next"]
    if method == "GET" and "{process_id}" in path and isinstance(case.query, dict):
        w = case.query.get("wait")
        if _is_number(w) and w >= 0:
            case.query["wait"] = min(float(w), 1.0)
        if path.rstrip("/").endswith("/events") and case.query.get("follow") in (True, "true"):
            case.query["follow"] = "false"
    if method == "GET" and path.rstrip("/").endswith("/watch") and isinstance(case.query, dict):
        p = case.query.get("path")
        if isinstance(p, str) and p.startswith("/"):
            case.query["path"] = "/nonexistent/daiv-fuzz-watch"


def _session_missing(response) -> bool:
    try:
        return response.json().get("detail") == "Session not found or already closed"
    except (ValueError, AttributeError):
        return False


@schemathesis.hook
def after_call(context, case, response):
    path = case.operation.path.rstrip("/")
    method = case.method.upper()
    params = case.path_parameters or {}
    if method == "POST" and path == "/session" and response.status_code == 200:
        # A session from a snapshot too.
        try:
            _record(response.json()["session_id"])
        except (ValueError, KeyError, TypeError):
            pass
        return
    if method == "POST" and path == "/session/{session_id}/fork" and response.status_code == 201:
        try:
            _record_sessions(response.json())
        except ValueError:
            pass
    if method == "POST" and path == "/session/{session_id}/snapshot" and response.status_code == 201:
        try:
            _record_snapshot(response.json()["snapshot_id"])
        except (ValueError, KeyError, TypeError):
            pass
    snap = params.get("snapshot_id")
    if isinstance(snap, str) and path == "/snapshots/{snapshot_id}":
        if response.status_code == 404 or (method == "DELETE" and response.status_code == 204):
            with _lock:
                if snap in _snap_used:
                    _snap_removed.add(snap)
        return
    sid = params.get("session_id")
    if not isinstance(sid, str):
        return
    gone = response.status_code == 404 and path == "/session/{session_id}"
    # A session's 404 on any other of its routes (a process's own 404 has other words): gone,
    # or stopped ("already closed": it still exists, and is removed at the end as any other);
    # either way the next case gets a live one again.
    missing = response.status_code == 404 and _session_missing(response)
    force = str((case.query or {}).get("force", "")).lower() in ("true", "1")
    if method == "DELETE" and path == "/session/{session_id}" and response.status_code == 204:
        gone = gone or force
    with _lock:
        for live in _live.values():  # any worker's: an id can come from schemathesis's pool
            if sid != live["session"]:
                continue
            if gone or missing:
                live.update(session=None, process=None)
            elif "{process_id}" in path and params.get("process_id") == live["process"]:
                ended = (method == "DELETE" or path.endswith("/signal")) and response.status_code == 204
                if response.status_code in (404, 409) or ended:
                    live["process"] = None
            elif method == "DELETE" and path == "/session/{session_id}":
                live["process"] = None  # a stop ends its processes
    if gone:
        with _lock:
            _removed.add(sid)
