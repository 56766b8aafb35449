#!/usr/bin/env python3
"""Per-binary times of a nextest run, from its JUnit report (default target/nextest/ci/junit.xml).

    scripts/test-times.py [JUNIT_XML]

One line per test binary, longest first: its tests, failures, wall time (first start to last
end: binaries run side by side, so these overlap) and the sum of its tests' times (what it would
take alone with one thread). Quiet, exit 0, when the report does not exist (nothing ran).
"""
import sys
import xml.etree.ElementTree as ET
from datetime import datetime

path = sys.argv[1] if len(sys.argv) > 1 else "target/nextest/ci/junit.xml"
try:
    root = ET.parse(path).getroot()
except FileNotFoundError:
    sys.exit(0)
except ET.ParseError as e:
    print(f"test-times: {path}: {e}", file=sys.stderr)
    sys.exit(0)


def stamp(text):
    return datetime.fromisoformat(text).timestamp()


rows = []
for suite in root.iter("testsuite"):
    starts, ends, total, failed, count = [], [], 0.0, 0, 0
    for case in suite.iter("testcase"):
        count += 1
        took = float(case.get("time") or 0)
        total += took
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        if case.get("timestamp"):
            start = stamp(case.get("timestamp"))
            starts.append(start)
            ends.append(start + took)
    wall = max(ends) - min(starts) if starts else total
    rows.append((wall, suite.get("name", "?"), count, failed, total))

rows.sort(reverse=True)
width = max([len(r[1]) for r in rows] + [6])
print(f"\nTest times by binary ({path}), longest wall time first:")
print(f"  {'binary':<{width}}  tests  failed      wall   test-time")
for wall, name, count, failed, total in rows:
    print(f"  {name:<{width}}  {count:>5}  {failed:>6}  {wall:>7.1f}s  {total:>9.1f}s")
run = root.get("time")
if run:
    tests = sum(r[2] for r in rows)
    failed = sum(r[3] for r in rows)
    print(f"  {'(the run)':<{width}}  {tests:>5}  {failed:>6}  {float(run):>7.1f}s")
