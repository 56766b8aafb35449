"""Drives daiv-sandbox's MCP endpoint with the official MCP Python SDK (`mcp` on PyPI), as a
user's program would: `streamable_http_client` + `ClientSession` over HTTP, `stdio_client` over
the service's own stdio bridge (`daiv-sandbox mcp --url ... --key-file ...`).

    python mcp_driver.py SCENARIO

Settings come from the environment:
    MCP_URL       the endpoint, e.g. http://127.0.0.1:8000/mcp
    MCP_KEY       the deployment's API key (sent as X-API-Key)
    MCP_PARAMS    a JSON object of the scenario's parameters (see each scenario)

Each scenario prints one JSON object on stdout (its observations; tests/tests/mcp.rs asserts on
them) and exits 0; anything unexpected (a transport failure, a tool that answers what no scenario
foresees) is an exception: a traceback on stderr and a non-zero exit.

Scenarios: init, turn, progress_cancel, errors, stdio, bench.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

# No scenario should take this long; past it the driver fails with a message instead of hanging
# until the test runner kills it.
SCENARIO_TIMEOUT_S = 400.0


def env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"mcp_driver: {name} is not set")
    return value


def params() -> dict[str, Any]:
    return json.loads(os.environ.get("MCP_PARAMS") or "{}")


class Recorder:
    """Every tool result and progress notification the client saw, as JSON, so the test can
    check that a secret appears in none of them."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def dump(self) -> list[Any]:
        return self.seen


