"""Where the suite's time goes: a per-tier and per-module table from pytest's JUnit XML, and the growth alarm.

    python -m pytest --junitxml=test-report.xml ...
    python tests/durations.py test-report.xml                     # the tables
    python tests/durations.py test-report.xml --fail-over 3600    # and exit 1 when the suite's wall time passes 60 min

`.ci/run` runs both after the suite. A test's seconds are its setup + call + teardown (JUnit's default), so a
module-scoped fixture (one shared training run) is charged to the test that first asked for it. Under
pytest-xdist the two workers' seconds add up to about twice the wall time: the tables show each tier's and
module's share of the test-process time, and the header shows the wall time the run took.

The tier is the folder under tests/ (unit, integration, docs; `tests` for files at the top), with `+matrix` for
tests carrying the matrix marker (tests/conftest.py records each test's markers as JUnit properties).
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass

# CI's hard limit is 90 minutes; the alarm rings at two thirds of it, long before a landing is blocked.
DEFAULT_ALARM_S = 3600


@dataclass
class Case:
    module: str  # tests/unit/test_config.py
    name: str
    seconds: float
    outcome: str  # passed | failed | error | skipped
    markers: frozenset[str]

    @property
    def tier(self) -> str:
        parts = self.module.split("/")
        tier = parts[1] if len(parts) > 2 else "tests"
        return f"{tier}+matrix" if "matrix" in self.markers else tier


def _module_of(classname: str, file: str | None) -> str:
    """tests/unit/test_x.py from JUnit's file attribute, or from classname (tests.unit.test_x[.Class])."""
    if file:
        return file
    parts = classname.split(".")
    while parts and not parts[-1].startswith("test_"):
        parts.pop()  # a test class's name
    return "/".join(parts) + ".py" if parts else classname


def read_cases(path: str) -> tuple[list[Case], float]:
    """Every <testcase> of the report, and the suite's wall time (the <testsuite> time attribute)."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    wall = sum(float(s.get("time", 0)) for s in suites)
    cases = []
    for case in root.iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
        markers = frozenset(p.get("value", "") for p in case.iter("property") if p.get("name") == "marker")
        cases.append(Case(_module_of(case.get("classname", ""), case.get("file")), case.get("name", ""),
                          float(case.get("time", 0) or 0), outcome, markers))
    return cases, wall


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}:{seconds % 60:04.1f}"


def table(rows: list[tuple], headers: tuple[str, ...]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows)]
    line = lambda cells: "  ".join(str(c).rjust(w) if i else str(c).ljust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def grouped(cases: list[Case], key) -> list[tuple]:
    groups: dict[str, list[Case]] = defaultdict(list)
    for case in cases:
        groups[key(case)].append(case)
    total = sum(c.seconds for c in cases) or 1.0
    rows = []
    for name, members in sorted(groups.items(), key=lambda kv: -sum(c.seconds for c in kv[1])):
        seconds = sum(c.seconds for c in members)
        counts = defaultdict(int)
        for c in members:
            counts[c.outcome] += 1
        rows.append((name, len(members), counts["passed"], counts["skipped"], counts["failed"] + counts["error"],
                     f"{seconds:.1f}", _minutes(seconds), f"{100 * seconds / total:.1f}%"))
    return rows


def report(cases: list[Case], wall: float, top: int = 25) -> str:
    headers = ("", "tests", "passed", "skipped", "failed", "seconds", "m:s", "share")
    busy = sum(c.seconds for c in cases)
    out = [f"suite wall time {_minutes(wall)} ({wall:.0f} s); test-process time {busy:.0f} s over {len(cases)} tests", "",
           "per tier", table(grouped(cases, lambda c: c.tier), ("tier", *headers[1:])), "",
           "per module", table(grouped(cases, lambda c: c.module), ("module", *headers[1:])), "",
           f"slowest {top} tests",
           table([(f"{c.module}::{c.name}", c.outcome, f"{c.seconds:.1f}")
                  for c in sorted(cases, key=lambda c: -c.seconds)[:top]], ("test", "outcome", "seconds"))]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit_xml", help="the report pytest wrote with --junitxml")
    parser.add_argument("--top", type=int, default=25, help="how many of the slowest tests to list")
    parser.add_argument("--fail-over", type=float, default=None, metavar="SECONDS",
                        help=f"exit 1 when the suite's wall time passes SECONDS (CI: {DEFAULT_ALARM_S})")
    args = parser.parse_args(argv)
    cases, wall = read_cases(args.junit_xml)
    print(report(cases, wall, args.top))
    if args.fail_over is not None and wall > args.fail_over:
        print(f"\nGROWTH ALARM: the test suite took {_minutes(wall)} ({wall:.0f} s), over the {args.fail_over:.0f} s "
              f"alarm (two thirds of CI's 90-minute limit). Find the new cost in the tables above; move what can be "
              f"cheaper to tests/unit, share runs through the equivalence table's cache (tests/integration/"
              f"equivalence), or make the slow path faster, before the suite blocks every landing.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
