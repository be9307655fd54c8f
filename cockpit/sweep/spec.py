"""A sweep's spec: the YAML ``cockpit sweep SPEC.yaml`` reads, validated, and each trial's config.

::

    name: lr-rank                  # default: the spec file's stem
    base: sft.yaml                 # a config path (relative to the spec) or an inline mapping of keys
    space:
      learning_rate: {type: float, low: 1.0e-5, high: 1.0e-2, log: true}
      lora_rank: {type: choice, choices: [4, 8, 16]}
      warmup_steps: {type: int, low: 0, high: 20, step: 5}
    objective: eval_loss           # any metric the run's events carry (default eval_loss)
    direction: minimize            # or maximize
    trials: 12
    parallel: 2
    sampler: tpe                   # tpe | random | grid
    sampler_startup_trials: 10     # tpe: trials that end before TPE models them (random until then)
    pruner: median                 # median | hyperband | none
    pruner_startup_trials: 5       # median: trials that finish before any is pruned
    pruner_warmup_steps: 0         # median: steps of a trial before it may be pruned
    seed: 0
    gpu_memory: 64                 # GiB of one device for the planner (default: none; a CPU run: the host's RAM)
    launcher: slurm                # local (default): detached runs on this host | slurm: one sbatch job a trial
    slurm:                         # launcher slurm: the sbatch options of ``cockpit train --slurm``
      partition: gpu
      time: "1:00:00"
      account: proj
      qos: normal
      cpus_per_task: 8
      exclusive: false             # default true (sbatch --exclusive)
      sbatch_args: [--constraint=mi300x]

No torch, no textual.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.errors import InputError, Problem

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "hyperband", "none")
LAUNCHERS = ("local", "slurm")
# the ``slurm:`` mapping: cockpit train's --partition --time --account --qos --cpus-per-task
# --no-exclusive --sbatch-arg, by their SlurmOptions names (the type each must have)
SLURM_KEYS: dict[str, type] = {
    "partition": str,
    "time": str,
    "account": str,
    "qos": str,
    "cpus_per_task": int,
    "exclusive": bool,
    "sbatch_args": list,
}
TYPES = ("float", "int", "choice")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
TOP_KEYS = {
    "name",
    "base",
    "space",
    "objective",
    "direction",
    "trials",
    "parallel",
    "sampler",
    "sampler_startup_trials",
    "pruner",
    "pruner_startup_trials",
    "pruner_warmup_steps",
    "seed",
    "gpu_memory",
    "launcher",
    "slurm",
}


@dataclass
class Param:
    key: str
    type: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: list[Any] = field(default_factory=list)

    def corners(self) -> list[Any]:
        """The values a trial can take that bound the space: low and high, or every choice."""
        if self.type == "choice":
            return list(self.choices)
        return [self.low, self.high]

    def grid(self) -> list[Any]:
        """Every value, for the grid sampler (a float range needs ``step``)."""
        if self.type == "choice":
            return list(self.choices)
        assert self.low is not None and self.high is not None
        if self.type == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        if not self.step:
            raise InputError(
                Problem("sampler grid: a float range needs step (or use choices)", key=f"space.{self.key}")
            )
        n = int(math.floor((float(self.high) - float(self.low)) / float(self.step) + 1e-9))
        return [float(self.low) + i * float(self.step) for i in range(n + 1)]

    def as_dict(self) -> dict[str, Any]:
        if self.type == "choice":
            return {"type": "choice", "choices": list(self.choices)}
        out: dict[str, Any] = {"type": self.type, "low": self.low, "high": self.high}
        if self.log:
            out["log"] = True
        if self.step:
            out["step"] = self.step
        return out


@dataclass
class SweepSpec:
    name: str
    base: dict[str, Any]  # the base config's raw keys (as in its YAML)
    base_dir: str  # where the base config's relative paths resolve
    space: list[Param]
    objective: str = "eval_loss"
    direction: str = "minimize"
    trials: int = 10
    parallel: int = 1
    sampler: str = "tpe"
    sampler_startup_trials: int = 10  # tpe: Optuna's n_startup_trials (its default)
    pruner: str = "median"
    pruner_startup_trials: int = 5
    pruner_warmup_steps: int = 0
    seed: int | None = None
    gpu_memory: float | None = None
    launcher: str = "local"
    slurm: dict[str, Any] = field(default_factory=dict)  # the sbatch options (SLURM_KEYS), launcher slurm

    def slurm_options(self) -> Any:
        """The trials' sbatch options, as ``cockpit train --slurm`` builds them from its flags."""
        from cockpit.slurm.script import SlurmOptions

        s = self.slurm
        return SlurmOptions(
            partition=s.get("partition"),
            time=s.get("time"),
            account=s.get("account"),
            qos=s.get("qos"),
            cpus_per_task=s.get("cpus_per_task"),
            exclusive=s.get("exclusive", True),
            extra=tuple(s.get("sbatch_args") or ()),
        )

    def as_dict(self) -> dict[str, Any]:
        """The spec as the sweep dir keeps it (spec.yaml): the base inline, so a resume needs no other file."""
        return {
            "name": self.name,
            "base": dict(self.base),
            "base_dir": self.base_dir,
            "space": {p.key: p.as_dict() for p in self.space},
            "objective": self.objective,
            "direction": self.direction,
            "trials": self.trials,
            "parallel": self.parallel,
            "sampler": self.sampler,
            **({"sampler_startup_trials": self.sampler_startup_trials} if self.sampler == "tpe" else {}),
            "pruner": self.pruner,
            "pruner_startup_trials": self.pruner_startup_trials,
            "pruner_warmup_steps": self.pruner_warmup_steps,
            "seed": self.seed,
            "gpu_memory": self.gpu_memory,
            "launcher": self.launcher,
            "slurm": dict(self.slurm),
        }

    def raw_config(self, params: Mapping[str, Any], run_name: str | None = None) -> dict[str, Any]:
        """The base config's keys with the trial's values (and its run name) on top. A trial's
        ``output_dir`` is its own folder under the base's, named after the trial (``<output_dir>/<name>-t<N>``):
        two trials never write one folder's checkpoints and adapter."""
        raw = {**self.base, **dict(params)}
        if run_name:
            raw["run_name"] = run_name
            if raw.get("output_dir"):
                raw["output_dir"] = str(Path(str(raw["output_dir"])).expanduser() / run_name)
        return raw

    def trial_config(self, params: Mapping[str, Any], run_name: str | None = None) -> RunConfig:
        """The validated config of a trial with ``params``; raises InputError naming the key and value."""
        from cockpit.config.load import validate

        try:
            return validate(self.raw_config(params, run_name), file=None, base_dir=Path(self.base_dir))
        except InputError as err:
            raise InputError([with_value(p, params) for p in err.problems]) from None

    def corner_params(self) -> list[dict[str, Any]]:
        """The trial values to check before any trial starts: each key at each of its bounds (low,
        high, every choice) with the others at their first value, and every combination of the
        bounds when that is at most 64 configs (else the all-low and all-high corners)."""
        firsts = {p.key: p.corners()[0] for p in self.space}
        out: list[dict[str, Any]] = []
        for p in self.space:
            for v in p.corners():
                out.append({**firsts, p.key: v})
        sizes = math.prod(len(p.corners()) for p in self.space)
        if sizes <= 64:
            out += [
                dict(zip([p.key for p in self.space], combo))
                for combo in itertools.product(*(p.corners() for p in self.space))
            ]
        else:
            out.append({p.key: p.corners()[-1] for p in self.space})
        seen: list[dict[str, Any]] = []
        for params in out:
            if params not in seen:
                seen.append(params)
        return seen

    def grid_points(self) -> int | None:
        """The grid's size (every combination of each key's values) with ``sampler: grid``, else None."""
        if self.sampler != "grid":
            return None
        return math.prod(len(p.grid()) for p in self.space)

    def budget(self) -> int:
        """The trials the driver asks: ``trials``, or the grid's size where that is smaller (Optuna's
        GridSampler would ask a used-up grid's points again)."""
        points = self.grid_points()
        return self.trials if points is None else min(self.trials, points)


