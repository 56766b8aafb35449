"""OpenSandbox's network as its SDK's users write it, for tests/tests/opensandbox_egress.rs: a
sandbox created with a network policy, its policy read and patched through the egress
endpoint, a credential vault whose binding injects a header at an upstream the test runs, and
a server of the sandbox's own reached at the endpoint the SDK gives for its port.

Run as `python opensandbox_egress.py SCENARIO` with OPEN_SANDBOX_DOMAIN, OPEN_SANDBOX_API_KEY
and the scenario's parameters as JSON in OS_PARAMS (`api`, `other`: upstream hosts; `secret`,
`rotated`: credential values). Prints one JSON line of what the program saw.
"""

import asyncio
import json
import os
from datetime import timedelta

import opensandbox
from opensandbox import Sandbox
from opensandbox.exceptions import SandboxApiException
from opensandbox.models.execd import RunCommandOpts
from opensandbox.models.sandboxes import NetworkPolicy, NetworkRule

P = json.loads(os.environ.get("OS_PARAMS") or "{}")
IMAGE = P.get("image", "daiv-sandbox-debian:local")


def err(e):
    out = {"type": type(e).__name__}
    if isinstance(e, SandboxApiException):
        out["status"] = e.status_code
    return out


TRUST = "/tmp/trust.pem"


async def trust_upstream(sb):
    """The sandbox's bundle (its image's roots and the gateway's CA) plus the test upstream's
    CA: a host the gateway tunnels shows the sandbox the upstream's own certificate."""
    await sb.files.write_file("/tmp/upstream-ca.pem", P["upstream_ca"], mode=644)
    await sb.commands.run(f'cat "$SSL_CERT_FILE" /tmp/upstream-ca.pem > {TRUST}')


async def curl(sb, url):
    """The status curl got: the proxy's refusal of a CONNECT, else the upstream's answer
    (000: none, TLS or the connection failed)."""
    ex = await sb.commands.run(
        f"curl -s --cacert {TRUST} -o /dev/null -w '%{{http_connect}} %{{http_code}}' {url}"
    )
    text = "".join(m.text for m in ex.logs.stdout).split()
    connect, code = (text + ["", ""])[:2]
    return code if connect in ("", "000", "200") else connect


async def denied_reason(sb, url):
    ex = await sb.commands.run(
        f"curl -s --cacert {TRUST} -D - -o /dev/null {url} | tr -d '\\r' | grep -i '^x-egress-denied' || true"
    )
    return "".join(m.text for m in ex.logs.stdout).strip()


def policy_view(p):
    return {
        "default": p.default_action,
        "egress": [{"action": r.action, "target": r.target} for r in (p.egress or [])],
    }


def vault_view(state):
    return {
        "revision": state.revision,
        "credentials": [
            {"name": c.name, "revision": c.revision, "source_type": c.source_type}
            for c in state.credentials
        ],
        "bindings": [
            {
                "name": b.name,
                "revision": b.revision,
                "hosts": b.match.hosts if b.match else None,
                "auth": b.auth.type if b.auth else None,
            }
            for b in state.bindings
        ],
    }


async def vault():
    api, other = P["api"], P["other"]
    out = {"sdk": getattr(opensandbox, "__version__", None)}
    sb = await Sandbox.create(
        IMAGE,
        timeout=timedelta(minutes=5),
        network_policy=NetworkPolicy(
            defaultAction="deny",
            egress=[NetworkRule(action="allow", target=api)],
        ),
    )
    out["id"] = sb.id
    try:
        await trust_upstream(sb)
        out["policy"] = policy_view(await sb.get_egress_policy())
        out["plain"] = await curl(sb, f"https://{api}/plain")
        out["other_before"] = await curl(sb, f"https://{other}/x")

        state = await sb.credential_vault.create(
            credentials=[{"name": "gh", "source": {"type": "inline", "value": P["secret"]}}],
            bindings=[
                {
                    "name": "gh-api",
                    "match": {"hosts": [api], "paths": ["/vault/*"]},
                    "auth": {"type": "bearer", "credential": "gh"},
                }
            ],
        )
        out["created"] = vault_view(state)
        out["vault_call"] = await curl(sb, f"https://{api}/vault/one")
        out["outside_paths"] = await curl(sb, f"https://{api}/elsewhere")
        out["got"] = vault_view(await sb.credential_vault.get())
        out["credentials"] = [c.name for c in await sb.credential_vault.list_credentials()]
        out["binding"] = (await sb.credential_vault.get_binding("gh-api")).name
        try:
            await sb.credential_vault.patch(
                bindings={
                    "add": [
                        {
                            "name": "gh-other",
                            "match": {"hosts": [other]},
                            "auth": {"type": "bearer", "credential": "gh"},
                        }
                    ]
                }
            )
            out["uncovered"] = None
        except Exception as e:  # noqa: BLE001
            out["uncovered"] = err(e)
        try:
            await sb.credential_vault.create(credentials=[], bindings=[])
            out["second_create"] = None
        except Exception as e:  # noqa: BLE001
            out["second_create"] = err(e)
        try:
            await sb.credential_vault.patch(expected_revision=99, credentials={"delete": ["gh"]})
            out["stale_revision"] = None
        except Exception as e:  # noqa: BLE001
            out["stale_revision"] = err(e)
        rotated = await sb.credential_vault.patch(
            expected_revision=1,
            credentials={"replace": [{"name": "gh", "source": {"type": "inline", "value": P["rotated"]}}]},
        )
        out["rotated"] = vault_view(rotated)
        out["rotated_call"] = await curl(sb, f"https://{api}/vault/two")

        await sb.patch_egress_rules([NetworkRule(action="allow", target=other)])
        out["patched"] = policy_view(await sb.get_egress_policy())
        out["other_after_patch"] = await curl(sb, f"https://{other}/y")
        if hasattr(sb, "delete_egress_rules"):
            await sb.delete_egress_rules([other])
            out["deleted"] = policy_view(await sb.get_egress_policy())
            out["other_after_delete"] = await curl(sb, f"https://{other}/z")

        # What the sandbox can see of the credential: nothing in its environment or files.
        ex = await sb.commands.run(
            f"env | grep -c -- '{P['secret']}' ; grep -rIl -- '{P['secret']}' /etc /home /tmp /workspace 2>/dev/null | head -1"
        )
        out["secret_in_sandbox"] = "".join(m.text for m in ex.logs.stdout).strip()

        await sb.credential_vault.delete()
        out["after_vault_delete"] = await curl(sb, f"https://{api}/vault/three")
        try:
            await sb.credential_vault.get()
            out["vault_gone"] = None
        except Exception as e:  # noqa: BLE001
            out["vault_gone"] = err(e)
    finally:
        await sb.kill()
    return out


