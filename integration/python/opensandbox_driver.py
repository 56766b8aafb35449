"""Programs written against OpenSandbox's Python SDK, as its users write them, for
tests/tests/opensandbox.rs.

Run as `python opensandbox_driver.py SCENARIO` with the SDK's own settings in the environment
(OPEN_SANDBOX_DOMAIN, OPEN_SANDBOX_API_KEY) and the scenario's parameters as JSON in OS_PARAMS.
Each scenario prints one JSON line: what the program saw, for the test to assert on. Nothing
here knows it is not OpenSandbox.
"""

import asyncio
import json
import os
import time
from datetime import timedelta

import opensandbox
from opensandbox import Sandbox, SandboxManager, SandboxSync
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.execd import ExecutionHandlers, RunCommandOpts
from opensandbox.models.filesystem import (
    ContentReplaceEntry,
    MoveEntry,
    SearchEntry,
    SetPermissionEntry,
    WriteEntry,
)
from opensandbox.models.sandboxes import SandboxFilter, SnapshotFilter

P = json.loads(os.environ.get("OS_PARAMS") or "{}")
IMAGE = P.get("image", "daiv-sandbox-debian:local")


def err(e):
    out = {"type": type(e).__name__, "message": str(e)}
    if isinstance(e, SandboxApiException):
        out["status"] = e.status_code
        out["code"] = e.error.code if e.error else None
    return out


def logs(ex):
    return {
        "stdout": [m.text for m in ex.logs.stdout],
        "stderr": [m.text for m in ex.logs.stderr],
        "exit_code": ex.exit_code,
        "error": ex.error and {"name": ex.error.name, "value": ex.error.value},
    }


async def turn():
    """Create, commands (streamed, failing, past a timeout, in the background), a bash session,
    files, info, list, metadata, renewal, metrics, pause and resume, kill."""
    out = {"sdk": getattr(opensandbox, "__version__", None)}
    sb = await Sandbox.create(
        IMAGE,
        timeout=timedelta(minutes=5),
        metadata={"suite": P["tag"]},
        env={"GREETING": "bonjour"},
    )
    out["id"] = sb.id
    out["kernel_log"] = logs(await sb.commands.run("dmesg 2>&1 | head -n 3 || true"))["stdout"]

    seen = []

    async def on_stdout(m):
        seen.append(["out", m.text, time.monotonic()])

    async def on_stderr(m):
        seen.append(["err", m.text, time.monotonic()])

    ex = await sb.commands.run(
        "echo $GREETING; echo oops >&2; sleep 0.5; echo late; id -u",
        handlers=ExecutionHandlers(on_stdout=on_stdout, on_stderr=on_stderr),
    )
    out["run"] = logs(ex)
    out["handled"] = [[k, t] for k, t, _ in seen]
    # Streamed as it ran: the line after the sleep came apart from the first.
    out["spread_s"] = seen[-1][2] - seen[0][2] if len(seen) > 1 else 0
    out["exit3"] = logs(await sb.commands.run("echo partial; exit 3"))
    out["timed_out"] = logs(
        await sb.commands.run("sleep 30", opts=RunCommandOpts(timeout=timedelta(seconds=1)))
    )
    bg = await sb.commands.run(
        "echo one; sleep 0.2; echo two", opts=RunCommandOpts(background=True)
    )
    for _ in range(50):
        st = await sb.commands.get_command_status(bg.id)
        if not st.running:
            break
        await asyncio.sleep(0.1)
    out["bg_status"] = {"running": st.running, "exit_code": st.exit_code}
    first = await sb.commands.get_background_command_logs(bg.id)
    out["bg_logs"] = {"content": first.content, "cursor": first.cursor}
    rest = await sb.commands.get_background_command_logs(bg.id, cursor=4)
    out["bg_logs_from_4"] = rest.content
    try:
        await sb.commands.run("id", opts=RunCommandOpts(uid=0))
        out["as_root"] = None
    except Exception as e:  # noqa: BLE001
        out["as_root"] = err(e)

    sid = await sb.commands.create_session(working_directory="/tmp")
    s1 = await sb.commands.run_in_session(sid, "pwd; X=42; cd /workspace")
    s2 = await sb.commands.run_in_session(sid, "echo $X; pwd")
    s3 = await sb.commands.run_in_session(sid, "sleep 30", timeout=timedelta(seconds=1))
    s4 = await sb.commands.run_in_session(sid, "echo $X")
    out["session"] = [logs(s) for s in (s1, s2, s3, s4)]
    await sb.commands.delete_session(sid)

    await sb.files.write_file("/workspace/hello.txt", "hello world", mode=644)
    await sb.files.write_files(
        [
            WriteEntry(path="/workspace/d/a.bin", data=b"\x00\x01\xff", mode=600),
            WriteEntry(path="/workspace/d/b.txt", data="B"),
        ]
    )
    out["read"] = await sb.files.read_file("/workspace/hello.txt")
    out["read_bytes"] = list(await sb.files.read_bytes("/workspace/d/a.bin"))
    info = await sb.files.get_file_info(["/workspace/hello.txt", "/workspace/d/a.bin"])
    out["info"] = {
        p: {"mode": i.mode, "size": i.size, "type": str(i.entry_type), "owner": i.owner}
        for p, i in info.items()
    }
    # (`find`, not `stat` or `ls`: coreutils' statx is not in every gVisor release.)
    out["cat_mode"] = logs(await sb.commands.run("find /workspace/d/b.txt -printf '%m\\n'"))["stdout"]
    await sb.files.create_directories([WriteEntry(path="/workspace/x/y", mode=755)])
    await sb.files.delete_files(["/workspace/hello.txt"])
    out["after_delete"] = logs(
        await sb.commands.run(
            "test -e /workspace/hello.txt || echo gone; test -d /workspace/x/y && echo dir"
        )
    )["stdout"]
    try:
        await sb.files.read_file("/workspace/none")
        out["read_missing"] = None
    except Exception as e:  # noqa: BLE001
        out["read_missing"] = err(e)

    got = await sb.get_info()
    out["get"] = {
        "state": got.status.state,
        "metadata": got.metadata,
        "ttl_s": (got.expires_at.timestamp() - time.time()) if got.expires_at else None,
    }
    await sb.renew(timedelta(minutes=30))
    got = await sb.get_info()
    out["renewed_ttl_s"] = got.expires_at.timestamp() - time.time()
    out["patched"] = (await sb.patch_metadata({"suite": None, "k": "v"})).metadata if hasattr(sb, "patch_metadata") else None
    out["patched_get"] = (await sb.get_info()).metadata
    await sb.patch_metadata({"suite": P["tag"], "k": None})
    manager = await SandboxManager.create()
    listed = await manager.list_sandbox_infos(
        SandboxFilter(states=["Running"], metadata={"suite": P["tag"]})
    )
    out["listed"] = [s.id for s in listed.sandbox_infos]
    out["pagination"] = {
        "total_items": listed.pagination.total_items,
        "has_next_page": listed.pagination.has_next_page,
    }
    m = await sb.get_metrics()
    out["metrics"] = {"cpu_count": m.cpu_count, "mem_total_mib": m.memory_total_in_mib}

    await sb.pause()
    out["paused_state"] = (await sb.get_info()).status.state
    resumed = await Sandbox.resume(sb.id)
    out["resumed_state"] = (await resumed.get_info()).status.state
    out["after_resume"] = logs(await resumed.commands.run("echo back; echo $GREETING"))["stdout"]
    await resumed.kill()
    try:
        await resumed.get_info()
        out["after_kill"] = None
    except Exception as e:  # noqa: BLE001
        out["after_kill"] = err(e)
    await manager.close()
    return out


