"""Programs written against E2B's Python SDK, as its users write them, for tests/tests/e2b.rs.

Run as `python e2b_driver.py SCENARIO` with the SDK's own settings in the environment
(E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL; E2B_VALIDATE_API_KEY=false for the SDKs that check
the key's shape) and the scenario's parameters as JSON in E2B_PARAMS. Each scenario prints one
JSON line: what the program saw, for the test to assert on. Nothing here knows it is not E2B.
"""

import datetime
import hashlib
import io
import json
import os
import sys
import time

import e2b
from e2b import Sandbox
from e2b.exceptions import (
    AuthenticationException,
    NotFoundException,
    SandboxException,
    TimeoutException,
)

try:  # where the SDKs keep it varies
    from e2b import CommandExitException
except ImportError:  # pragma: no cover
    from e2b.sandbox.commands.command_handle import CommandExitException

P = json.loads(os.environ.get("E2B_PARAMS") or "{}")


def err(e):
    return {"type": type(e).__name__, "message": str(e)}


def create(**kw):
    return Sandbox.create(
        template=P.get("template", "base"),
        timeout=P.get("timeout", 300),
        metadata={"suite": P.get("tag", "e2b")},
        **kw,
    )


def turn():
    """Create, commands (foreground, streamed, failing, background with stdin, kill), files,
    info, list, metrics, kill."""
    out = {"sdk": e2b.__version__ if hasattr(e2b, "__version__") else None}
    sbx = create(envs={"GREETING": "bonjour"})
    out["id"] = sbx.sandbox_id
    # gVisor's kernel says its name in its log; runc's host kernel log is not readable.
    out["kernel_log"] = sbx.commands.run("dmesg 2>&1 | head -n 3 || true").stdout
    r = sbx.commands.run("echo $GREETING; echo oops >&2; pwd; id -u")
    out["run"] = {"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code}
    try:
        sbx.commands.run("echo partial; exit 3")
        out["exit3"] = None
    except CommandExitException as e:
        out["exit3"] = {"exit_code": e.exit_code, "stdout": e.stdout}
    chunks = []
    sbx.commands.run(
        "for i in 1 2 3; do echo line$i; sleep 0.3; done",
        on_stdout=lambda d: chunks.append((round(time.monotonic(), 2), d)),
    )
    out["streamed"] = [c[1] for c in chunks]
    out["streamed_spread_s"] = chunks[-1][0] - chunks[0][0] if len(chunks) > 1 else 0
    h = sbx.commands.run("cat; echo done", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "hello stdin\n")
    sbx.commands.close_stdin(h.pid)
    out["stdin_echo"] = h.wait().stdout
    # Reattached from another handle: the command's output, its end.
    bg = sbx.commands.run("sleep 1; echo from-background", background=True)
    out["reconnected"] = sbx.commands.connect(bg.pid).wait().stdout
    if hasattr(sbx.commands, "stream_input"):  # the newer SDKs' client stream
        h = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.stream_input(h.pid, iter(["streamed ", b"input\n"]))
        sbx.commands.close_stdin(h.pid)
        out["stream_input"] = h.wait().stdout
    sleeper = sbx.commands.run("sleep 300", background=True)
    out["listed"] = sleeper.pid in [p.pid for p in sbx.commands.list()]
    out["killed"] = sbx.commands.kill(sleeper.pid)
    out["kill_unknown"] = sbx.commands.kill(999999)
    try:
        sbx.commands.run("id", user="root")
        out["as_root"] = None
    except SandboxException as e:
        out["as_root"] = err(e)
    # Files: absolute and relative (the user's home), text and bytes, the fs calls.
    sbx.files.write("/home/user/dir/a.txt", "first line\n")
    out["read"] = sbx.files.read("/home/user/dir/a.txt")
    sbx.files.write("rel.bin", b"\x00\x01\xffbinary")
    out["read_rel"] = list(sbx.files.read("rel.bin", format="bytes"))
    out["cat_rel"] = sbx.commands.run("cat /home/user/rel.bin | od -An -tx1 | tr -d ' \\n'").stdout
    out["exists"] = sbx.files.exists("/home/user/dir/a.txt")
    out["exists_missing"] = sbx.files.exists("/home/user/nope")
    out["list"] = sorted(e.name for e in sbx.files.list("/home/user/dir"))
    out["mkdir"] = sbx.files.make_dir("/home/user/newdir/sub")
    out["mkdir_again"] = sbx.files.make_dir("/home/user/newdir/sub")
    moved = sbx.files.rename("/home/user/dir/a.txt", "/home/user/dir/b.txt")
    out["moved"] = moved.path
    info = sbx.files.get_info("/home/user/dir/b.txt")
    out["info_file"] = {
        "type": str(info.type),
        "size": info.size,
        "owner": info.owner,
        "group": info.group,
    }
    # A symlink's info is what it leads to, and where (envd's Stat).
    sbx.commands.run("ln -s b.txt /home/user/dir/link")
    link = sbx.files.get_info("/home/user/dir/link")
    out["info_link"] = {"type": str(link.type), "target": link.symlink_target}
    sbx.files.remove("/home/user/dir/link")
    sbx.files.remove("/home/user/dir/b.txt")
    out["after_remove"] = sbx.files.exists("/home/user/dir/b.txt")
    # Removing what is not there is no error (envd's Remove).
    sbx.files.remove("/home/user/dir/b.txt")
    out["remove_missing"] = "ok"
    try:
        sbx.files.read("/home/user/dir/b.txt")
        out["read_missing"] = None
    except NotFoundException as e:
        out["read_missing"] = err(e)
    multi = sbx.files.write_files(
        [
            {"path": "/home/user/m/one.txt", "data": "1"},
            {"path": "/home/user/m/two.txt", "data": "2"},
        ]
    )
    out["write_files"] = sorted(w.path for w in multi)
    out["multi_cat"] = sbx.commands.run("cat /home/user/m/one.txt /home/user/m/two.txt").stdout
    # The sandbox as the control API shows it.
    i = sbx.get_info()
    out["info"] = {
        "sandbox_id": i.sandbox_id,
        "template_id": i.template_id,
        "metadata": i.metadata,
        "state": str(i.state),
        "ends_after_start_s": (i.end_at - i.started_at).total_seconds(),
    }
    sbx.set_timeout(600)
    i2 = sbx.get_info()
    out["timeout_moved_s"] = (i2.end_at - i.end_at).total_seconds()
    listed = Sandbox.list(query=e2b.SandboxQuery(metadata={"suite": P.get("tag", "e2b")}))
    out["list_ids"] = [s.sandbox_id for s in listed.next_items()]
    # Filters by start and template: a second after its start, and another template, list none.
    q = lambda **kw: [  # noqa: E731
        s.sandbox_id
        for s in Sandbox.list(
            query=e2b.SandboxQuery(metadata={"suite": P.get("tag", "e2b")}, **kw)
        ).next_items()
    ]
    out["list_started_after"] = [
        q(started_after=i.started_at),
        q(started_after=i.started_at + datetime.timedelta(seconds=1)),
    ]
    out["list_template"] = [q(template=i.template_id), q(template="unknown-template")]
    # A connect's timeout never shortens a running sandbox's life.
    Sandbox.connect(sbx.sandbox_id, timeout=10)
    out["connect_kept_end"] = Sandbox.get_info(sbx.sandbox_id).end_at == i2.end_at
    out["is_running"] = sbx.is_running()
    deadline = time.time() + 20
    metrics = []
    while time.time() < deadline and not metrics:
        metrics = sbx.get_metrics()
        if not metrics:
            time.sleep(1)
    out["metrics"] = [
        {"cpu_count": m.cpu_count, "mem_total": m.mem_total, "disk_total": m.disk_total}
        for m in metrics[:1]
    ]
    # A command running when its sandbox is killed ends in the SDK's timeout error.
    running = sbx.commands.run("sleep 60", background=True)
    out["kill"] = sbx.kill()
    try:
        running.wait()
        out["killed_while_running"] = None
    except TimeoutException as e:  # the newest SDKs raise a subclass, SandboxNotRunningException
        out["killed_while_running"] = "timeout"
        out["killed_type"] = type(e).__name__
    out["is_running_killed"] = sbx.is_running()
    out["kill_again"] = Sandbox.kill(out["id"])
    try:
        Sandbox.connect(out["id"])
        out["connect_killed"] = None
    except SandboxException as e:
        out["connect_killed"] = err(e)
    return out


def big_files():
    """A file of P["mb"] MiB up (streamed from a file-like object) and down (streamed)."""
    size = P.get("mb", 100) * 1024 * 1024
    sbx = create()
    out = {"id": sbx.sandbox_id}
    block = hashlib.sha256(b"seed").digest() * 2048  # 64 KiB

    class Source(io.RawIOBase):
        def __init__(self):
            self.left = size

        def readable(self):
            return True

        def readinto(self, b):
            n = min(len(b), self.left, len(block))
            b[:n] = block[:n]
            self.left -= n
            return n

    up = hashlib.sha256()
    left = size
    while left:
        n = min(left, len(block))
        up.update(block[:n])
        left -= n
    t = time.monotonic()
    sbx.files.write("/home/user/big.bin", io.BufferedReader(Source(), 1 << 20))
    out["up_s"] = time.monotonic() - t
    t = time.monotonic()
    down = hashlib.sha256()
    got = 0
    for chunk in sbx.files.read("/home/user/big.bin", format="stream"):
        down.update(chunk)
        got += len(chunk)
    out["down_s"] = time.monotonic() - t
    out["size"] = got
    out["same"] = up.hexdigest() == down.hexdigest()
    out["in_sandbox"] = sbx.commands.run("sha256sum /home/user/big.bin | cut -c1-64").stdout.strip()
    out["sha256"] = up.hexdigest()
    sbx.kill()
    return out


def watch():
    """The synchronous watch (polled watchers) seeing a command's creates."""
    sbx = create()
    out = {"id": sbx.sandbox_id}
    sbx.files.make_dir("/home/user/w")
    handle = sbx.files.watch_dir("/home/user/w", recursive=True)
    n = P.get("files", 200)
    sbx.commands.run(f"mkdir -p /home/user/w/d && for i in $(seq 1 {n}); do : > /home/user/w/d/f$i; done")
    seen = set()
    deadline = time.time() + 20
    while time.time() < deadline and len(seen) < n:
        for ev in handle.get_new_events():
            if str(ev.type).endswith("CREATE") and ev.name.startswith("d/f"):
                seen.add(ev.name)
        time.sleep(0.2)
    handle.stop()
    out["created_seen"] = len(seen)
    # A file the SDK writes is written in place: the watcher sees its own create and write.
    handle = sbx.files.watch_dir("/home/user/w")
    sbx.files.write("/home/user/w/note.txt", "one")
    sbx.files.write("/home/user/w/note.txt", "two")
    events = []
    deadline = time.time() + 10
    while time.time() < deadline and ("write", "note.txt") not in events:
        events += [(str(ev.type.value), ev.name) for ev in handle.get_new_events()]
        time.sleep(0.2)
    handle.stop()
    out["written_events"] = sorted(set(events))
    try:
        sbx.files.watch_dir("/home/user/missing")
        out["missing"] = None
    except SandboxException as e:
        out["missing"] = err(e)
    # A sandbox's watchers are capped; they go when it is killed.
    handles = []
    try:
        for _ in range(P.get("watchers", 17)):
            handles.append(sbx.files.watch_dir("/home/user/w"))
        out["over_cap"] = None
    except SandboxException as e:
        out["over_cap"] = err(e)
    out["watchers_kept"] = len(handles)
    sbx.kill()
    try:
        handles[0].get_new_events()
        out["after_kill"] = None
    except SandboxException as e:
        out["after_kill"] = err(e)
    return out


def signed_upload():
    """A URL signed for one file (`upload_url`), posted by someone who holds only the URL with
    two parts, the second named ~/.bashrc (which `bash -l` runs before every command): nothing
    is written but the signed path. A URL signed without a path is refused."""
    import httpx

    sbx = create()
    out = {"id": sbx.sandbox_id}
    bashrc = "/home/user/.bashrc"
    digest = f"sha256sum {bashrc} 2>&1 || true"
    before = sbx.commands.run(digest).stdout
    # The sandbox is named by the header E2B_SANDBOX_URL's road needs; the URL is all else.
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id}
    evil = b"touch /tmp/pwned\n"
    r = httpx.post(
        sbx.upload_url("/home/user/upload.txt"),
        files=[("file", ("a.txt", b"first")), ("file", (bashrc, evil))],
        headers=headers,
    )
    out["status"] = r.status_code
    out["upload"] = sbx.files.read("/home/user/upload.txt")
    out["a_written"] = sbx.files.exists("/home/user/a.txt")
    r = httpx.post(sbx.upload_url(""), files=[("file", (bashrc, evil))], headers=headers)
    out["no_path_status"] = r.status_code
    out["bashrc_kept"] = sbx.commands.run(digest).stdout == before
    out["pwned"] = sbx.files.exists("/tmp/pwned")
    sbx.kill()
    return out


