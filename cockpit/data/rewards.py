"""Stage grpo's reward functions: the built-ins and the user's, each checked as it is called.

TRL's GRPOTrainer calls ``f(prompts=..., completions=..., completion_ids=..., trainer_state=..., **columns)``
(the dataset's other columns as lists, e.g. ``answer``) and wants one float (or None: not scored) per
completion. A completion is a string, or for a conversational prompt a list holding one assistant
message. Every function here is wrapped by :func:`checked`: one that raises, or returns the wrong
shape, fails the run with its name and the sample instead of a bare traceback.

Built-ins (``cockpit.config.grpo.BUILTIN_REWARDS`` says what each scores): ``exact_match``,
``contains_answer``, ``numeric_match``, ``regex``, ``length_penalty``, ``concise_answer``. A user function is ``path/file.py:function``,
loaded with importlib from the file (never from the config's text). No torch imports.
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.config.grpo import BUILTIN_REWARDS, reward_names, user_reward
from cockpit.errors import InputError, Problem

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

RewardFunc = Callable[..., list[float | None]]
_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?")
_EDGE = " \t\n\r.,;:!?\"'`*()[]{}"


def completion_text(completion: Any) -> str:
    """A completion as text: a string as it is; a message list: its (last) assistant content."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion:
        last = completion[-1]
        if isinstance(last, Mapping):
            return str(last.get("content") or "")
    if isinstance(completion, Mapping):
        return str(completion.get("content") or "")
    return str(completion)


def _normal(text: Any) -> str:
    return " ".join(str(text).strip(_EDGE).casefold().split())


def _number(text: Any) -> float | None:
    found = _NUMBER.findall(str(text))
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def _column(kwargs: Mapping[str, Any], column: str, name: str, n: int) -> Sequence[Any]:
    values = kwargs.get(column)
    if values is None:
        raise KeyError(
            f"{name} compares with the dataset column {column!r} (reward_answer_column), which the rows lack "
            f"(columns: {', '.join(sorted(k for k in kwargs if k not in ('completion_ids', 'trainer_state'))) or 'none'})"
        )
    return values


