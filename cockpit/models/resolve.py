"""``model_name_or_path`` -> something transformers can load: the embedded short name, a local
HF folder, a ``.gguf`` file, or a hub id (only where a hub or the HF cache has it).

A name that is none of these gets a did-you-mean from the embedded names, the model folders
beside it (or in the working dir) and the HF cache's models. Before a hub id is loaded the hub is
asked for once (an HTTP HEAD of ``HF_ENDPOINT``, a few seconds at most; none under
``HF_HUB_OFFLINE``): unreachable, a cached model loads from the cache (``local_files_only``) and an
uncached one is refused at once, not after the HF libraries' retries (51 s measured)."""

from __future__ import annotations

import difflib
import functools
import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.errors import InputError, Problem
from cockpit.models.embedded import ensure_embedded_model, is_embedded
from cockpit.models.embedded_vlm import ensure_embedded_vlm, is_embedded_vlm

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


@dataclass(frozen=True)
class ModelRef:
    path: str  # folder, or the folder holding the gguf file, or a hub id
    gguf_file: str | None = None
    embedded: bool = False
    hub: bool = False
    revision: str | None = None  # model_revision: a hub id's branch, tag or commit
    local_only: bool = False  # a hub id the HF cache holds while the hub is unreachable: no download tried

    def kwargs(self) -> dict[str, Any]:
        """from_pretrained's arguments that say which files: the GGUF file, the hub revision (from
        the cache only when the hub is unreachable)."""
        out: dict[str, Any] = {"gguf_file": self.gguf_file} if self.gguf_file else {}
        if self.revision:
            out["revision"] = self.revision
        if self.local_only:
            out["local_files_only"] = True
        return out

    def model_kwargs(self) -> dict[str, Any]:
        """:meth:`kwargs` for a model's from_pretrained: offline, its look for an adapter_config.json
        too (transformers 5's auto classes do not pass local_files_only on to it: 5 retries, ~25 s)."""
        out = self.kwargs()
        if self.local_only:
            out["adapter_kwargs"] = {"local_files_only": True}
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


def config_model(cfg: RunConfig, log=print) -> ModelRef:
    """The run's base model: ``model_name_or_path`` at ``model_revision`` (a hub id: :func:`hub_ready`)."""
    return hub_ready(resolve_model(cfg.model_name_or_path, log=log, revision=cfg.model_revision))


def _resolve_name(name: str, log) -> ModelRef:
    if is_embedded(name):
        return ModelRef(str(ensure_embedded_model(log=log)), embedded=True)
    if is_embedded_vlm(name):
        return ModelRef(str(ensure_embedded_vlm(log=log)), embedded=True)
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
    raise InputError(Problem(f"no such model folder or file: {name}{did_you_mean(name)}", key="model_name_or_path"))


# -- a did-you-mean for a model name --------------------------------------------------------------
def _model_folders(folder: Path) -> list[str]:
    """The folders in ``folder`` that hold a model (config.json or a .gguf file)."""
    try:
        entries = [e for e in folder.iterdir() if e.is_dir()]
    except OSError:
        return []
    return [e.name for e in entries if (e / "config.json").is_file() or any(e.glob("*.gguf"))]


def cached_hub_models() -> list[str]:
    """The hub ids of the models in this machine's HF cache (its ``models--org--name`` folders)."""
    from huggingface_hub import constants

    try:
        names = os.listdir(constants.HF_HUB_CACHE)
    except OSError:
        return []
    return sorted(n[len("models--") :].replace("--", "/", 1) for n in names if n.startswith("models--"))


def did_you_mean(name: str) -> str:
    """``" (did you mean 'x'?)"``: the closest of the embedded names, the model folders beside
    ``name`` (or in the working dir) and the HF cache's models; "" when none is close."""
    from cockpit.models.embedded import EMBEDDED_NAMES, HUB_ID
    from cockpit.models.embedded_vlm import VLM_NAMES

    p = Path(name).expanduser()
    parent = p.parent if str(p.parent) not in ("", ".") else Path.cwd()
    beside = [str(parent / n) if str(p.parent) not in ("", ".") else n for n in _model_folders(parent)]
    candidates = list(
        dict.fromkeys([*sorted(EMBEDDED_NAMES), HUB_ID, *sorted(VLM_NAMES), *beside, *cached_hub_models()])
    )
    by_lower = {c.lower(): c for c in candidates if c.lower() != name.lower()}  # the name itself is no hint
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(by_lower[c]) for c in close) + "?)"


