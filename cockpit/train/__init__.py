"""Training ranks: the HF Trainer worker, its callbacks, atomic checkpoints and probes (imports torch)."""
