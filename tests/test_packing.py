"""Padding-free packing (``packing`` / ``neat_packing``) and length-grouped batches.

The tiny random Llama in fp32: a packed micro-batch (one row, position ids restarting per
sample, transformers' block-diagonal mask) gives every sample the loss it gets in a padded
batch, and training packed or padded on the same samples gives the same losses step by step.
"""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from cockpit.config.load import validate  # noqa: E402
from cockpit.config.run_config import RunConfig  # noqa: E402
from cockpit.config.schema import default_config  # noqa: E402
from cockpit.data.packing import batching_arguments, build_collator, padded_tokens  # noqa: E402
from cockpit.data.padding import padding_free as packing_enabled  # noqa: E402


def _rows(vocab: int, lengths: list[int], seed: int = 1) -> list[dict[str, list[int]]]:
    rng = random.Random(seed)
    rows = []
    for n in lengths:
        ids = [rng.randrange(3, vocab) for _ in range(n)]
        prompt = max(1, n // 3)
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return rows


def _per_sample_loss(model, batch) -> list[float]:
    """Summed next-token loss of each sample of ``batch`` (padded or packed)."""
    kwargs = {k: v for k, v in batch.items() if k != "labels"}
    logits = model(**kwargs).logits.float()
    ce = torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), batch["labels"][:, 1:], ignore_index=-100, reduction="none"
    )
    if "position_ids" in batch and "attention_mask" not in batch:  # packed: split the row at each restart
        starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist() + [batch["input_ids"].shape[1]]
        return [ce[0, a : b - 1].sum().item() for a, b in zip(starts, starts[1:])]
    return [ce[i].sum().item() for i in range(ce.shape[0])]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    model.config.use_cache = False  # as the worker: no KV cache, so position ids mark the samples
    return model.eval(), tok


def test_packed_forward_gives_each_sample_its_padded_loss(tiny):
    model, tok = tiny
    rows = _rows(len(tok), [7, 19, 12, 30])
    padded = build_collator(RunConfig(packing=False), tok)(rows)
    packed = build_collator(RunConfig(packing=True), tok, model)(rows)
    assert packed["input_ids"].shape == (1, sum(len(r["input_ids"]) for r in rows))
    assert "attention_mask" not in packed
    with torch.no_grad():
        want = _per_sample_loss(model, padded)
        got = _per_sample_loss(model, packed)
        # the control: the same row with positions running on lets attention cross samples
        crossed = dict(packed, position_ids=torch.arange(packed["input_ids"].shape[1])[None])
        leaked = model(input_ids=crossed["input_ids"], position_ids=crossed["position_ids"]).logits
    assert got == pytest.approx(want, abs=1e-4)
    leaked_ce = torch.nn.functional.cross_entropy(leaked[0, :-1].float(), packed["labels"][0, 1:], ignore_index=-100, reduction="sum")
    assert abs(leaked_ce.item() - sum(want)) > 1e-2  # per-sample attention is what makes them equal


def _train(model_dir, tok, rows, cfg: dict, tmp_path, attn: str = "sdpa") -> tuple[list[float], object, int]:
    from transformers import AutoModelForCausalLM

    from cockpit.train.trainer import CockpitTrainer
    from cockpit.train.arguments import ListDataset, training_arguments

    full = RunConfig.from_mapping({**default_config(), "dataset": "x", "finetuning_type": "full",
                                   "per_device_train_batch_size": 3, "max_steps": 4, "learning_rate": 1e-2,
                                   "lr_scheduler_type": "constant", "logging_steps": 1, "save_strategy": "no",
                                   "plot_loss": False, "use_cpu": True, **cfg})
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.config.use_cache = False
    if attn != "sdpa":
        from cockpit.train.packed_attention import use_for_padding_free

        assert use_for_padding_free(model)
    args = training_arguments(full, {"checkpoints": tmp_path}, True, 1)
    trainer = CockpitTrainer(model=model, args=args, train_dataset=ListDataset(rows),
                             data_collator=build_collator(full, tok, model), processing_class=tok)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, model.eval(), trainer.state.num_input_tokens_seen


