"""After the run: hand a trained run to vLLM, and compare base vs tuned answers.

- ``artifacts``   what a finished run offers (adapter, base model, rank, template, probes); no torch
- ``vllm``        a stdlib (urllib) client for a vLLM OpenAI-compatible server, runtime LoRA
                  loading, and the mapping of the server's errors to clear messages; no torch
- ``command``     the ``vllm serve`` command line for a run (merged model, or base + adapter)
- ``chat_worker`` ``python -m cockpit.serve.chat_worker RUN``: local generation in its own
                  process, JSON lines on stdin/stdout (protocol in its docstring); imports torch
- ``compare``     base vs tuned, side by side, through the worker or through vLLM; no torch
"""
