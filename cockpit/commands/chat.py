"""``cockpit chat RUN [--prompt P] [--image PATH] [--probes] [--vllm-url URL] [--jsonl]``: the same
prompt to the base and the tuned model, streamed, side by side (``--image``: a vision-language model's
run answers about a local image).

Generation runs in the chat worker subprocess (``python -m cockpit.serve.chat_worker``), or on a
vLLM server when ``--vllm-url`` is given (the adapter is hot-loaded first when missing). This
process never imports torch.

``--jsonl``: the chat worker's JSON-lines protocol on stdin/stdout, whichever backend (see
``cockpit.serve.chat_worker``); this is what a UI should drive.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from cockpit.commands.common import EXIT_FAILED, EXIT_OK, add_runs_dir, find_run, print_input_error
from cockpit.errors import InputError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run")
    add_runs_dir(p)
    p.add_argument(
        "--prompt",
        action="append",
        default=[],
        help="a prompt (repeatable); none and no --probes: read prompts from stdin",
    )
    p.add_argument(
        "--image",
        action="append",
        default=[],
        metavar="PATH",
        help="a local image for every prompt (a vision-language model's run; repeatable: several images); "
        "the prompt gets <image> before its text unless it has one per image",
    )
    p.add_argument("--probes", action="store_true", help="ask the run's probes, report pass/fail for both sides")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: the run's probe_max_new_tokens")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--device", default=None, help="local generation: cpu, cuda, ... (default: cuda when available)")
    p.add_argument(
        "--vllm-url",
        default=os.environ.get("COCKPIT_VLLM_URL"),
        help="generate on this vLLM server instead (default: $COCKPIT_VLLM_URL)",
    )
    p.add_argument(
        "--name",
        default=None,
        help="with --vllm-url: the adapter's model name (default: serve.json's, else the run id)",
    )
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"))
    p.add_argument("--jsonl", action="store_true", help="speak the chat worker's JSON-lines protocol on stdin/stdout")
    p.add_argument("--json", action="store_true", help="print one JSON result at the end instead of streaming text")


def _vllm_backend(args, art, max_new):
    from cockpit.serve.handoff import handoff, read_serve_record
    from cockpit.serve.side_by_side import VLLMBackend
    from cockpit.serve.vllm import VLLMClient

    client = VLLMClient(args.vllm_url, api_key=args.api_key)
    rec = read_serve_record(art)
    name = args.name or (rec.get("model") if rec.get("url") == client.url else None) or art.run_id
    listed = {m.get("id"): m for m in client.models()}
    if name not in listed:
        rec = handoff(art, client, name, log=lambda m: print(m, file=sys.stderr))
        base = rec["base_model_id"]
    else:
        base = listed[name].get("parent") or rec.get("base_model_id")
        if not base:
            raise InputError(
                f"{name!r} on {client.url} is not a LoRA adapter (no parent model); pass --name of the adapter"
            )
    return VLLMBackend(art, client, tuned=name, base=base, max_new_tokens=max_new)


def _jsonl_vllm(backend) -> int:
    out = sys.stdout
    out.write(json.dumps(backend.ready) + "\n")
    out.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            if req.get("quit"):
                return EXIT_OK
            if req.get("cancel"):
                continue  # requests are served synchronously here; nothing in flight to cancel
            msgs = req.get("messages") or [{"role": "user", "content": req["prompt"]}]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            out.write(json.dumps({"error": f"bad request: {exc}"}) + "\n")
            out.flush()
            continue
        for ev in backend.ask(msgs, req.get("max_new_tokens"), float(req.get("temperature") or 0.0)):
            if "id" in req:
                ev = {"id": req["id"], **ev}
            out.write(json.dumps(ev, ensure_ascii=False) + "\n")
            out.flush()
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    from cockpit.serve.artifacts import load_run, load_run_probes
    from cockpit.serve.vllm import VLLMError

    try:
        art = load_run(find_run(args))
        max_new = args.max_new_tokens or art.max_new_tokens()
        args.image = _images(args, art)
        if args.jsonl and not args.vllm_url:
            _exec_chat_worker(args, art, max_new)  # the worker itself speaks the protocol
        backend = _vllm_backend(args, art, max_new) if args.vllm_url else None
        if args.jsonl:
            return _jsonl_vllm(backend)
        probes = load_run_probes(art) if args.probes else []
        if any(p.get("image_path") for p in probes):  # image probes: a vision-language model's run only
            art.refuse_images(key="probes")
        prompts = [{"prompt": p} for p in args.prompt] + probes
        interactive = not prompts
        if interactive and sys.stdin.isatty():
            print("type a prompt, Enter to send; Ctrl-D to quit", file=sys.stderr)
        if backend is None:
            backend = _local_backend(args, art, max_new)
    except InputError as err:
        return print_input_error(err)
    except (VLLMError, RuntimeError) as err:
        print(f"cockpit chat: {err}", file=sys.stderr)
        return EXIT_FAILED
    try:
        results = [_ask(args, backend, item, max_new, many=len(prompts) > 1) for item in _prompts(prompts, interactive)]
    finally:
        backend.close()
    if probes and not args.json:
        passed = {s: sum(1 for r in results if r.get(f"{s}_ok")) for s in ("base", "tuned")}
        print(f"\nprobes: base {passed['base']}/{len(probes)}, tuned {passed['tuned']}/{len(probes)}")
    if args.json:
        print(
            json.dumps(
                {"run_id": art.run_id, "backend": "vllm" if args.vllm_url else "local", "results": results},
                indent=1,
                ensure_ascii=False,
            )
        )
    return EXIT_FAILED if any("error" in r for r in results) else EXIT_OK


def _images(args: argparse.Namespace, art: Any) -> list[str]:
    """``--image``'s paths, absolute; InputError (exit 2) for a file that is not there, a text model (named
    by its type) or a vLLM server."""
    from pathlib import Path

    from cockpit.errors import Problem

    if not args.image:
        return []
    missing = [p for p in args.image if not Path(p).is_file()]
    if missing:
        raise InputError([Problem(f"no such image file: {p}", key="--image") for p in missing])
    if args.vllm_url:
        raise InputError(Problem("images on a vLLM server: not built yet (leave out --vllm-url)", key="--image"))
    if args.jsonl:
        raise InputError(Problem("with --jsonl, a request names its own images ('images')", key="--image"))
    art.refuse_images()
    return [str(Path(p).resolve()) for p in args.image]


def _local_backend(args: argparse.Namespace, art: Any, max_new: int) -> Any:
    """The chat worker, each stage of its load said on stderr as it begins (a model can take minutes)."""
    from cockpit.serve.side_by_side import LocalBackend

    def said(ev: dict[str, Any]) -> None:
        print(f"[{ev.get('elapsed_s', 0):5.1f} s] {ev['progress']} ...", file=sys.stderr, flush=True)

    backend = LocalBackend(art, device=args.device, max_new_tokens=max_new, on_progress=said)
    r = backend.ready
    print(
        f"ready in {r.get('load_s', 0):.1f} s: base and tuned on {r.get('device')} ({r.get('dtype')})", file=sys.stderr
    )
    return backend


def _exec_chat_worker(args: argparse.Namespace, art: Any, max_new: int) -> None:
    """``--jsonl`` with local models: this process becomes the chat worker (JSON lines on stdin/stdout)."""
    argv = [
        sys.executable,
        "-P",
        "-m",
        "cockpit.serve.chat_worker",
        str(art.run.path),
        "--max-new-tokens",
        str(max_new),
    ]
    if args.device:
        argv += ["--device", args.device]
    sys.stdout.flush()
    os.execv(sys.executable, argv)


def end_note(ev: dict[str, Any], max_new: int) -> str:
    """After a side's answer: its token count and time, and whether the token limit (``max_new``) cut it."""
    tokens, seconds = ev.get("tokens"), ev.get("seconds")
    note = f"{tokens} tokens in {seconds:.1f} s" if tokens is not None and seconds is not None else ""
    if ev.get("cut"):
        note = f"cut at max_new_tokens={max_new}" + (f", {seconds:.1f} s" if seconds is not None else "")
    return f"  [{note}]" if note else ""