def test_packed_and_padded_training_give_the_same_losses(tiny, tiny_model_dir, tmp_path):
    _, tok = tiny
    rows = _rows(len(tok), [9, 31, 14, 22, 40, 11, 27, 18, 35, 8, 16, 25], seed=3)
    padded_losses, padded_model, padded_tokens_seen = _train(tiny_model_dir, tok, rows, {"packing": False}, tmp_path / "a")
    packed_losses, packed_model, packed_tokens_seen = _train(tiny_model_dir, tok, rows, {"packing": True}, tmp_path / "b")
    assert len(padded_losses) == len(packed_losses) == 4
    assert packed_losses == pytest.approx(padded_losses, abs=1e-4)
    assert packed_tokens_seen == padded_tokens_seen == sum(len(r["input_ids"]) for r in rows)
    # the trained models agree sample by sample (training actually changed them)
    held = _rows(len(tok), [13, 29, 6], seed=9)
    with torch.no_grad():
        after_padded = _per_sample_loss(padded_model, build_collator(RunConfig(packing=False), tok)(held))
        after_packed = _per_sample_loss(packed_model, build_collator(RunConfig(packing=True), tok)(held))
    assert after_packed == pytest.approx(after_padded, abs=1e-4)


def test_group_by_length_batches_similar_lengths(tiny, tmp_path):
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from cockpit.train.trainer import CockpitTrainer
    from cockpit.train.arguments import ListDataset, training_arguments

    model, tok = tiny
    lengths = [random.Random(i).randrange(4, 120) for i in range(64)]
    rows = _rows(len(tok), lengths)
    cfg = RunConfig.from_mapping({**default_config(), "dataset": "x", "per_device_train_batch_size": 4, "use_cpu": True,
                                  "group_by_length": True, "packing": False})
    args = training_arguments(cfg, {"checkpoints": tmp_path}, True, 1)
    trainer = CockpitTrainer(model=model, args=args, train_dataset=ListDataset(rows),
                             data_collator=build_collator(cfg, tok), processing_class=tok)
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, LengthGroupedSampler)
    order = list(iter(sampler))
    assert sorted(order) == list(range(len(rows)))  # every sample once per epoch
    grouped_waste = padded_tokens([lengths[i] for i in order], 4)
    random_waste = padded_tokens(lengths, 4)
    assert grouped_waste[0] == random_waste[0]
    assert grouped_waste[1] - grouped_waste[0] < 0.5 * (random_waste[1] - random_waste[0])


def test_packing_keys_validate_and_select_packing():
    cfg = validate({"dataset": "x", "neat_packing": True, "group_by_length": True})
    assert packing_enabled(cfg) and not packing_enabled(validate({"dataset": "x", "packing": False}))
    assert batching_arguments(cfg) == {"include_num_input_tokens_seen": "all", "train_sampling_strategy": "group_by_length"}
    with pytest.raises(Exception, match="packing"):
        validate({"dataset": "x", "packing": "sometimes"})


def test_planner_knows_packing_memory():
    from cockpit.plan import estimate_config

    base = {"model_name_or_path": "smollm2-135m-instruct", "cutoff_len": 512, "per_device_train_batch_size": 4}
    padded = estimate_config({**base, "packing": False})[1]
    packed = estimate_config({**base, "packing": True})[1]
    auto = estimate_config(base)[1]  # packing unset: 4 x 512 tokens, padding-free
    assert auto.components == packed.components
    fa2 = estimate_config({**base, "packing": True, "flash_attn": "fa2"})[1]
    # the packed row's 2048 x 2048 bool mask: 2048 bytes per token more than fa2's varlen
    assert packed.components["activations_saved"] - fa2.components["activations_saved"] >= 2048 * 2048
    assert any("packing" in n for n in packed.notes) and not any("packing" in n for n in padded.notes)


