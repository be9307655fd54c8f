"""All samples of a config's datasets, with every bad row listed (``file:line: reason``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cockpit.data.dataset_info import resolve_datasets
from cockpit.data.formats import LoadResult, load_dataset_file
from cockpit.errors import InputError


def collect_samples(cfg: Mapping[str, Any], *, strict: bool | None = None) -> LoadResult:
    """Read every dataset of the config. With ``strict`` (default: not ``allow_bad_rows``) any
    bad row raises an InputError listing all of them; otherwise they are returned as problems."""
    if strict is None:
        strict = not cfg.get("allow_bad_rows", False)
    specs = resolve_datasets(cfg)
    total = LoadResult([], [], {})
    for spec in specs:
        res = load_dataset_file(spec, cfg.get("max_samples"))
        total.samples += res.samples
        total.problems += res.problems
        total.formats.update(res.formats)
        total.rows += res.rows
    if strict and total.problems:
        raise InputError(total.problems)
    if not total.samples:
        raise InputError(total.problems or "no usable samples in the dataset(s)")
    return total
