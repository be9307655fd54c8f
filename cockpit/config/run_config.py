"""The run config ``validate()`` returns: frozen and typed, one field per schema key
(``run_config_keys.py``, generated from the schema), with the answers derived from several keys
computed once (world size, precision, strategy, whether the parameters are sharded).

Read fields as attributes (``cfg.cutoff_len``). The read-only mapping view (``cfg["cutoff_len"]``,
``cfg.get(...)``, ``dict(cfg)``) serves code written against the flat LLaMA-Factory dict; it also holds
``_base_dir`` (the folder relative paths were resolved against) and ``_notes`` (what validation said
once). A change is a new config: ``cfg.replace(key=value)`` (validated values only: to apply a user's
value, validate again).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from cockpit.config.run_config_keys import RunConfigKeys
from cockpit.shape import RunShape, shape_of

KEY_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RunConfigKeys))
_KEY_SET = frozenset(KEY_NAMES)
_PRIVATE = {"_base_dir": "base_dir", "_notes": "notes"}  # the mapping view's names for the two extras


@dataclass(frozen=True, eq=False)
class RunConfig(RunConfigKeys, Mapping[str, Any]):
    base_dir: str | None = None
    notes: tuple[str, ...] = ()

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RunConfig:
        """A config from resolved values (schema keys, and ``_base_dir`` / ``_notes``); an unknown key is
        a programming error (``validate`` refuses a user's unknown key with its line)."""
        unknown = sorted(set(values) - _KEY_SET - set(_PRIVATE))
        if unknown:
            raise TypeError(f"not run config keys: {', '.join(unknown)}")
        kw = {k: v for k, v in values.items() if k in _KEY_SET}
        return cls(**kw, base_dir=values.get("_base_dir"), notes=tuple(values.get("_notes") or ()))

    @classmethod
    def from_resolved(cls, values: Mapping[str, Any] | None) -> RunConfig:
        """A run dir's config.yaml (written resolved by ``cockpit train``), typed and not validated again:
        its files may be gone and its env is redacted. A key a later Cockpit no longer has is left out,
        so an old run can still be read, resumed and exported."""
        return cls.from_mapping({k: v for k, v in (values or {}).items() if k in _KEY_SET})

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    # -- derived once ----------------------------------------------------------------------------
    @cached_property
    def shape(self) -> RunShape:
        return shape_of(self)

    @property
    def world_size(self) -> int:
        return self.shape.world_size

    @property
    def precision(self) -> str:
        return self.shape.precision

    @property
    def strategy(self) -> str:
        return self.shape.strategy

    @property
    def sharded(self) -> bool:
        """Parameters split over ranks: ZeRO-3 (generated) or FSDP."""
        return self.shape.sharded

    # -- the read-only mapping view ----------------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        if key in _PRIVATE:
            value = getattr(self, _PRIVATE[key])
            return list(value) if key == "_notes" else value
        if key not in _KEY_SET:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        yield from KEY_NAMES
        yield from _PRIVATE

    def __len__(self) -> int:
        return len(KEY_NAMES) + len(_PRIVATE)

    def __contains__(self, key: object) -> bool:
        return key in _PRIVATE or key in _KEY_SET

    def keys_only(self) -> dict[str, Any]:
        """The schema keys and their values, as a plain dict (what config.yaml holds)."""
        return {k: getattr(self, k) for k in KEY_NAMES}
