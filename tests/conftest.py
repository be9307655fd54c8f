"""Shared fixtures: the embedded model (converted once into a cache shared by test runs), a tiny
random Llama with the SmolLM2 tokenizer, and helpers to run the real CLI."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from budget import apply_budgets, report_over_budget

from cockpit.run import warm_start

ROOT = Path(__file__).resolve().parent.parent
# One cache for the converted embedded model across test sessions (CI sets it to the clone).
os.environ.setdefault("COCKPIT_CACHE_DIR", str(ROOT / ".cache" / "cockpit"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Each test process marks what it starts: every subprocess inherits this environment variable, the
# detached supervisors (own session, setsid) and their ranks included, and the process's session end
# kills whatever still carries its own value (scripts/kill_marked.py; scripts/test.sh sweeps its
# COCKPIT_TEST_SESSION the same way when the suite is interrupted). xdist workers set their own.
TEST_OWNER = f"{os.getpid()}-{secrets.token_hex(4)}"
os.environ["COCKPIT_TEST_OWNER"] = TEST_OWNER


def _interruptible() -> None:
    """SIGINT and SIGTERM end the session through pytest's KeyboardInterrupt path (its teardown, then
    pytest_sessionfinish's sweep): a background pytest of a non-interactive shell (scripts/test.sh)
    starts with SIGINT ignored, and Python's default SIGTERM ends a process with no clean-up at all."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:

        def _terminated(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")

        signal.signal(signal.SIGTERM, _terminated)


_interruptible()


@pytest.hookimpl(trylast=True)  # after the session fixtures' teardown
def pytest_sessionfinish(session, exitstatus):
    """Kill what this process's tests started and left running (detached runs, UI subprocesses, ...).
    An xdist controller runs no tests: its workers sweep their own."""
    config = session.config
    if getattr(config, "workerinput", None) is None and (config.getoption("numprocesses", None) or 0):
        return
    from kill_marked import kill_marked

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the sweep short
    try:
        pids = kill_marked("COCKPIT_TEST_OWNER", TEST_OWNER)
    finally:
        signal.signal(signal.SIGINT, previous)
    if pids:
        print(f"\n[conftest] killed {len(pids)} process(es) the tests left running: {' '.join(map(str, pids))}", file=sys.stderr)


# The longest test files first: scripts/test.sh runs the suite on pytest-xdist workers file by file in
# collection order (--dist loadfile --no-loadscope-reorder; xdist's default order, most tests first,
# started the one-test demo files last, one worker then idle while the other finished the DPO demo).
LONGEST_FIRST = ("test_stages_slow.py", "test_demo_slow.py", "test_ui_navigation.py", "test_ui_navigation_runs.py",
                 "test_key_sweep.py", "test_sharded_load.py", "test_strategy_runs.py", "test_side_site.py",
                 "test_config_flags.py", "test_predict.py", "test_ui_setup_live.py", "test_ui_chat.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    apply_budgets(items)  # each test's time budget, enforced (tests/budget.py)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """Through a pipe (`scripts/test.sh 2>&1 | tee log`) xdist says "bringing up nodes..." and nothing
    more until the first result (its workers' status line is rewritten in place, on terminals only):
    each worker's collected count as a line of its own there, before the minutes its first files take."""
    reporter = node.config.pluginmanager.getplugin("terminalreporter")
    if reporter is not None and not reporter.isatty:
        reporter.write_line(f"[{node.gateway.id}] collected {len(ids)} tests; running them")


def pytest_terminal_summary(terminalreporter):
    report_over_budget(terminalreporter)


def prerequisite(ok: bool, why: str) -> None:
    """A test's prerequisite (root for a tmpfs, tmux, a local Slurm, numactl): without it the test
    skips on a developer's machine; under ``CI=true`` it fails, since CI installs all of them and a
    silent skip there would hide a broken install step (issue 34)."""
    if ok:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"missing prerequisite in CI (CI=true): {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def embedded_dir() -> Path:
    from cockpit.models.embedded import ensure_embedded_model

    return ensure_embedded_model(log=lambda *_: None)


@pytest.fixture(scope="session")
def tokenizer(embedded_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(embedded_dir))


@pytest.fixture(scope="session")
def lowrank_env() -> dict:
    """The environment of a subprocess that can import galore_torch / apollo_torch (and the
    bitsandbytes both import): scripts/bootstrap.sh installs them in ``<venv>/lowrank-site``, off
    the suite's own sys.path (bitsandbytes there slows every ``import peft`` by seconds)."""
    return _side_site_env(("galore_torch", "apollo_torch"), "galore-torch / apollo-torch")


@pytest.fixture(scope="session")
def bnb_env() -> dict:
    """The environment of a subprocess that can import bitsandbytes (QLoRA): the same side folder."""
    return _side_site_env(("bitsandbytes",), "bitsandbytes")


@pytest.fixture(scope="session")
def trackers_env() -> dict:
    """The environment of a subprocess that can import the experiment trackers (the ``trackers`` extra):
    scripts/bootstrap.sh installs them in ``<venv>/trackers-site``, off the suite's sys.path (wandb there
    makes every TRL trainer import it)."""
    modules = ("tensorboard", "wandb", "mlflow", "trackio", "swanlab", "sqlalchemy")
    return _side_site_env(modules, "the trackers extra", site_name="trackers")


def _side_site_env(modules: tuple[str, ...], what: str, site_name: str = "lowrank") -> dict:
    variable = f"COCKPIT_{site_name.upper()}_SITE"
    site = Path(os.environ.get(variable) or Path(sys.prefix) / f"{site_name}-site")
    if not all((site / m).is_dir() for m in modules):
        prerequisite(False, f"{what} not installed in {site} (scripts/bootstrap.sh --for test puts them there)")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, embedded_dir) -> Path:
    """A tiny random Llama (built from a config) with the SmolLM2 tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(embedded_dir))
    cfg = LlamaConfig(**_tiny_text(tok, tie_word_embeddings=True))
    return _save_random(tmp_path_factory.mktemp("tiny-llama"), LlamaForCausalLM, cfg, tok)


def _save_random(out: Path, model_cls, cfg, tok) -> Path:
    """``model_cls(cfg)`` with seed 0's random weights, saved in ``out`` with ``tok``: the tiny models' last step."""
    import torch

    torch.manual_seed(0)
    model_cls(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_llava_dir(tmp_path_factory, embedded_dir) -> Path:
    """A tiny random LLaVA (issue 63): the SmolLM2 tokenizer with an ``<image>`` token added, a Llama
    language model as tiny_model_dir's, a 2-layer CLIP vision tower (32x32 images, 8x8 patches: 16 image
    tokens each) and LLaVA's projector, built from their transformers configs, saved with a LlavaProcessor
    (its PIL image processor: no torchvision)."""
    import torch
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    out = tmp_path_factory.mktemp("tiny-llava")
    tok = AutoTokenizer.from_pretrained(str(embedded_dir))
    tok.add_tokens(["<image>"], special_tokens=True)
    text = LlamaConfig(**_tiny_text(tok, tie_word_embeddings=True))
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=32, patch_size=8)
    cfg = LlavaConfig(text_config=text, vision_config=vision, image_token_index=tok.convert_tokens_to_ids("<image>"),
                      vision_feature_select_strategy="default", vision_feature_layer=-1, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlavaForConditionalGeneration(cfg).save_pretrained(out)
    images = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=8, vision_feature_select_strategy="default",
                   image_token="<image>", num_additional_image_tokens=1).save_pretrained(out)
    return out


def build_tiny_qwen_vl(out: Path, tok, family: str = "qwen2_vl") -> Path:
    """A tiny random Qwen2-VL or Qwen2.5-VL (``family``): ``tok`` with Qwen's vision tokens added, a 2-layer
    language model with M-RoPE (tiny_model_dir's sizes), a 2-block vision tower (patch 14, merge 2: one image
    token per 28x28 pixels) and its merger, built from the transformers config; saved with the PIL image
    processor, whose pixel bounds (28x28 to 56x84) keep an image to 1-6 image tokens."""
    import torch
    from transformers import AutoModelForImageTextToText, Qwen2_5_VLConfig, Qwen2VLConfig
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    vision_tokens = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tok.add_tokens(vision_tokens, special_tokens=True)
    start, end, image, video = tok.convert_tokens_to_ids(vision_tokens)
    mrope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]}  # head_dim 16
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=True,
                rope_parameters=mrope)  # fmt: skip
    vision: dict = dict(depth=2, num_heads=2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    if family == "qwen2_vl":
        config_cls, vision = Qwen2VLConfig, {**vision, "embed_dim": 32, "mlp_ratio": 2, "hidden_size": 64}
    else:  # qwen2_5_vl: a gated MLP, window attention in block 0, full attention in block 1
        config_cls = Qwen2_5_VLConfig
        vision |= dict(hidden_size=32, intermediate_size=64, out_hidden_size=64, window_size=56, fullatt_block_indexes=[1])
    cfg = config_cls(text_config=text, vision_config=vision, image_token_id=image, video_token_id=video,
                     vision_start_token_id=start, vision_end_token_id=end, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    AutoModelForImageTextToText.from_config(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    Qwen2VLImageProcessorPil(size={"shortest_edge": 28 * 28, "longest_edge": 56 * 84}).save_pretrained(out)
    return out


def write_vlm_dataset(tmp_path: Path, images: dict[str, tuple[tuple[int, int, int], tuple[int, int]]], rows: list) -> Path:
    """A sharegpt image dataset as LLaMA-Factory lays one out (issue 63): ``tmp_path/data`` with ``images``
    (name: (colour, size)) as data/img/NAME.png, a colour blended with noise (resampling changes the pixels),
    and ``rows`` in vlm.jsonl, registered as ``vlm`` in dataset_info.json (images column ``images``)."""
    from PIL import Image

    data = tmp_path / "data"
    (data / "img").mkdir(parents=True)
    for name, (colour, size) in images.items():
        noise = Image.effect_noise(size, 60).convert("RGB")
        Image.blend(Image.new("RGB", size, colour), noise, 0.3).save(data / "img" / f"{name}.png")
    (data / "vlm.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    entry = {"file_name": "vlm.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"},
             "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}  # fmt: skip
    (data / "dataset_info.json").write_text(json.dumps({"vlm": entry}))
    return data


def prepare_vlm(raw: dict):
    """(prepared, tokenizer) of a config's dataset, as cockpit check and the ranks prepare it."""
    from cockpit.config import validate
    from cockpit.data.prepare import prepare_dataset
    from cockpit.models.resolve import load_tokenizer, resolve_model

    cfg = validate(raw)
    tok = load_tokenizer(cfg, resolve_model(str(raw["model_name_or_path"]), log=lambda *_: None), log=lambda *_: None)
    return prepare_dataset(cfg, tok), tok


@pytest.fixture(scope="session")
def tiny_qwen2_vl_dir(tmp_path_factory, embedded_dir) -> Path:
    """A tiny random Qwen2-VL (issue 63; :func:`build_tiny_qwen_vl`) with the SmolLM2 tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(embedded_dir))
    return build_tiny_qwen_vl(tmp_path_factory.mktemp("tiny-qwen2-vl"), tok, "qwen2_vl")


@pytest.fixture(scope="session")
def tiny_qwen2_5_vl_dir(tmp_path_factory, embedded_dir) -> Path:
    """A tiny random Qwen2.5-VL (issue 63; :func:`build_tiny_qwen_vl`) with the SmolLM2 tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(embedded_dir))
    return build_tiny_qwen_vl(tmp_path_factory.mktemp("tiny-qwen2.5-vl"), tok, "qwen2_5_vl")