def test_packing_auto_is_padding_free_where_it_is_cheaper():
    """Unset ``packing`` (auto): padding-free for micro-batches of several samples whose packed row
    stays within AUTO_MAX_PACKED_TOKENS, or with FlashAttention's varlen kernel; padded otherwise.
    What the config says always wins."""
    from cockpit.data.padding import AUTO_MAX_PACKED_TOKENS, batching_words, padding_free

    def cfg(**k):
        return validate({"dataset": "x", **k})

    assert validate({"dataset": "x"}).packing is None  # auto is the default
    assert padding_free(cfg(per_device_train_batch_size=4, cutoff_len=1024))
    assert padding_free(cfg(per_device_train_batch_size=4, cutoff_len=AUTO_MAX_PACKED_TOKENS // 4))
    assert not padding_free(cfg(per_device_train_batch_size=4, cutoff_len=AUTO_MAX_PACKED_TOKENS // 4 + 1))
    assert padding_free(cfg(per_device_train_batch_size=4, cutoff_len=8192).replace(flash_attn="fa2"))  # varlen: no mask
    assert not padding_free(cfg(per_device_train_batch_size=1, cutoff_len=256))  # nothing to pad
    assert not padding_free(cfg(per_device_train_batch_size=4, cutoff_len=256, packing=False))
    assert padding_free(cfg(per_device_train_batch_size=2, cutoff_len=8192, packing=True))
    assert batching_args_for(cfg(per_device_train_batch_size=4, cutoff_len=256)) == "all"
    assert batching_args_for(cfg(per_device_train_batch_size=4, cutoff_len=256, packing=False)) == "non_padding"
    words = batching_words(cfg(per_device_train_batch_size=4, cutoff_len=2048))
    assert words.startswith("padded") and "8192 > 4096" in words


def batching_args_for(cfg) -> str:
    return batching_arguments(cfg)["include_num_input_tokens_seen"]


def test_packing_auto_pads_a_model_that_cannot_attend_per_sample(tiny_model_dir):
    """The training rank asks the model: Llama builds its masks with masking_utils (packs); Mamba
    (a state carried along the row, no such mask) falls back to padded batches under auto and is
    refused under packing: true."""
    from transformers import AutoConfig, MambaConfig

    from cockpit.data.packing import model_packs, resolve_for_model, resolve_for_run
    from cockpit.errors import InputError
    from cockpit.models.resolve import resolve_model

    llama = AutoConfig.from_pretrained(str(tiny_model_dir))
    mamba = MambaConfig(num_hidden_layers=1, hidden_size=16)
    auto = validate({"dataset": "x", "per_device_train_batch_size": 4, "cutoff_len": 256})
    assert model_packs(llama) and resolve_for_model(auto, llama) is auto
    said: list[str] = []  # what the training rank calls, with the run's model reference
    assert resolve_for_run(auto, resolve_model(str(tiny_model_dir)), said.append) is auto and not said
    assert not model_packs(mamba)
    assert resolve_for_model(auto, mamba, said.append).packing is False and "padded" in said[0]
    with pytest.raises(InputError, match="packing"):
        resolve_for_model(auto.replace(packing=True), mamba)
    assert model_packs(mamba, flash=True)


def test_check_says_which_batches_the_run_trains_on(tmp_path, tiny_model_dir):
    from conftest import cockpit, tiny_config

    cfg = tiny_config(tmp_path, tiny_model_dir, per_device_train_batch_size=4, cutoff_len=256)
    auto = cockpit("check", str(cfg), "--no-devices", timeout=300)
    assert auto.returncode == 0, auto.stdout + auto.stderr
    assert "batches: padding-free batches (packing: auto; micro-batch x cutoff_len = 1024 <= 4096 tokens)" in auto.stdout
    padded = cockpit("check", str(cfg), "--no-devices", "--set", "packing=false", timeout=300)
    assert "batches: padded batches (packing: false)" in padded.stdout, padded.stdout + padded.stderr
