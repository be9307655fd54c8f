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
