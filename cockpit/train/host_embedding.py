"""A LoRA run's input embedding in host memory: only the rows a forward reads go to the device.

The weight becomes a plain attribute of :class:`HostEmbedding` (neither a parameter nor a buffer),
so ``model.to(device)``, DDP and DeepSpeed's ZeRO-1/2 engine leave it where it is. Each forward
looks the rows up in host memory and copies them to the device of the token ids: the same rows,
so the same activations bit for bit, and the hooks on the embedding's output (PEFT's
``enable_input_require_grads``, NEFTune) see the device tensor as before. Unsloth's
``offload_embedding`` does the same (unslothai/unsloth#6774, guarded on tied embeddings as here);
LLaMA-Factory users asked for it (hiyouga/LlamaFactory#3202).

Cost on a GPU: the token ids come back to the host (a sync) and ``tokens x hidden`` bytes go out
(32 MiB for 2 x 2048 tokens at Llama-3.1-8B's width) once per forward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from cockpit.models.embedding_place import host_embedding_off

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


class HostEmbedding(torch.nn.Module):  # type: ignore[misc]  # torch.nn.Module is Any here (follow_imports = skip)
    """An ``nn.Embedding`` whose frozen weight stays in host memory."""

    def __init__(self, embedding: torch.nn.Embedding) -> None:
        super().__init__()
        self.num_embeddings = embedding.num_embeddings
        self.embedding_dim = embedding.embedding_dim
        self.padding_idx = embedding.padding_idx
        # a plain attribute: Module._apply (to / cuda / half) moves parameters and buffers only
        self.host_weight = embedding.weight.detach().to("cpu")

    @property
    def weight(self) -> torch.Tensor:
        """The table itself (shape, dtype; its device is the host), for code that reads it."""
        return self.host_weight

    def _apply(self, fn: Any, recurse: bool = True) -> HostEmbedding:
        # a cast of the model (half / bfloat16 / to(dtype), DeepSpeed's engine) casts the table too, in
        # host memory; a move (to(device) / cuda) leaves it there: fn tried on an empty tensor says which
        target = fn(torch.empty(0, dtype=self.host_weight.dtype)).dtype
        if target != self.host_weight.dtype:
            self.host_weight = self.host_weight.to(target)
        moved: HostEmbedding = super()._apply(fn, recurse)
        return moved

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(input_ids.to(self.host_weight.device), self.host_weight, self.padding_idx)
        return rows.to(input_ids.device)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, in host memory"


def model_why_not(model: Any) -> str:
    """Why ``model``'s input embedding stays where it is ("" when it can go to host memory)."""
    embedding = model.get_input_embeddings()
    if type(embedding) is not torch.nn.Embedding:
        return f"the input embedding is a {type(embedding).__qualname__}, not a plain nn.Embedding"
    if embedding.max_norm is not None or embedding.sparse:
        return "the input embedding renormalises or has sparse gradients"
    weight = embedding.weight
    if type(weight.data) is not torch.Tensor or hasattr(weight, "ds_id") or weight.is_meta:
        return "the input embedding is sharded or not loaded"
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is weight:
        return "the LM head is tied to it"
    return ""


def keep_on_host(model: Any, cfg: RunConfig) -> str:
    """Moves the input embedding of ``model`` (the base, before its adapter wraps it: the hooks the
    adapter and the Trainer put on the embedding then land on this one) to host memory where the
    config (:func:`cockpit.models.embedding_place.host_embedding_off`) and the model allow; returns
    why not, or "" once moved. A DeepSpeed config of the user's that partitions the weights shows
    in the model (``model_why_not``)."""
    why = host_embedding_off(cfg, bool(cfg.fsdp) or cfg.shape.zero_stage == 3) or model_why_not(model)
    if why:
        return why
    device_table = model.get_input_embeddings()
    model.set_input_embeddings(HostEmbedding(device_table))
    device_table.weight.data = torch.empty(0, dtype=device_table.weight.dtype)  # its device copy goes now
    return ""
