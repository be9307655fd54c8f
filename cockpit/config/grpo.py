"""Stage ``grpo``'s cross-key rules: its reward functions, weights and batch shape. Pure (no torch, no
import of the user's reward file: its function is found by parsing the file, never by running it).

``reward_funcs`` is a comma list of reward functions, each a built-in (:data:`BUILTIN_REWARDS`) or a
user function named ``path/to/file.py:function`` (``def function(prompts, completions, **columns)``
returning one float, or None, per completion, as TRL's GRPOTrainer calls it).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from cockpit.errors import Problem
from cockpit.shape import world_size_of

# built-in reward functions (cockpit/train/rewards.py): name -> what it scores, in words (docs, errors)
BUILTIN_REWARDS = {
    "exact_match": "1 when the completion, trimmed and case-folded (outer punctuation and quotes left out), equals "
    "the row's reward_answer_column, else 0",
    "contains_answer": "1 when the row's reward_answer_column appears in the completion as whole words (case-folded), "
    "else 0",
    "numeric_match": "1 when the last number in the completion equals the row's reward_answer_column as a number "
    "(within 1e-6), else 0",
    "regex": "1 when reward_regex matches the completion (re.search; anchor it with ^ / $ for a format), else 0",
    "length_penalty": "1 up to reward_target_words words, then reward_target_words / words (0-1, shorter is better)",
    "concise_answer": "length_penalty's score when the completion contains the answer (contains_answer), else 0: "
    "brevity counts only with the right answer (a gated reward: a short wrong answer earns nothing)",
}
# the built-ins that read reward_target_words
LENGTH_REWARDS = ("length_penalty", "concise_answer")
# keys only stage grpo reads (TRL GRPOConfig's names where TRL has them)
GRPO_KEYS = (
    "reward_funcs",
    "reward_weights",
    "reward_answer_column",
    "reward_regex",
    "reward_target_words",
    "num_generations",
    "max_completion_length",
    "steps_per_generation",
    "num_iterations",
    "beta",
    "epsilon",
    "epsilon_high",
    "loss_type",
    "scale_rewards",
    "mask_truncated_completions",
    "use_vllm",
    "vllm_mode",
)


def reward_names(value: Any) -> list[str]:
    """``reward_funcs`` as a list of names (built-ins or ``file.py:function``)."""
    if not value:
        return []
    return [part.strip() for part in str(value).split(",") if part.strip()]


def user_reward(name: str) -> tuple[str, str] | None:
    """``path/file.py:function`` -> (path, function); a built-in name -> None."""
    path, sep, func = name.rpartition(":")
    if not sep or not path.endswith(".py"):
        return None
    return path, func


def reward_weights(cfg: Mapping[str, Any]) -> list[float] | None:
    """``reward_weights`` as floats (None: every function weighs 1.0)."""
    value = cfg.get("reward_weights")
    if value in (None, ""):
        return None
    return [float(x) for x in str(value).split(",")]


def function_defined(path: Path, func: str) -> str | None:
    """Why ``func`` is not a top-level function of the Python file ``path`` (parsed, not run), or None."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read {path}: {exc}"
    except SyntaxError as exc:
        return f"{path}:{exc.lineno}: syntax error: {exc.msg}"
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    if func not in names:
        return f"{path} defines no top-level function {func!r}"
    return None


def generation_batch(cfg: Mapping[str, Any]) -> int:
    """Completions sampled per generation round: per-device batch x ranks x steps_per_generation
    (default gradient_accumulation_steps), as TRL's GRPOConfig derives it."""
    steps = cfg.get("steps_per_generation") or cfg.get("gradient_accumulation_steps") or 1
    return int(cfg.get("per_device_train_batch_size") or 1) * world_size_of(cfg) * int(steps)


def grpo_problems(cfg: Mapping[str, Any], where: Callable[[str], dict[str, Any]]) -> list[Problem]:
    """Stage grpo's rules; on any other stage, a GRPO key set is refused (it would do nothing)."""
    from cockpit.config.schema import SCHEMA

    stage = cfg.get("stage", "sft")
    if stage != "grpo":
        return [
            Problem(f"applies to stage grpo only (this config's stage is {stage}); remove it", **where(key))
            for key in GRPO_KEYS
            if cfg.get(key) != SCHEMA[key].default
        ]
    out: list[Problem] = []
    names = reward_names(cfg.get("reward_funcs"))
    if not names:
        out.append(
            Problem(
                "stage grpo needs reward_funcs: built-ins ("
                + ", ".join(BUILTIN_REWARDS)
                + ") or path/file.py:function",
                **where("reward_funcs"),
            )
        )
    for name in names:
        if name not in BUILTIN_REWARDS and user_reward(name) is None:
            out.append(
                Problem(
                    f"unknown reward function {name!r}: a built-in ({', '.join(BUILTIN_REWARDS)}) or "
                    "path/file.py:function",
                    **where("reward_funcs"),
                )
            )
    if len(set(names)) != len(names):
        out.append(Problem("a reward function is named twice; weigh it with reward_weights", **where("reward_funcs")))
    try:
        weights = reward_weights(cfg)
    except ValueError:
        out.append(Problem("reward_weights must be a comma list of numbers, e.g. 0.7,0.3", **where("reward_weights")))
        weights = None
    if weights is not None:
        if len(weights) != len(names):
            out.append(
                Problem(
                    f"reward_weights has {len(weights)} weights for {len(names)} reward functions; give one each",
                    **where("reward_weights"),
                )
            )
        if any(not math.isfinite(w) for w in weights) or not any(weights):
            out.append(Problem("reward_weights must be finite and not all zero", **where("reward_weights")))
    if "regex" in names:
        if not cfg.get("reward_regex"):
            out.append(Problem("the regex reward needs reward_regex (the pattern)", **where("reward_regex")))
        else:
            try:
                re.compile(cfg["reward_regex"])
            except re.error as exc:
                out.append(Problem(f"reward_regex does not compile: {exc}", **where("reward_regex")))
    elif cfg.get("reward_regex"):
        out.append(
            Problem("reward_regex is read by the regex reward: add regex to reward_funcs", **where("reward_regex"))
        )
    length = [n for n in names if n in LENGTH_REWARDS]
    if length and not cfg.get("reward_target_words"):
        out.append(Problem(f"the {length[0]} reward needs reward_target_words", **where("reward_target_words")))
    elif cfg.get("reward_target_words") and not length:
        out.append(
            Problem(
                "reward_target_words is read by the length_penalty and concise_answer rewards: add length_penalty "
                "to reward_funcs",
                **where("reward_target_words"),
            )
        )
    batch, gens = generation_batch(cfg), int(cfg.get("num_generations") or 2)
    if batch % gens:
        spg = "steps_per_generation" if cfg.get("steps_per_generation") else "gradient_accumulation_steps"
        out.append(
            Problem(
                f"the generation batch (per_device_train_batch_size x ranks x {spg} = {batch} completions) must be "
                f"divisible by num_generations ({gens}): every prompt's group of completions in one batch",
                **where("num_generations"),
            )
        )
    if cfg.get("epsilon_high") is not None and cfg["epsilon_high"] < cfg.get("epsilon", 0.2):
        out.append(Problem("epsilon_high must be >= epsilon (the upper clipping bound)", **where("epsilon_high")))
    if cfg.get("use_vllm") and cfg.get("use_cpu"):
        out.append(
            Problem(
                "use_vllm generates on a GPU through vLLM; this config trains on the CPU (use_cpu: true): "
                "unset use_vllm (HF generate is used)",
                **where("use_vllm"),
            )
        )
    return out
