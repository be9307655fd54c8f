"""Data keys (LLaMA-Factory's DataArguments): datasets, templates' inputs, cutoff, packing, mixing.

Each key once: type, default, help, range or choices, and whether LLaMA-Factory has it
(``llamafactory``); :mod:`cockpit.config.schema` joins the groups."""

from __future__ import annotations

from cockpit.config.keys.base import Key, _k

KEYS: tuple[Key, ...] = (
    _k(
        "dataset",
        "str",
        None,
        "a .json/.jsonl file, or comma-separated names from dataset_info.json",
        "dataset",
        nullable=False,
    ),
    _k(
        "dataset_dir",
        "str",
        None,
        "folder with dataset_info.json (default: ./data where the command runs, else next to the config; then the built-in demo data)",
        "dataset",
    ),
    _k(
        "media_dir",
        "str",
        None,
        "folder where the images column's relative paths are looked up first (default: dataset_dir, as in LLaMA-Factory; "
        "else the folder of the dataset_info.json or dataset file)",
        "dataset",
    ),
    _k(
        "cutoff_len",
        "int",
        1024,
        "max tokens per sample; longer samples are truncated",
        "dataset",
        min=8,
        max=1_048_576,
        nullable=False,
    ),
    _k("max_samples", "int", None, "use at most N samples per dataset", "dataset", min=1),
    _k("val_size", "float", 0.0, "fraction (<1) or count (>=1) held out for eval", "dataset", min=0.0, nullable=False),
    _k(
        "overwrite_cache",
        "bool",
        False,
        "with tokenized_path: tokenise afresh and replace the cache (false: reuse it when its settings match)",
        "dataset",
        nullable=False,
    ),
    _k(
        "tokenized_path",
        "str",
        None,
        "a folder keeping SFT's tokenised samples for later runs (reused when tokenizer, template, cutoff, masking and data match)",
        "dataset",
    ),
    _k(
        "preprocessing_num_workers",
        "int",
        None,
        "processes that tokenise the data (default: one)",
        "dataset",
        min=1,
        max=1024,
    ),
    _k(
        "default_system",
        "str",
        None,
        "the system message of every conversation that has none (training, probes, chat, the saved template)",
        "dataset",
    ),
    _k(
        "enable_thinking",
        "bool",
        True,
        "false: the chat template renders with enable_thinking false (a reasoning model's template then writes an empty thought)",
        "dataset",
        nullable=False,
    ),
    _k(
        "tool_format",
        "choice",
        None,
        "how a dataset's tools and function calls are written, as LLaMA-Factory's tool format of that name "
        "(default: Action / Action Input lines; qwen: <tools> / <tool_call> XML; glm4, glm4_moe, ling, llama3, lfm2, "
        "minimax1, minimax2, mistral, seed_oss); unset: a named template's own; with no template (the tokenizer's "
        "own, parsed as LLaMA-Factory parses it) default (gemma4, qwen3_5: not implemented yet)",
        "dataset",
        choices=(
            "default",
            "gemma4",
            "glm4",
            "glm4_moe",
            "lfm2",
            "ling",
            "llama3",
            "minimax1",
            "minimax2",
            "mistral",
            "qwen",
            "qwen3_5",
            "seed_oss",
        ),
    ),
    _k(
        "mix_strategy",
        "choice",
        "concat",
        "several datasets: concat | interleave_under (stop at the shortest) | interleave_over (until the longest ends, oversampling the others)",
        "dataset",
        choices=("concat", "interleave_under", "interleave_over"),
        nullable=False,
    ),
    _k(
        "interleave_probs",
        "str",
        None,
        "interleaving: each dataset's sampling probability, comma-separated, in the datasets' order (default: alternate)",
        "dataset",
    ),
    _k(
        "train_on_prompt",
        "bool",
        False,
        "the loss on the prompt tokens too (system, user), not only the assistant replies",
        "dataset",
        nullable=False,
    ),
    _k(
        "mask_history",
        "bool",
        False,
        "the loss on the last assistant reply only (earlier turns are context)",
        "dataset",
        nullable=False,
    ),
    _k(
        "ignore_pad_token_for_loss",
        "bool",
        True,
        "padding never carries the loss (labels -100): true is the only value",
        "dataset",
        nullable=False,
    ),
    _k("dataloader_num_workers", "int", 0, "DataLoader workers", "dataset", min=0, max=256, nullable=False),
    _k(
        "packing",
        "bool",
        None,
        "padding-free: each micro-batch's samples in one row, position ids restart per sample, attention never crosses samples; "
        "unset: auto (padding-free for micro-batch x cutoff_len <= 4096 tokens or FlashAttention)",
        "dataset",
    ),
    _k(
        "neat_packing",
        "bool",
        False,
        "same as packing here (attention never crosses samples either way)",
        "dataset",
        nullable=False,
    ),
    _k(
        "group_by_length",
        "bool",
        False,
        "micro-batches of similar-length samples (less padding; same samples per epoch)",
        "dataset",
        nullable=False,
    ),
    _k(
        "allow_bad_rows",
        "bool",
        False,
        "skip bad dataset rows (each still reported) instead of failing",
        "dataset",
        nullable=False,
        llamafactory=False,
    ),
)
