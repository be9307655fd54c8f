"""A run's lifecycle: three processes, one contract.

The UI / CLI starts a run (:mod:`.launch`), a detached supervisor owns it (:mod:`.supervisor`,
with :mod:`.watchdog`), the ranks train (``cockpit.train.worker``), and they meet only in the
run directory (:mod:`.rundir`: config, status, logs, checkpoints; :mod:`.events`: the append-only
event log). Every reader checks that the run's owner is alive (:mod:`.liveness`, deciding with the
pure :mod:`.runstate`) and follows it (:mod:`.follow`). :mod:`.preflight` is what ``cockpit check``
verifies before a launch. Nothing here imports torch or textual (preflight loads a tokenizer,
lazily; the import contracts in pyproject.toml hold the rest to it).
"""