def exact_match(column: str) -> RewardFunc:
    def exact_match(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        answers = _column(kwargs, column, "exact_match", len(completions))
        return [float(_normal(completion_text(c)) == _normal(a)) for c, a in zip(completions, answers)]

    return exact_match


def contains_answer(column: str) -> RewardFunc:
    def contains_answer(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        answers = _column(kwargs, column, "contains_answer", len(completions))
        out: list[float | None] = []
        for c, a in zip(completions, answers):
            want = _normal(a)
            found = bool(want) and re.search(rf"(?<!\w){re.escape(want)}(?!\w)", _normal(completion_text(c)))
            out.append(float(bool(found)))
        return out

    return contains_answer


def numeric_match(column: str) -> RewardFunc:
    def numeric_match(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        answers = _column(kwargs, column, "numeric_match", len(completions))
        out: list[float | None] = []
        for c, a in zip(completions, answers):
            got, want = _number(completion_text(c)), _number(a)
            out.append(float(got is not None and want is not None and math.isclose(got, want, abs_tol=1e-6)))
        return out

    return numeric_match


def regex(pattern: str) -> RewardFunc:
    compiled = re.compile(pattern)

    def regex(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        return [float(compiled.search(completion_text(c)) is not None) for c in completions]

    return regex


def length_penalty(target_words: int) -> RewardFunc:
    def length_penalty(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        out: list[float | None] = []
        for c in completions:
            words = len(completion_text(c).split())
            out.append(1.0 if words <= target_words else target_words / words)
        return out

    return length_penalty


def concise_answer(column: str, target_words: int) -> RewardFunc:
    """``length_penalty`` gated by ``contains_answer``: brevity earns only with the right answer in it."""
    right, short = contains_answer(column), length_penalty(target_words)

    def concise_answer(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        hits = right(prompts=prompts, completions=completions, **kwargs)
        lengths = short(prompts=prompts, completions=completions, **kwargs)
        return [(h or 0.0) * (n or 0.0) for h, n in zip(hits, lengths)]

    return concise_answer


def load_user_function(spec: str) -> RewardFunc:
    """``path/file.py:function`` imported from the file (its folder first on sys.path while it loads)."""
    parsed = user_reward(spec)
    if parsed is None:
        raise InputError(Problem(f"not a path/file.py:function reward: {spec!r}", key="reward_funcs"))
    path, func = Path(parsed[0]).expanduser(), parsed[1]
    if not path.is_file():
        raise InputError(Problem(f"reward file not found: {path}", key="reward_funcs"))
    name = f"cockpit_reward_{path.stem}_{abs(hash(str(path.resolve())))}"
    module = sys.modules.get(name)
    if module is None:
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise InputError(Problem(f"cannot import {path}", key="reward_funcs"))
        module = importlib.util.module_from_spec(loader_spec)
        sys.path.insert(0, str(path.parent.resolve()))
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:
            raise InputError(
                Problem(f"importing reward file {path} failed: {type(exc).__name__}: {exc}", key="reward_funcs")
            ) from exc
        finally:
            sys.path.remove(str(path.parent.resolve()))
        sys.modules[name] = module
    fn = getattr(module, func, None)
    if not callable(fn):
        raise InputError(Problem(f"{path} has no function {func!r}", key="reward_funcs"))
    return fn


def _short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def checked(fn: RewardFunc, name: str) -> RewardFunc:
    """``fn`` under ``name`` (TRL's metric name ``rewards/<name>/mean``): an exception, a result that is not one
    number (or None) per completion, or a non-finite number raises :class:`InputError` naming the function and
    the first sample (prompt and completion)."""

    def reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        def sample(i: int) -> str:
            prompt = prompts[i] if i < len(prompts) else None
            if isinstance(prompt, list) and prompt and isinstance(prompt[-1], Mapping):
                prompt = prompt[-1].get("content")
            return f"prompt {_short(prompt)!s}; completion {_short(completion_text(completions[i]))!s}"

        def fail(why: str, i: int = 0) -> InputError:
            return InputError(Problem(f"reward function {name} {why} (sample {i}: {sample(i)})", key="reward_funcs"))

        try:
            out = fn(prompts=prompts, completions=completions, **kwargs)
        except InputError:
            raise
        except Exception as exc:
            raise fail(f"raised {type(exc).__name__}: {exc}") from exc
        if isinstance(out, (str, bytes, Mapping)) or not isinstance(out, Sequence):
            raise fail(f"returned {type(out).__name__}, not a list of {len(completions)} floats")
        if len(out) != len(completions):
            raise fail(f"returned {len(out)} rewards for {len(completions)} completions")
        values: list[float | None] = []
        for i, v in enumerate(out):
            if v is None:
                values.append(None)
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) and not hasattr(v, "__float__"):
                raise fail(f"returned {type(v).__name__} {_short(v)!s} for a completion, not a float (or None)", i)
            f = float(v)
            if not math.isfinite(f):
                raise fail(f"returned {f} (not finite)", i)
            values.append(f)
        return values

    reward.__name__ = name
    reward.__qualname__ = name
    return reward


def build_reward_funcs(cfg: RunConfig) -> list[RewardFunc]:
    """The config's reward functions, in ``reward_funcs``' order, each :func:`checked`."""
    column = cfg.reward_answer_column or "answer"
    out: list[RewardFunc] = []
    for spec in reward_names(cfg.reward_funcs):
        if spec == "exact_match":
            fn, name = exact_match(column), spec
        elif spec == "contains_answer":
            fn, name = contains_answer(column), spec
        elif spec == "numeric_match":
            fn, name = numeric_match(column), spec
        elif spec == "regex":
            fn, name = regex(str(cfg.reward_regex)), spec
        elif spec == "length_penalty":
            fn, name = length_penalty(int(cfg.reward_target_words)), spec
        elif spec == "concise_answer":
            fn, name = concise_answer(column, int(cfg.reward_target_words)), spec
        elif spec in BUILTIN_REWARDS:  # pragma: no cover - a built-in named in config/grpo.py and not here
            raise InputError(Problem(f"built-in reward {spec} has no implementation", key="reward_funcs"))
        else:
            fn, name = load_user_function(spec), spec.rpartition(":")[2]
        out.append(checked(fn, name))
    return out


def total_rewards(
    funcs: Sequence[RewardFunc], weights: Sequence[float] | None, prompts: list[Any], completions: list[Any], **kw: Any
) -> dict[str, Any]:
    """Each function's rewards and the weighted total per completion (None rewards count as 0 in the total, as
    TRL's nansum does): ``{"per_func": {name: [..]}, "total": [..]}``."""
    weights = list(weights) if weights is not None else [1.0] * len(funcs)
    per: dict[str, list[float | None]] = {}
    total = [0.0] * len(completions)
    for fn, w in zip(funcs, weights):
        values = fn(prompts=prompts, completions=completions, **kw)
        per[fn.__name__] = values
        for i, v in enumerate(values):
            total[i] += w * (v or 0.0)
    return {"per_func": per, "total": total}
