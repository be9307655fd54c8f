"""LLaMA-Factory's flag form of a run config: ``--key value`` / ``--key=value`` / a bare ``--flag``.

``llamafactory-cli train --model_name_or_path M --do_train --dataset D ...`` is how guides start a
run. ``cockpit train`` / ``check`` / ``plan`` accept the same form: :func:`split_config_flags` takes
the config flags out of a command's arguments (whatever the command's own parser does not know),
and :func:`flags_to_overrides` turns them into overrides that go through the same schema as YAML
keys (``load_config``), after the YAML file and before ``--set``. The values stay strings here;
the schema types them. No torch imports.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from cockpit.config.schema import ALIASES, SCHEMA
from cockpit.errors import InputError, Problem

_BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "1", "0"}


@dataclass(frozen=True)
class ConfigFlag:
    flag: str  # as typed, e.g. "--lora_target_modules"
    key: str  # the config key it names, e.g. "lora_target_modules" (aliases resolved by the schema)
    value: Any  # a string as typed, True for a bare flag; a mapping for `env`


def _key_type(key: str) -> str | None:
    spec = SCHEMA.get(ALIASES.get(key, key))
    return spec.type if spec else None


def _is_option(token: str) -> bool:
    return token.startswith("--") and len(token) > 2


def split_config_flags(argv: list[str], own_options: dict[str, bool]) -> tuple[list[str], list[ConfigFlag]]:
    """Split a command's arguments into (its own arguments, config flags).

    ``own_options`` maps the command's own option strings (``--set``, ``--json``, ...) to whether
    each takes a value. Every other ``--name`` is a config flag: ``--name=value``; ``--name value``;
    a bare ``--name`` (true) when the key is a bool and the next word is not true/false.
    ``-`` in a name reads as ``_`` (``--lora-rank`` = ``--lora_rank``), as HF's argument parser does.
    """
    rest: list[str] = []
    flags: list[ConfigFlag] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":  # everything after is the command's own (positional) arguments
            rest.extend(argv[i:])
            break
        name, eq, inline = token.partition("=")
        if not _is_option(token) or name in own_options:
            rest.append(token)
            if name in own_options and own_options[name] and not eq and i + 1 < len(argv):
                rest.append(argv[i + 1])
                i += 1
            i += 1
            continue
        key = name[2:].replace("-", "_")
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if eq:
            value: Any = inline
        elif _key_type(key) == "bool":
            takes = nxt is not None and nxt.strip().lower() in _BOOL_WORDS | {"null", "none"}
            value, i = (nxt, i + 1) if takes else (True, i)
        elif nxt is not None and not _is_option(nxt):
            value, i = nxt, i + 1
        elif _key_type(key) is None:
            value = True  # an unknown / unsupported key: the schema names it below
        else:
            raise InputError(Problem(f"expects a value ({SCHEMA[ALIASES.get(key, key)].type})", key=name))
        if _key_type(key) == "map" and isinstance(value, str):
            value = _yaml_value(value, name)
        flags.append(ConfigFlag(name, key, value))
        i += 1
    return rest, flags


def _yaml_value(raw: str, flag: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise InputError(Problem(f"not a YAML mapping: {exc}", key=flag)) from None


def flags_to_overrides(flags: Iterable[ConfigFlag]) -> tuple[dict[str, Any], dict[str, str]]:
    """(key -> value, key -> flag as typed). A key given twice is an error naming both flags."""
    values: dict[str, Any] = {}
    typed: dict[str, str] = {}
    for f in flags:
        canonical = ALIASES.get(f.key, f.key)
        seen = next((k for k in values if ALIASES.get(k, k) == canonical), None)
        if seen is not None:
            raise InputError(Problem(f"given twice (also as {typed[seen]})", key=f.flag))
        values[f.key] = f.value
        typed[f.key] = f.flag
    return values, typed


def own_options(parser: Any) -> dict[str, bool]:
    """A command parser's option strings -> whether each takes a value."""
    return {
        opt: action.nargs != 0 for opt, action in parser._option_string_actions.items()
    }  # argparse has no public list of options


def typed_values(flags: Iterable[ConfigFlag]) -> dict[str, Any]:
    """The flags' values typed by the schema (aliases read as their key); a bad value or an
    unknown key is a problem naming the flag. For commands that take a raw mapping (``plan``)."""
    from cockpit.config.load import _unknown_key_problem, coerce

    values, typed = flags_to_overrides(flags)
    out: dict[str, Any] = {}
    problems: list[Problem] = []
    for key, value in values.items():
        spec = SCHEMA.get(ALIASES.get(key, key))
        if spec is None:
            p = _unknown_key_problem(key, None, None)
            problems.append(Problem(p.message, key=typed[key]))
            continue
        try:
            out[spec.name] = coerce(spec, value)
        except ValueError as exc:
            problems.append(Problem(str(exc), key=typed[key]))
    if problems:
        raise InputError(problems)
    return out


def name_flags(problems: Iterable[Problem], flags: Iterable[ConfigFlag], *, skip: Iterable[str] = ()) -> None:
    """A problem about a key that a flag set names the flag as typed (``--fp16``), not the key."""
    skipped = set(skip)
    typed = {ALIASES.get(f.key, f.key): f.flag for f in flags if f.key not in skipped}
    typed.update({f.key: f.flag for f in flags if f.key not in skipped})
    for p in problems:
        if p.key in typed and p.line is None:
            p.file, p.key = None, typed[p.key]
