"""Which OpenAPI links the stateful phase followed (run by run.sh after that phase).

    link_coverage.py DOCUMENT EVENTS [--require all | --require SOURCE>LINK|SOURCE>* ...]

DOCUMENT is the served /api/v1/openapi.json, EVENTS the phase's NDJSON report
(`--report-ndjson-path`). The document's links are read from the document itself: every
`links` entry of every response, named as schemathesis names a transition,
`<METHOD path> -> [<status>] <link name> -> <METHOD target path>`. A link counts as covered as
schemathesis's own "API Links: N covered" counts it: some scenario (not the replay of a failure)
sent a request along it with the link's values applied (the ids it carries; schemathesis
sometimes leaves them out on purpose, as exploration) and got an answer.

Prints `links covered: N/M` (M: the document's links) and what is missing. Exits 1
when a required link is not covered: `--require all` is every link of the document; otherwise
each `--require` names one, as `<source operationId>><link name>` (`create>run`: the `run` link
of `POST /session/`'s response), or all of one operation's, as `<source operationId>>*`.
"""

from __future__ import annotations

import argparse
import json
import sys

METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")


def _operations(doc: dict) -> dict[str, tuple[str, str]]:
    """operationId -> (METHOD, path)."""
    out = {}
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            if method in METHODS and isinstance(op, dict) and "operationId" in op:
                out[op["operationId"]] = (method.upper(), path)
    return out


def _by_ref(doc: dict, ref: str) -> tuple[str, str]:
    """`#/paths/~1session~1/post` -> ("POST", "/session/")."""
    parts = ref.removeprefix("#/").split("/")
    if len(parts) != 3 or parts[0] != "paths":
        raise ValueError(f"operationRef {ref!r} is not #/paths/<path>/<method>")
    path = parts[1].replace("~1", "/").replace("~0", "~")
    return parts[2].upper(), path


def document_links(doc: dict) -> dict[str, str]:
    """Transition id -> `<source operationId>><link name>`, for every link of the document."""
    ops = _operations(doc)
    out = {}
    for path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            if method not in METHODS or not isinstance(op, dict):
                continue
            source = f"{method.upper()} {path}"
            for status, response in (op.get("responses") or {}).items():
                for name, link in ((response or {}).get("links") or {}).items():
                    if "operationId" in link:
                        target = ops[link["operationId"]]
                    else:
                        target = _by_ref(doc, link["operationRef"])
                    tid = f"{source} -> [{status}] {name} -> {target[0]} {target[1]}"
                    out[tid] = f"{op.get('operationId', source)}>{name}"
    return out


def followed(events_path: str) -> set[str]:
    """Transition ids a scenario followed with their values applied, and got an answer to."""
    covered: set[str] = set()
    with open(events_path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                event = json.loads(line)
            except ValueError:
                # A report cut short (schemathesis stopped, a full disk): count what is readable.
                print(f"api-fuzz: warning: {events_path}:{n} is not JSON (a report cut short?)", file=sys.stderr)
                continue
            kind, body = next(iter(event.items()))
            if kind != "ScenarioFinished" or body.get("phase") != "stateful" or body.get("is_final"):
                continue
            recorder = body["recorder"]  # a skipped scenario's has no cases
            for case_id, case in recorder.get("cases", {}).items():
                transition = case.get("transition")
                answered = (recorder.get("interactions", {}).get(case_id) or {}).get("response")
                if transition and case.get("is_transition_applied") and answered:
                    covered.add(transition["id"])
    return covered


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("document")
    parser.add_argument("events")
    parser.add_argument("--require", action="append", default=[], metavar="all|SOURCE>LINK|SOURCE>*")
    args = parser.parse_args()

    with open(args.document, encoding="utf-8") as f:
        links = document_links(json.load(f))
    covered = followed(args.events) & links.keys()
    short = {v: k for k, v in links.items()}

    print(f"api-fuzz: links covered: {len(covered)}/{len(links)} (the links of /api/v1/openapi.json)")

    if args.require == ["all"]:
        required = set(links)
        what = "every link of the document"
    else:
        # `SOURCE>*`: every link of that operation's answers.
        named = {
            r: {t for n, t in short.items() if n == r or (r.endswith(">*") and n.startswith(r[:-1]))}
            for r in args.require
        }
        unknown = [r for r, ts in named.items() if not ts]
        if unknown:
            print(f"api-fuzz: error: required links not in the document: {', '.join(unknown)}", file=sys.stderr)
            return 1
        required = set().union(*named.values())
        got = len(required & covered)
        what = f"the {len(required)} required links"
        print(f"api-fuzz: required links covered: {got}/{len(required)}")

    absent = required - covered
    for tid in sorted(absent):
        print(f"api-fuzz:   not covered: {links[tid]}  ({tid})")
    spare = sorted(links[tid] for tid in links.keys() - covered - required)
    if spare:
        print(f"api-fuzz: not covered, not required here: {' '.join(spare)}")
    if absent:
        print(f"api-fuzz: FAIL: {len(absent)} of {what} not covered", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
