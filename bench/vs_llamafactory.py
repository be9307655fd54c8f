"""Cockpit vs LLaMA-Factory 0.9.5 on the same job, through both CLIs, run alternately.

    python bench/vs_llamafactory.py [--shape lora|lora-fp32|full|short|packing|all] [--rounds 3] [--real-data]
                                    [--fp32-model] [--same-settings] [--model DIR] [--no-lf]
    python bench/vs_llamafactory.py --no-lf --model DIR --shape lora-fp32 --steps 1 --rounds 1   # the suite's smoke run

LLaMA-Factory lives in its own venv under the bench cache dir (``bench/lf_venv.py`` installs it
on first use; it is never a dependency of the project). Both tools read the same YAML (LLaMA-
Factory keys) and the same model folder: the embedded SmolLM2-135M-Instruct, converted once by
cockpit into ``$COCKPIT_CACHE_DIR/models/smollm2-135m-instruct``.

Data: the bench writes its own alpaca-format demo data (instruction / input / output, LLaMA-
Factory's ``dataset_info.json``), deterministic and of varied length. ``--real-data`` uses
LLaMA-Factory's own ``alpaca_en_demo`` / ``alpaca_zh_demo`` from ``--lf-data`` instead (and says
so, and stops, when they are missing).

Shapes (issue 16). The YAML sets neither gradient checkpointing nor packing, so each tool runs
its own defaults: LLaMA-Factory checkpoints (reentrant) and pads; Cockpit does not checkpoint
(its planner asks for ``gradient_checkpointing: true`` when a run would not fit) and trains
padding-free (``packing`` auto: the same samples and the same loss, no padding computed).
``--same-settings`` also writes LLaMA-Factory's defaults into the YAML for both (checkpointing,
padded), and runs the user's YAML with LLaMA-Factory's checkpointing written in and packing unset
(LLaMA-Factory pads, Cockpit trains padding-free), each beside the defaults rows.
  lora       LoRA r8 on all linear layers, bf16, cutoff 256, batch 4, 20 steps, en + zh rows
             (100 each)
  lora-fp32  the lora job in fp32 (CPUs without fast bf16)
  full       the same job with full fine-tuning in fp32
  short      short varied samples: en rows only (200), cutoff 1024, LoRA, fp32, 20 steps
  packing    en rows only, cutoff 1024, one epoch, ``packing: true`` (Cockpit: padding-free with
             per-sample attention; LLaMA-Factory: its own packing into cutoff_len blocks, which
             lets samples attend to each other and takes fewer, longer steps)

Per round it prints each tool's whole-command wall time, its training time, and training
tokens/s (cockpit: its summary's non-padding tokens / train time; LLaMA-Factory: its own count,
HF's ``num_input_tokens_seen`` with ``include_num_input_tokens_seen=non_padding``, / its ``train_runtime``), then the ratios LLaMA-Factory / cockpit (above 1:
cockpit is faster). Ratios, not absolute times, are the result: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lf_venv

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = lf_venv.cache_root().parent.parent / "models" / "smollm2-135m-instruct"
LF_DATA = Path("/work/shared/interop/llama-factory/data")

COMMON = {
    "model_name_or_path": None,  # filled: the model folder
    "stage": "sft",
    "do_train": True,
    "template": "chatml",
    "dataset_dir": None,  # filled
    "overwrite_cache": True,
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 1,
    "learning_rate": 1.0e-4,
    "lr_scheduler_type": "cosine",
    "logging_steps": 5,
    "save_strategy": "no",
    "report_to": "none",
    "plot_loss": False,
    "use_cpu": True,
    "seed": 42,
}
_LORA = {"finetuning_type": "lora", "lora_rank": 8, "lora_target": "all"}
_EN_ZH = {"dataset": "bench_en,bench_zh", "max_samples": 100, "cutoff_len": 256, "max_steps": 20}  # the issue-16 job
_EN_LONG = {"dataset": "bench_en", "max_samples": 200, "cutoff_len": 1024}  # short varied samples, cutoff 1024
SHAPES = {
    "lora": {**_EN_ZH, **_LORA, "bf16": True},
    # the lora job in fp32: for CPUs without AVX512-BF16 / AMX, where bf16 autocast is emulated
    # (~190 s a step against ~7 s in fp32 on such a 2-core box): ratios of the bf16 shape mean nothing there
    "lora-fp32": {**_EN_ZH, **_LORA, "bf16": False},
    "full": {**_EN_ZH, "finetuning_type": "full", "bf16": False},
    "short": {**_EN_LONG, **_LORA, "bf16": False, "max_steps": 20},
    "packing": {**_EN_LONG, **_LORA, "bf16": False, "num_train_epochs": 1.0, "packing": True},
}
# --same-settings: LLaMA-Factory's defaults written into the YAML, so Cockpit runs them too
# (gradient checkpointing on, reentrant; padded batches) instead of its own (off; padding-free)
SAME_SETTINGS = {"gradient_checkpointing": True, "use_reentrant_gc": True, "packing": False}
# --same-settings also runs the YAML a LLaMA-Factory user has (its examples set neither key) with
# LLaMA-Factory's checkpointing written in, packing left unset: LLaMA-Factory pads (its default for
# sft), Cockpit trains padding-free (its default: the same samples per step and the same loss). It
# is the same LLaMA-Factory run as SAME_SETTINGS, so each round runs it once for both rows.
USER_SETTINGS = {"gradient_checkpointing": True, "use_reentrant_gc": True}


_EN = (
    "the model reads a short note about rivers and mountains and answers in plain words while "
    "the team checks every step of the training run for errors and slow parts before lunch"
).split()
_ZH = list("模型读取一段关于河流和山脉的短文并用简单的话回答团队在午饭前检查训练的每一步")


def _text(rng: random.Random, words: list[str], n: int, sep: str) -> str:
    return sep.join(rng.choice(words) for _ in range(n))


def write_demo_data(folder: Path, real: bool) -> str:
    """Alpaca-format files + dataset_info.json in ``folder``; returns a line saying which data."""
    folder.mkdir(parents=True, exist_ok=True)
    if real:
        names = {"bench_en": "alpaca_en_demo.json", "bench_zh": "alpaca_zh_demo.json"}
        missing = [n for n in names.values() if not (LF_DATA / n).exists()]
        if missing:
            raise SystemExit(
                f"--real-data: {', '.join(missing)} missing in {LF_DATA}; run without --real-data to use the bench's own data"
            )
        for name, file in names.items():
            shutil.copy(LF_DATA / file, folder / f"{name}.json")
        source = f"LLaMA-Factory's alpaca_en_demo / alpaca_zh_demo from {LF_DATA}"
    else:
        rng = random.Random(16)
        for name, words, sep in (("bench_en", _EN, " "), ("bench_zh", _ZH, "")):
            rows = [
                {
                    "instruction": _text(rng, words, rng.randint(4, 30), sep),
                    "input": _text(rng, words, rng.randint(0, 40), sep) if rng.random() < 0.4 else "",
                    "output": _text(rng, words, rng.randint(10, 200), sep),
                }
                for _ in range(300)
            ]
            (folder / f"{name}.json").write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
        source = "the bench's own synthetic alpaca-format rows (300 en, 300 zh; varied lengths)"
    info = {n: {"file_name": f"{n}.json"} for n in ("bench_en", "bench_zh")}
    (folder / "dataset_info.json").write_text(json.dumps(info), encoding="utf-8")
    return source


def fp32_copy(model_dir: Path) -> Path:
    """The model folder with fp32 weights (config dtype float32), written once beside it, for
    ``--fp32-model``: LLaMA-Factory loads weights in the config's dtype (``torch_dtype="auto"``), so
    the embedded model's bf16 folder makes it compute in bf16 even in the fp32 shapes, which a CPU
    without AVX512-BF16 / AMX emulates (~25x slower). Both tools then read this one folder."""
    out = model_dir.parent / f"{model_dir.name}-fp32"
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).save_pretrained(str(tmp))
    AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(tmp))
    tmp.rename(out)
    return out


def run_cockpit(cfg_path: Path, work: Path) -> dict[str, float]:
    runs = work / "cockpit-runs"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "cockpit.cli", "train", str(cfg_path), "--runs-dir", str(runs)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(work),
    )
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"cockpit train failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    run = max((d for d in runs.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    s = json.loads((run / "summary.json").read_text())
    return {
        "wall": wall,
        "train": s["train_runtime_s"],
        "tokens": s["tokens_seen"],
        "steps": s["steps"],
        "tokens_per_s": s["tokens_seen"] / s["train_runtime_s"],
    }


def llamafactory_command(cli: Path, cfg_path: Path, out: Path) -> tuple[list[str], dict[str, str]]:
    """``llamafactory-cli train``'s command line and environment for ``cfg_path`` (its output in ``out``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        HF_HUB_OFFLINE="1",
        DISABLE_VERSION_CHECK="1",
        CUDA_VISIBLE_DEVICES="",
        PATH=f"{cli.parent}:{env.get('PATH', '')}",
    )
    # LLaMA-Factory counts its own tokens (HF's num_input_tokens_seen, padding left out, as Cockpit's count)
    return [str(cli), "train", str(cfg_path), f"output_dir={out}", "include_num_input_tokens_seen=non_padding"], env


