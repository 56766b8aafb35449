"""Programs written against E2B's code-interpreter SDK (`e2b-code-interpreter`), as its users
write them, for tests/tests/code_interpreter.rs.

Run as `python code_interpreter_driver.py SCENARIO` with the SDK's own settings in the
environment (E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL; E2B_VALIDATE_API_KEY=false for the SDKs
that check the key's shape) and the scenario's parameters as JSON in E2B_PARAMS. Each scenario
prints one JSON line: what the program saw, for the test to assert on. Nothing here knows it is
not E2B.
"""

import json
import os
import statistics
import sys
import time

from e2b_code_interpreter import Sandbox

P = json.loads(os.environ.get("E2B_PARAMS") or "{}")


def err(e):
    return {"type": type(e).__name__, "message": str(e)}


def create(**kw):
    kw.setdefault("timeout", 300)
    kw.setdefault("metadata", {"suite": P.get("tag", "code-interpreter")})
    if "template" in P:
        kw["template"] = P["template"]
    return Sandbox.create(**kw)


def notebook():
    """A notebook's cells: state kept, a chart, a DataFrame, streams in order, an exception, a
    timeout that leaves the context usable, two contexts apart, restart, bash, envs; E2B's user."""
    out = {}
    sbx = create()
    out["id"] = sbx.sandbox_id
    try:
        # E2B's own SDK commands in the same sandbox: its user and home.
        r = sbx.commands.run("whoami; echo $HOME; pwd")
        out["whoami"] = r.stdout.split()
        # State across cells.
        sbx.run_code("import pandas as pd\nx = 40")
        out["state"] = sbx.run_code("x + 2").text

        # A chart: a PNG result.
        chart = sbx.run_code(
            "import matplotlib.pyplot as plt\n"
            "plt.plot([1, 2, 3], [1, 4, 9])\n"
            "plt.title('squares')\n"
            "plt.show()"
        )
        pngs = [r.png for r in chart.results if r.png]
        out["chart_png_prefix"] = pngs[0][:12] if pngs else None
        out["chart_formats"] = [list(r.formats()) for r in chart.results]

        # A DataFrame: HTML and text, the main result.
        df = sbx.run_code("pd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
        main = [r for r in df.results if r.is_main_result]
        out["df_html_has_table"] = bool(main and main[0].html and "<table" in main[0].html)
        out["df_text"] = main[0].text if main else None

        # stdout and stderr callbacks, in the order printed.
        seen = []
        sbx.run_code(
            "import sys\nprint('one', flush=True)\nprint('two', file=sys.stderr, flush=True)\n"
            "print('three', flush=True)",
            on_stdout=lambda m: seen.append(("out", m.line)),
            on_stderr=lambda m: seen.append(("err", m.line)),
        )
        out["streams"] = seen

        # An exception with its traceback.
        e = sbx.run_code("def f():\n    return 1 / 0\nf()")
        out["error"] = (
            {"name": e.error.name, "value": e.error.value, "traceback_has_f": "f()" in e.error.traceback}
            if e.error
            else None
        )

        # A timeout interrupts the kernel, not the context.
        started = time.time()
        try:
            # request_timeout too: the older SDKs take the longer of the two as the deadline.
            sbx.run_code("import time\ntime.sleep(60)", timeout=2, request_timeout=2)
            out["timeout"] = "no timeout"
        except Exception as ex:  # the SDK's TimeoutException
            out["timeout"] = type(ex).__name__
        out["timeout_seconds"] = round(time.time() - started, 1)
        out["after_timeout"] = sbx.run_code("x * 2").text

        # Two contexts apart, each its own working directory.
        ctx = sbx.create_code_context(cwd="/tmp")
        sbx.run_code("x = 'other'", context=ctx)
        out["ctx_x"] = sbx.run_code("x", context=ctx).text
        out["default_x"] = sbx.run_code("x").text
        out["ctx_cwd"] = sbx.run_code("import os\nos.getcwd()", context=ctx).text
        out["contexts"] = sorted(c.id == ctx.id for c in sbx.list_code_contexts())
        sbx.restart_code_context(ctx)
        out["after_restart"] = sbx.run_code("'x' in dir()", context=ctx).text
        sbx.remove_code_context(ctx)
        out["contexts_after_remove"] = [c.id for c in sbx.list_code_contexts() if c.id == ctx.id]

        # Environment variables for one execution.
        out["env"] = sbx.run_code("import os\nos.environ.get('CELL_VAR')", envs={"CELL_VAR": "v1"}).text
        out["env_after"] = sbx.run_code("import os\nos.environ.get('CELL_VAR')").text

        # bash as a language, and a file the SDK wrote read by a cell.
        sbx.files.write("notes.txt", "written by the SDK")
        out["bash"] = sbx.run_code("cat ~/notes.txt", language="bash").logs.stdout
        out["python_reads_sdk_file"] = sbx.run_code("open('notes.txt').read()").text
    finally:
        sbx.kill()
    return out


def timing():
    """run_code("1+1") after the first, n times; create-to-first-result."""
    n = int(P.get("n", 50))
    t0 = time.perf_counter()
    sbx = create()
    created = time.perf_counter()
    first = sbx.run_code("1+1").text
    t1 = time.perf_counter()
    times = []
    try:
        for _ in range(n):
            s = time.perf_counter()
            sbx.run_code("1+1")
            times.append((time.perf_counter() - s) * 1000)
    finally:
        sbx.kill()
    times.sort()
    return {
        "first": first,
        "create_ms": round((created - t0) * 1000, 1),
        "first_run_code_ms": round((t1 - created) * 1000, 1),
        "p50_ms": round(statistics.median(times), 2),
        "p95_ms": round(times[int(len(times) * 0.95) - 1], 2),
    }


def pip_install():
    """An egress sandbox's kernel installs a package from an allowed index (whose token the
    gateway adds) and imports it in the same kernel; a denied host is refused by the gateway."""
    out = {}
    # The index takes a token, which the gateway adds (E2B's network rules): never in the sandbox.
    sbx = create(
        network={
            "deny_out": ["0.0.0.0/0"],
            "allow_out": [P["host"]],
            "rules": {P["host"]: [{"transform": {"headers": {"X-Index-Token": P["secret"]}}}]},
        }
    )
    try:
        r = sbx.run_code(
            "import subprocess, sys\n"
            "p = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-cache-dir',\n"
            "    '--disable-pip-version-check', '--index-url', %r, 'daivpkg'],\n"
            "    capture_output=True, text=True)\n"
            "print(p.returncode)\nprint(p.stdout[-3000:])\nprint(p.stderr[-3000:])" % P["index"]
        )
        out["install"] = "".join(r.logs.stdout)
        r = sbx.run_code("import importlib\nimportlib.invalidate_caches()\nimport daivpkg\ndaivpkg.VALUE")
        out["imported"] = r.text
        out["import_error"] = err(r.error) if r.error else None
        r = sbx.run_code(
            "import urllib.request\n"
            "try:\n"
            "    urllib.request.urlopen(%r, timeout=20).read()\n"
            "    print('reached')\n"
            "except Exception as e:\n"
            "    body = e.read().decode(errors='replace') if hasattr(e, 'read') else ''\n"
            "    print('refused', getattr(e, 'code', None), body or e)" % P["denied"]
        )
        out["denied"] = "".join(r.logs.stdout)
        r = sbx.run_code("import os\nany(%r in v for v in os.environ.values())" % P["secret"])
        out["kernel_env_has_secret"] = r.text
    finally:
        sbx.kill()
    return out


SCENARIOS = {"notebook": notebook, "timing": timing, "pip_install": pip_install}

if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[1]](), default=str))
