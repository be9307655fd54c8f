"""Datasets of the non-SFT stages, read like LLaMA-Factory reads them; bad rows by ``file:line: reason``.

- pairs (stage dpo / rm; ``ranking: true`` in dataset_info.json): alpaca with ``chosen`` /
  ``rejected`` string columns, or sharegpt whose conversation ends on a user turn and whose
  ``chosen`` / ``rejected`` are one assistant turn each (``{"from": "gpt", "value": ...}``).
  Sample: ``{"prompt": [messages], "chosen": str, "rejected": str, "source", "dataset"}``; stage dpo's
  rows may have images (``images``: ``[{"path", "size"}]``, the prompt's ``<image>`` placeholders), the
  other stages refuse them by name (:func:`cockpit.data.media.text_stage_problem`).
- tagged answers (stage kto; a ``kto_tag`` column holding true / false): a conversation ending
  on the answer. Sample: ``{"prompt": [messages], "completion": str, "label": bool, ...}``.
- raw text (stage pt; the ``prompt`` column, e.g. ``columns: {prompt: text}``).
  Sample: ``{"text": str, ...}``.
- prompts (stage grpo): alpaca (``instruction`` + ``input``, or a bare ``prompt`` string column), sharegpt
  ending on a user turn, or TRL's conversational ``prompt`` (a list of role / content messages); every
  other column is kept for the reward functions (e.g. ``answer``).
  Sample: ``{"prompt": [messages], "columns": {name: value}, ...}``.

The prompt part is validated by the SFT readers in :mod:`cockpit.data.formats` (the answer is
appended, then split off again), so both stages report the same problems the same way.
No torch imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cockpit.data.formats import (
    ALPACA_COLUMNS,
    SHAREGPT_COLUMNS,
    SHAREGPT_TAGS,
    DatasetSpec,
    LoadResult,
    alpaca_to_messages,
    read_records,
    sharegpt_to_messages,
)
from cockpit.data.media import IMAGE_PLACEHOLDER, IMAGE_STAGES, row_images, text_stage_problem
from cockpit.errors import Problem

PAIRWISE = ("dpo", "rm")


def ranking_problem(stage: str, ranking: bool, entry: Mapping[str, Any]) -> str | None:
    """Why a dataset_info.json entry does not suit the stage, or None."""
    if ranking and stage not in PAIRWISE:
        return f"a ranking (chosen / rejected) dataset needs stage dpo or rm, not {stage}"
    if stage in PAIRWISE and not ranking:
        return f'stage {stage} needs preference pairs: an entry with "ranking": true and chosen / rejected columns'
    if stage == "kto" and not (entry.get("columns") or {}).get("kto_tag"):
        return 'stage kto needs a kto_tag column (columns: {"kto_tag": "label"})'
    return None


def _detect(record: Any) -> str:
    if isinstance(record, dict) and ("conversations" in record or "messages" in record):
        return "sharegpt"
    return "alpaca"


def _answer_text(value: Any, tags: Mapping[str, str], side: str) -> tuple[str | None, str | None]:
    """A chosen / rejected side: a string (alpaca) or one assistant turn (sharegpt)."""
    if isinstance(value, dict):
        content = value.get(tags["content_tag"], value.get("content"))
        role = value.get(tags["role_tag"], value.get("role"))
        if role is not None and role not in (tags["assistant_tag"], "assistant", "gpt"):
            return None, f"{side}: expected an assistant turn, got role {role!r}"
        value = content
    if value is None:
        return None, f"missing {side} answer"
    if not isinstance(value, str):
        return None, f"{side} must be a string or an assistant turn, got {type(value).__name__}"
    if not value.strip():
        return None, f"empty {side} answer"
    return value, None


def _prompt(rec: dict[str, Any], fmt: str, spec: DatasetSpec) -> tuple[list[dict[str, str]] | None, str | None]:
    """The prompt messages of a pair / tagged row (everything before the answer)."""
    if fmt == "alpaca":
        cols = {**ALPACA_COLUMNS, **spec.columns}
        msgs, err = alpaca_to_messages({**rec, cols["response"]: "-"}, spec.columns)
        return (msgs[:-1] if msgs else None), err
    cols = {**SHAREGPT_COLUMNS, **spec.columns}
    tags = {**SHAREGPT_TAGS, **spec.tags}
    key = cols["messages"] if cols["messages"] in rec or "messages" not in rec else "messages"
    conv = rec.get(key)
    if not isinstance(conv, list) or not conv:
        return None, f"field {key!r} must be a non-empty list of turns"
    if key == "messages" and cols["messages"] == "conversations":
        tags = {**tags, "role_tag": "role", "content_tag": "content", "assistant_tag": "assistant"}
    turn = {tags["role_tag"]: tags["assistant_tag"], tags["content_tag"]: "-"}
    msgs, err = sharegpt_to_messages({**rec, key: conv + [turn]}, {**spec.columns, "messages": key}, tags)
    return (msgs[:-1] if msgs else None), err


def pair_from_record(rec: Any, fmt: str, spec: DatasetSpec) -> tuple[dict[str, Any] | None, str | None]:
    if not isinstance(rec, dict):
        return None, f"expected a JSON object, got {type(rec).__name__}"
    tags = {**SHAREGPT_TAGS, **spec.tags}
    sides = {}
    for side in ("chosen", "rejected"):
        col = spec.columns.get(side, side)
        text, err = _answer_text(rec.get(col), tags, side)
        if err:
            return None, err
        sides[side] = text
    if sides["chosen"].strip() == sides["rejected"].strip():
        return None, "chosen and rejected answers are identical (the pair teaches nothing)"
    prompt, err = _prompt(rec, fmt, spec)
    if err:
        return None, err
    return {"prompt": prompt, **sides}, None


def kto_from_record(rec: Any, fmt: str, spec: DatasetSpec) -> tuple[dict[str, Any] | None, str | None]:
    if not isinstance(rec, dict):
        return None, f"expected a JSON object, got {type(rec).__name__}"
    tag_col = spec.columns.get("kto_tag", "kto_tag")
    tag = rec.get(tag_col)
    if tag is None:
        return None, f"missing KTO tag {tag_col!r} (true: a desirable answer, false: an undesirable one)"
    if not isinstance(tag, bool):
        return None, f"KTO tag {tag_col!r} must be true or false, got {tag!r}"
    if fmt == "alpaca":
        msgs, err = alpaca_to_messages(rec, spec.columns)
    else:
        msgs, err = sharegpt_to_messages(rec, spec.columns, spec.tags)
    if err:
        return None, err
    return {"prompt": msgs[:-1], "completion": msgs[-1]["content"], "label": tag}, None


def text_from_record(rec: Any, fmt: str, spec: DatasetSpec) -> tuple[dict[str, Any] | None, str | None]:
    col = {**ALPACA_COLUMNS, **spec.columns}["prompt"]
    if not isinstance(rec, dict):
        return None, f"expected a JSON object, got {type(rec).__name__}"
    if "prompt" not in spec.columns and col not in rec and "text" in rec:
        col = "text"  # a bare file of {"text": ...} lines (c4 style) without a dataset_info entry
    text = rec.get(col)
    if text is None:
        return (
            None,
            f"missing field {col!r} (stage pt reads raw text from the prompt column, e.g. columns: {{prompt: text}})",
        )
    if not isinstance(text, str):
        return None, f"field {col!r} must be a string, got {type(text).__name__}"
    if not text.strip():
        return None, f"empty {col!r}"
    return {"text": text}, None


_TRL_RESERVED = ("prompt", "completion", "completions", "completion_ids", "prompts", "trainer_state")


def prompt_from_record(rec: Any, fmt: str, spec: DatasetSpec) -> tuple[dict[str, Any] | None, str | None]:
    """A GRPO prompt (messages) and the row's other columns, which the reward functions read."""
    if not isinstance(rec, dict):
        return None, f"expected a JSON object, got {type(rec).__name__}"
    alpaca = {**ALPACA_COLUMNS, **spec.columns}
    used: set[str] = set()
    value = rec.get("prompt")
    if isinstance(value, list) and "prompt" not in spec.columns:  # TRL's conversational prompt
        msgs = []
        for i, m in enumerate(value):
            if (
                not isinstance(m, dict)
                or not isinstance(m.get("content"), str)
                or m.get("role")
                not in (
                    "system",
                    "user",
                    "assistant",
                )
            ):
                return None, f"prompt turn {i}: expected {{role: system | user | assistant, content: string}}"
            msgs.append({"role": m["role"], "content": m["content"]})
        if not msgs or msgs[-1]["role"] != "user":
            return None, "prompt must end on a user turn (the model answers it)"
        prompt, used = msgs, {"prompt"}
    elif fmt == "alpaca":
        columns = dict(spec.columns)
        if "prompt" not in columns and alpaca["prompt"] not in rec and isinstance(value, str):
            columns["prompt"] = "prompt"  # a bare {"prompt": "...", "answer": ...} row
        cols = {**ALPACA_COLUMNS, **columns}
        if cols["prompt"] not in rec:
            return None, f"missing prompt column {cols['prompt']!r} (or a 'prompt' string / message list)"
        msgs_or_none, err = alpaca_to_messages({**rec, cols["response"]: "-"}, columns)
        if err:
            return None, err
        prompt = (msgs_or_none or [])[:-1]
        used = {cols[k] for k in ("prompt", "query", "system", "history", "response")}
    else:
        prompt_or_none, err = _prompt(rec, fmt, spec)
        if err:
            return None, err
        prompt = prompt_or_none or []
        cols = {**SHAREGPT_COLUMNS, **spec.columns}
        used = {cols["messages"], "messages", cols["system"], cols["tools"]}
    if not prompt or not any(m["role"] == "user" and m["content"].strip() for m in prompt):
        return None, "empty prompt"
    extra = {k: v for k, v in rec.items() if k not in used and k not in _TRL_RESERVED}
    return {"prompt": prompt, "columns": extra}, None


