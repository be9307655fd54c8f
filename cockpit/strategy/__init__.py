"""Distributed strategies and launch: torchrun command and per-rank environment (``launch``),
NUMA binding (``numa``, ``bind``), DeepSpeed configs (``deepspeed``), FSDP2 sharding (``fsdp``),
multi-node exports (``multinode``). Only ``fsdp`` and ``deepspeed.effective`` import torch /
transformers / deepspeed, and only when called."""
