"""A schema key's shape (:class:`Key`) and the value lists keys name as choices. No torch / transformers
imports here (the UI uses the schema)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# transformers.SchedulerType values (pinned by tests/test_config.py against the real enum).
SCHEDULERS = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
    "greedy",
)


# transformers.training_args.OptimizerNames values (pinned by tests/test_lf_parity.py against the real enum).
OPTIMIZERS = (
    "adamw_torch",
    "adamw_torch_fused",
    "adamw_torch_xla",
    "adamw_torch_npu_fused",
    "adafactor",
    "adamw_anyprecision",
    "adamw_torch_4bit",
    "adamw_torch_8bit",
    "ademamix",
    "sgd",
    "adagrad",
    "adamw_bnb_8bit",
    "adamw_8bit",
    "ademamix_8bit",
    "lion_8bit",
    "lion_32bit",
    "paged_adamw_32bit",
    "paged_adamw_8bit",
    "paged_ademamix_32bit",
    "paged_ademamix_8bit",
    "paged_lion_32bit",
    "paged_lion_8bit",
    "rmsprop",
    "rmsprop_bnb",
    "rmsprop_bnb_8bit",
    "rmsprop_bnb_32bit",
    "galore_adamw",
    "galore_adamw_8bit",
    "galore_adafactor",
    "galore_adamw_layerwise",
    "galore_adamw_8bit_layerwise",
    "galore_adafactor_layerwise",
    "lomo",
    "adalomo",
    "grokadamw",
    "schedule_free_radam",
    "schedule_free_adamw",
    "schedule_free_sgd",
    "apollo_adamw",
    "apollo_adamw_layerwise",
    "stable_adamw",
)


# torch.compile's modes (torch._inductor.list_mode_options; pinned by tests/test_kernels.py): HF's
# torch_compile_mode reaches torch.compile(mode=...) through accelerate's TorchDynamoPlugin.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

# report_to: the experiment trackers HF's Trainer logs to (cockpit/config/trackers.py, cockpit/train/trackers.py)
TRACKER_NAMES = ("tensorboard", "wandb", "mlflow", "trackio", "swanlab")
REPORT_TO_HELP = (
    "experiment trackers HF's Trainer logs to, one or a list: none | tensorboard | wandb | mlflow | trackio | swanlab "
    "(their files under RUN_DIR/trackers)"
)


@dataclass(frozen=True)
class Key:
    name: str
    type: str  # str | int | float | bool | map (env: NAME -> str) | dict (any YAML mapping) | choice | int_or_auto
    # | names (one or a YAML / comma list of the choices, stored as a comma string: report_to)
    default: Any = None
    help: str = ""
    group: str = "training"
    choices: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    nullable: bool = True
    llamafactory: bool = True  # the key (and its meaning) comes from LLaMA-Factory
    extra: dict[str, Any] = field(default_factory=dict)


def _k(*args: Any, **kwargs: Any) -> Key:
    return Key(*args, **kwargs)