def _tiny_text(tok, **over) -> dict:
    """A tiny language model's config fields (tiny_model_dir's, the MoE's and the vision-language models' text
    model's); ``over`` adds or replaces fields."""
    return {**dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=16, max_position_embeddings=512, bos_token_id=tok.bos_token_id,
                   eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id), **over}  # fmt: skip


@pytest.fixture(scope="session")
def tiny_qwen3_vl_dir(tmp_path_factory, embedded_dir) -> Path:
    """A tiny random Qwen3-VL (issue 63): the SmolLM2 tokenizer (ChatML's <|im_start|> / <|im_end|>) with Qwen's
    vision tokens added, a 2-layer language model with M-RoPE, a 2-block vision tower (patch 16, merge 2: a
    32x32 image is 4 patches, 1 image token; one deepstack merger) built from Qwen3VLConfig. Saved as a real
    Qwen3-VL folder is: preprocessor_config.json naming Qwen2VLImageProcessorFast and Qwen3VLProcessor, which
    load as the PIL image processor without torchvision (AutoProcessor itself wants torchvision here)."""
    import json

    import torch
    from transformers import AutoTokenizer, Qwen3VLConfig, Qwen3VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    out = tmp_path_factory.mktemp("tiny-qwen3-vl")
    tok = AutoTokenizer.from_pretrained(str(embedded_dir))
    vision_tokens = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
    tok.add_tokens([*vision_tokens, "<think>", "</think>"], special_tokens=True)  # a Qwen3 tokenizer's
    start, end, image, video = tok.convert_tokens_to_ids(vision_tokens)
    mrope = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [4, 2, 2], "mrope_interleaved": True}
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16, deepstack_visual_indexes=[0])  # fmt: skip
    cfg = Qwen3VLConfig(text_config=_tiny_text(tok, rope_parameters=mrope), vision_config=vision, image_token_id=image,
                        video_token_id=video, vision_start_token_id=start, vision_end_token_id=end,
                        tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    Qwen3VLForConditionalGeneration(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3,
                             image_std=[0.5] * 3, size={"shortest_edge": 32 * 32, "longest_edge": 128 * 128},
                             ).save_pretrained(out)  # fmt: skip
    config = json.loads((out / "preprocessor_config.json").read_text())
    config.update(image_processor_type="Qwen2VLImageProcessorFast", processor_class="Qwen3VLProcessor")
    (out / "preprocessor_config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="session")
def tiny_gemma3_dir(tmp_path_factory, embedded_dir) -> Path:
    """A tiny random Gemma 3 (issue 63): the SmolLM2 tokenizer with Gemma 3's <start_of_image>,
    <image_soft_token> and <end_of_image> (its boi / image / eoi tokens), a 2-layer Gemma3 language model, a
    2-layer SigLIP tower (32x32 images, 8x8 patches) and Gemma 3's pooling projector down to 4 image tokens
    (mm_tokens_per_image; its projection weight drawn at random: Gemma 3 initialises it to zeros, which would
    hide the image), built from Gemma3Config; saved with a Gemma3Processor (its PIL image processor,
    image_seq_length 4), which loads without torchvision."""
    import torch
    from transformers import AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    out = tmp_path_factory.mktemp("tiny-gemma3")
    special = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"}
    tok = AutoTokenizer.from_pretrained(str(embedded_dir), extra_special_tokens=special)
    tok.add_tokens(["<start_of_turn>", "<end_of_turn>", *special.values()], special_tokens=True)  # Gemma's turns
    boi, image, eoi = tok.convert_tokens_to_ids(list(special.values()))
    text = _tiny_text(tok, sliding_window=64, query_pre_attn_scalar=16)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                  patch_size=8)  # fmt: skip
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, boi_token_index=boi,
                       eoi_token_index=eoi, image_token_index=image, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(cfg)
    torch.nn.init.normal_(model.model.multi_modal_projector.mm_input_projection_weight, std=0.2)  # zeros by its init
    model.save_pretrained(out)
    images = Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    Gemma3Processor(image_processor=images, tokenizer=tok, image_seq_length=4).save_pretrained(out)
    return out


def build_tiny_moe(out: Path, tok, family: str = "qwen3_moe", **over):
    """A tiny random mixture-of-experts model (8 experts, top-2, 4 layers) of ``family`` (qwen3_moe,
    mixtral), built from its transformers config, saved with ``tok``."""
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    common = _tiny_text(tok, num_hidden_layers=4, num_experts_per_tok=2, tie_word_embeddings=True)
    if family == "mixtral":
        cfg = MixtralConfig(**common, num_local_experts=8, **over)
        cls = MixtralForCausalLM
    else:
        cfg = Qwen3MoeConfig(**common, num_experts=8, moe_intermediate_size=64, **over)
        cls = Qwen3MoeForCausalLM
    return _save_random(out, cls, cfg, tok)


@pytest.fixture(scope="session")
def tiny_moe_dir(tmp_path_factory, embedded_dir) -> Path:
    """A tiny random Qwen3-MoE (8 experts, top-2, 4 layers) with the SmolLM2 tokenizer."""
    from transformers import AutoTokenizer

    return build_tiny_moe(tmp_path_factory.mktemp("tiny-qwen3-moe"), AutoTokenizer.from_pretrained(str(embedded_dir)))


WARM_START_ENV: dict[str, str] = {}  # the environment the warm start server started with


@pytest.fixture(scope="session", autouse=True)
def warm_start_server(tmp_path_factory):
    """This test process's warm start server (cockpit/train/warm_start.py): the CLI calls below and the
    supervisors' single-process ranks start forked from it, torch and transformers imported once, instead
    of importing them anew (about 3 s for `cockpit check`, 4 s for a rank). A test marked ``cold_start``
    runs without it (the fixture below). A process whose import-time environment differs (a side
    folder's PYTHONPATH, a test's OMP_NUM_THREADS, ...) starts from one of at most three pool servers
    that this one starts for those environments (each ends after 60 s unused); with all three busy it
    starts cold."""
    if os.environ.get("COCKPIT_TEST_WARM_START", "1") == "0":
        yield None
        return
    path = str(tmp_path_factory.mktemp("warm") / "warm.sock")
    WARM_START_ENV.clear()
    WARM_START_ENV.update(os.environ)  # the server's own (a test's leak into os.environ later is not)
    log = open(Path(path).with_suffix(".log"), "ab")
    server = subprocess.Popen(
        [sys.executable, "-m", "cockpit.train.warm_start", path, "--pool", "3"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    log.close()
    os.environ["COCKPIT_WARM_START"] = path  # ready or not: until it listens, a start is cold
    yield path
    os.environ.pop("COCKPIT_WARM_START", None)
    server.terminate()  # it ends its pool servers
    try:
        server.wait(15)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


@pytest.fixture(autouse=True)
def _cold_start(request, monkeypatch):
    if request.node.get_closest_marker("cold_start") is not None:
        monkeypatch.delenv("COCKPIT_WARM_START", raising=False)


def cockpit(*args: str, env: dict | None = None, timeout: float = 600, cwd: str | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess: forked by the warm start server where there is one."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return warm_start.run([sys.executable, "-m", "cockpit.cli", *args], full_env, cwd or str(ROOT), timeout)


def read_events(run_dir: Path) -> list[dict]:
    return [json.loads(l) for l in (run_dir / "events.jsonl").read_text().splitlines() if l.strip()]


def start_detached(tmp_path: Path, cfg: Path, env: dict | None = None, preexec=None, extra: tuple[str, ...] = ()) -> Path:
    """``cockpit train CFG --detach`` into ``tmp_path/runs``; the new run's dir. ``extra``: more
    arguments (``--skip-check``: the command returns before the ranks load, as no held run does)."""
    full_env = dict(os.environ, **(env or {}))
    command = [sys.executable, "-m", "cockpit.cli", "train", str(cfg), "--runs-dir", str(tmp_path / "runs"), "--detach", "--json", *extra]
    if preexec is None:
        res = warm_start.run(command, full_env, os.getcwd(), 300)
    else:  # what preexec sets up (limits, a session) its children inherit: the ranks start cold too
        full_env.pop("COCKPIT_WARM_START", None)
        res = subprocess.run(command, capture_output=True, text=True, env=full_env, preexec_fn=preexec, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return Path(json.loads(res.stdout)["run_dir"])


def wait_for(pred, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def has_step(run: Path, n: int = 1):
    return sum(1 for e in read_events(run) if e["kind"] == "step") >= n


def write_yaml(path: Path, data: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


TINY_CONFIG = {
    "template": "chatml",
    "dataset": "cockpit_identity",
    "finetuning_type": "lora",
    "lora_rank": 4,
    "lora_target": "all",
    "cutoff_len": 128,
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 1,
    "learning_rate": 5e-3,
    "max_steps": 6,
    "logging_steps": 1,
    "save_steps": 3,
    "probes": "@demo/identity_probes.jsonl",
    "probe_max_new_tokens": 4,
    "use_cpu": True,
    "telemetry_interval_s": 0.5,
}


def tiny_config(tmp_path: Path, model_dir: Path, name: str = "tiny", **over) -> Path:
    """``<tmp_path>/<name>.yaml``: a few-step LoRA run of ``model_dir`` (the tiny Llama) on the
    built-in identity data, on the CPU; ``over`` replaces or adds keys."""
    cfg = {"model_name_or_path": str(model_dir), **TINY_CONFIG, **over}
    return write_yaml(tmp_path / f"{name}.yaml", cfg)