def signed_urls():
    """A secured sandbox's signed URLs, used as their holder has them: the bare URL, no header
    naming the sandbox (urllib, a browser). An expired one says so."""
    import urllib.error
    import urllib.request

    import httpx

    sbx = create(secure=True)
    other = create(secure=True)
    out = {"id": sbx.sandbox_id}
    sbx.files.write("/home/user/signed.txt", "signed content")
    other.files.write("/home/user/signed.txt", "the other sandbox")

    def get(url):
        try:
            with urllib.request.urlopen(url) as resp:
                return {"status": resp.status, "body": resp.read().decode()}
        except urllib.error.HTTPError as e:
            return {"status": e.code, "body": e.read().decode()}

    out["download"] = get(sbx.download_url("/home/user/signed.txt", "user"))
    out["download_expiring"] = get(sbx.download_url("/home/user/signed.txt", "user", 120))
    out["download_expired"] = get(
        sbx.download_url("/home/user/signed.txt", "user", use_signature_expiration=-120)
    )
    out["other_download"] = get(other.download_url("/home/user/signed.txt", "user"))
    # A signature changed by one character opens nothing.
    url = sbx.download_url("/home/user/signed.txt", "user")
    i = url.index("signature=v1_") + len("signature=v1_")
    out["forged"] = get(url[:i] + ("A" if url[i] != "A" else "B") + url[i + 1 :])
    r = httpx.post(
        sbx.upload_url("/home/user/up.txt", "user"),
        files=[("file", ("up.txt", b"uploaded by URL"))],
    )
    out["upload_status"] = r.status_code
    out["upload_body"] = r.text
    up = "/home/user/up.txt"
    out["uploaded"] = sbx.files.read(up) if sbx.files.exists(up) else None
    out["other_has_upload"] = other.files.exists("/home/user/up.txt")
    other.kill()
    sbx.kill()
    return out


