"""Issue 62, item 9's small things outside the cockpit's screens."""

from __future__ import annotations

import os

from cockpit.config.run_config import RunConfig


def test_more_loader_workers_than_cores_get_a_note_at_check():
    """dataloader_num_workers beside each rank: more processes than this machine's cores is said at
    check (this box's own cores: as many workers as cores always exceeds them with the rank)."""
    from cockpit.preflight.checks import static_checks

    cores = len(os.sched_getaffinity(0))
    said = [w for w in static_checks(RunConfig(dataloader_num_workers=cores)) if "dataloader_num_workers" in w]
    assert said and f"{cores + 1} processes on {cores} CPU cores" in said[0], said
    assert not [w for w in static_checks(RunConfig(dataloader_num_workers=0)) if "dataloader_num_workers" in w]
    assert not [w for w in static_checks(RunConfig(dataloader_num_workers=cores), gpus=0) if "dataloader" in w]  # a Slurm node's cores


def test_a_swept_learning_rate_prints_the_same_digits_everywhere():
    """The sweep's driver log ("trial 3: learning_rate=..."), `cockpit sweep status` and the Sweep
    screen print a swept value through one formatter: 9.73e-05 in the log and 9.732e-05 on screen before."""
    from cockpit.commands.sweep import _cell
    from cockpit.sweep.driver import _short
    from cockpit.ui.screens.sweep import cell

    for value, text in ((9.7321e-05, "9.732e-05"), (0.25, "0.25"), (16, "16"), ("cosine", "cosine")):
        assert _short(value) == _cell(value) == cell(value) == text