READERS = {
    "dpo": pair_from_record,
    "rm": pair_from_record,
    "kto": kto_from_record,
    "pt": text_from_record,
    "grpo": prompt_from_record,
}


def pair_images(rec: Any, sample: dict[str, Any], spec: DatasetSpec) -> tuple[list[dict[str, Any]], str | None]:
    """A pair's images, as LLaMA-Factory's pairwise processor takes them: they go with the prompt (chosen and
    rejected share them), so the prompt holds one ``<image>`` per image (its count rule) and an answer none."""
    images, err = row_images(
        rec, sample["prompt"], spec.columns, spec.media_dir or spec.path.parent, spec.base_dir or Path.cwd()
    )
    if err or not images:
        return [], err
    for side in ("chosen", "rejected"):
        if IMAGE_PLACEHOLDER in sample[side]:
            return [], f"the {side} answer holds {IMAGE_PLACEHOLDER}: a pair's images go with its prompt, not an answer"
    return images, None


def _stage_sample(rec: Any, fmt: str, spec: DatasetSpec, stage: str) -> tuple[dict[str, Any] | None, str | None]:
    """One row read for ``stage``: its images with a pair (stage dpo), refused by name in the text stages."""
    sample, err = READERS[stage](rec, fmt, spec)
    if err or sample is None:
        return None, err
    if stage not in IMAGE_STAGES:
        err = text_stage_problem(rec, spec.columns, stage)
        return (None, err) if err else (sample, None)
    images, err = pair_images(rec, sample, spec)
    if err:
        return None, err
    return ({**sample, "images": images} if images else sample), None


def load_stage_file(spec: DatasetSpec, stage: str, max_samples: int | None = None) -> LoadResult:
    """Every row of one dataset file read for ``stage`` (not sft), bad rows as problems."""
    records, problems = read_records(spec.path)
    fmt = spec.formatting
    if fmt == "auto":
        fmt = _detect(records[0][1]) if records else "alpaca"
    samples: list[dict[str, Any]] = []
    name = str(spec.path)
    for line, rec in records:
        sample, err = _stage_sample(rec, fmt, spec, stage)
        if err or sample is None:
            problems.append(Problem(err, file=name, line=line))
            continue
        samples.append({**sample, "source": f"{name}:{line}", "dataset": spec.name})
    if max_samples is not None:
        samples = samples[:max_samples]
    if not samples and not problems:
        problems.append(Problem("no samples", file=name))
    return LoadResult(samples, problems, {spec.name: fmt}, rows=len(records))