def metadata():
    """File metadata: written with a file, read back by get_info, list and rename, replaced by
    the next upload (cleared by one without), set from inside the sandbox too."""
    from e2b.exceptions import InvalidArgumentException

    sbx = create()
    out = {"id": sbx.sandbox_id}
    meta = {"author": "mish", "purpose": "upload"}
    try:
        out["written"] = sbx.files.write("m.txt", "x", metadata=meta).metadata
    except SandboxException as e:
        # A file system without user attributes (gVisor's): refused, and nothing left.
        out["refused"] = err(e)
        out["refused_left_file"] = sbx.files.exists("m.txt")
        out["plain_write"] = sbx.files.write("p.txt", "x").metadata
        out["plain_info"] = sbx.files.get_info("p.txt").metadata
        sbx.kill()
        return out
    out["info"] = sbx.files.get_info("m.txt").metadata
    out["octet"] = sbx.files.write("o.txt", "x", metadata=meta, use_octet_stream=True).metadata
    sbx.files.make_dir("d")
    sbx.files.write("d/listed.txt", "x", metadata={"tag": "listed"})
    out["listed"] = {e.name: e.metadata for e in sbx.files.list("d")}
    out["renamed"] = sbx.files.rename("m.txt", "n.txt").metadata
    out["overwritten"] = sbx.files.write("n.txt", "y").metadata
    out["overwritten_info"] = sbx.files.get_info("n.txt").metadata
    path = sbx.commands.run("realpath o.txt").stdout.strip()
    sbx.commands.run(
        f"python3 -c \"import os; os.setxattr('{path}', 'user.e2b.author', b'inside')\""
    )
    out["set_inside"] = sbx.files.get_info("o.txt").metadata
    try:
        sbx.files.write("bad.txt", "x", metadata={"good": "bad\nvalue"})
        out["invalid"] = None
    except InvalidArgumentException as e:
        out["invalid"] = err(e)
    out["bad_exists"] = sbx.files.exists("bad.txt")
    # The service's own check, past the SDK's: too many keys.
    try:
        sbx.files.write("many.txt", "x", metadata={f"k{i}": "v" for i in range(40)})
        out["too_many"] = None
    except SandboxException as e:
        out["too_many"] = err(e)
    sbx.kill()
    return out