async def denylist():
    """Allow by default, one host denied by a rule."""
    api, other = P["api"], P["other"]
    out = {"sdk": getattr(opensandbox, "__version__", None)}
    sb = await Sandbox.create(
        IMAGE,
        timeout=timedelta(minutes=5),
        network_policy=NetworkPolicy(
            defaultAction="allow",
            egress=[NetworkRule(action="deny", target=other)],
        ),
    )
    out["id"] = sb.id
    try:
        await trust_upstream(sb)
        out["policy"] = policy_view(await sb.get_egress_policy())
        out["api"] = await curl(sb, f"https://{api}/a")
        out["other"] = await curl(sb, f"https://{other}/b")
        out["other_reason"] = await denied_reason(sb, f"https://{other}/c")
        ex = await sb.commands.run("uname -a; cat /proc/version 2>/dev/null; dmesg 2>/dev/null | head -3")
        out["kernel_log"] = "".join(m.text for m in ex.logs.stdout)
    finally:
        await sb.kill()
    return out


async def refused():
    out = {}
    for name, policy in [
        ("nothing_reachable", NetworkPolicy(defaultAction="deny", egress=[])),
        ("cidr", NetworkPolicy(defaultAction="deny", egress=[NetworkRule(action="allow", target="10.0.0.0/8")])),
    ]:
        try:
            sb = await Sandbox.create(IMAGE, timeout=timedelta(minutes=2), network_policy=policy)
            await sb.kill()
            out[name] = None
        except Exception as e:  # noqa: BLE001
            out[name] = err(e)
    # A sandbox without a network policy has no egress gateway: its policy cannot be read.
    sb = await Sandbox.create(IMAGE, timeout=timedelta(minutes=2))
    try:
        await sb.get_egress_policy()
        out["no_gateway"] = None
    except Exception as e:  # noqa: BLE001
        out["no_gateway"] = err(e)
    finally:
        await sb.kill()
    return out


async def ports():
    """A server the sandbox runs, reached at the endpoint the SDK gives for its port."""
    import httpx

    out = {}
    sb = await Sandbox.create(IMAGE, timeout=timedelta(minutes=2))
    # A server that answers with the headers it was sent.
    server = (
        "import json, http.server\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        body = json.dumps({'path': self.path, 'headers': dict(self.headers)}).encode()\n"
        "        self.send_response(200); self.send_header('Content-Length', str(len(body)))\n"
        "        self.end_headers(); self.wfile.write(body)\n"
        "http.server.HTTPServer(('0.0.0.0', 8765), H).serve_forever()\n"
    )
    try:
        await sb.files.write_file("/tmp/echo.py", server, mode=644)
        await sb.commands.run("exec python3 /tmp/echo.py", opts=RunCommandOpts(background=True))
        ep = await sb.get_endpoint(8765)
        out["endpoint"] = ep.endpoint
        out["header_names"] = sorted(ep.headers)
        # As a client that sends everything it has: the endpoint's headers and the API key.
        sent = {**ep.headers, "OPEN-SANDBOX-API-KEY": os.environ["OPEN_SANDBOX_API_KEY"], "X-Mine": "1"}
        async with httpx.AsyncClient(timeout=10) as client:
            for _ in range(50):
                r = await client.get(f"http://{ep.endpoint}/page?q=1", headers=sent)
                if r.status_code == 200:
                    break
                await asyncio.sleep(0.2)
            out["page"] = r.status_code
            seen = r.json() if r.status_code == 200 else {}
            out["seen_path"] = seen.get("path")
            out["seen_headers"] = sorted(k.lower() for k in seen.get("headers", {}))
            r = await client.get(f"http://{ep.endpoint}/page")
            out["without_headers"] = r.status_code
            execd = await sb.get_endpoint(44772)
            r = await client.get(f"http://{execd.endpoint}/ping", headers=ep.headers)
            out["port_token_on_execd"] = r.status_code
    finally:
        await sb.kill()
    return out


SCENARIOS = {"vault": vault, "denylist": denylist, "refused": refused, "ports": ports}

if __name__ == "__main__":
    import sys

    print(json.dumps(asyncio.run(SCENARIOS[sys.argv[1]]())))
