"""A launch says its stages as they happen (issue 62, item 8): Setup's F8 runs `cockpit train --detach
--json --progress`, whose stderr lines (`stage: ...`) reach the screen while the command runs
(`warm_start.run(on_stderr=...)`, warm or cold), instead of one "launching ..." for the whole launch."""

from __future__ import annotations

import os
import sys

import pytest
from conftest import WARM_START_ENV, wait_for

from cockpit.run import warm_start

CHILD = """
import os, sys, time
print("stage: one", file=sys.stderr, flush=True)
deadline = time.time() + 30
while not os.path.exists("go") and time.time() < deadline:
    time.sleep(0.05)
print("stage: two" if os.path.exists("go") else "stage: nobody read the first line in time", file=sys.stderr, flush=True)
print("done")
"""


@pytest.mark.parametrize("how", ["warm", "cold"])
def test_stderr_lines_reach_the_caller_while_the_command_runs(tmp_path, how, warm_start_server):
    """The child waits for the file the caller makes when it reads the child's first line: read only
    at the end, the child would say it was never answered."""
    (tmp_path / "stage_child.py").write_text(CHILD)
    env = dict(os.environ)
    env.pop(warm_start.ENV_VAR, None)
    if how == "warm":
        if warm_start_server is None:
            pytest.skip("COCKPIT_TEST_WARM_START=0: no warm start server")
        wait_for(lambda: os.path.exists(warm_start_server), 60, "the warm start server's socket")
        env = dict(WARM_START_ENV, COCKPIT_WARM_START=warm_start_server)  # not os.environ: a test may leak into it
    lines: list[str] = []

    def said(line: str) -> None:
        lines.append(line)
        if line == "stage: one":
            (tmp_path / "go").touch()

    res = warm_start.run([sys.executable, "-m", "stage_child"], env, str(tmp_path), 60, on_stderr=said)
    assert res.returncode == 0 and res.stdout == "done\n"
    assert lines == ["stage: one", "stage: two"], lines
    assert res.stderr == "stage: one\nstage: two\n"
    if how == "warm":
        assert warm_start.last_refusal is None, warm_start.last_refusal  # it did run warm


def test_the_launch_says_its_first_stage_and_the_refusal(tmp_path):
    """Through the cockpit's own call (cli_calls.train_detached, as F8 makes it): the stage is said
    as it begins; a refused config ends there (exit 2), with no run dir."""
    from cockpit.ui import cli_calls

    cfg = tmp_path / "bad.yaml"
    cfg.write_text("model_name_or_path: /nonexistent/model\nstage: sft\nfinetuning_type: lora\nlerning_rate: 1e-4\n")
    stages: list[str] = []
    res = cli_calls.train_detached(cfg, tmp_path / "runs", timeout=120, on_stage=stages.append)
    assert res.rc == 2 and "lerning_rate" in res.stderr
    assert stages[0] == "stage: checking the config and every data row", stages
    assert not any("supervisor" in s for s in stages) and not (tmp_path / "runs").exists()