def deadlines():
    """A sandbox ends at its timeout, to the second (not at some later sweep); one created to
    pause pauses when `set_timeout(0)` ends its time, and `connect` resumes it."""
    out = {}
    short = Sandbox.create(template=P.get("template", "base"), timeout=2,
                           metadata={"suite": P.get("tag", "e2b")})
    out["short_id"] = short.sandbox_id
    t0 = time.time()
    while short.is_running() and time.time() - t0 < 30:
        time.sleep(0.25)
    out["short_running"] = short.is_running()

    def listed():
        q = e2b.SandboxQuery(metadata={"suite": P.get("tag", "e2b")})
        return short.sandbox_id in [s.sandbox_id for s in Sandbox.list(query=q).next_items()]

    while listed() and time.time() - t0 < 30:
        time.sleep(0.25)
    out["short_listed"] = listed()
    paused = Sandbox.create(template=P.get("template", "base"), timeout=300,
                            metadata={"suite": P.get("tag", "e2b")},
                            lifecycle={"on_timeout": "pause"})
    paused.files.write("/home/user/kept.txt", "kept")
    paused.set_timeout(0)
    t0 = time.time()
    while str(paused.get_info().state) != "paused" and time.time() - t0 < 30:
        time.sleep(0.25)
    out["paused_state"] = str(paused.get_info().state)
    out["paused_running"] = paused.is_running()
    resumed = paused.connect()
    out["resumed_state"] = str(resumed.get_info().state)
    out["resumed_reads"] = resumed.files.read("/home/user/kept.txt")
    resumed.kill()
    # Paused by its client before its deadline: the deadline passing leaves it paused, whole.
    kept = Sandbox.create(template=P.get("template", "base"), timeout=3,
                          metadata={"suite": P.get("tag", "e2b")})
    kept.files.write("/home/user/k.txt", "paused by its client")
    kept.pause()
    time.sleep(5)
    out["client_paused_state"] = str(kept.get_info().state)
    again = Sandbox.connect(kept.sandbox_id, timeout=60)
    out["client_paused_reads"] = again.files.read("/home/user/k.txt")
    again.kill()
    return out