def mode_of(path):
    # (`find`, not `stat` or `ls`: coreutils' statx is not in every gVisor release.)
    return f"find {path} -printf '%m\\n'"


async def snapshots_and_files():
    """Files searched, moved, chmodded, replaced and read by lines through `sb.files`; a
    snapshot taken, got and listed; a sandbox made from it; both killed, the snapshot deleted."""
    out = {"sdk": getattr(opensandbox, "__version__", None)}
    sb = await Sandbox.create(IMAGE, timeout=timedelta(minutes=5), metadata={"suite": P["tag"]})
    out["id"] = sb.id
    await sb.files.write_files(
        [
            WriteEntry(path="/workspace/s/a.py", data="print(1)\n", mode=644),
            WriteEntry(path="/workspace/s/sub/b.py", data="print(2)\n", mode=644),
            WriteEntry(path="/workspace/s/notes.txt", data="l1\nl2\nl3\nl4\n", mode=644),
            WriteEntry(path="/workspace/s/app.cfg", data="host=localhost\ndb=localhost\n", mode=640),
        ]
    )
    found = await sb.files.search(SearchEntry(path="/workspace/s", pattern="*.py"))
    out["search"] = {
        f.path: {"mode": f.mode, "size": f.size, "type": str(f.entry_type)} for f in found
    }
    await sb.files.move_files(
        [MoveEntry(src="/workspace/s/notes.txt", dest="/workspace/s/sub/notes.txt")]
    )
    out["moved"] = logs(
        await sb.commands.run(
            "test -e /workspace/s/notes.txt || echo gone; head -n 1 /workspace/s/sub/notes.txt"
        )
    )["stdout"]
    await sb.files.set_permissions([SetPermissionEntry(path="/workspace/s/a.py", mode=700)])
    out["chmodded"] = logs(await sb.commands.run(mode_of("/workspace/s/a.py")))["stdout"]
    try:
        await sb.files.set_permissions(
            [SetPermissionEntry(path="/workspace/s/a.py", mode=600, owner="root")]
        )
        out["chown"] = None
    except Exception as e:  # noqa: BLE001
        out["chown"] = err(e)
    out["chown_left"] = logs(await sb.commands.run(mode_of("/workspace/s/a.py")))["stdout"]
    replaced = await sb.files.replace_contents_detailed(
        [
            ContentReplaceEntry(
                path="/workspace/s/app.cfg", old_content="localhost", new_content="db.internal"
            )
        ]
    )
    out["replaced"] = {r.path: r.replaced_count for r in replaced}
    await sb.files.replace_contents(
        [ContentReplaceEntry(path="/workspace/s/app.cfg", old_content="db=", new_content="store=")]
    )
    out["replaced_text"] = await sb.files.read_file("/workspace/s/app.cfg")
    out["replaced_mode"] = logs(await sb.commands.run(mode_of("/workspace/s/app.cfg")))["stdout"]
    out["lines"] = await sb.files.read_file("/workspace/s/sub/notes.txt", offset=2, limit=2)

    await sb.files.write_file("/workspace/kept.txt", "before the snapshot", mode=644)
    snap = await sb.create_snapshot(name=P["tag"])
    out["snapshot"] = {
        "id": snap.id,
        "state": snap.status.state,
        "name": snap.name,
        "sandbox_id": snap.sandbox_id,
    }
    await sb.files.write_file("/workspace/kept.txt", "after the snapshot", mode=644)
    manager = await SandboxManager.create()
    got = await manager.get_snapshot(snap.id)
    out["got"] = {"id": got.id, "state": got.status.state, "name": got.name}
    listed = await manager.list_snapshots(SnapshotFilter(sandbox_id=sb.id))
    out["listed"] = [s.id for s in listed.snapshot_infos]
    out["listed_total"] = listed.pagination.total_items
    by_name = await manager.list_snapshots(SnapshotFilter(states=["Ready"], name=P["tag"]))
    out["listed_by_name"] = [s.id for s in by_name.snapshot_infos]
    restored = await Sandbox.create(
        snapshot_id=snap.id, timeout=timedelta(minutes=5), metadata={"suite": P["tag"]}
    )
    out["restored_read"] = await restored.files.read_file("/workspace/kept.txt")
    out["restored_snapshot_id"] = getattr(await restored.get_info(), "snapshot_id", None)
    out["source_read"] = await sb.files.read_file("/workspace/kept.txt")
    await restored.kill()
    await sb.kill()
    await manager.delete_snapshot(snap.id)
    try:
        await manager.get_snapshot(snap.id)
        out["after_delete"] = None
    except Exception as e:  # noqa: BLE001
        out["after_delete"] = err(e)
    left = await manager.list_snapshots(SnapshotFilter(sandbox_id=sb.id))
    out["listed_after_delete"] = [s.id for s in left.snapshot_infos]
    await manager.close()
    return out


