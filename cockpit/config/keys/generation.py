"""Generation keys (LLaMA-Factory's GeneratingArguments): do_predict and how predictions are sampled.

Each key once: type, default, help, range or choices, and whether LLaMA-Factory has it
(``llamafactory``); :mod:`cockpit.config.schema` joins the groups."""

from __future__ import annotations

from cockpit.config.keys.base import Key, _k

KEYS: tuple[Key, ...] = (
    # prediction (LLaMA-Factory's do_predict + predict_with_generate; its generating arguments)
    _k(
        "do_predict",
        "bool",
        False,
        "generate an answer for every prediction sample (eval_dataset, else the val_size split; with do_train "
        "false, else dataset) with the trained adapter: generated_predictions.jsonl, BLEU-4 and ROUGE scores",
        "predict",
        nullable=False,
    ),
    _k(
        "predict_with_generate",
        "bool",
        False,
        "prediction generates (required with do_predict: the scores compare generated text with the labels)",
        "predict",
        nullable=False,
    ),
    _k(
        "max_new_tokens",
        "int",
        1024,
        "prediction: tokens generated per sample at most",
        "predict",
        min=1,
        nullable=False,
    ),
    _k(
        "do_sample",
        "bool",
        False,
        "prediction: sample (seeded by seed) instead of greedy decoding (LLaMA-Factory's default is true; Cockpit's "
        "false: the same adapter gives the same predictions)",
        "predict",
        nullable=False,
    ),
    _k(
        "temperature",
        "float",
        0.95,
        "prediction with do_sample, and grpo's sampled completions: sampling temperature",
        "predict",
        min=0.0,
        min_exclusive=True,
        nullable=False,
    ),
    _k(
        "top_p",
        "float",
        0.7,
        "prediction with do_sample, and grpo's sampled completions: nucleus sampling mass",
        "predict",
        min=0.0,
        max=1.0,
        min_exclusive=True,
        nullable=False,
    ),
    _k(
        "top_k",
        "int",
        50,
        "prediction with do_sample, and grpo's sampled completions: sample among the k likeliest tokens (0: all)",
        "predict",
        min=0,
        nullable=False,
    ),
    _k(
        "repetition_penalty",
        "float",
        1.0,
        "prediction and grpo's sampled completions: penalty of repeated tokens (1.0: none)",
        "predict",
        min=0.0,
        min_exclusive=True,
        nullable=False,
    ),
)