def listing():
    """Sandboxes made within one second list in the order they were made; pages of paused ones
    and of running and paused ones hold one each, in order, and end."""
    tag = {"suite": P.get("tag", "e2b"), "listing": str(time.time())}

    def make():
        return Sandbox.create(template=P.get("template", "base"), timeout=300, metadata=tag)

    first = make()
    second = make()
    out = {"ids": [first.sandbox_id, second.sandbox_id]}
    q = e2b.SandboxQuery(metadata=tag)
    out["asc"] = [s.sandbox_id for s in Sandbox.list(query=q, order="asc").next_items()]
    out["desc"] = [s.sandbox_id for s in Sandbox.list(query=q, order="desc").next_items()]

    def pages(states):
        p = Sandbox.list(query=e2b.SandboxQuery(metadata=tag, state=states), limit=1)
        seen = []
        while p.has_next and len(seen) < 5:
            seen.append([(s.sandbox_id, str(s.state)) for s in p.next_items()])
        return seen

    out["running_pages"] = pages([e2b.SandboxState.RUNNING])
    second.beta_pause() if hasattr(second, "beta_pause") else second.pause()
    out["mixed_pages"] = pages([e2b.SandboxState.RUNNING, e2b.SandboxState.PAUSED])
    first.beta_pause() if hasattr(first, "beta_pause") else first.pause()
    out["paused_pages"] = pages([e2b.SandboxState.PAUSED])
    first.kill()
    second.kill()
    return out