def sync_turn():
    """The synchronous SDK: create, a command, a file, kill."""
    sb = SandboxSync.create(IMAGE, metadata={"suite": P["tag"]})
    out = {"id": sb.id}
    out["run"] = logs(sb.commands.run("echo sync"))
    sb.files.write_file("/workspace/s.txt", "sync file")
    out["read"] = sb.files.read_file("/workspace/s.txt")
    sb.kill()
    return out


def refused():
    """A wrong key, an image no registry has (P["missing_image"]: on a loopback port nothing
    listens on, so no name goes to a resolver)."""
    out = {}
    key = os.environ["OPEN_SANDBOX_API_KEY"]
    os.environ["OPEN_SANDBOX_API_KEY"] = "not-the-key"
    try:
        asyncio.run(Sandbox.create(IMAGE))
        out["wrong_key"] = None
    except Exception as e:  # noqa: BLE001
        out["wrong_key"] = err(e)
    os.environ["OPEN_SANDBOX_API_KEY"] = key
    try:
        asyncio.run(Sandbox.create(P["missing_image"]))
        out["unknown_image"] = None
    except Exception as e:  # noqa: BLE001
        out["unknown_image"] = err(e)
    return out


SCENARIOS = {
    "turn": lambda: asyncio.run(turn()),
    "snapshots_and_files": lambda: asyncio.run(snapshots_and_files()),
    "sync_turn": sync_turn,
    "refused": refused,
}

if __name__ == "__main__":
    import sys

    print(json.dumps(SCENARIOS[sys.argv[1]](), default=str))
