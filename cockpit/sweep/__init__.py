"""Sweeps: many runs of one base config over a search space, driven by Optuna (issue 55).

``spec``: the sweep's YAML (base config, space, objective, trials, parallel, sampler, pruner), its
validation and every trial's config; ``driver``: the Optuna study in ``<runs>/sweeps/<name>/optuna.db``
(SQLite), the trials as ordinary detached runs, pruning through the run's stop request, status and
the best trial as a preset. The driver imports no torch and no textual itself (the planner's
meta-device model is lazy, in the check before the first trial).
"""
