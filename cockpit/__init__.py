"""Cockpit: a terminal training cockpit for fine-tuning LLMs (ROCm first, CPU for tests)."""

__version__ = "0.1.0"