def pty():
    """A terminal: a shell prompt, `stty size`, a resize, input typed into it."""
    from e2b import PtySize

    sbx = create()
    out = {"id": sbx.sandbox_id}
    data = bytearray()
    h = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.send_stdin(h.pid, b"stty size\n")
    events = iter(h)
    # The first size seen before the resize, as a user at the terminal would wait for it.
    deadline = time.time() + 20
    while b"24 80" not in data and time.time() < deadline:
        _, _, chunk = next(events)
        if chunk:
            data.extend(chunk)
    sbx.pty.resize(h.pid, PtySize(rows=40, cols=120))
    sbx.pty.send_stdin(h.pid, b"stty size; exit\n")
    for _, _, chunk in events:
        if chunk:
            data.extend(chunk)
    r = h.wait()
    text = data.decode("utf-8", "replace")
    out["sizes"] = [s for s in ("24 80", "40 120") if s in text]
    out["exit_code"] = r.exit_code
    sbx.kill()
    return out


def lifecycle():
    """Pause and connect (resumes), fork, snapshots, a create from a snapshot."""
    sbx = create()
    out = {"id": sbx.sandbox_id}
    sbx.files.write("/home/user/state.txt", "kept")
    out["pause"] = sbx.pause()
    out["pause_again"] = sbx.pause()
    out["state_paused"] = str(sbx.get_info().state)
    out["is_running_paused"] = sbx.is_running()
    # envd does not resume a paused sandbox (only connect does): not running, as on E2B.
    for name, call in [
        ("read_paused", lambda: sbx.files.read("/home/user/state.txt")),
        ("run_paused", lambda: sbx.commands.run("true")),
    ]:
        try:
            call()
            out[name] = None
        except SandboxException as e:
            out[name] = err(e)
    out["state_after_envd"] = str(sbx.get_info().state)
    resumed = Sandbox.connect(sbx.sandbox_id)
    out["after_connect"] = resumed.commands.run("cat /home/user/state.txt").stdout
    out["state_resumed"] = str(resumed.get_info().state)
    forks = sbx.fork()
    fork = forks[0]
    out["fork_reads"] = fork.files.read("/home/user/state.txt")
    out["fork_is_other"] = fork.sandbox_id != sbx.sandbox_id
    fork.kill()
    snap = sbx.create_snapshot(name=f"snap-{sbx.sandbox_id[:12]}")
    out["snapshot_id"] = snap.snapshot_id
    out["snapshot_names"] = snap.names
    out["snapshots"] = [s.snapshot_id for s in sbx.list_snapshots().next_items()]
    out["snapshots_by_name"] = [
        s.snapshot_id
        for s in Sandbox.list_snapshots(name=f"snap-{sbx.sandbox_id[:12]}").next_items()
    ]
    out["snapshots_by_other_name"] = [
        s.snapshot_id for s in Sandbox.list_snapshots(name="no-such-name").next_items()
    ]
    from_snap = Sandbox.create(template=snap.snapshot_id, timeout=120)
    out["from_snapshot_reads"] = from_snap.files.read("/home/user/state.txt")
    from_snap.kill()
    out["snapshot_deleted"] = Sandbox.delete_snapshot(snap.snapshot_id)
    out["snapshot_deleted_again"] = Sandbox.delete_snapshot(snap.snapshot_id)
    sbx.kill()
    return out


