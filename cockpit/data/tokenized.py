"""``tokenized_path``: SFT's rendered samples kept on disk and reused by later runs (LLaMA-Factory's key).

The folder holds the rendered rows as a Hugging Face ``datasets`` dataset (``save_to_disk``:
``input_ids``, ``labels`` and the truncation counts) and ``cockpit_tokenized.json`` with the
samples as read (for the data report) and the fingerprint of everything that made the tokens:
the tokenizer, the template settings, ``cutoff_len``, the masking keys, the datasets and their
files' sizes and times, the mixing keys. A later run reuses the folder only when its fingerprint
is the same; a different one is refused with the keys that differ (never stale tokens trained
silently), and ``overwrite_cache: true`` tokenises afresh and replaces it. Written to a temporary
folder and renamed into place, so ranks tokenising at once never leave half a cache.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.errors import InputError, Problem

META = "cockpit_tokenized.json"
ROWS = "dataset"
# the config keys whose values decide the rendered tokens
RENDER_KEYS = (
    "template",
    "default_system",
    "enable_thinking",
    "tool_format",
    "add_tokens",
    "add_special_tokens",
    "cutoff_len",
    "train_on_prompt",
    "mask_history",
    "dataset",
    "max_samples",
    "mix_strategy",
    "interleave_probs",
    "seed",
    "allow_bad_rows",
)

# how Cockpit renders (a cache written by an older rendering is refused, not reused): LLaMA-Factory 0.9.5's
# templates, and its parse of the tokenizer's own Jinja when the template is unset (issue 31)
RENDERING = 'LLaMA-Factory 0.9.5; template unset: its parse_template; tools "[]": empty system slot'

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


def fingerprint(cfg: RunConfig, tokenizer: Any) -> dict[str, Any]:
    """What made the tokens: the render keys, the tokenizer and each dataset file's size and time."""
    from cockpit.data.dataset_info import resolve_datasets

    files = {}
    for spec in resolve_datasets(cfg):
        st = spec.path.stat()
        files[str(spec.path)] = [st.st_size, int(st.st_mtime)]
    return {
        **{k: getattr(cfg, k) for k in RENDER_KEYS},
        "rendering": RENDERING,
        "tokenizer": [str(getattr(tokenizer, "name_or_path", "")), len(tokenizer)],
        "files": files,
    }


def load(path: Path, want: dict[str, Any]) -> tuple[Any, list[Any]] | None:
    """(loaded samples, rendered rows) from the cache at ``path``; None when there is none yet."""
    from datasets import load_from_disk

    from cockpit.data.formats import LoadResult
    from cockpit.data.render import Rendered

    meta_file = path / META
    if not path.exists() or (path.is_dir() and not any(path.iterdir())):
        return None
    if not meta_file.is_file():
        raise InputError(
            Problem(
                f"{path} is not a Cockpit tokenized cache (a LLaMA-Factory cache holds its own template's tokens); "
                "point tokenized_path at a new folder",
                key="tokenized_path",
            )
        )
    meta = json.loads(meta_file.read_text(encoding="utf-8"))
    differ = sorted(k for k in {*want, *meta["fingerprint"]} if want.get(k) != meta["fingerprint"].get(k))
    if differ:
        raise InputError(
            Problem(
                f"the cache in {path} was tokenized with other settings ({', '.join(differ)} differ); "
                "set overwrite_cache: true to tokenize afresh into it, or use another folder",
                key="tokenized_path",
            )
        )
    rows = load_from_disk(str(path / ROWS))
    rendered = [Rendered(**{f.name: row[f.name] for f in dataclasses.fields(Rendered)}) for row in rows]
    got = meta["loaded"]
    loaded = LoadResult(got["samples"], [Problem(**p) for p in got["problems"]], got["formats"], got["rows"])
    return loaded, rendered


def save(path: Path, want: dict[str, Any], loaded: Any, rendered: list[Any]) -> None:
    """The cache at ``path`` (replacing one there), written aside and renamed into place."""
    from datasets import Dataset

    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        columns = {f.name: [getattr(r, f.name) for r in rendered] for f in dataclasses.fields(rendered[0])}
        Dataset.from_dict(columns).save_to_disk(str(staging / ROWS))
        meta = {
            "fingerprint": want,
            "loaded": {
                "samples": loaded.samples,
                "problems": [dataclasses.asdict(p) for p in loaded.problems],
                "formats": loaded.formats,
                "rows": loaded.rows,
            },
        }
        (staging / META).write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
        if path.exists():
            shutil.rmtree(path)
        os.replace(staging, path)
    except OSError:
        if not (path / META).is_file():  # another rank's cache landed first: theirs stays
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
