"""``model_name_or_path`` -> something transformers can load: the embedded short name, a local
HF folder, a ``.gguf`` file, or a hub id (only where a hub or the HF cache has it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cockpit.errors import InputError, Problem
from cockpit.models.embedded import ensure_embedded_model, is_embedded


@dataclass(frozen=True)
class ModelRef:
    path: str  # folder, or the folder holding the gguf file, or a hub id
    gguf_file: str | None = None
    embedded: bool = False
    hub: bool = False
    revision: str | None = None  # model_revision: a hub id's branch, tag or commit

    def kwargs(self) -> dict[str, Any]:
        """from_pretrained's arguments that say which files: the GGUF file, the hub revision."""
        out: dict[str, Any] = {"gguf_file": self.gguf_file} if self.gguf_file else {}
        if self.revision:
            out["revision"] = self.revision
        return out


def resolve_model(name: str, log=print, revision: str | None = None) -> ModelRef:
    """``name`` as a ModelRef; ``revision`` (``model_revision``) pins a hub id's branch, tag or
    commit, and is refused for anything else (a folder or file holds one revision)."""
    ref = _resolve_name(name, log)
    if not revision:
        return ref
    if not ref.hub:
        raise InputError(
            Problem(
                f"pins a hub revision; {name} is a local model (one revision): unset model_revision or set "
                "model_name_or_path to the hub id",
                key="model_revision",
            )
        )
    return ModelRef(ref.path, hub=True, revision=revision)


def config_model(cfg: Mapping[str, Any], log=print) -> ModelRef:
    """The run's base model: ``model_name_or_path`` at ``model_revision``."""
    return resolve_model(cfg["model_name_or_path"], log=log, revision=cfg.get("model_revision"))


def _resolve_name(name: str, log) -> ModelRef:
    if is_embedded(name):
        return ModelRef(str(ensure_embedded_model(log=log)), embedded=True)
    p = Path(name).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return ModelRef(str(p.parent), gguf_file=p.name)
    if p.is_dir():
        if not (p / "config.json").exists():
            ggufs = sorted(p.glob("*.gguf"))
            if ggufs:
                return ModelRef(str(p), gguf_file=ggufs[0].name)
            raise InputError(
                Problem(f"{p} has no config.json (not a Hugging Face model folder)", key="model_name_or_path")
            )
        return ModelRef(str(p))
    if p.exists():
        raise InputError(Problem(f"{p} is neither a model folder nor a .gguf file", key="model_name_or_path"))
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        return ModelRef(name, hub=True)
    raise InputError(Problem(f"no such model folder or file: {name}", key="model_name_or_path"))


def _hub_error(ref: ModelRef, exc: Exception) -> InputError:
    at = f" at revision {ref.revision!r}" if ref.revision else ""
    return InputError(
        Problem(
            f"cannot load {ref.path!r}{at} from the hub: it is not in the local Hugging Face cache and the hub is "
            f"unreachable ({type(exc).__name__}). Download it on a machine with network and point "
            "model_name_or_path at the folder.",
            key="model_name_or_path",
        )
    )


def load_tokenizer(cfg: Mapping[str, Any], ref: ModelRef | None = None, log=print):
    from transformers import AutoTokenizer

    ref = ref or config_model(cfg, log=log)
    try:
        tok = AutoTokenizer.from_pretrained(
            ref.path, trust_remote_code=bool(cfg.get("trust_remote_code")), **ref.kwargs()
        )
    except (OSError, ValueError) as exc:
        if ref.hub:
            raise _hub_error(ref, exc) from None
        raise InputError(Problem(f"cannot load a tokenizer from {ref.path}: {exc}", key="model_name_or_path")) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    from cockpit.models.vocab import add_configured_tokens

    add_configured_tokens(tok, cfg)  # add_tokens / add_special_tokens
    return tok


def load_model_config(cfg: Mapping[str, Any], ref: ModelRef):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(
            ref.path, trust_remote_code=bool(cfg.get("trust_remote_code")), **ref.kwargs()
        )
    except (OSError, ValueError) as exc:
        if ref.hub:
            raise _hub_error(ref, exc) from None
        raise InputError(
            Problem(f"cannot read the model config from {ref.path}: {exc}", key="model_name_or_path")
        ) from None