# -- a hub id: is the hub there? ------------------------------------------------------------------
HUB_PROBE_S = 3.0  # the most the reachability check waits (name lookup included)


@functools.lru_cache(maxsize=4)
def hub_reachable(endpoint: str | None = None, timeout_s: float = HUB_PROBE_S) -> bool:
    """Whether the HF hub answers an HTTP HEAD (any status) within ``timeout_s``, through the
    proxy the environment names as the HF libraries would (no under ``HF_HUB_OFFLINE``). Once per
    process: the HF libraries' own retries take ~50 s offline."""
    import urllib.error
    import urllib.request

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    url = endpoint or constants.ENDPOINT
    answer: list[bool] = []

    def ask() -> None:  # in a thread: a name lookup that hangs is bounded by the join too
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s).close()
            answer.append(True)
        except urllib.error.HTTPError:  # it answered (a 4xx / 5xx is an answer)
            answer.append(True)
        except (OSError, ValueError):  # refused, no route, no name, a timeout, not a URL
            answer.append(False)

    worker = threading.Thread(target=ask, daemon=True, name="hub-probe")
    worker.start()
    worker.join(timeout_s)
    return bool(answer and answer[0])


def in_hf_cache(repo_id: str, revision: str | None = None) -> bool:
    """Whether this machine's HF cache holds ``repo_id``'s config.json at ``revision``."""
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json", revision=revision), str)
    except (OSError, ValueError):
        return False


def hub_ready(ref: ModelRef) -> ModelRef:
    """A hub id before it loads: the hub reachable, as it is; unreachable, a cached model from the
    cache only (``local_only``), else an InputError at once (with a did-you-mean)."""
    if not ref.hub or ref.local_only or hub_reachable():
        return ref
    if in_hf_cache(ref.path, ref.revision):
        return replace(ref, local_only=True)
    raise _hub_error(ref, None)


def _hub_error(ref: ModelRef, exc: Exception | None) -> InputError:
    at = f" at revision {ref.revision!r}" if ref.revision else ""
    if exc is not None and hub_reachable():  # the hub answered: it does not have it (or refused it)
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return InputError(
            Problem(
                f"cannot load {ref.path!r}{at} from the hub: {why}{did_you_mean(ref.path)}", key="model_name_or_path"
            )
        )
    from huggingface_hub import constants

    offline = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else f"{constants.ENDPOINT} is unreachable"
    return InputError(
        Problem(
            f"cannot load {ref.path!r}{at}: it is not in the local Hugging Face cache and {offline}"
            f"{did_you_mean(ref.path)}. Download it on a machine with network and point model_name_or_path "
            "at the folder.",
            key="model_name_or_path",
        )
    )


def load_tokenizer(cfg: RunConfig, ref: ModelRef | None = None, log=print):
    from transformers import AutoTokenizer

    ref = hub_ready(ref or config_model(cfg, log=log))
    try:
        tok = AutoTokenizer.from_pretrained(ref.path, trust_remote_code=bool(cfg.trust_remote_code), **ref.kwargs())
    except (OSError, ValueError) as exc:
        if ref.hub:
            raise _hub_error(ref, exc) from None
        raise InputError(Problem(f"cannot load a tokenizer from {ref.path}: {exc}", key="model_name_or_path")) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    from cockpit.models.vocab import add_configured_tokens

    add_configured_tokens(tok, cfg)  # add_tokens / add_special_tokens
    return tok


def load_model_config(cfg: RunConfig, ref: ModelRef):
    from transformers import AutoConfig

    ref = hub_ready(ref)
    try:
        return AutoConfig.from_pretrained(ref.path, trust_remote_code=bool(cfg.trust_remote_code), **ref.kwargs())
    except (OSError, ValueError) as exc:
        if ref.hub:
            raise _hub_error(ref, exc) from None
        raise InputError(
            Problem(f"cannot read the model config from {ref.path}: {exc}", key="model_name_or_path")
        ) from None


def load_processor(cfg: RunConfig, ref: ModelRef) -> Any:
    """The model's processor (``AutoProcessor``: LlavaProcessor's image processor needs no torchvision)."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(ref.path, trust_remote_code=bool(cfg.trust_remote_code), **ref.kwargs())
