"""Training recipes: one per ``stage``, chosen by :func:`get_recipe`.

The worker hands every stage to :func:`run_stage`: the stage's recipe runs in a context built
once (:func:`cockpit.train.recipes.base.make_context`: device, precision, folders, model
reference, tokenizer). The recipe interface and the one flow every stage runs
(:meth:`cockpit.train.recipes.base.Recipe.run`: resume totals, the NaN rule, PiSSA's conversion,
the summary) are in :mod:`cockpit.train.recipes.base`; SFT (:mod:`cockpit.train.recipes.sft`)
fills its hooks with the distributed strategies and lends its trainer to ``cockpit tune``'s trials. Importing this package imports no torch (the recipe
modules are loaded on first use).

Still SFT-only: DeepSpeed / FSDP2 and sharded loading (the other stages declare DDP only, and
``cockpit check`` refuses the rest: ``config/stages.py``).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig
    from cockpit.train.recipes.base import Recipe

# stage -> "module:class" (lazy: a recipe module imports torch / TRL)
RECIPES = {
    "sft": "cockpit.train.recipes.sft:SFTRecipe",
    "dpo": "cockpit.train.recipes.preference:DPORecipe",
    "kto": "cockpit.train.recipes.preference:KTORecipe",
    "rm": "cockpit.train.recipes.reward:RewardRecipe",
    "pt": "cockpit.train.recipes.pretrain:PretrainRecipe",
    "grpo": "cockpit.train.recipes.grpo:GRPORecipe",
}


def get_recipe(stage: str) -> Recipe:
    if stage not in RECIPES:
        raise KeyError(f"no recipe for stage {stage!r} (known: {', '.join(RECIPES)})")
    module, _, name = RECIPES[stage].partition(":")
    recipe: Recipe = getattr(import_module(module), name)()
    return recipe


def run_stage(run: Any, cfg: RunConfig, rank: int, world_size: int, local_rank: int, writer: Any, t0: float) -> int:
    """Train the run's stage in this rank; the worker's exit codes."""
    from cockpit.train.recipes.base import make_context

    recipe = get_recipe(cfg.stage)
    recipe.refuse_what_it_does_not_honour(cfg)
    return recipe.run(make_context(run, cfg, rank, world_size, local_rank, writer, t0))
