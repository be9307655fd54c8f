"""Resolve the config's ``dataset`` value to files: a path, or names in ``dataset_info.json``.

``dataset_info.json`` is LLaMA-Factory's registry: ``{name: {file_name, formatting, columns,
tags, ...}}``. Lookup order for names: ``dataset_dir`` (when set), ``./data``, then the
built-in demo data shipped in the package. No torch imports.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.config.load import DEMO_DIR
from cockpit.data.formats import DatasetSpec
from cockpit.data.media import media_dir_of
from cockpit.data.pairs import ranking_problem
from cockpit.errors import InputError, Problem

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

_UNSUPPORTED_ENTRY_KEYS = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")


def _read_info(path: Path) -> tuple[dict[str, Any], str]:
    text = path.read_text(encoding="utf-8-sig")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(Problem(f"invalid JSON: {exc.msg}", file=str(path), line=exc.lineno)) from None
    if not isinstance(data, dict):
        raise InputError(Problem("expected an object of name: {file_name, ...}", file=str(path), line=1))
    return data, text


def _entry_line(text: str, name: str) -> int | None:
    m = re.search(r'"' + re.escape(name) + r'"\s*:', text)
    return text.count("\n", 0, m.start()) + 1 if m else None


def info_dirs(cfg: RunConfig) -> list[Path]:
    dirs: list[Path] = []
    if cfg.dataset_dir:
        dirs.append(Path(cfg.dataset_dir))
    else:
        for base in (Path.cwd(), Path(cfg.base_dir or Path.cwd())):
            if (base / "data" / "dataset_info.json").exists():
                dirs.append(base / "data")
    dirs.append(DEMO_DIR)
    out: list[Path] = []
    for d in dirs:
        if d not in out:
            out.append(d)
    return out


_Registry = tuple[Path, Path, dict[str, Any], str]  # (folder, its dataset_info.json, parsed, text)


def resolve_datasets(cfg: RunConfig, key: str = "dataset") -> list[DatasetSpec]:
    value = str(getattr(cfg, key) or "").strip()
    where: dict[str, Any] = {"key": key}
    if not value:
        raise InputError(Problem("required: a .json/.jsonl file or dataset names", **where))
    bases = [Path.cwd(), Path(cfg.base_dir or Path.cwd())]
    # A path to a file (or something that looks like one).
    if value.endswith((".json", ".jsonl")) or "/" in value or value.startswith("@demo"):
        return [_with_media(_file_spec(value, bases, where), cfg)]
    specs: list[DatasetSpec] = []
    problems: list[Problem] = []
    registries = _registries(cfg, where)
    for name in (n.strip() for n in value.split(",")):
        if not name:
            continue
        hit = next(((d, info, data, text) for d, info, data, text in registries if name in data), None)
        if hit is None:
            problems.append(_unknown_name_problem(name, registries, where))
            continue
        spec_or_problem = _entry_spec(name, hit, cfg)
        if isinstance(spec_or_problem, Problem):
            problems.append(spec_or_problem)
        else:
            specs.append(spec_or_problem)
    if problems:
        raise InputError(problems)
    return [_with_media(spec, cfg) for spec in specs]


def _with_media(spec: DatasetSpec, cfg: RunConfig) -> DatasetSpec:
    """The spec with where its images are looked up (cockpit.data.media.media_dir_of); a built-in demo
    dataset's images are in the demo folder whatever dataset_dir is (LLaMA-Factory's media_dir default is
    the folder of the dataset_info.json that names the dataset: its dataset_dir)."""
    registry = Path(spec.info_file).parent if spec.info_file else None
    dataset_dir = None if registry == DEMO_DIR else cfg.dataset_dir
    spec.media_dir = media_dir_of(cfg.media_dir, dataset_dir, registry, spec.path)
    spec.base_dir = Path(cfg.base_dir or Path.cwd())
    return spec


def _file_spec(value: str, bases: list[Path], where: dict[str, Any]) -> DatasetSpec:
    """The dataset of a file path (relative to the first of BASES that has it, or under @demo)."""
    if value.startswith("@demo"):
        p = DEMO_DIR / value[len("@demo") :].lstrip("/")
    else:
        p = Path(value).expanduser()
        if not p.is_absolute():
            p = next((b / p for b in bases if (b / p).exists()), bases[0] / p)
    if not p.exists():
        raise InputError(Problem(f"no such file: {value}", **where))
    if p.is_dir():
        raise InputError(Problem(f"is a directory, expected a .json or .jsonl file: {value}", **where))
    return DatasetSpec(name=p.stem, path=p)


def _registries(cfg: RunConfig, where: dict[str, Any]) -> list[_Registry]:
    """The dataset_info.json files of info_dirs, read in lookup order; InputError when there is none."""
    registries: list[_Registry] = []
    for d in info_dirs(cfg):
        info = d / "dataset_info.json"
        if info.is_file():
            data, text = _read_info(info)
            registries.append((d, info, data, text))
    if not registries:
        raise InputError(Problem("no dataset_info.json found (set dataset_dir, or give a .json/.jsonl path)", **where))
    return registries


def _unknown_name_problem(name: str, registries: list[_Registry], where: dict[str, Any]) -> Problem:
    """A dataset name no registry has: the closest names they have (a did-you-mean), else all of
    them when they are few, else how many and where."""
    import difflib

    known = sorted({n for _, _, data, _ in registries for n in data})
    files = ", ".join(str(r[1]) for r in registries)
    by_lower = {n.lower(): n for n in known}
    close = [by_lower[c] for c in difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.7)]
    if close:
        hint = "did you mean " + " or ".join(repr(c) for c in close) + "?"
    elif len(known) <= 12:
        hint = "known: " + ", ".join(known)
    else:
        hint = f"none of its {len(known)} names is close; they are the keys of those files"
    return Problem(f"dataset {name!r} is not in {files} ({hint})", **where)


def _entry_spec(name: str, hit: _Registry, cfg: RunConfig) -> DatasetSpec | Problem:
    """The dataset of registry entry NAME, or the first problem of the entry (at its file:line)."""
    d, info, data, text = hit
    entry = data[name]
    line = _entry_line(text, name)
    loc: dict[str, Any] = {"file": str(info), "line": line, "key": name}
    if not isinstance(entry, dict):
        return Problem("entry must be an object with file_name", **loc)
    remote = [k for k in _UNSUPPORTED_ENTRY_KEYS if k in entry]
    if remote and "file_name" not in entry:
        return Problem(
            f"{remote[0]}: datasets from a hub or script are not supported (no hub access); download it and use file_name",
            **loc,
        )
    if "file_name" not in entry:
        return Problem("missing 'file_name'", **loc)
    stage_problem = ranking_problem(cfg.stage or "sft", bool(entry.get("ranking")), entry)
    if stage_problem:
        return Problem(stage_problem, **loc)
    fmt = entry.get("formatting", "alpaca")
    if fmt not in ("alpaca", "sharegpt"):
        return Problem(f"formatting must be alpaca or sharegpt, got {fmt!r}", **loc)
    path = d / entry["file_name"]
    if not path.exists():
        return Problem(f"file_name {entry['file_name']!r}: no such file in {d}", **loc)
    if path.is_dir():
        return Problem(
            f"file_name {entry['file_name']!r} is a directory (folders of files are not supported yet)", **loc
        )
    columns = entry.get("columns") or {}
    tags = entry.get("tags") or {}
    return DatasetSpec(
        name=name,
        path=path,
        formatting=fmt,
        columns=dict(columns),
        tags=dict(tags),
        info_file=str(info),
        info_line=line,
        ranking=bool(entry.get("ranking")),
    )
