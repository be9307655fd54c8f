"""Model keys (LLaMA-Factory's ModelArguments): which weights, how they load, quantization, vocabulary.

Each key once: type, default, help, range or choices, and whether LLaMA-Factory has it
(``llamafactory``); :mod:`cockpit.config.schema` joins the groups."""

from __future__ import annotations

from cockpit.config.keys.base import Key, _k

KEYS: tuple[Key, ...] = (
    _k(
        "model_name_or_path",
        "str",
        "smollm2-135m-instruct",
        "embedded short name, local HF folder, .gguf file, or hub id",
        "model",
        nullable=False,
    ),
    _k("adapter_name_or_path", "str", None, "an existing LoRA adapter folder to start from", "model"),
    _k("trust_remote_code", "bool", False, "run Python code shipped with the model (warned)", "model", nullable=False),
    _k(
        "model_revision",
        "str",
        None,
        "a hub id's branch, tag or commit (from_pretrained revision=; default: main); refused with a local folder "
        "(it holds one revision)",
        "model",
    ),
    _k("template", "str", None, "chat template: the tokenizer's own when unset, else a named one", "model"),
    _k(
        "quantization_bit",
        "choice",
        None,
        "4 (QLoRA, NF4) or 8 bit base weights; needs bitsandbytes (its wheels train on a GPU or the CPU)",
        "method",
        choices=(4, 8),
    ),
    _k(
        "quantization_method",
        "choice",
        "bnb",
        "how quantization_bit quantizes: bitsandbytes on the fly (LLaMA-Factory's hqq / eetq are not supported)",
        "method",
        choices=("bnb", "bitsandbytes"),
        nullable=False,
    ),
    _k(
        "quantization_type",
        "choice",
        "nf4",
        "4-bit data type of bitsandbytes",
        "method",
        choices=("nf4", "fp4"),
        nullable=False,
    ),
    _k(
        "double_quantization",
        "bool",
        True,
        "4-bit: quantize the quantization constants too (about 0.37 bit a weight less)",
        "method",
        nullable=False,
    ),
    _k(
        "flash_attn",
        "choice",
        "auto",
        "attention kernel: auto | sdpa | eager | fa2 (fa2 needs flash-attn and a GPU)",
        "model",
        choices=("auto", "sdpa", "eager", "disabled", "fa2"),
        nullable=False,
    ),
    _k(
        "rope_scaling",
        "choice",
        None,
        "RoPE scaling for a cutoff_len beyond the model's context: linear | dynamic | yarn | llama3 (factor: cutoff_len / context, rounded up)",
        "model",
        choices=("linear", "dynamic", "yarn", "llama3"),
    ),
    _k(
        "moe_aux_loss_coef",
        "float",
        None,
        "a mixture-of-experts model's router load-balancing loss, added to the loss with this weight (the config's "
        "router_aux_loss_coef, router logits on, as LLaMA-Factory sets them); logged beside the loss as aux_loss",
        "model",
        min=0.0,
    ),
    _k("upcast_layernorm", "bool", False, "keep the norm layers' weights in fp32", "model", nullable=False),
    _k("upcast_lmhead_output", "bool", False, "compute the LM head's logits in fp32", "model", nullable=False),
    _k(
        "low_cpu_mem_usage",
        "bool",
        True,
        "load weights without a random init first (transformers 5 always does)",
        "model",
        nullable=False,
    ),
    _k(
        "add_tokens",
        "str",
        None,
        "comma-separated normal tokens added to the tokenizer (each then one id; the embeddings grow, resize_vocab)",
        "model",
    ),
    _k(
        "add_special_tokens",
        "str",
        None,
        "comma-separated special tokens added to the tokenizer (new_special_tokens: the older name)",
        "model",
    ),
    _k(
        "resize_vocab",
        "bool",
        False,
        "resize the embeddings and LM head to the tokenizer (a multiple of 64), new rows trained; on when tokens are added",
        "model",
        nullable=False,
    ),
)