def run_llamafactory(cli: Path, cfg_path: Path, out: Path, no_lf: bool = False) -> dict[str, float] | None:
    """LLaMA-Factory's run of ``cfg_path``; ``no_lf``: its command line printed, not run (None)."""
    shutil.rmtree(out, ignore_errors=True)
    argv, env = llamafactory_command(cli, cfg_path, out)
    if no_lf:
        print(f"LLaMA-Factory (--no-lf: not run): cd {out.parent} && {' '.join(argv)}", flush=True)
        return None
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(out.parent))
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"llamafactory-cli train failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    metrics = json.loads((out / "train_results.json").read_text())
    train = float(metrics["train_runtime"])
    tokens = json.loads((out / "trainer_state.json").read_text()).get("num_input_tokens_seen")
    return {"wall": wall, "train": train, "tokens": tokens, "tokens_per_s": tokens / train if tokens else None}


def shape_config(shape: str, data_dir: Path, steps: int | None, model_dir: Path, settings: dict) -> dict:
    cfg = {**COMMON, **SHAPES[shape], "model_name_or_path": str(model_dir), "dataset_dir": str(data_dir)}
    cfg.update({k: v for k, v in settings.items() if k not in SHAPES[shape]})
    if steps and "max_steps" in cfg:
        cfg["max_steps"] = steps
    return cfg


