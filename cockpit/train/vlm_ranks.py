"""A vision-language model on several ranks (issue 63): every rank's micro-batch carries an image, and
each rank says how much of each part of the model it holds.

Under ZeRO-3 and FSDP2 the vision tower's parameters are gathered by collectives as it runs, so every
rank must run it at every step, in the same order as the others: a micro-batch whose rows have no image
(text-only rows) would leave its rank out of the tower's all-gathers (measured on 2 gloo ranks under
FSDP2: "Received data size doesn't match expected size ... a distributed collective mismatch"), and
under DDP a tower that trains would get no gradient on that rank. LLaMA-Factory 0.9.5's collator
(``MultiModalDataCollatorForSeq2Seq``) adds a blank image for this ("avoid process hanging in zero3/fsdp
case"): a white 64x64 image whose image tokens go after the first row's tokens, out of the attention
(mask 0) and out of the loss (labels -100). Cockpit does the same whenever there are several ranks; one
rank trains as before.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

BLANK_SIZE = (64, 64)  # LLaMA-Factory's fake image: white, 64x64
IGNORE = -100


class BlankImageWhenNone:
    """The image collator, with a blank image added to a micro-batch whose rows carry none: its tokens
    after the first row's, attended by nothing and out of the loss; the image itself as a row's image
    file, so the image collator processes it as it processes every image."""

    def __init__(self, inner: Callable[[list[dict[str, Any]]], Any], blank_path: str, blank_ids: list[int]) -> None:
        self.inner = inner
        self.blank_path = blank_path
        self.blank_ids = blank_ids
        self.said = False

    def __call__(self, features: list[dict[str, Any]]) -> Any:
        if any(f.get("images") for f in features):
            return self.inner(features)
        if not self.said:  # once, in the rank's log
            print(
                f"a micro-batch without images: a blank image added ({len(self.blank_ids)} image tokens out of the loss)",
                flush=True,
            )
            self.said = True
        rows = [{**f, "attention_mask": list(f.get("attention_mask") or [1] * len(f["input_ids"]))} for f in features]
        first, n = rows[0], len(self.blank_ids)
        rows[0] = {
            **first,
            "input_ids": [*first["input_ids"], *self.blank_ids],
            "attention_mask": [*first["attention_mask"], *[0] * n],
            "labels": [*first["labels"], *[IGNORE] * n],
            "images": [self.blank_path],
        }
        return self.inner(rows)


def blank_image() -> str:
    """A white 64x64 PNG, written once per user in the temporary folder (the same bytes for every run, so
    ranks and runs share it; replaced whole, never seen half written)."""
    from PIL import Image

    path = Path(tempfile.gettempdir()) / f"cockpit-blank-image-{os.getuid()}.png"
    if not path.is_file():
        part = path.with_name(f"{path.name}.{os.getpid()}")
        Image.new("RGB", BLANK_SIZE, (255, 255, 255)).save(part, format="PNG")
        os.replace(part, path)
    return str(path)


def every_rank_sees_an_image(collator: Any, cfg: RunConfig, tokenizer: Any, world_size: int) -> Any:
    """``collator`` (the image collator of a vision-language model), with :class:`BlankImageWhenNone` on
    several ranks; as it is on one. The blank image's tokens are the ones a row's image of its size becomes
    (the template's image plugin: :meth:`cockpit.data.prepare.ImagePlan.texts`), tokenized as
    LLaMA-Factory's collator tokenizes its fake image's."""
    if world_size <= 1:
        return collator
    from cockpit.data.prepare import image_plan

    plan = image_plan(cfg, [{"images": [BLANK_SIZE]}], tokenizer)
    assert plan is not None  # the sample above has an image
    (text,) = plan.texts([{"size": BLANK_SIZE}])
    return BlankImageWhenNone(collator, blank_image(), list(tokenizer(text, add_special_tokens=False)["input_ids"]))


def held_numel(param: Any) -> tuple[int, int]:
    """(elements this rank holds, elements of the whole parameter): a ZeRO-3 parameter's partition plus
    whatever of it is gathered now (a persistent one is kept whole), an FSDP2 DTensor's local shard, or
    the whole tensor (DDP, one rank)."""
    part = getattr(param, "ds_tensor", None)
    if part is not None:
        return int(part.numel()) + int(param.data.numel()), int(param.ds_numel)
    to_local = getattr(param, "to_local", None)
    if callable(to_local):
        return int(to_local().numel()), int(param.numel())
    return int(param.numel()), int(param.numel())


def parameters_held(model: Any) -> dict[str, dict[str, int]] | None:
    """A vision-language model's parameter elements this rank holds per part (``vision``, ``projector``,
    ``language``: ``local`` of ``global``); None for a text model. Under ZeRO-3 and FSDP2 each rank
    holds about 1 / world size of every part, the vision tower included; under DDP all of it."""
    from cockpit.train.vlm import parts_of

    parts = parts_of(model)
    if parts is None:
        return None
    projector = getattr(parts, "projector_keys", None) or (getattr(parts, "projector_key", ""),)
    keys = {
        "vision": tuple(parts.vision_model_keys),
        "projector": tuple(projector),
        "language": tuple(parts.language_model_keys),
    }
    held = {part: {"local": 0, "global": 0} for part in keys}
    for name, param in model.named_parameters():
        part = next((p for p, subs in keys.items() if any(s in name for s in subs)), None)
        if part is not None:
            local, whole = held_numel(param)
            held[part]["local"] += local
            held[part]["global"] += whole
    return held