class Tools:
    """A `ClientSession`'s tool calls, each result reduced to what the test asserts on."""

    def __init__(self, session: ClientSession, recorder: Recorder) -> None:
        self.session = session
        self.recorder = recorder

    async def call(
        self, name: str, arguments: dict[str, Any], progress: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """Calls a tool; its result as {is_error, value, text} (value: the structured content)."""

        async def on_progress(p: float, total: float | None, message: str | None) -> None:
            note = {"progress": p, "total": total, "message": message}
            self.recorder.seen.append({"progress": note})
            if progress is not None:
                progress.append(note)

        result = await self.session.call_tool(
            name, arguments, progress_callback=on_progress if progress is not None else None
        )
        self.recorder.seen.append({"tool": name, "result": result.model_dump(mode="json")})
        text = "".join(getattr(c, "text", "") for c in result.content)
        return {
            "is_error": bool(result.is_error),
            "value": result.structured_content,
            "text": text,
            "images": [
                {"mime": c.mime_type, "head": c.data[:12]}
                for c in result.content
                if getattr(c, "type", None) == "image"
            ],
        }

    async def ok(self, name: str, arguments: dict[str, Any], **kw: Any) -> dict[str, Any]:
        """A call that must succeed: its structured value (with `text` beside it)."""
        r = await self.call(name, arguments, **kw)
        if r["is_error"]:
            raise AssertionError(f"{name} failed: {r['value']}")
        value = dict(r["value"] or {})
        value["_text"] = r["text"]
        return value

    async def ok_when_free(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """`ok`, retried while the session is busy (a cancelled call's lock is let go as its
        command is killed)."""
        for _ in range(100):
            r = await self.call(name, arguments)
            if r["is_error"] and (r["value"] or {}).get("code") == "busy":
                await anyio.sleep(0.1)
                continue
            if r["is_error"]:
                raise AssertionError(f"{name} failed: {r['value']}")
            return r["value"]
        raise AssertionError(f"{name}: the session stayed busy for 10 s")

    async def sh(self, session_id: str, command: str) -> dict[str, Any]:
        """One command's result (exit_code, output)."""
        v = await self.ok_when_free("run", {"session_id": session_id, "commands": [command]})
        return v["results"][0]


def http_client(key: str | None, seen_session_ids: list[str] | None = None) -> httpx2.AsyncClient:
    """The HTTP client a user's program hands the SDK: the key as a header, the SDK's timeouts;
    optionally noting every `Mcp-Session-Id` the server answers with."""

    async def note(response: httpx2.Response) -> None:
        sid = response.headers.get("mcp-session-id")
        if sid is not None and seen_session_ids is not None:
            seen_session_ids.append(sid)

    headers = {"X-API-Key": key} if key is not None else {}
    return httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(30.0, read=300.0),
        event_hooks={"response": [note]},
    )


@asynccontextmanager
async def connect(
    era: str = "handshake", seen_session_ids: list[str] | None = None
) -> AsyncIterator[tuple[ClientSession, Any]]:
    """An initialised `ClientSession` over streamable HTTP: `initialize` (the handshake, up to
    2025-11-25) or `discover` (2026-07-28, no session)."""
    async with http_client(env("MCP_KEY"), seen_session_ids) as client:
        async with streamable_http_client(env("MCP_URL"), http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                if era == "handshake":
                    info = await session.initialize()
                elif era == "discover":
                    info = await session.discover()
                else:
                    raise SystemExit(f"mcp_driver: unknown era {era!r}")
                yield session, info


def tool_summary(listed: Any) -> list[dict[str, Any]]:
    return [
        {
            "name": t.name,
            "schema_type": t.input_schema.get("type"),
            "required": t.input_schema.get("required", []),
            "described": bool(t.description),
            "read_only": bool(t.annotations and t.annotations.read_only_hint),
        }
        for t in listed.tools
    ]


# === scenarios ===


async def scenario_init() -> dict[str, Any]:
    """Initialise (params.era: handshake | discover) and list the tools; then a ping (the
    handshake era has one) and one cheap tool call, so the session (or its absence) is exercised
    past initialisation."""
    p = params()
    era = p.get("era", "handshake")
    session_ids: list[str] = []
    async with connect(era, session_ids) as (session, info):
        listed = await session.list_tools()
        if era == "handshake":
            await session.send_ping()
        # A tool call on a session that does not exist: answered as a result, not an error.
        r = await Tools(session, Recorder()).call("pause", {"session_id": "0" * 64})
    return {
        "era": era,
        "protocol_version": session.protocol_version,
        "server_name": session.server_info.name if session.server_info else None,
        "server_version": session.server_info.version if session.server_info else None,
        "instructions": session.instructions,
        "tools_capability": bool(session.server_capabilities and session.server_capabilities.tools),
        "tools": tool_summary(listed),
        "mcp_session_ids": sorted(set(session_ids)),
        "missing_session_call": r,
    }


async def scenario_turn() -> dict[str, Any]:
    """A whole agent turn through the tools, on a session with egress.

    params: image, egress (session_create's), egress_updated (egress_update's), upstream_url,
    secret_head and secret_tail (the secret's two halves: the sandbox is searched for it without
    the command carrying it)."""
    p = params()
    rec = Recorder()
    out: dict[str, Any] = {}
    async with connect() as (session, _):
        t = Tools(session, rec)
        created = await t.ok(
            "session_create",
            {"image": p["image"], "environment": {"TURN": "mcp"}, "egress": p["egress"]},
        )
        sid = created["session_id"]
        out["session_id"] = sid
        app = "/workspace/repo/src/app.py"

        out["write"] = await t.ok(
            "write", {"session_id": sid, "path": app, "content": "GREETING = 'hello'\nprint(GREETING)\n"}
        )
        out["write_again"] = await t.call("write", {"session_id": sid, "path": app, "content": "x"})

        progress: list[dict[str, Any]] = []
        out["run"] = await t.ok(
            "run",
            {
                "session_id": sid,
                "commands": [
                    "python3 src/app.py && echo TURN=$TURN",
                    # The echo upstream answers with the request, injected header included:
                    # only its status comes back to the sandbox.
                    f"curl -sS --fail -o /dev/null -w '%{{http_code}}' {p['upstream_url']}/mcp-turn",
                ],
            },
            progress=progress,
        )
        out["run_progress"] = progress

        out["grep"] = await t.ok("grep", {"session_id": sid, "pattern": "GREETING =", "glob": "*.py"})
        out["edit"] = await t.ok("edit", {"session_id": sid, "path": app, "old": "'hello'", "new": "'bonjour'"})
        out["edit_missing"] = await t.call("edit", {"session_id": sid, "path": app, "old": "'hello'", "new": "x"})
        out["read"] = await t.ok("read", {"session_id": sid, "path": app})
        out["ls"] = await t.ok("ls", {"session_id": sid, "path": "/workspace/repo"})
        out["glob"] = await t.ok("glob", {"session_id": sid, "pattern": "**/*.py"})

        # A background process: its output as it comes, then killed.
        started = await t.ok(
            "process_start",
            {
                "session_id": sid,
                "command": "for i in 1 2 3; do echo tick-$i; sleep 0.2; done; exec sleep 600",
            },
        )
        pid = started["process_id"]
        output, offset, state = "", 0, {}
        for _ in range(50):
            state = await t.ok(
                "process_output", {"session_id": sid, "process_id": pid, "offset": offset, "wait": 2}
            )
            output += state.get("output") or ""
            offset = state.get("next_offset", offset)
            if "tick-3" in output:
                break
        out["process_output"] = {"output": output, "running": state.get("running")}
        out["process_kill"] = await t.ok("process_kill", {"session_id": sid, "process_id": pid})
        after = {}
        for _ in range(50):
            after = await t.ok("process_output", {"session_id": sid, "process_id": pid, "offset": offset})
            if not after.get("running"):
                break
            await anyio.sleep(0.1)
        out["process_after_kill"] = {"running": after.get("running"), "exit_code": after.get("exit_code")}

        # The secret is nowhere in the sandbox: its environment, its processes', its files.
        head, tail = p["secret_head"], p["secret_tail"]
        out["secret_scan"] = await t.sh(
            sid,
            "env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; "
            f"grep -rIl '{head}''{tail}' /workspace /home /tmp /etc /usr/local /root /var /run "
            "2>/dev/null; echo scan-end",
        )

        # A new credential, without a restart: the upstream sees it on the next request.
        out["egress_update"] = await t.ok("egress_update", {"session_id": sid, "egress": p["egress_updated"]})
        out["after_update"] = await t.sh(
            sid, f"curl -sS --fail -o /dev/null -w '%{{http_code}}' {p['upstream_url']}/mcp-after-update"
        )

        # Snapshot, and a new session from it with the edited file.
        snap = await t.ok("snapshot", {"session_id": sid, "name": "mcp-turn"})
        out["snapshot"] = snap
        from_snap = await t.ok("session_create", {"snapshot_id": snap["snapshot_id"]})
        out["from_snapshot"] = {
            "session_id": from_snap["session_id"],
            "read": await t.ok("read", {"session_id": from_snap["session_id"], "path": app}),
        }
        out["from_snapshot"]["close"] = await t.ok("session_close", {"session_id": from_snap["session_id"]})

        # Fork: a copy with the file as it is now.
        forked = await t.ok("fork", {"session_id": sid, "count": 1})
        fork_id = forked["session_ids"][0]
        out["fork"] = {
            "session_ids": forked["session_ids"],
            "read": await t.ok("read", {"session_id": fork_id, "path": app}),
            "close": await t.ok("session_close", {"session_id": fork_id}),
        }

        # Pause, then the next call resumes it.
        out["pause"] = await t.ok("pause", {"session_id": sid})
        out["after_pause"] = await t.sh(sid, "python3 src/app.py")

        out["close"] = await t.ok("session_close", {"session_id": sid})
        # The session is gone: a call on it is a result with isError and not_found.
        out["after_close"] = await t.call("run", {"session_id": sid, "commands": ["true"]})
    out["transcript"] = rec.dump()
    return out


async def scenario_progress_cancel() -> dict[str, Any]:
    """A long run's output as progress notifications, then a run cancelled by the client: its
    command is killed. params: image, marker (a number the cancelled command sleeps, to find it
    by), era (handshake: notifications/cancelled on an MCP session; discover: the 2026-07-28
    client hangs up the call's stream). The session is left open (the test looks into it, then
    removes it)."""
    p = params()
    marker = p["marker"]
    out: dict[str, Any] = {}
    async with connect(p.get("era", "handshake")) as (session, _):
        t = Tools(session, Recorder())
        sid = (await t.ok("session_create", {"image": p["image"]}))["session_id"]
        out["session_id"] = sid

        progress: list[dict[str, Any]] = []
        out["long_run"] = await t.ok(
            "run",
            {"session_id": sid, "commands": ["for i in 1 2 3 4 5; do echo line-$i; sleep 0.3; done; echo end"]},
            progress=progress,
        )
        out["long_run_progress"] = progress
        # Output printed just before a command ends: its notification, too, comes before the
        # result (a few runs, as the two race when they are not ordered).
        out["short_runs_progress"] = []
        for _ in range(5):
            short: list[dict[str, Any]] = []
            await t.ok("run", {"session_id": sid, "commands": ["echo a; sleep 0.2; echo z"]}, progress=short)
            out["short_runs_progress"].append("".join(p["message"] or "" for p in short))

        # Cancel once the command has said it started (its first output, as progress) and the
        # sandbox shows its process; `exec` makes that process `sleep MARKER` in any shell.
        seen: list[dict[str, Any]] = []
        started = anyio.Event()
        outcome: dict[str, Any] = {"finished": False}
        command = f"echo started-{marker}; exec sleep {marker}"

        async def count_sleepers() -> int:
            """How many processes of the sandbox run `sleep MARKER`, seen from a background
            process (which takes no session lock, so it works beside a run)."""
            probe = (
                "{ for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done; } 2>/dev/null "
                f"| grep -c '^sleep {marker}' || true"
            )
            pid = (await t.ok("process_start", {"session_id": sid, "command": probe}))["process_id"]
            text, offset = "", 0
            for _ in range(50):
                o = await t.ok("process_output", {"session_id": sid, "process_id": pid, "offset": offset, "wait": 2})
                text += o.get("output") or ""
                offset = o.get("next_offset", offset)
                if not o.get("running"):
                    return int(text.strip() or "0")
            raise AssertionError("the probe process did not end")

        async def long_call() -> None:
            async def on_progress(pr: float, total: float | None, message: str | None) -> None:
                seen.append({"progress": pr, "message": message})
                if message and f"started-{marker}" in message:
                    started.set()

            result = await session.call_tool(
                "run", {"session_id": sid, "commands": [command]}, progress_callback=on_progress
            )
            outcome["finished"] = True
            outcome["result"] = result.model_dump(mode="json")

        async with anyio.create_task_group() as tg:
            tg.start_soon(long_call)
            with anyio.fail_after(60):
                await started.wait()
            running_before = 0
            for _ in range(50):
                running_before = await count_sleepers()
                if running_before:
                    break
                await anyio.sleep(0.1)
            t0 = time.monotonic()
            tg.cancel_scope.cancel()
        out["cancel"] = {
            "progress_before": seen,
            "running_before": running_before,
            "call_finished": outcome["finished"],
            **outcome,
        }

        # The command is gone from the sandbox (polled: the kill is asynchronous).
        remaining = None
        for _ in range(100):
            remaining = await count_sleepers()
            if remaining == 0:
                break
            await anyio.sleep(0.2)
        out["cancel"]["remaining_after"] = remaining
        out["cancel"]["seconds_until_gone"] = round(time.monotonic() - t0, 2)
        out["after_cancel"] = await t.sh(sid, "echo still-usable")
    return out


async def scenario_errors() -> dict[str, Any]:
    """Arguments that are not the tool's and a tool that does not exist: JSON-RPC errors (the
    SDK raises MCPError) naming the field; a session that does not exist: a result."""
    cases = {
        "commands_not_a_list": ("run", {"session_id": "x", "commands": "ls"}),
        "commands_missing": ("run", {"session_id": "x"}),
        "unknown_field": ("ls", {"session_id": "x", "pth": "/"}),
        "wrong_type": ("read", {"session_id": "x", "path": "/workspace/a", "limit": "ten"}),
        "unknown_tool": ("no_such_tool", {"session_id": "x"}),
    }
    out: dict[str, Any] = {}
    async with connect() as (session, _):
        t = Tools(session, Recorder())
        for label, (name, args) in cases.items():
            try:
                r = await t.call(name, args)
                out[label] = {"raised": False, "result": r}
            except MCPError as e:
                out[label] = {"raised": True, "code": e.code, "message": e.message}
        # After all of that the MCP session still works.
        out["still_works"] = await t.call("ls", {"session_id": "0" * 64})
    return out


async def scenario_stdio() -> dict[str, Any]:
    """The stdio bridge, as a stdio-only client spawns it. params: bin (daiv-sandbox), url,
    key_file, image."""
    p = params()
    server = StdioServerParameters(
        command=p["bin"],
        # The SDK passes on only HOME, PATH and the like: the key comes from the file.
        args=["mcp", "--url", p["url"], "--key-file", p["key_file"]],
    )
    out: dict[str, Any] = {}
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            info = await session.initialize()
            out["protocol_version"] = info.protocol_version
            out["server_name"] = info.server_info.name
            out["tools"] = [tool.name for tool in (await session.list_tools()).tools]
            t = Tools(session, Recorder())
            sid = (await t.ok("session_create", {"image": p["image"]}))["session_id"]
            out["session_id"] = sid
            progress: list[dict[str, Any]] = []
            out["run"] = await t.ok(
                "run",
                {"session_id": sid, "commands": ["echo via-stdio; sleep 0.3; echo done-stdio"]},
                progress=progress,
            )
            out["run_progress"] = progress
            try:
                await t.call("run", {"session_id": sid})
                out["bad_args"] = {"raised": False}
            except MCPError as e:
                out["bad_args"] = {"raised": True, "code": e.code, "message": e.message}
            out["close"] = await t.ok("session_close", {"session_id": sid})
    return out


async def scenario_bench() -> dict[str, Any]:
    """A tool call's overhead beside the native route: n `run`s of `true` through MCP, then n
    POST /session/{id}/ with the same client library, on one session. params: image, n, rest
    (the API's base URL, e.g. http://127.0.0.1:8000/api/v1)."""
    p = params()
    n = int(p.get("n", 50))
    key = env("MCP_KEY")
    out: dict[str, Any] = {"n": n}
    async with connect() as (session, _):
        t = Tools(session, Recorder())
        sid = (await t.ok("session_create", {"image": p["image"]}))["session_id"]
        try:
            args = {"session_id": sid, "commands": ["true"]}
            await t.ok("run", args)  # warm-up
            mcp_ms = []
            for _ in range(n):
                t0 = time.perf_counter()
                await session.call_tool("run", args)
                mcp_ms.append((time.perf_counter() - t0) * 1000)
            async with http_client(key) as client:
                url = f"{p['rest']}/session/{sid}/"
                body = {"commands": ["true"]}
                (await client.post(url, json=body)).raise_for_status()  # warm-up
                rest_ms = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    r = await client.post(url, json=body)
                    r.raise_for_status()
                    rest_ms.append((time.perf_counter() - t0) * 1000)
        finally:
            await t.call("session_close", {"session_id": sid})

    def stats(xs: list[float]) -> dict[str, float]:
        q = statistics.quantiles(xs, n=10)
        return {"p50_ms": round(statistics.median(xs), 2), "p90_ms": round(q[-1], 2), "min_ms": round(min(xs), 2)}

    out["mcp_run"] = stats(mcp_ms)
    out["rest_run"] = stats(rest_ms)
    out["overhead_p50_ms"] = round(out["mcp_run"]["p50_ms"] - out["rest_run"]["p50_ms"], 2)
    return out


async def scenario_code() -> dict[str, Any]:
    """The code interpreter through `run_code`: state kept across calls, a chart as MCP image
    content, an exception's traceback, a session whose image runs no interpreter.

    params: image (one that runs the interpreter), plain_image (one that does not)."""
    p = params()
    out: dict[str, Any] = {}
    async with connect() as (session, _):
        tools = Tools(session, Recorder())
        sid = (await tools.ok("session_create", {"image": p["image"]}))["session_id"]
        try:
            await tools.ok("run_code", {"session_id": sid, "code": "import pandas as pd\nx = 20"})
            out["state"] = await tools.ok("run_code", {"session_id": sid, "code": "x * 2"})
            chart = await tools.call(
                "run_code",
                {
                    "session_id": sid,
                    "code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
                },
            )
            out["chart_images"] = chart["images"]
            out["error"] = await tools.ok("run_code", {"session_id": sid, "code": "1 / 0"})
            out["timeout"] = await tools.ok(
                "run_code", {"session_id": sid, "code": "import time\ntime.sleep(30)", "timeout": 1}
            )
            out["after_timeout"] = await tools.ok("run_code", {"session_id": sid, "code": "x"})
        finally:
            await tools.ok("session_close", {"session_id": sid})
        plain = (await tools.ok("session_create", {"image": p["plain_image"]}))["session_id"]
        try:
            out["plain"] = await tools.call("run_code", {"session_id": plain, "code": "1"})
        finally:
            await tools.ok("session_close", {"session_id": plain})
    return out


SCENARIOS = {
    "code": scenario_code,
    "init": scenario_init,
    "turn": scenario_turn,
    "progress_cancel": scenario_progress_cancel,
    "errors": scenario_errors,
    "stdio": scenario_stdio,
    "bench": scenario_bench,
}


async def main() -> None:
    if len(sys.argv) != 2 or sys.argv[1] not in SCENARIOS:
        raise SystemExit(f"usage: {sys.argv[0]} {{{'|'.join(SCENARIOS)}}}")
    with anyio.fail_after(SCENARIO_TIMEOUT_S):
        result = await SCENARIOS[sys.argv[1]]()
    print(json.dumps(result))


if __name__ == "__main__":
    anyio.run(main)
