"""The sweep driver: an Optuna study whose trials are ordinary detached runs.

Layout::

    <runs_dir>/sweeps/<name>/
      spec.yaml      the sweep's spec, its base config inline (a resume needs no other file)
      optuna.db      Optuna's RDB storage (SQLite): the study, every trial's params, state,
                     intermediate values (the objective at each evaluation) and value
      .driver.lock   flock held by the driver for its life (a second driver of the sweep exits)
      driver.json    the driver's pid

A trial is asked of the study, named ``<name>-t<N>`` (its ``run_name``), and started as a detached
run through ``launch.start_run``, the path of ``cockpit train --detach``: its own run dir, supervisor,
events and summary; status.json ``sweep`` / ``sweep_trial`` name it, and the trial's user attributes
``run_id``. ``parallel`` trials run at once; on a host with GPUs (the queue's inventory,
``$COCKPIT_QUEUE_DEVICES`` included) each gets the free GPUs it needs (``queue.assign``, the GPUs
every active run of the runs dir holds counted), so two trials never share one. With ``launcher:
slurm`` a trial is one Slurm job instead, submitted through ``run.slurm_submit.submit`` (the path of
``cockpit train --slurm``: its run dir created at submission, ``queued`` → ``running`` →
``finished``) with the spec's sbatch options; Slurm places it, the driver assigns no GPU, and
``parallel`` bounds the trials queued or running.

Each turn the driver reads every running trial's new events: each value of the objective (an
``eval`` event's ``eval_loss``, or any field a step / eval / probe event carries) at its step goes to
``trial.report``; when ``trial.should_prune()`` says so, the run is asked to stop through its
control file (``cockpit stop``'s path: a checkpoint saved, state ``stopped``), the trial marked
``prune_requested``, and told ``PRUNED`` once the run has ended. A run that ends ``finished`` tells
its last objective value (COMPLETE); failed, lost, killed or without a value: FAIL.

Resume (``cockpit sweep --resume NAME``): a RUNNING trial of the study names its run (user attribute
``run_id``, or status.json ``sweep_trial`` for one killed between the start and the record) and is
followed again; one whose run never started is started now. So no trial is lost and none runs twice.
No torch, no textual (``check_space``'s planner loads a meta-device model lazily).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from cockpit.errors import InputError, Problem
from cockpit.store.events import EventReader
from cockpit.store.rundir import TERMINAL_STATES, RunDir, atomic_write_json, atomic_write_text, list_runs
from cockpit.sweep.spec import SweepSpec, parse_spec, with_value
from cockpit.sweep.ties import flat_warning, tie_note, tied_with

POLL_S = 1.0
STEP_KINDS = ("step", "eval")  # a bare objective (eval_loss, loss, reward) is a field of these


def sweeps_dir(runs_dir: Path) -> Path:
    return Path(runs_dir).expanduser() / "sweeps"


def sweep_dir(runs_dir: Path, name: str) -> Path:
    return sweeps_dir(runs_dir) / name


def storage_url(path: Path) -> str:
    return f"sqlite:///{path / 'optuna.db'}"


def read_sweep_spec(runs_dir: Path, name: str) -> SweepSpec:
    """The spec a sweep was started with (spec.yaml in its dir); LookupError when there is none."""
    import yaml

    path = sweep_dir(runs_dir, name) / "spec.yaml"
    if not path.is_file():
        known = sorted(p.name for p in sweeps_dir(runs_dir).glob("*") if (p / "spec.yaml").is_file())
        raise LookupError(
            f"no sweep {name!r} in {sweeps_dir(runs_dir)}" + (f" (sweeps: {', '.join(known)})" if known else "")
        )
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    return parse_spec(raw, path.parent, default_name=name)


def optuna_quiet() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def sampler_of(spec: SweepSpec, asked: int = 0) -> Any:
    """The spec's sampler; ``asked``: the trials the study already holds (a resume), which moves the
    seed on, so a resumed seeded sampler does not draw the first trials' values again. The grid's
    seed stays: it shuffles the grid's order, and trial N takes the N-th point of that order, so a
    resumed driver with another seed would ask points already run and skip others."""
    optuna = optuna_quiet()
    if spec.sampler == "grid":
        return optuna.samplers.GridSampler({p.key: p.grid() for p in spec.space}, seed=spec.seed)
    seed = None if spec.seed is None else spec.seed + asked
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=spec.sampler_startup_trials)


def pruner_of(spec: SweepSpec) -> Any:
    optuna = optuna_quiet()
    if spec.pruner == "none":
        return optuna.pruners.NopPruner()
    if spec.pruner == "hyperband":
        max_steps = int(spec.base.get("max_steps") or 0)
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max_steps if max_steps > 0 else "auto")
    return optuna.pruners.MedianPruner(
        n_startup_trials=spec.pruner_startup_trials, n_warmup_steps=spec.pruner_warmup_steps
    )


def open_study(runs_dir: Path, spec: SweepSpec, create: bool = False) -> Any:
    optuna = optuna_quiet()
    path = sweep_dir(runs_dir, spec.name)
    storage = optuna.storages.RDBStorage(storage_url(path), engine_kwargs={"connect_args": {"timeout": 30}})
    kwargs = {"study_name": spec.name, "storage": storage, "sampler": sampler_of(spec), "pruner": pruner_of(spec)}
    if create:
        return optuna.create_study(direction=spec.direction, load_if_exists=True, **kwargs)
    study = optuna.load_study(**kwargs)
    if asked := len(study.get_trials(deepcopy=False)):
        study.sampler = sampler_of(spec, asked)
    return study


def suggest(trial: Any, spec: SweepSpec) -> dict[str, Any]:
    """The trial's values, drawn by the study's sampler from the space."""
    out: dict[str, Any] = {}
    for p in spec.space:
        if p.type == "choice":
            out[p.key] = trial.suggest_categorical(p.key, p.choices)
        elif p.type == "int":
            out[p.key] = trial.suggest_int(p.key, int(p.low or 0), int(p.high or 0), step=int(p.step or 1), log=p.log)
        else:
            out[p.key] = trial.suggest_float(p.key, float(p.low or 0), float(p.high or 0), step=p.step, log=p.log)
    return out


# ------------------------------------------------------------------ the check before any trial


def check_space(spec: SweepSpec, log: Callable[[str], None] = print) -> None:
    """Every config the space bounds (each key at its low / high / every choice, and their
    combinations) passes ``cockpit check``'s static checks, and the one with the largest values
    the full check (model, tokenizer, data); the planner's largest trial fits the device. Raises
    InputError naming the key and the value that breaks it."""
    from cockpit.preflight.checks import check_run, static_checks

    corners = spec.corner_params()
    problems: list[Problem] = []
    configs = []
    for params in corners:
        try:
            cfg = spec.trial_config(params)
        except InputError as err:  # its problems name the trial's values already
            problems += err.problems
            continue
        try:
            static_checks(cfg)
            configs.append((params, cfg))
        except InputError as err:
            problems += [with_value(p, params) if not (p.key or "").startswith("space.") else p for p in err.problems]
    if problems:
        raise InputError(dedup(problems))
    log(f"sweep {spec.name}: {len(corners)} corner configs of the space pass the static checks")
    if flat := flat_warning(spec.objective, [(params, cfg.mapping()) for params, cfg in configs]):
        log(f"sweep {spec.name}: warning: {flat}")
    params, cfg = largest(configs)
    try:
        check_run(cfg, log=lambda *_: None)
    except InputError as err:
        raise InputError([with_value(p, params) for p in err.problems]) from None
    plan_largest(spec, configs, log)


def dedup(problems: list[Problem]) -> list[Problem]:
    out: list[Problem] = []
    for p in problems:
        if str(p) not in {str(q) for q in out}:
            out.append(p)
    return out


def largest(configs: list[tuple[dict[str, Any], Any]]) -> tuple[dict[str, Any], Any]:
    """The corner whose numeric values are highest (most memory, the largest rank)."""

    def size(item: tuple[dict[str, Any], Any]) -> tuple[float, ...]:
        return tuple(
            float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0 for v in item[0].values()
        )

    return max(configs, key=lambda item: sum(size(item)))


def plan_largest(spec: SweepSpec, configs: list[tuple[dict[str, Any], Any]], log: Callable[[str], None]) -> None:
    """The planner's verdict on each corner config; a sweep with one that does not fit is refused,
    with the values. GPU runs without ``gpu_memory`` have no verdict (as ``cockpit plan``)."""
    from cockpit.plan import plan

    worst: tuple[float, dict[str, Any], dict[str, Any]] | None = None
    for params, cfg in configs:
        try:
            d = plan(cfg, gpu_memory_gb=spec.gpu_memory, suggest=False).as_dict()
        except InputError:
            continue  # a model the planner cannot size: the check above passed it
        v = d.get("verdict")
        if v and (worst is None or d["peak_bytes"] > worst[0]):
            worst = (d["peak_bytes"], params, d)
    if worst is None:
        return
    peak, params, d = worst
    v = d["verdict"]
    values = ", ".join(f"{k}={val!r}" for k, val in params.items())
    if v["status"] == "does not fit":
        raise InputError(
            Problem(
                f"the largest trial ({values}) does not fit: planned peak {peak / 2**30:.2f} GiB per device "
                f"over {v['capacity_bytes'] / 2**30:.3g} GiB; narrow the space",
                key="space",
            )
        )
    log(f"sweep {spec.name}: the largest trial ({values}) plans {peak / 2**30:.2f} GiB per device: {v['status']}")


# ------------------------------------------------------------------ the driver


def asked(study: Any) -> int:
    """The trials of the budget the study has asked: a trial enqueued (``study.enqueue_trial``, WAITING)
    counts once the driver asks it."""
    import optuna

    waiting = optuna.trial.TrialState.WAITING
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state != waiting)


@contextmanager
def driver_lock(path: Path) -> Iterator[None]:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path / ".driver.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"sweep {path.name} already has a driver (driver.json); stop it first") from None
        atomic_write_json(path / "driver.json", {"pid": os.getpid(), "started": time.time()})
        yield
    finally:
        os.close(fd)


class Driver:
    def __init__(self, runs_dir: Path, spec: SweepSpec, log: Callable[[str], None] = print, poll_s: float = POLL_S):
        self.runs_dir = Path(runs_dir).expanduser()
        self.spec = spec
        self.log = log
        self.poll_s = poll_s
        self.path = sweep_dir(self.runs_dir, spec.name)
        self.readers: dict[int, EventReader] = {}
        self.last_step: dict[int, int] = {}
        self.inventory: list[str] | None = None
        self.used_up = False  # the grid sampler asked the study to stop: every grid point has been asked

    # ---- setup
    def create(self) -> Any:
        self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        import yaml

        atomic_write_text(self.path / "spec.yaml", yaml.safe_dump(self.spec.as_dict(), sort_keys=False))
        return open_study(self.runs_dir, self.spec, create=True)

    def run(self, study: Any) -> int:
        """Drive the study until every trial of the budget has ended; returns the count of trials."""
        from cockpit.run.queue import host_gpus

        self.inventory = host_gpus()
        budget = self.spec.budget()  # a grid: at most its size
        with driver_lock(self.path):
            while True:
                active = self.follow(study)
                started = asked(study)
                while len(active) < self.spec.parallel and started < budget and not self.used_up:
                    gpus = self.free_gpus(len(active))
                    if gpus is False:
                        break
                    trial = study.ask()
                    self.start(study, trial.number, trial._trial_id, suggest(trial, self.spec), gpus)
                    active.append(trial.number)
                    started += 1
                if not active and (started >= budget or self.used_up):
                    break
                time.sleep(self.poll_s)
        return started

    def free_gpus(self, active: int) -> list[str] | None | Literal[False]:
        """The GPUs the next trial gets (None: the environment's, a CPU run), or False to wait."""
        from cockpit.run.queue import ALL, assign, gpus_needed, held_gpus

        if not self.inventory or self.spec.launcher == "slurm":
            return None  # no GPU here, or Slurm's to give
        need = gpus_needed(self.spec.trial_config({p.key: p.corners()[0] for p in self.spec.space}))
        if need == ALL:
            return None  # CPU trials: `parallel` of them share the host
        given = assign(self.inventory, held_gpus(self.runs_dir, self.inventory), [need])
        return given[0] if given else False

    def start(self, study: Any, number: int, trial_id: int, params: dict[str, Any], gpus: list[str] | None) -> None:
        from cockpit.config.load import dump_resolved
        from cockpit.run.launch import start_run

        name = f"{self.spec.name}-t{number}"
        cfg = self.spec.trial_config(params, run_name=name)
        (self.path / "trials").mkdir(exist_ok=True, mode=0o700)
        atomic_write_text(self.path / "trials" / f"t{number}.yaml", dump_resolved(cfg))  # paths resolved
        study._storage.set_trial_user_attr(trial_id, "run_name", name)
        config_path = str(self.path / "trials" / f"t{number}.yaml")
        extra = {"sweep": self.spec.name, "sweep_trial": number}
        if self.spec.launcher == "slurm":
            from cockpit.run.slurm_submit import SubmitRefused, submit

            try:
                run, job = submit(
                    cfg, self.spec.slurm_options(), config_path=config_path, runs_dir=self.runs_dir, status_extra=extra
                )
            except SubmitRefused as exc:  # its run dir says failed (found by sweep_trial): the trial fails
                self.log(f"trial {number}: sbatch refused the job: {exc}")
                return
            on = f" as Slurm job {job}"
        else:
            run = start_run(cfg, config_path=config_path, runs_dir=self.runs_dir, status_extra=extra, gpus=gpus)
            on = f" on GPU {','.join(gpus)}" if gpus else ""
        study._storage.set_trial_user_attr(trial_id, "run_id", run.run_id)
        shown = ", ".join(f"{k}={_short(v)}" for k, v in params.items())
        self.log(f"trial {number}: run {run.run_id}{on} ({shown})")

    # ---- following
    def follow(self, study: Any) -> list[int]:
        """Read every running trial's run: report new objective values, prune, tell the ends.
        Returns the numbers of the trials still running."""
        import optuna

        active: list[int] = []
        for ft in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            run = self.trial_run(ft)
            if run is None:  # asked, never started (the driver died in between): start it now
                gpus = self.free_gpus(len(active))
                if gpus is not False:
                    self.start(study, ft.number, ft._trial_id, dict(ft.params), gpus)
                active.append(ft.number)
                continue
            if self.step_trial(study, ft, run):
                active.append(ft.number)
        return active

    def trial_run(self, ft: Any) -> RunDir | None:
        run_id = ft.user_attrs.get("run_id")
        if run_id and (self.runs_dir / run_id / "status.json").exists():
            return RunDir(self.runs_dir / run_id)
        for run in list_runs(self.runs_dir):  # started, killed before the record
            st = run.read_status()
            if st.get("sweep") == self.spec.name and st.get("sweep_trial") == ft.number:
                return run
        return None

    def step_trial(self, study: Any, ft: Any, run: RunDir) -> bool:
        """One look at a running trial; False once it has been told its end."""
        import optuna

        from cockpit.run.liveness import reconcile
        from cockpit.slurm.queue import effective_status

        status = reconcile(run, status=effective_status(run))  # the scheduler's word (a Slurm trial), then liveness
        trial = optuna.trial.Trial(study, ft._trial_id)
        reported = dict(ft.intermediate_values)
        state = status.get("state")
        pruning = bool(ft.user_attrs.get("prune_requested"))
        judging = not pruning and state not in TERMINAL_STATES
        prune_at = None
        # each new value reported and judged at its own step: the pruner compares a trial's last step
        # only, so values read in a burst (a slow turn, squeue under load) judged at the last would
        # pass the steps where the earlier trials have values, and the trial would never be pruned
        for step, value in self.objective_values(ft.number, run):
            if step not in reported:
                trial.report(value, step)
                reported[step] = value
                if judging and prune_at is None and trial.should_prune():
                    prune_at = step
        if state not in TERMINAL_STATES:
            if prune_at is not None:
                study._storage.set_trial_user_attr(ft._trial_id, "prune_requested", prune_at)
                stop_trial(run, status, f"sweep {self.spec.name}: pruned at step {prune_at}")
                self.log(
                    f"trial {ft.number}: pruned at step {prune_at} ({self.spec.objective} {reported[prune_at]:.4g})"
                )
            return True
        last = reported[max(reported)] if reported else None
        if pruning and state in ("stopped", "finished", "cancelled"):
            self.tell(study, trial, state=optuna.trial.TrialState.PRUNED)
            self.log(f"trial {ft.number}: {state} (pruned), its checkpoint kept")
        elif state == "finished" and last is not None:
            self.tell(study, trial, last)
            self.log(f"trial {ft.number}: finished, {self.spec.objective} {last:.4g}")
        else:
            why = status.get("reason") or (f"no {self.spec.objective} in its events" if state == "finished" else state)
            study._storage.set_trial_user_attr(ft._trial_id, "fail_reason", f"{state}: {why}")
            self.tell(study, trial, state=optuna.trial.TrialState.FAIL)
            self.log(f"trial {ft.number}: {state} ({why})")
        self.readers.pop(ft.number, None)
        return False

    def tell(self, study: Any, trial: Any, value: float | None = None, state: Any = None) -> None:
        """``study.tell``, and the stop the grid sampler asks for once every point of its grid has been
        asked: ``GridSampler.after_trial`` calls ``study.stop()``, which raises outside ``optimize()``
        (the driver asks and tells; Optuna's GridSampler docs, optuna/optuna#4121). Optuna stores the
        trial's end before that raises (``_tell_with_warning``'s ``finally``); the driver then asks no
        more trials and ends once the running ones have."""
        try:
            study.tell(trial, value, state=state)
        except RuntimeError as err:
            told = study._storage.get_trial(trial._trial_id).state.is_finished()
            if "Study.stop" not in str(err) or not told:
                raise
            if not self.used_up:
                self.log(f"sweep {self.spec.name}: the grid is used up (every point asked); no more trials")
            self.used_up = True

    def objective_values(self, number: int, run: RunDir) -> list[tuple[int, float]]:
        """The objective's new (step, value) pairs in the run's events."""
        reader = self.readers.setdefault(number, EventReader(run.events_path))
        points, self.last_step[number] = objective_points(
            reader.read_new(), self.spec.objective, self.last_step.get(number, 0)
        )
        return points


def stop_trial(run: RunDir, status: dict[str, Any], why: str) -> None:
    """Stop a trial's run as ``cockpit stop`` does: a Slurm job still in the queue is cancelled
    (scancel), a running run asked to save a checkpoint and stop (its control file)."""
    from cockpit.slurm.queue import cancel, job_id

    job = job_id(status)
    if job and status.get("state") in ("queued", "submitting"):
        cancel(run, job, why)
    else:
        run.request("stop", why)


def objective_points(
    events: list[dict[str, Any]], metric: str, last_step: int = 0
) -> tuple[list[tuple[int, float]], int]:
    """The objective's (step, value) pairs in ``events``, and the last step seen. ``metric``: a field
    of the step / eval events (``eval_loss``, ``loss``, ``reward``), or ``kind.field``, a field of one
    event kind (``probe_results.rate``, ``held_out.accuracy``): such an event of phase ``before`` (asked
    before training) is no value of the trial, and one without a step counts after the last step seen."""
    kind, _, field = metric.rpartition(".")
    out = []
    for ev in events:
        step = ev.get("step")
        if isinstance(step, int):
            last_step = max(last_step, step)
        if (ev.get("kind") != kind if kind else ev.get("kind") not in STEP_KINDS) or ev.get("phase") == "before":
            continue
        value = ev.get(field)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out.append((step if isinstance(step, int) else last_step + 1, float(value)))
    return out, last_step


def _short(v: Any) -> str:
    from cockpit.cells import value_text

    return value_text(v)  # the digits the Sweep screen and `cockpit sweep status` show


# ------------------------------------------------------------------ status and the best trial


def status(runs_dir: Path, name: str) -> dict[str, Any]:
    """The sweep as ``cockpit sweep status`` shows it: each trial (number, run, params, state,
    objective, steps) and the best so far."""
    spec = read_sweep_spec(runs_dir, name)
    study = open_study(runs_dir, spec)
    rows = []
    for ft in study.get_trials(deepcopy=False):
        run_id = ft.user_attrs.get("run_id")
        st = RunDir(Path(runs_dir) / run_id).read_status() if run_id and (Path(runs_dir) / run_id).is_dir() else {}
        inter = ft.intermediate_values
        state = ft.state.name.lower()
        if state == "running" and ft.user_attrs.get("prune_requested") is not None:
            state = "pruning"
        rows.append(
            {
                "number": ft.number,
                "run_id": run_id,
                "params": dict(ft.params),
                "state": state,
                "run_state": st.get("state"),
                "objective": ft.value if ft.value is not None else (inter[max(inter)] if inter else None),
                "steps": st.get("step"),
                "reason": ft.user_attrs.get("fail_reason"),
            }
        )
    best = best_trial(study)
    tied = best_ties(study, best)
    driver = {}
    try:
        driver = json.loads((sweep_dir(runs_dir, name) / "driver.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    return {
        "name": name,
        "objective": spec.objective,
        "direction": spec.direction,
        "trials_budget": spec.budget(),
        "grid_points": spec.grid_points(),
        "parallel": spec.parallel,
        "trials": rows,
        "best": None
        if best is None
        else {
            "number": best.number,
            "value": best.value,
            "params": dict(best.params),
            "run_id": best.user_attrs.get("run_id"),
            "tied_with": tied,
            "tie": tie_note(spec.objective, tied, sum(1 for t in rows if t["state"] == "complete")),
        },
        "importance": importance(study),
        "driver_alive": _alive(driver.get("pid")),
    }


IMPORTANCE_MIN_TRIALS = 4  # completed trials before the parameters' importance is worth showing


def importance(study: Any) -> dict[str, Any] | None:
    """Each parameter's share of the objective's variation over the completed trials
    (``optuna.importance.get_param_importances``, values summing to 1, the largest first), or None
    below :data:`IMPORTANCE_MIN_TRIALS`. PED-ANOVA: Optuna's evaluator that needs no scikit-learn
    (its default, fANOVA, does; the ``sweep`` extra installs Optuna alone)."""
    import warnings

    import optuna

    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(done) < IMPORTANCE_MIN_TRIALS:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PED-ANOVA is experimental in Optuna 4
        try:
            found = optuna.importance.get_param_importances(
                study, evaluator=optuna.importance.PedAnovaImportanceEvaluator()
            )
        except (ValueError, RuntimeError):  # e.g. every completed trial has the same values
            return None
    return {"evaluator": "ped-anova", "trials": len(done), "params": {k: float(v) for k, v in found.items()}}


def _alive(pid: Any) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def best_trial(study: Any) -> Any:
    import optuna

    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not done:
        return None
    best = study.best_trial  # among equal values the lowest-numbered (Optuna's SQL leaves their order open)
    return min((t for t in done if t.value == best.value), key=lambda t: t.number)


def best_ties(study: Any, best: Any) -> list[int]:
    """The completed trials whose objective equals the best's (``ties.tied_with``)."""
    import optuna

    return tied_with(best, study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))


def best_preset(runs_dir: Path, name: str) -> tuple[Any, str | None, str]:
    """The best trial, what it ties with (``ties.tie_note``, or None) and its config as a preset's YAML
    (the keys that differ from the defaults, without the trial's run name); LookupError when no trial
    has completed."""
    import optuna

    from cockpit.config.load import to_yaml

    spec = read_sweep_spec(runs_dir, name)
    study = open_study(runs_dir, spec)
    best = best_trial(study)
    if best is None:
        raise LookupError(f"sweep {name}: no trial has completed yet")
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    tie = tie_note(spec.objective, tied_with(best, done), len(done))
    cfg = spec.trial_config(best.params).keys_only()
    cfg.pop("run_name", None)
    head = f"# sweep {name}, trial {best.number}: {spec.objective} {best.value:.6g} ({', '.join(f'{k}={_short(v)}' for k, v in best.params.items())})\n"
    return best, tie, head + (f"# {tie}\n" if tie else "") + to_yaml(cfg)


def main_log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True, file=sys.stdout)
