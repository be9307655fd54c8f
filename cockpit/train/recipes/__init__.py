"""Training recipes: one per ``stage``, chosen by :func:`get_recipe`.

``worker._train`` hands every stage but ``sft`` to :func:`run_stage`; the recipe interface and
the shared flow are in :mod:`cockpit.train.recipes.base`. Importing this package imports no
torch (the recipe modules are loaded on first use).

SFT is still the inline path of ``worker._train`` (others were editing it while the seam was
cut). It moves in as ``recipes/sft.py``: ``build_data`` = ``prepare_dataset`` + the val split,
``build_models`` = ``build_model`` + ``_apply_strategy`` / FSDP sharding (which move into
``run_recipe`` so every stage gets them), ``build_trainer`` = ``CockpitTrainer`` (or FSDP's
``trainer_class``) with ``DataCollatorForSeq2Seq``, ``summary`` = the truncation report. Then
``_train`` is ``run_recipe(get_recipe(stage), make_context(...))`` and ``plan/tune.py``'s trial
trainer asks ``recipe.build_trainer`` instead of the worker's private helpers.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# stage -> "module:class" (lazy: a recipe module imports torch / TRL)
RECIPES = {
    "dpo": "cockpit.train.recipes.preference:DPORecipe",
    "kto": "cockpit.train.recipes.preference:KTORecipe",
    "rm": "cockpit.train.recipes.reward:RewardRecipe",
    "pt": "cockpit.train.recipes.pretrain:PretrainRecipe",
}


def get_recipe(stage: str) -> Any:
    if stage not in RECIPES:
        raise KeyError(f"no recipe for stage {stage!r} (known: sft, {', '.join(RECIPES)})")
    module, _, name = RECIPES[stage].partition(":")
    return getattr(import_module(module), name)()


def run_stage(run: Any, cfg: dict[str, Any], rank: int, world_size: int, local_rank: int, writer: Any, t0: float) -> int:
    """Train one non-SFT stage in this rank; the worker's exit codes."""
    from cockpit.train.recipes.base import make_context, run_recipe

    recipe = get_recipe(cfg["stage"])
    return run_recipe(recipe, make_context(run, cfg, rank, world_size, local_rank, writer, t0))