def with_value(problem: Problem, params: Mapping[str, Any]) -> Problem:
    """A trial's problem, saying which value of the space broke it."""
    if problem.key in params:
        return Problem(
            f"the search space gives {problem.key}={params[problem.key]!r}: {problem.message}",
            key=f"space.{problem.key}",
        )
    values = ", ".join(f"{k}={v!r}" for k, v in params.items())
    return Problem(f"with {values}: {problem.message}", file=problem.file, line=problem.line, key=problem.key)


def _number(value: Any, where: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise InputError(Problem(f"must be a number, not {value!r}", key=where))
    return value


def parse_param(key: str, raw: Any) -> Param:
    where = f"space.{key}"
    if isinstance(raw, list):  # shorthand: a list is the choices
        raw = {"type": "choice", "choices": raw}
    if not isinstance(raw, Mapping):
        raise InputError(
            Problem("must be a mapping {type, low, high, log, step} or {type: choice, choices}", key=where)
        )
    unknown = set(raw) - {"type", "low", "high", "log", "step", "choices"}
    if unknown:
        raise InputError(Problem(f"unknown field(s) {', '.join(sorted(unknown))}", key=where))
    kind = str(raw.get("type") or ("choice" if "choices" in raw else "float"))
    if kind not in TYPES:
        raise InputError(Problem(f"type must be one of {', '.join(TYPES)}, not {kind!r}", key=where))
    if kind == "choice":
        choices = raw.get("choices")
        if not isinstance(choices, list) or not choices:
            raise InputError(Problem("a choice needs a non-empty list choices", key=where))
        return Param(key, "choice", choices=list(choices))
    if "low" not in raw or "high" not in raw:
        raise InputError(Problem(f"a {kind} range needs low and high", key=where))
    low, high = _number(raw["low"], where + ".low"), _number(raw["high"], where + ".high")
    step = _number(raw["step"], where + ".step") if raw.get("step") is not None else None
    if kind == "int":
        if any(float(v) != int(v) for v in (low, high, step or 1)):
            raise InputError(Problem("an int range needs whole low, high and step", key=where))
        low, high, step = int(low), int(high), (int(step) if step else None)
    else:
        low, high = float(low), float(high)
    if low >= high:
        raise InputError(Problem(f"low {low!r} must be below high {high!r}", key=where))
    log = bool(raw.get("log", False))
    if log and low <= 0:
        raise InputError(Problem(f"a log range needs low > 0, not {low!r}", key=where))
    if log and step:
        raise InputError(Problem("log and step do not go together", key=where))
    return Param(key, kind, low=low, high=high, log=log, step=step)


def read_spec(path: str | Path, name: str | None = None) -> SweepSpec:
    """Read and validate a spec file; raises InputError (file, key, message)."""
    from cockpit.config.load import read_yaml

    path = Path(path)
    raw, _ = read_yaml(path)
    try:
        spec = parse_spec(raw, path.resolve().parent, default_name=name or path.stem)
        require_launcher(spec)
        return spec
    except InputError as err:
        for p in err.problems:
            p.file = p.file or str(path)
        raise


def parse_spec(raw: Mapping[str, Any], spec_dir: Path, default_name: str = "sweep") -> SweepSpec:
    unknown = set(raw) - TOP_KEYS - {"base_dir"}
    if unknown:
        raise InputError(
            [Problem(f"unknown sweep key (known: {', '.join(sorted(TOP_KEYS))})", key=k) for k in sorted(unknown)]
        )
    name = str(raw.get("name") or default_name)
    if not NAME_RE.match(name):
        raise InputError(Problem(f"{name!r}: letters, digits, '.', '_', '-' (up to 64)", key="name"))
    base = raw.get("base")
    if isinstance(base, str):
        from cockpit.config.load import read_yaml

        base_path = (spec_dir / base).resolve()
        if not base_path.is_file():
            raise InputError(Problem(f"no such config file: {base_path}", key="base"))
        base_cfg, _ = read_yaml(base_path)
        base_dir = str(base_path.parent)
    elif isinstance(base, Mapping):
        base_cfg, base_dir = dict(base), str(raw.get("base_dir") or spec_dir)
    else:
        raise InputError(Problem("a config path or a mapping of config keys", key="base"))
    space_raw = raw.get("space")
    if not isinstance(space_raw, Mapping) or not space_raw:
        raise InputError(Problem("a mapping of config keys to ranges or choices", key="space"))
    from cockpit.config.schema import SCHEMA

    bad = [k for k in space_raw if k not in SCHEMA]
    if bad:
        raise InputError([Problem("not a config key Cockpit knows", key=f"space.{k}") for k in bad])
    space = [parse_param(str(k), v) for k, v in space_raw.items()]
    objective = raw.get("objective") or "eval_loss"
    direction = raw.get("direction") or "minimize"
    if isinstance(objective, Mapping):
        direction = objective.get("direction") or direction
        objective = objective.get("metric") or "eval_loss"
    if direction not in ("minimize", "maximize"):
        raise InputError(Problem(f"minimize or maximize, not {direction!r}", key="direction"))
    spec = SweepSpec(
        name=name,
        base=base_cfg,
        base_dir=base_dir,
        space=space,
        objective=str(objective),
        direction=str(direction),
        trials=_positive(raw, "trials", 10),
        parallel=_positive(raw, "parallel", 1),
        sampler=_one_of(raw, "sampler", SAMPLERS),
        sampler_startup_trials=_positive(raw, "sampler_startup_trials", 10, zero=True),
        pruner=_one_of(raw, "pruner", PRUNERS),
        pruner_startup_trials=_positive(raw, "pruner_startup_trials", 5, zero=True),
        pruner_warmup_steps=_positive(raw, "pruner_warmup_steps", 0, zero=True),
        seed=None if raw.get("seed") is None else int(raw["seed"]),
        gpu_memory=None if raw.get("gpu_memory") is None else float(_number(raw["gpu_memory"], "gpu_memory")),
        launcher=_one_of(raw, "launcher", LAUNCHERS),
    )
    spec.slurm = parse_slurm(raw.get("slurm"), spec)
    if raw.get("sampler_startup_trials") is not None and spec.sampler != "tpe":
        raise InputError(
            Problem(f"only with sampler: tpe (sampler {spec.sampler} has no start-up)", key="sampler_startup_trials")
        )
    if spec.sampler == "grid":
        for p in spec.space:
            p.grid()  # refuses a float range without step
    return spec


def parse_slurm(raw: Any, spec: SweepSpec) -> dict[str, Any]:
    """The ``slurm:`` mapping, checked as ``cockpit train --slurm`` checks its flags (types, and
    every value that reaches an ``#SBATCH`` line); only with ``launcher: slurm``."""
    from cockpit.slurm.script import refuse_unsafe_values

    if raw is None or raw == {}:
        return {}
    if spec.launcher != "slurm":
        raise InputError(Problem("sbatch options need launcher: slurm", key="slurm"))
    if not isinstance(raw, Mapping):
        raise InputError(Problem(f"a mapping of sbatch options ({', '.join(SLURM_KEYS)})", key="slurm"))
    problems = [
        Problem(f"unknown sbatch option (known: {', '.join(SLURM_KEYS)})", key=f"slurm.{k}")
        for k in raw
        if k not in SLURM_KEYS
    ]
    for k, want in SLURM_KEYS.items():
        v = raw.get(k)
        if v is None:
            continue
        ok = isinstance(v, want) and not (want is int and isinstance(v, bool))
        if want is str and isinstance(v, int | float) and not isinstance(v, bool):
            ok = True  # a bare YAML number: partition 1, time 60
        if want is int and ok and v < 1:
            ok = False
        if want is list and ok:
            ok = all(isinstance(x, str) and x.startswith("-") for x in v)
        if not ok:
            what = {str: "a string", int: "a whole number >= 1", bool: "true or false"}.get(
                want, "a list of sbatch options (--constraint=mi300x)"
            )
            problems.append(Problem(f"must be {what}, not {v!r}", key=f"slurm.{k}"))
    if problems:
        raise InputError(problems)
    out = {k: (str(v) if SLURM_KEYS[k] is str else v) for k, v in raw.items() if v is not None}
    spec.slurm = out
    try:
        refuse_unsafe_values(None, spec.slurm_options(), job_name=spec.name)
    except InputError as err:  # named as the spec names them: --partition is slurm.partition
        flags = [(p.key or "").lstrip("-").replace("-", "_") for p in err.problems]
        raise InputError(
            [
                Problem(p.message, key="slurm.sbatch_args" if flag == "sbatch_arg" else f"slurm.{flag}")
                for p, flag in zip(err.problems, flags)
            ]
        ) from None
    return out


def require_launcher(spec: SweepSpec) -> None:
    """A Slurm sweep needs ``sbatch`` here: refused before any study or trial exists."""
    import shutil

    if spec.launcher == "slurm" and not shutil.which("sbatch"):
        raise InputError(Problem("launcher slurm: sbatch is not on PATH (is this a Slurm login node?)", key="launcher"))


def _positive(raw: Mapping[str, Any], key: str, default: int, zero: bool = False) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        raise InputError(Problem(f"must be a whole number >= {0 if zero else 1}, not {value!r}", key=key))
    return value


def _one_of(raw: Mapping[str, Any], key: str, allowed: tuple[str, ...]) -> str:
    value = str(raw.get(key) or allowed[0])
    if value not in allowed:
        raise InputError(Problem(f"one of {', '.join(allowed)}, not {value!r}", key=key))
    return value
