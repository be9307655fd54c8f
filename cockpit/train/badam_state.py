"""BAdam's place in its block order, kept with each checkpoint so a resumed run trains the block it
was on (badam's ``BlockOptimizer`` starts at ``start_block`` otherwise, and the Adam moments saved
for the block it left would be loaded into another block's parameters)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

STATE_FILE = "badam_block.json"


def block_optimizer(optimizer: Any) -> Any:
    """The ``badam.BlockOptimizer`` behind the Trainer's (accelerate-wrapped) optimizer, or None."""
    inner = getattr(optimizer, "optimizer", optimizer)
    return inner if type(inner).__name__ == "BlockOptimizer" else None


def active_block(opt: Any) -> int:
    """The index of the block being trained now (``current_block_idx`` already names the next one)."""
    active = [p for p in opt.active_param_prefixs if p not in opt.active_modules]
    index: int = opt.block_prefix_list.index(active)
    return index


def save_block(optimizer: Any, folder: str) -> None:
    opt = block_optimizer(optimizer)
    if opt is None:
        return
    state = {
        "active_block": active_block(opt),
        "next_block": opt.current_block_idx,
        "global_step": opt.global_step,
        "block_order": list(getattr(opt, "block_order", [])),
    }
    with open(os.path.join(folder, STATE_FILE), "w", encoding="utf-8") as fh:
        json.dump(state, fh)


def restore_block(optimizer: Any, checkpoint: str, log: Callable[[str], object]) -> None:
    """Make the checkpoint's block the trained one again (fresh fp32 copies of its weights, which
    the checkpoint's weights already hold), before its Adam moments are loaded."""
    opt = block_optimizer(optimizer)
    path = os.path.join(checkpoint, STATE_FILE)
    if opt is None or not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as fh:
        state = json.load(fh)
    opt.current_block_idx = int(state["active_block"])
    opt.switch_trainable_params(verbose=0)
    opt.current_block_idx, opt.global_step = int(state["next_block"]), int(state["global_step"])
    if opt.switch_mode == "random":  # the rest of the saved shuffle, even when it was used up
        opt.block_order = list(state["block_order"])
    log(f"BAdam: resumed on block {state['active_block']} ({', '.join(opt.block_prefix_list[state['active_block']])})")
