"""The job every throughput benchmark trains: LoRA on the embedded demo data, fp32 on CPU.

One definition, so ratios between benchmarks compare the same work."""

DEMO_LORA_JOB = {
    "template": "chatml",
    "dataset": "cockpit_identity,cockpit_bilingual",
    "finetuning_type": "lora",
    "lora_rank": 16,
    "lora_alpha": 32,
    "lora_target": "all",
    "cutoff_len": 256,
    "learning_rate": 1e-3,
    "lr_scheduler_type": "constant",
    "save_strategy": "no",
    "plot_loss": False,
    "use_cpu": True,
    "seed": 42,
}