def write_config(cfg: dict, path: Path, title: str) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    print(f"\n## {title}: {path}\n" + "\n".join(f"    {k}: {v}" for k, v in cfg.items()), flush=True)
    return path


def bench_shape(
    shape: str,
    rounds: int,
    cli: Path,
    work: Path,
    data_dir: Path,
    steps: int | None,
    model_dir: Path = MODEL_DIR,
    settings: dict | None = None,
    cockpit_only: dict[str, dict] | None = None,
    no_lf: bool = False,
) -> dict[str, list[tuple[dict, dict | None]]]:
    """Alternated rounds of LLaMA-Factory and Cockpit on ``settings`` written into the shape's YAML;
    ``cockpit_only``: more Cockpit configs (label: settings) each compared with the same LF run."""
    label = f"{shape}"
    cfg_path = write_config(
        shape_config(shape, data_dir, steps, model_dir, settings or {}), work / f"{shape}.yaml", label
    )
    variants = {label: cfg_path}
    for extra, extra_settings in (cockpit_only or {}).items():
        variants[extra] = write_config(
            shape_config(shape, data_dir, steps, model_dir, extra_settings),
            work / f"{shape}-{len(variants)}.yaml",
            f"{extra} (cockpit; LF's run as above)",
        )
    results: dict[str, list[tuple[dict, dict | None]]] = {v: [] for v in variants}
    for r in range(rounds):
        order = [*variants, "lf"] if r % 2 == 0 else ["lf", *variants]  # alternate who goes first
        got: dict[str, dict | None] = {}
        for who in order:
            got[who] = (
                run_llamafactory(cli, cfg_path, work / f"lf-{shape}", no_lf)
                if who == "lf"
                else run_cockpit(variants[who], work)
            )
        lf = got["lf"]
        if lf is None:  # --no-lf: Cockpit's side only
            for v in variants:
                c = got[v]
                assert c is not None
                results[v].append((c, None))
                print(f"round {r + 1} {v}: cockpit wall {c['wall']:.1f} s, train {c['train']:.1f} s, {c['steps']} steps, "
                      f"tokens/s {c['tokens_per_s']:.0f} (LLaMA-Factory not run)", flush=True)
            continue
        if not lf["tokens"]:
            raise SystemExit(
                "LLaMA-Factory's trainer_state.json has no num_input_tokens_seen: its tokens/s cannot be its own"
            )
        for v in variants:
            c = got[v]
            assert c is not None
            results[v].append((c, lf))
            print(
                f"round {r + 1} {v}: wall LF {lf['wall']:.1f} s  cockpit {c['wall']:.1f} s  (LF/cockpit {lf['wall'] / c['wall']:.3f}) | "
                f"train LF {lf['train']:.1f} s  cockpit {c['train']:.1f} s | tokens/s LF {lf['tokens_per_s']:.0f}  "
                f"cockpit {c['tokens_per_s']:.0f}  (cockpit/LF {c['tokens_per_s'] / lf['tokens_per_s']:.3f})",
                flush=True,
            )
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="lora", help=f"one of {', '.join(SHAPES)}, several joined by commas, or all")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, help="override the step count of the lora/full shapes (a quick check)")
    ap.add_argument("--real-data", action="store_true", help=f"LLaMA-Factory's alpaca demo files from {LF_DATA}")
    ap.add_argument(
        "--same-settings",
        action="store_true",
        help="LLaMA-Factory's defaults in the YAML (checkpointing on, padded) for both tools, "
        "reported beside each tool's own defaults",
    )
    ap.add_argument(
        "--fp32-model",
        action="store_true",
        help="both tools read an fp32 copy of the model folder (CPUs without fast bf16: see fp32_copy)",
    )
    ap.add_argument(
        "--no-lf",
        action="store_true",
        help="Cockpit's side only: LLaMA-Factory's command line is printed, not run, and its side venv neither made "
        "nor asked for (the suite's smoke run: no LLaMA-Factory there)",
    )
    ap.add_argument("--model", type=Path, default=MODEL_DIR, help="the model folder both tools read (default: %(default)s)")
    a = ap.parse_args()
    if not (a.model / "config.json").exists():
        raise SystemExit(
            f"{a.model} missing: run `cockpit doctor` or any cockpit train on smollm2-135m-instruct once to convert it"
        )
    cli = lf_venv.cli_path() if a.no_lf else lf_venv.ensure()
    model_dir = fp32_copy(a.model) if a.fp32_model else a.model
    print("model:", model_dir)
    shapes = list(SHAPES) if a.shape == "all" else a.shape.split(",")
    if unknown := [s for s in shapes if s not in SHAPES]:
        ap.error(f"--shape {', '.join(unknown)}: not one of {', '.join(SHAPES)}")
    with tempfile.TemporaryDirectory(prefix="cockpit-vs-lf-") as tmp:
        work = Path(tmp)
        print("data:", write_demo_data(work / "data", a.real_data))
        print(f"machine: {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} at start")
        table = []
        for shape in shapes:
            runs = []
            if a.same_settings:  # beside the defaults: LF's written into the YAML, then the user's YAML
                user = f"{shape} (checkpointing as LF's default, packing unset: LF pads, Cockpit padding-free)"
                runs.append(
                    bench_shape(
                        shape,
                        a.rounds,
                        cli,
                        work,
                        work / "data",
                        a.steps,
                        model_dir,
                        SAME_SETTINGS,
                        cockpit_only={user: USER_SETTINGS},
                        no_lf=a.no_lf,
                    )
                )
                runs[-1][f"{shape} (same settings: checkpointing, padded)"] = runs[-1].pop(shape)
            defaults = bench_shape(shape, a.rounds, cli, work, work / "data", a.steps, model_dir, no_lf=a.no_lf)
            if a.same_settings:
                defaults[f"{shape} (each tool's defaults)"] = defaults.pop(shape)
            runs.append(defaults)
            for by_label in runs:
                for label, res in by_label.items():
                    if a.no_lf:
                        table.append((label, res, None, None))
                        continue
                    wall = statistics.median(lf["wall"] / c["wall"] for c, lf in res)
                    tps = statistics.median(c["tokens_per_s"] / lf["tokens_per_s"] for c, lf in res)
                    table.append((label, res, wall, tps))
        print(
            "\n| shape | LF wall (s) per round | cockpit wall (s) per round | LF/cockpit wall (median) | cockpit/LF tokens/s (median) |"
        )
        print("|---|---|---|---|---|")
        for shape, res, wall, tps in table:
            ck_walls = ", ".join(format(c["wall"], ".1f") for c, _ in res)
            if wall is None:  # --no-lf
                print(f"| {shape} | not run | {ck_walls} | - | - |")
                continue
            lf_walls = ", ".join(format(lf["wall"], ".1f") for _, lf in res)
            print(f"| {shape} | {lf_walls} | {ck_walls} | **{wall:.2f}** | {tps:.2f} |")
        print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