def network():
    """A header injected by the gateway for one host (E2B's network rules), the sandbox never
    seeing its value; other hosts refused."""
    secret = P["secret"]
    sbx = create(
        network={
            "deny_out": ["0.0.0.0/0"],
            "allow_out": [P["host"]],
            "rules": {P["host"]: [{"transform": {"headers": {"X-Token": secret}}}]},
        }
    )
    out = {"id": sbx.sandbox_id}
    r = sbx.commands.run(f"curl -sS --max-time 20 https://{P['host']}/hello", timeout=60)
    out["upstream"] = r.stdout
    try:
        sbx.commands.run(f"curl -sS --max-time 10 https://{P['other']}/", timeout=60)
        out["other"] = None
    except CommandExitException as e:
        out["other"] = {"exit_code": e.exit_code}
    out["env_has_secret"] = secret in sbx.commands.run("env").stdout
    found = sbx.commands.run(
        f"grep -rlsF {secret} /home /tmp /etc /workspace /root 2>/dev/null | head -1 || true"
    )
    out["secret_in_files"] = found.stdout.strip()
    # An update that says nothing clears the rules: every host, as E2B's default (tunnelled,
    # not intercepted, with no rule left: the fixture's own certificate, hence -k).
    sbx.update_network({})
    r = sbx.commands.run(
        f"curl -ksS --max-time 20 -o /dev/null -w '%{{http_code}}' https://{P['other']}/",
        timeout=60,
    )
    out["other_after_clear"] = r.stdout
    sbx.kill()
    return out


def ports():
    """A web server started in the sandbox, reached at get_host(port) as E2B's proxy serves it
    (the Host header sent to E2B_SANDBOX_URL, as a wildcard DNS entry would route it); with
    allow_public_traffic False, only with the sandbox's traffic access token."""
    import http.client
    import urllib.parse

    target = urllib.parse.urlparse(os.environ["E2B_SANDBOX_URL"])
    out = {}

    def fetch(host, path, headers=None):
        c = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
        c.request("GET", path, headers={"Host": host, **(headers or {})})
        r = c.getresponse()
        body = r.read().decode(errors="replace")
        c.close()
        return r.status, body

    def serve(sbx, port):
        sbx.commands.run("mkdir -p /tmp/site && echo hello-from-the-sandbox > /tmp/site/index.html")
        sbx.commands.run(
            f"python3 -m http.server {port} --bind 127.0.0.1 --directory /tmp/site",
            background=True,
        )
        host = sbx.get_host(port)
        for _ in range(100):
            status, body = fetch(host, "/", {"E2B-Traffic-Access-Token": getattr(sbx, "traffic_access_token", None) or ""})
            if status == 200:
                return host
            time.sleep(0.1)
        return host

    sbx = create()
    host = serve(sbx, 8765)
    out["host"] = host
    out["public"] = fetch(host, "/")
    out["closed"] = fetch(sbx.get_host(8766), "/")[0]
    sbx.kill()
    if P.get("private"):
        sbx = create(network={"allow_public_traffic": False})
        host = serve(sbx, 8765)
        token = sbx.traffic_access_token
        out["private_token_set"] = bool(token)
        out["private_without"] = fetch(host, "/")[0]
        out["private_with"] = fetch(host, "/", {"E2B-Traffic-Access-Token": token})
        sbx.kill()
    return out


def faults():
    """A wrong key, an unknown sandbox, an unknown template."""
    out = {}
    try:
        Sandbox.create(template="base", api_key="e2b_0000")
        out["bad_key"] = None
    except AuthenticationException as e:
        out["bad_key"] = err(e)
    try:
        Sandbox.connect("0" * 64)
        out["unknown_connect"] = None
    except SandboxException as e:
        out["unknown_connect"] = err(e)
    out["unknown_kill"] = Sandbox.kill("0" * 64)
    try:
        Sandbox.create(template="no-such-template")
        out["unknown_template"] = None
    except SandboxException as e:
        out["unknown_template"] = err(e)
    # A command whose sandbox is killed under it: the SDK's own words for it (its stream's
    # connection drops, and /health says the sandbox is gone).
    sbx = create()
    cmd = sbx.commands.run("sleep 60", background=True)
    sbx.kill()
    try:
        cmd.wait()
        out["killed_during_run"] = None
    except Exception as e:  # noqa: BLE001 (which class the SDK raises is the point)
        out["killed_during_run"] = err(e)
    return out


SCENARIOS = {
    "signed_urls": signed_urls,
    "listing": listing,
    "deadlines": deadlines,
    "metadata": metadata,
    "turn": turn,
    "big_files": big_files,
    "watch": watch,
    "signed_upload": signed_upload,
    "pty": pty,
    "lifecycle": lifecycle,
    "network": network,
    "ports": ports,
    "faults": faults,
}

if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[1]](), default=str))
