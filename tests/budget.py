"""Each test's time budget (issue 51): 60 s unless the test says otherwise with
``@pytest.mark.budget(seconds, reason="...")``; a marked test must say why it needs more.

Enforced through pytest-timeout: a test (its fixtures' set-up included) fails once it has run
``budget * slack`` seconds, slack ``COCKPIT_TEST_BUDGET_SLACK`` (default 3: a loaded 2-core box runs a test
two to three times slower than a quiet one). A test past its budget but inside the slack passes and is named
at the end of the run (``over budget``), with its time and its budget, so a slow creep shows before it fails.

tests/conftest.py applies it to the suite; a pytest run elsewhere loads it with ``-p budget`` (the
module's hooks), as tests/test_budget.py does.
"""

from __future__ import annotations

import os

import pytest

DEFAULT_BUDGET_S = 60.0


def slack() -> float:
    return float(os.environ.get("COCKPIT_TEST_BUDGET_SLACK", "3"))


def budget_of(item: pytest.Item) -> float:
    """The test's budget in seconds: its ``budget`` mark's, else the default. A mark without a reason, or
    with a budget that is not a positive number, is a usage error raised at collection."""
    mark = item.get_closest_marker("budget")
    if mark is None:
        return DEFAULT_BUDGET_S
    seconds = mark.args[0] if mark.args else mark.kwargs.get("seconds")
    reason = mark.kwargs.get("reason") or (mark.args[1] if len(mark.args) > 1 else "")
    if not isinstance(seconds, (int, float)) or seconds <= 0:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.budget needs a positive number of seconds, got {seconds!r}")
    if not str(reason).strip():
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.budget({seconds}) needs reason=... (why this test needs more than {DEFAULT_BUDGET_S:.0f} s)")
    return float(seconds)


def apply_budgets(items: list[pytest.Item]) -> None:
    """Give each test a pytest-timeout of budget x slack (a test's own ``timeout`` mark wins) and record its
    budget in its report's user_properties (the controller of an xdist run reads it from there)."""
    factor = slack()
    for item in items:
        seconds = budget_of(item)
        item.user_properties.append(("budget_s", seconds))
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(seconds * factor))


def over_budget(reports) -> list[tuple[float, float, str]]:
    """(seconds, budget, test id) for each test whose call took longer than its budget."""
    spent: dict[str, float] = {}
    budget: dict[str, float] = {}
    for report in reports:
        spent[report.nodeid] = spent.get(report.nodeid, 0.0) + getattr(report, "duration", 0.0)
        for name, value in getattr(report, "user_properties", ()):
            if name == "budget_s":
                budget[report.nodeid] = float(value)
    return sorted(((spent[n], budget[n], n) for n in budget if spent.get(n, 0.0) > budget[n]), reverse=True)


def report_over_budget(terminalreporter) -> None:
    reports = [r for r in terminalreporter.stats.get("passed", ()) if getattr(r, "when", "") == "call"]
    late = over_budget(reports)
    if not late:
        return
    terminalreporter.write_sep("-", f"over budget ({len(late)}): past its budget, inside the slack x{slack():g}")
    for seconds, limit, nodeid in late:
        terminalreporter.write_line(f"{seconds:7.1f} s  (budget {limit:g} s)  {nodeid}")


# ---- hooks, for `pytest -p budget` (tests/conftest.py calls the functions above itself) ----------------
def pytest_configure(config):
    config.addinivalue_line("markers", "budget(seconds, reason): this test's time budget when above 60 s, and why")


def pytest_collection_modifyitems(config, items):
    apply_budgets(items)


def pytest_terminal_summary(terminalreporter):
    report_over_budget(terminalreporter)
