"""The per-test time budget (tests/budget.py), through a real pytest run of a small test file with the
module loaded as a plugin: a test past its budget x slack fails, one past its budget but inside the slack
passes and is named `over budget`, a budget without a reason is refused at collection, and an unmarked
test gets the default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

TESTS = '''
import time
import pytest

@pytest.mark.budget(0.5, reason="a sleep of 0.7 s: past its budget, inside the slack")
def test_late_but_inside_the_slack():
    time.sleep(0.7)

@pytest.mark.budget(0.5, reason="a sleep of 5 s: past the slack")
def test_past_the_slack():
    time.sleep(5)

def test_unmarked_gets_the_default(request):
    assert request.node.get_closest_marker("timeout").args[0] == 60 * 2
'''


def run_pytest(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": str(HERE), "COCKPIT_TEST_BUDGET_SLACK": "2"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "budget", "-p", "no:cacheprovider", "-p", "no:randomly", "test_sample.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )


def test_a_test_past_its_budget_times_the_slack_fails_and_one_inside_is_named(tmp_path):
    res = run_pytest(tmp_path, TESTS)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "1 failed, 2 passed" in out, out
    assert "FAILED test_sample.py::test_past_the_slack" in out and "Timeout" in out, out
    assert "over budget (1)" in out and "(budget 0.5 s)  test_sample.py::test_late_but_inside_the_slack" in out, out


def test_a_budget_without_a_reason_is_refused_at_collection(tmp_path):
    res = run_pytest(tmp_path, "import pytest\n\n@pytest.mark.budget(90)\ndef test_x():\n    pass\n")
    out = res.stdout + res.stderr
    assert res.returncode == 4, out  # pytest's usage error
    assert "needs reason=" in out and "test_x" in out, out
