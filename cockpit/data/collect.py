"""All samples of a config's datasets, with every bad row listed (``file:line: reason``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cockpit.data import media
from cockpit.data.dataset_info import resolve_datasets
from cockpit.data.formats import LoadResult, load_dataset_file
from cockpit.errors import InputError, Problem

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


def collect_samples(cfg: RunConfig, *, strict: bool | None = None) -> LoadResult:
    """Read every dataset of the config. With ``strict`` (default: not ``allow_bad_rows``) any
    bad row raises an InputError listing all of them; otherwise they are returned as problems."""
    if strict is None:
        strict = not cfg.allow_bad_rows
    specs = resolve_datasets(cfg)
    total = LoadResult([], [], {})
    per_dataset: list[list[dict[str, Any]]] = []
    for spec in specs:
        res = load_dataset_file(spec, cfg.max_samples)
        per_dataset.append(res.samples)
        total.problems += res.problems
        total.formats.update(res.formats)
        total.rows += res.rows
    total.samples = mixed(per_dataset, cfg)
    total.problems += image_template_problems(total.samples, cfg.template)
    if strict and total.problems:
        raise InputError(total.problems)
    if not total.samples:
        raise InputError(total.problems or "no usable samples in the dataset(s)")
    return total


def image_template_problems(samples: list[dict[str, Any]], template: str | None) -> list[Problem]:
    """The rows with images, when the config's template takes none (cockpit.data.media.template_problem);
    such rows are dropped from ``samples`` (allow_bad_rows trains the others)."""
    why = media.template_problem(template)
    bad = [s for s in samples if s.get("images")] if why else []
    if not bad:
        return []
    samples[:] = [s for s in samples if not s.get("images")]
    return [Problem(why, file=s["source"].rpartition(":")[0], line=int(s["source"].rpartition(":")[2])) for s in bad]


def mixed(per_dataset: list[list[dict[str, Any]]], cfg: RunConfig) -> list[dict[str, Any]]:
    """The datasets' samples in the config's mixing order (``mix_strategy``, ``interleave_probs``)."""
    order = mixed_order(
        [len(s) for s in per_dataset],
        cfg.mix_strategy or "concat",
        cfg.interleave_probs,
        cfg.seed,
    )
    return [per_dataset[k][j] for k, j in order]


def mixed_order(sizes: list[int], strategy: str, probs: Any, seed: int) -> list[tuple[int, int]]:
    """(dataset, row) pairs in LLaMA-Factory's mixing order (its ``merge_dataset``): ``concat`` one
    after the other; ``interleave_under`` / ``interleave_over`` by ``datasets.interleave_datasets``
    itself (the same library, seed and stopping strategy LLaMA-Factory uses), alternating when no
    ``interleave_probs`` are given. Interleaving over a dataset index keeps the samples as read."""
    if strategy == "concat" or len(sizes) < 2:
        return [(k, j) for k, n in enumerate(sizes) for j in range(n)]
    from datasets import Dataset, interleave_datasets

    from cockpit.config.parity import interleave_probs

    weights = interleave_probs(probs) if probs not in (None, "") else None
    kept = [k for k, n in enumerate(sizes) if n]  # a dataset left with no usable row takes no part
    if weights is not None:
        weights = [weights[k] / sum(weights[i] for i in kept) for k in kept]
    mixed = interleave_datasets(
        [Dataset.from_dict({"k": [k] * sizes[k], "j": list(range(sizes[k]))}) for k in kept],
        probabilities=weights,
        seed=seed,
        stopping_strategy="first_exhausted" if strategy.endswith("under") else "all_exhausted",
    )
    return list(zip(mixed["k"], mixed["j"]))