def _prompts(prompts: list[dict[str, Any]], interactive: bool):
    """The given prompts and probes, then (none given) one per line of stdin."""
    yield from prompts
    if interactive:
        for line in sys.stdin:
            if line.strip():
                yield {"prompt": line.strip()}


def _ask(args: argparse.Namespace, backend: Any, item: dict[str, Any], max_new: int, *, many: bool) -> dict[str, Any]:
    """One prompt to base and tuned, streamed to the terminal (unless ``--json``), with a probe's verdicts."""
    from cockpit.data.probes import passes
    from cockpit.serve.side_by_side import collect, side_by_side

    state: dict[str, Any] = {"side": None}

    def show(ev: dict[str, Any]) -> None:
        if args.json:
            return
        side = ev.get("side")
        if ev.get("start") or ("delta" in ev and state["side"] != side):
            if state["side"] != side:  # a side begins: said before its first token (a CPU can take a while)
                print(f"\n[{side}] ", end="", flush=True)
                state["side"] = side
        if "delta" in ev:
            print(ev["delta"], end="", flush=True)
        elif ev.get("end"):
            print(end_note(ev, max_new), end="", flush=True)
        elif "error" in ev:
            print(f"\nerror: {ev['error']}", file=sys.stderr)

    images = [item["image_path"]] if item.get("image_path") else args.image  # an image probe: its own image
    if not args.json:
        seen = "".join(f"[image {os.path.basename(p)}] " for p in images)
        print(f"\n>>> {seen}{item['prompt']}", end="")
    asked = [{"role": "user", "content": item["prompt"]}]
    if images:
        res = collect(backend.ask(asked, max_new, args.temperature, images=images), show)
        res["images"] = images
    else:
        res = collect(backend.ask(asked, max_new, args.temperature), show)
    res["prompt"] = item["prompt"]
    if item.get("image"):  # an image probe: its image's file name and size, as the Summary names it
        res["image"], res["image_size"] = item["image"], item.get("image_size")
    if "expect" in item:
        res["expect"] = item["expect"]
        res["base_ok"] = passes(res.get("base", ""), item["expect"])
        res["tuned_ok"] = passes(res.get("tuned", ""), item["expect"])
    if not args.json:
        print()
        if many or "expect" in item:
            cut = {side: " [cut]" if res.get(f"{side}_cut") else "" for side in ("base", "tuned")}
            print(side_by_side(res.get("base", "") + cut["base"], res.get("tuned", "") + cut["tuned"]))
        if "expect" in item:
            print(
                f"expect {item['expect']}: base {'PASS' if res['base_ok'] else 'fail'}, tuned {'PASS' if res['tuned_ok'] else 'fail'}"
            )
    return res
