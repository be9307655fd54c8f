"""The run config ``validate()`` returns: frozen and typed, one field per schema key
(``run_config_keys.py``, generated from the schema), with the answers derived from several keys
computed once (world size, precision, strategy, whether the parameters are sharded).

Read fields as attributes (``cfg.cutoff_len``); a RunConfig is not a mapping. The loader's rules
(``config/load.py``, ``parity.py``, ``stages.py``, ...) work on the flat LLaMA-Factory dict before a
RunConfig exists; where a rank or the planner asks one of them again, it hands them ``cfg.mapping()``
(the schema keys plus ``_base_dir``, the folder relative paths were resolved against, and ``_notes``,
what validation said once). A change is a new config: ``cfg.replace(key=value)`` (validated values
only: to apply a user's value, validate again, e.g. ``validate({**cfg.mapping(), **changes})``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from cockpit.config.run_config_keys import RunConfigKeys
from cockpit.shape import RunShape, shape_of

KEY_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RunConfigKeys))
_KEY_SET = frozenset(KEY_NAMES)
_PRIVATE = {"_base_dir": "base_dir", "_notes": "notes"}  # the flat dict's names for the two extras


@dataclass(frozen=True)  # equal when every field is (base_dir and notes too)
class RunConfig(RunConfigKeys):
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
        return shape_of(self.mapping())

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

    # -- the flat dict the loader's rules read ------------------------------------------------------
    def mapping(self) -> dict[str, Any]:
        """The schema keys, ``_base_dir`` and ``_notes``: the flat dict ``validate`` built this config
        from, for the loader's rules (and ``validate`` again, with changes spread over it)."""
        return {**self.keys_only(), "_base_dir": self.base_dir, "_notes": list(self.notes)}

    def keys_only(self) -> dict[str, Any]:
        """The schema keys and their values, as a plain dict (what config.yaml holds)."""
        return {k: getattr(self, k) for k in KEY_NAMES}
