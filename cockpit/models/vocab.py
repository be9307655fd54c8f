"""Vocabulary changes (LLaMA-Factory's ``add_tokens``, ``add_special_tokens`` and ``resize_vocab``):
new tokens in the tokenizer, embedding rows for them, and which rows train.

The tokenizer gains the tokens wherever it is loaded (:func:`cockpit.models.resolve.load_tokenizer`:
``cockpit check``, the ranks, tune, chat), and the run's saved adapter folder carries it. The
model's input embeddings and LM head grow to the tokenizer (``resize_token_embeddings``, padded
to a multiple of 64, new rows initialised from the old rows' mean and covariance) whenever the
config adds tokens (LLaMA-Factory then turns ``resize_vocab`` on) or sets ``resize_vocab``; export
and chat grow the base the same way before they load the adapter. Torch only inside functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cockpit.config.parity import adds_tokens, token_list

PAD_TO_MULTIPLE_OF = 64  # LLaMA-Factory's resize_embedding_layer

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


def grows_vocab(cfg: RunConfig) -> bool:
    """Whether the run resizes the embeddings to its tokenizer (tokens added, or ``resize_vocab``)."""
    return adds_tokens(cfg.mapping()) or bool(cfg.resize_vocab)


def add_configured_tokens(tokenizer: Any, cfg: RunConfig) -> list[str]:
    """Add ``add_tokens`` (normal) and ``add_special_tokens`` (special: never split, skipped when
    decoding with ``skip_special_tokens``) to ``tokenizer``; the tokens that were new to it."""
    vocab = tokenizer.get_vocab()
    normal, special = token_list(cfg.add_tokens), token_list(cfg.add_special_tokens)
    if normal:
        tokenizer.add_tokens(normal, special_tokens=False)
    if special:
        tokenizer.add_special_tokens({"extra_special_tokens": special}, replace_extra_special_tokens=False)
    return [t for t in [*normal, *special] if t not in vocab]


def resize_to_tokenizer(model: Any, tokenizer: Any, mean_resizing: bool = True) -> int | None:
    """Grow the model's input embeddings and LM head to hold every id of ``tokenizer`` (a multiple
    of 64); the number of rows before, or None when the model already had room."""
    rows = int(model.get_input_embeddings().weight.shape[0])
    if len(tokenizer) <= rows:
        return None
    model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=PAD_TO_MULTIPLE_OF, mean_resizing=mean_resizing)
    return rows


def trained_token_ids(tokenizer: Any, cfg: RunConfig, rows_before: int | None) -> list[int]:
    """The ids whose embedding rows must train: the configured tokens and every id the resize gave
    a new row (padding rows past the tokenizer never appear in the data)."""
    tokens = [*token_list(cfg.add_tokens), *token_list(cfg.add_special_tokens)]
    ids = set(tokenizer.convert_tokens_to_ids(tokens)) if tokens else set()
    if rows_before is not None:
        ids |= set(range(rows_before, len(tokenizer)))
    return sorted(i for i in ids if isinstance(i, int) and i >= 0)


def embeddings_tied(model: Any) -> bool:
    out = model.get_output_embeddings()
    return out is not None and out.weight is model.get_input_embeddings().weight


def lora_new_rows_trainable(model: Any, lora_kwargs: dict[str, Any], token_ids: list[int]) -> dict[str, Any]:
    """LoraConfig arguments that train the new tokens' rows beside the adapter.

    Tied embeddings (input embedding = LM head, e.g. SmolLM2, Qwen2.5-0.5B): PEFT's
    ``trainable_token_indices``, which trains only those rows and puts the LM head's token layer on
    the same weights, so the tie holds through training, save and merge. ``modules_to_save`` there
    would train two separate full copies (the tie broken; a merged model that re-ties on load keeps
    only one of them). Untied embeddings: the input embedding and the LM head in
    ``modules_to_save``, as LLaMA-Factory does, since the LM head's new rows must train too."""
    if not token_ids:
        return lora_kwargs
    if embeddings_tied(model):
        return {**lora_kwargs, "trainable_token_indices": list(token_ids)}
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if module is model.get_input_embeddings() or module is model.get_output_embeddings()
    }
    return {**lora_kwargs, "modules_to_save": sorted({*(lora_kwargs.get("modules_to_save") or []), *names})}


def train_embedding_rows(model: Any) -> None:
    """Freeze tuning: the input embedding and LM head train too (they hold the new tokens' rows)."""
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        if module is not None:
            module.weight.requires_grad_(True)
