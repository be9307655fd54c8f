"""A corpus of malformed configs, datasets and command lines: each is exit 2 with a message that
names the file, line or key, and never a traceback. Awkward-but-valid input passes.

Runs the real CLI entry point in-process (``cockpit.cli.main``) for speed; an unexpected
exception would escape and fail the test, which is how "no traceback" is checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cockpit.cli import main

GOOD_ROW = {"instruction": "hi", "input": "", "output": "hello"}


def _jsonl(rows) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


# name -> (files {relative path: text or bytes}, argv (with {d} for the temp dir), expected substrings)
CASES: dict[str, tuple[dict, list[str], list[str]]] = {
    "unknown_key": ({"c.yaml": "dataset: d.jsonl\nlearning_rat: 0.1\n"}, ["check", "{d}/c.yaml"], ["c.yaml:2: learning_rat: unknown key (did you mean 'learning_rate'?)"]),
    "unsupported_lf_key": ({"c.yaml": "dataset: d.jsonl\nuse_kt: true\n"}, ["check", "{d}/c.yaml"], ["c.yaml:2: use_kt", "Cockpit refuses: KTransformers"]),
    "wrong_type_int": ({"c.yaml": "dataset: d.jsonl\nlora_rank: eight\n"}, ["check", "{d}/c.yaml"], ["c.yaml:2: lora_rank: must be int"]),
    "wrong_type_bool": ({"c.yaml": "dataset: d.jsonl\nbf16: 2\n"}, ["check", "{d}/c.yaml"], [":2: bf16: must be true | false"]),
    "lr_negative": ({"c.yaml": "dataset: d.jsonl\nlearning_rate: -0.1\n"}, ["check", "{d}/c.yaml"], [":2: learning_rate: must be float > 0"]),
    "lr_zero": ({"c.yaml": "dataset: d.jsonl\nlearning_rate: 0\n"}, ["check", "{d}/c.yaml"], [":2: learning_rate"]),
    "epochs_zero": ({"c.yaml": "dataset: d.jsonl\nnum_train_epochs: 0\n"}, ["check", "{d}/c.yaml"], [":2: num_train_epochs"]),
    "bad_scheduler": ({"c.yaml": "dataset: d.jsonl\nlr_scheduler_type: cosine_annealing\n"}, ["check", "{d}/c.yaml"], [":2: lr_scheduler_type: must be one of"]),
    "bad_finetuning_type": ({"c.yaml": "dataset: d.jsonl\nfinetuning_type: qlora\n"}, ["check", "{d}/c.yaml"], [":2: finetuning_type: must be one of lora | oft | freeze | full"]),
    "lora_rank_zero": ({"c.yaml": "dataset: d.jsonl\nlora_rank: 0\n"}, ["check", "{d}/c.yaml"], [":2: lora_rank: must be int >= 1"]),
    "lora_rank_huge": ({"c.yaml": "dataset: d.jsonl\nlora_rank: 100000\n"}, ["check", "{d}/c.yaml"], [":2: lora_rank: must be int >= 1 and <= 4096"]),
    "lora_dropout_range": ({"c.yaml": "dataset: d.jsonl\nlora_dropout: 1.5\n"}, ["check", "{d}/c.yaml"], [":2: lora_dropout"]),
    "conflicting_precision": ({"c.yaml": "dataset: d.jsonl\nbf16: true\nfp16: true\n"}, ["check", "{d}/c.yaml"], [":3: fp16: bf16 and fp16 are both true"]),
    "qlora_with_full": ({"c.yaml": "dataset: d.jsonl\nfinetuning_type: full\nquantization_bit: 4\n"}, ["check", "{d}/c.yaml"], [":3: quantization_bit: quantization_bit needs finetuning_type: lora"]),
    "bad_quant_bits": ({"c.yaml": "dataset: d.jsonl\nquantization_bit: 3\n"}, ["check", "{d}/c.yaml"], [":2: quantization_bit: must be one of 4 | 8"]),
    "deepspeed_and_fsdp": ({"c.yaml": "dataset: d.jsonl\nfsdp: full_shard auto_wrap\ndeepspeed: ds.json\n", "ds.json": "{}"}, ["check", "{d}/c.yaml"], ["fsdp: deepspeed and fsdp are both set"]),
    "bad_fsdp_option": ({"c.yaml": "dataset: d.jsonl\nfsdp: full_shard autowrap\n"}, ["check", "{d}/c.yaml"], [":2: fsdp: unknown fsdp option"]),
    "missing_dataset_key": ({"c.yaml": "lora_rank: 8\n"}, ["check", "{d}/c.yaml"], ["dataset: required"]),
    "do_train_false": ({"c.yaml": "dataset: d.jsonl\ndo_train: false\n"}, ["check", "{d}/c.yaml"], [":2: do_train: only a prediction run skips training"]),
    "stage_ppo": ({"c.yaml": "dataset: d.jsonl\nstage: ppo\n"}, ["check", "{d}/c.yaml"], [":2: stage: must be one of sft | pt | dpo | kto | rm"]),
    "node_rank_ge_nnodes": ({"c.yaml": "dataset: d.jsonl\nnnodes: 2\nnode_rank: 2\n"}, ["check", "{d}/c.yaml"], ["node_rank: node_rank 2 must be < nnodes 2"]),
    "env_not_mapping": ({"c.yaml": "dataset: d.jsonl\nenv: [A, B]\n"}, ["check", "{d}/c.yaml"], [":2: env: must be a mapping"]),
    "env_bad_name": ({"c.yaml": "dataset: d.jsonl\nenv:\n  1BAD: x\n"}, ["check", "{d}/c.yaml"], [":2: env: '1BAD' is not a valid environment variable name"]),
    "broken_yaml": ({"c.yaml": "dataset: d.jsonl\nlora_rank: [8\n"}, ["check", "{d}/c.yaml"], ["c.yaml:", "invalid YAML"]),
    "yaml_tab_indent": ({"c.yaml": "dataset: d.jsonl\nenv:\n\tA: b\n"}, ["check", "{d}/c.yaml"], ["c.yaml:3", "invalid YAML"]),
    "yaml_python_tag": ({"c.yaml": "dataset: !!python/object/apply:os.system ['true']\n"}, ["check", "{d}/c.yaml"], ["c.yaml:1: tag !!python/object/apply:os.system refused"]),
    "yaml_duplicate_key": ({"c.yaml": "dataset: d.jsonl\nlora_rank: 8\nlora_rank: 16\n"}, ["check", "{d}/c.yaml"], ["c.yaml:3: duplicate key 'lora_rank' (first on line 2)"]),
    "yaml_top_level_list": ({"c.yaml": "- dataset: d.jsonl\n"}, ["check", "{d}/c.yaml"], ["c.yaml:1: expected a mapping"]),
    "config_not_utf8": ({"c.yaml": "dataset: caf\xe9.jsonl\n".encode("latin-1")}, ["check", "{d}/c.yaml"], ["c.yaml:1: not UTF-8"]),
    "config_missing": ({}, ["check", "{d}/nope.yaml"], ["nope.yaml: no such file"]),
    "config_is_directory": ({"sub/x.txt": "x"}, ["check", "{d}/sub"], ["sub: is a directory"]),
    "dataset_missing_file": ({"c.yaml": "dataset: missing.jsonl\n"}, ["check", "{d}/c.yaml"], ["dataset: no such file: missing.jsonl"]),
    "dataset_is_directory": ({"c.yaml": "dataset: data.json\n", "data.json/x": "x"}, ["check", "{d}/c.yaml"], ["dataset: is a directory"]),
    "dataset_unknown_name": ({"c.yaml": "dataset: not_registered\n"}, ["check", "{d}/c.yaml"], ["dataset 'not_registered' is not in"]),
    "dataset_broken_json_lines": ({"c.yaml": "dataset: d.jsonl\n", "d.jsonl": _jsonl([GOOD_ROW]) + "{oops\n" + _jsonl([GOOD_ROW]) + '{"instruction": "x"\n'}, ["check", "{d}/c.yaml"], ["d.jsonl:2: invalid JSON", "d.jsonl:4: invalid JSON"]),
    "dataset_missing_fields": ({"c.yaml": "dataset: d.jsonl\n", "d.jsonl": _jsonl([GOOD_ROW, {"instruction": "q"}, {"output": "a"}])}, ["check", "{d}/c.yaml"], ["d.jsonl:2: missing field 'output'", "d.jsonl:3: missing field 'instruction'"]),
    "dataset_wrong_types": ({"c.yaml": "dataset: d.jsonl\n", "d.jsonl": _jsonl([GOOD_ROW, {"instruction": ["a"], "output": "b"}, {"instruction": "a", "output": 5}])}, ["check", "{d}/c.yaml"], ["d.jsonl:2: field 'instruction' must be a string, got list", "d.jsonl:3: field 'output' must be a string, got int"]),
    "dataset_empty_output": ({"c.yaml": "dataset: d.jsonl\n", "d.jsonl": _jsonl([GOOD_ROW, {"instruction": "q", "output": "   "}])}, ["check", "{d}/c.yaml"], ["d.jsonl:2: empty 'output'"]),
    "dataset_not_utf8": ({"c.yaml": "dataset: d.jsonl\n", "d.jsonl": _jsonl([GOOD_ROW]).encode() + '{"instruction": "caf\xe9", "output": "x"}\n'.encode("latin-1")}, ["check", "{d}/c.yaml"], ["d.jsonl:2: not UTF-8"]),
    "sharegpt_unknown_role": ({"c.yaml": "dataset: s.json\n", "s.json": json.dumps([{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}, {"conversations": [{"from": "bot", "value": "a"}, {"from": "gpt", "value": "b"}]}], indent=1)}, ["check", "{d}/c.yaml"], ["s.json:", "unknown role 'bot'"]),
    "json_array_truncated": ({"c.yaml": "dataset: a.json\n", "a.json": '[\n  {"instruction": "a", "output": "b"},\n  {"instruction": "c",\n'}, ["check", "{d}/c.yaml"], ["a.json:"]),
    "empty_dataset": ({"c.yaml": "dataset: e.jsonl\n", "e.jsonl": "\n\n"}, ["check", "{d}/c.yaml"], ["e.jsonl:1: empty file"]),
    "dataset_info_broken": ({"c.yaml": "dataset: mine\ndataset_dir: data\n", "data/dataset_info.json": '{"mine": {"file_name": "m.json",}}'}, ["check", "{d}/c.yaml"], ["dataset_info.json:1: invalid JSON"]),
    "dataset_info_missing_file": ({"c.yaml": "dataset: mine\ndataset_dir: data\n", "data/dataset_info.json": '{\n "mine": {"file_name": "gone.json"}\n}'}, ["check", "{d}/c.yaml"], ["dataset_info.json:2: mine: file_name 'gone.json': no such file"]),
    "probes_missing": ({"c.yaml": "dataset: d.jsonl\nprobes: p.jsonl\n"}, ["check", "{d}/c.yaml"], ["probes: no such file"]),
    "probes_malformed": ({"c.yaml": "dataset: d.jsonl\nprobes: p.jsonl\n", "p.jsonl": '{"prompt": "who?"}\n'}, ["check", "{d}/c.yaml"], ["p.jsonl:1: 'expect' must be"]),
    "output_dir_has_checkpoints": ({"c.yaml": "dataset: d.jsonl\noutput_dir: out\n", "out/checkpoints/checkpoint-5/x": "x"}, ["check", "{d}/c.yaml"], ["output_dir:", "already holds checkpoints"]),
    "set_without_equals": ({"c.yaml": "dataset: d.jsonl\n"}, ["check", "{d}/c.yaml", "--set", "lora_rank"], ["--set expects key=value"]),
    "set_unknown_key": ({"c.yaml": "dataset: d.jsonl\n"}, ["check", "{d}/c.yaml", "--set", "lora_rnk=4"], ["--set: lora_rnk: unknown key"]),
    "set_bad_value": ({"c.yaml": "dataset: d.jsonl\n"}, ["check", "{d}/c.yaml", "--set", "per_device_train_batch_size=0"], ["--set: per_device_train_batch_size: must be int >= 1"]),
    "unknown_subcommand": ({}, ["trian", "x.yaml"], ["invalid choice: 'trian'"]),
    "train_missing_config_arg": ({}, ["train"], ["give a YAML config, or the config as flags"]),
    "attach_unknown_run": ({}, ["attach", "nope", "--runs-dir", "{d}/runs"], ["no run 'nope'"]),
    "model_folder_without_config": ({"c.yaml": "dataset: d.jsonl\nmodel_name_or_path: m\n", "m/readme.txt": "x"}, ["check", "{d}/c.yaml", "--no-devices"], ["model_name_or_path:", "has no config.json"]),
}


def materialize(tmp_path: Path, files: dict) -> None:
    files = dict(files)
    if "c.yaml" in files and "d.jsonl" not in files:
        files["d.jsonl"] = _jsonl([GOOD_ROW, GOOD_ROW])
    for rel, content in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content, encoding="utf-8")


def test_corpus_is_large_enough():
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_exits_2_naming_the_place(name, tmp_path, capsys, monkeypatch):
    files, argv, expected = CASES[name]
    materialize(tmp_path, files)
    monkeypatch.chdir(tmp_path)
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    out = capsys.readouterr()
    text = out.out + out.err
    assert code == 2, text
    for sub in expected:
        assert sub in text, f"{sub!r} not in:\n{text}"
    assert "Traceback" not in text


AWKWARD = {
    "bom_crlf_blank_lines": b"\xef\xbb\xbf" + _jsonl([GOOD_ROW]).replace("\n", "\r\n").encode() + b"\r\n\r\n" + _jsonl([GOOD_ROW]).encode(),
    "long_chinese_rows": _jsonl([{"instruction": "请介绍长江。", "input": "长江是中国最长的河流，" * 10, "output": "长江发源于青藏高原，流经十一个省市，最后注入东海。" * 200}] * 3).encode(),
}


@pytest.mark.parametrize("name", sorted(AWKWARD))
def test_awkward_but_valid_input_passes(name, tmp_path, capsys, monkeypatch, embedded_dir):
    (tmp_path / "d.jsonl").write_bytes(AWKWARD[name])
    (tmp_path / "c.yaml").write_bytes(b"\xef\xbb\xbfdataset: d.jsonl\r\ncutoff_len: 256\r\ntemplate: chatml\r\n")
    monkeypatch.chdir(tmp_path)
    code = main(["check", str(tmp_path / "c.yaml"), "--no-devices"])
    text = capsys.readouterr().out
    assert code == 0, text
    if name == "long_chinese_rows":
        assert "truncates 3 samples (100.0%)" in text
