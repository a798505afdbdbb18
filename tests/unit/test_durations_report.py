"""tests/durations.py: the per-tier and per-module time table .ci/run prints, and its growth alarm."""

from __future__ import annotations

import pytest

from tests import durations

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="4" time="3700.5">
<testcase classname="tests.unit.test_config" name="test_a" time="2.0"/>
<testcase classname="tests.unit.test_config" name="test_b" time="1.0"><skipped message="no GPU"/></testcase>
<testcase classname="tests.integration.equivalence.test_layouts.TestDataParallel" name="test_matches_reference[dp2-zero3]"
          time="30.0"><properties><property name="marker" value="slow"/></properties></testcase>
<testcase classname="tests.integration.test_multinode" name="test_two_nodes" time="60.0">
<properties><property name="marker" value="slow"/><property name="marker" value="matrix"/></properties>
<failure message="boom"/></testcase>
</testsuite></testsuites>
"""


@pytest.fixture
def report(tmp_path):
    path = tmp_path / "report.xml"
    path.write_text(REPORT)
    return str(path)


def test_tables_group_by_tier_and_module(report, capsys):
    assert durations.main([report]) == 0
    out = capsys.readouterr().out
    assert out.startswith("suite wall time 61:40.5 (3700 s); test-process time 93 s over 4 tests")
    lines = out.splitlines()
    tier = {line.split()[0]: line.split() for line in lines if line.startswith(("unit ", "integration"))}
    assert tier["unit"][1:6] == ["2", "1", "1", "0", "3.0"]  # tests, passed, skipped, failed, seconds
    assert tier["integration"][1:6] == ["1", "1", "0", "0", "30.0"]
    assert tier["integration+matrix"][1:6] == ["1", "0", "0", "1", "60.0"]
    assert any(line.startswith("tests/integration/equivalence/test_layouts.py ") for line in lines)


def test_the_growth_alarm_fails_past_its_limit(report, capsys):
    assert durations.main([report, "--fail-over", "3600"]) == 1
    assert "GROWTH ALARM: the test suite took 61:40.5 (3700 s), over the 3600 s alarm" in capsys.readouterr().err
    assert durations.main([report, "--fail-over", "4000"]) == 0
