"""A run's lifecycle: three processes, one contract.

The UI / CLI starts a run (:mod:`.launch`), a detached supervisor owns it (:mod:`.supervisor`,
with :mod:`.watchdog`), the ranks train (``cockpit.train.worker``), and they meet only in the
run directory (:mod:`.rundir`: config, status, logs, checkpoints; :mod:`.events`: the append-only
event log). Every reader checks that the run's owner is alive (:mod:`.liveness`, deciding with the
pure :mod:`.runstate`) and follows it (:mod:`.follow`). A Slurm run is submitted by
:mod:`.slurm_submit` and entered on each node by :mod:`.slurm_node`. Nothing here imports torch or
textual (the import contracts in pyproject.toml hold it to that). What ``cockpit check`` verifies
before a launch lives one layer up, in ``cockpit.preflight``.
"""
