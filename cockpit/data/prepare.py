"""Config + tokenizer -> rendered training samples and the truncation report.

One code path for ``cockpit check`` and the training ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from cockpit.data.collect import collect_samples
from cockpit.data.formats import LoadResult
from cockpit.data.render import Rendered, apply_template_choice, render_sample
from cockpit.data.report import TruncationReport, truncation_report
from cockpit.errors import InputError, Problem


@dataclass
class Prepared:
    loaded: LoadResult
    rendered: list[Rendered]
    report: TruncationReport


def prepare_dataset(cfg: Mapping[str, Any], tokenizer: Any, loaded: LoadResult | None = None) -> Prepared:
    try:
        apply_template_choice(tokenizer, cfg.get("template"))
    except ValueError as exc:
        raise InputError(Problem(str(exc), key="template")) from None
    if loaded is None:
        loaded = collect_samples(cfg)
    rendered: list[Rendered] = []
    problems: list[Problem] = []
    cutoff = int(cfg["cutoff_len"])
    for sample in loaded.samples:
        try:
            rendered.append(render_sample(tokenizer, sample["messages"], cutoff))
        except Exception as exc:  # noqa: BLE001 - a template error on one row: report it by its line
            file, _, line = sample["source"].rpartition(":")
            problems.append(Problem(f"cannot render with the chat template: {exc}", file=file, line=int(line)))
    if problems:
        if not cfg.get("allow_bad_rows"):
            raise InputError(problems)
        loaded.problems += problems
    if not rendered:
        raise InputError("no sample could be rendered")
    return Prepared(loaded, rendered, truncation_report(rendered, cutoff))
