"""The non-SFT stages' data: every dataset read for the stage, tokenized the way the trainer will
(TRL's prompt / prompt + answer split for pairs and KTO; LLaMA-Factory's packing for pt), and
the report ``cockpit check`` and the ranks print. Tokenizer only; no model, no torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from cockpit.data.collect import image_template_problems, mixed
from cockpit.data.dataset_info import resolve_datasets
from cockpit.data.formats import LoadResult
from cockpit.data.pairs import load_stage_file
from cockpit.data.render import apply_template_choice
from cockpit.data.report import percentile
from cockpit.errors import InputError, Problem

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


def collect_stage_samples(cfg: RunConfig) -> LoadResult:
    """Read every dataset of the config for its stage; bad rows raise (or, with allow_bad_rows, are kept as problems)."""
    stage = cfg.stage
    total = LoadResult([], [], {})
    per_dataset: list[list[dict[str, Any]]] = []
    for spec in resolve_datasets(cfg):
        res = load_stage_file(spec, stage, cfg.max_samples)
        per_dataset.append(res.samples)
        total.problems += res.problems
        total.formats.update(res.formats)
        total.rows += res.rows
    total.samples = mixed(
        per_dataset, cfg
    )  # mix_strategy / interleave_probs, before packing and cutoff (as LLaMA-Factory)
    total.problems += image_template_problems(total.samples, cfg.template)  # dpo's pairs with images
    if total.problems and not cfg.allow_bad_rows:
        raise InputError(total.problems)
    if not total.samples:
        raise InputError(total.problems or "no usable samples in the dataset(s)")
    if stage == "kto" and not any(s["label"] for s in total.samples):
        raise InputError(Problem("stage kto: no row is tagged true (desirable); KTO needs both kinds", key="dataset"))
    if stage == "kto" and len(total.samples) < 2:  # its KL term pairs each prompt with another row's answer
        raise InputError(
            Problem(
                "stage kto needs 2 or more rows: its KL term pairs each prompt with another row's answer", key="dataset"
            )
        )
    return total


def _ids(tokenizer: Any, messages: list[dict[str, str]], gen: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def answer_lengths(tokenizer: Any, prompt: list[dict[str, str]], answers: Sequence[str]) -> tuple[int, list[int]]:
    """(prompt tokens, tokens of each answer), split where TRL splits them: the prompt rendered
    with the generation prompt, against the prompt + answer rendered as a conversation."""
    p_ids = _ids(tokenizer, prompt, True)
    fulls = [_ids(tokenizer, prompt + [{"role": "assistant", "content": a}], False) for a in answers]
    p_len = min(_common_prefix(p_ids, f) for f in fulls)
    return p_len, [len(f) - p_len for f in fulls]


def survives_cutoff(stage: str, prompt_len: int, answer_lens: Sequence[int], cutoff: int) -> bool:
    """The one rule of what a pair / KTO sample keeps at ``cutoff_len``, read by ``cockpit check``'s report
    and by the ranks (which train only the survivors, so TRL's own filter drops nothing more): TRL's
    RewardTrainer (rm) drops a pair when either whole sequence is longer than max_length (it does not
    truncate); DPOTrainer and KTOTrainer drop a sample whose prompt alone fills max_length and cut the
    rest; ORPO / SimPO would train an empty answer there, so they lose it too."""
    if stage == "rm":
        return all(prompt_len + n <= cutoff for n in answer_lens)
    if stage == "grpo":  # a prompt longer than cutoff_len is dropped (GRPO samples its answers: none to cut)
        return prompt_len <= cutoff
    return prompt_len < cutoff


@dataclass
class StageReport:
    """Lengths and what cutoff_len cuts, for pairs (sides chosen + rejected), KTO (one side) or pt."""

    stage: str
    samples: int
    cutoff_len: int
    prompt: dict[str, int] = field(default_factory=dict)  # p50 / p90 / max tokens
    responses: dict[str, dict[str, int]] = field(default_factory=dict)  # side -> p50 / p90 / max
    truncated: dict[str, int] = field(default_factory=dict)  # side -> samples whose side is cut
    truncated_any: int = 0  # samples cut on either side
    emptied: int = 0  # samples dropped at cutoff_len (survives_cutoff: the ranks train the others)
    blocks: int = 0  # pt: cutoff_len blocks after packing
    tokens_total: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "lines": self.lines()}

    def lines(self) -> list[str]:
        def stats(d: dict[str, int]) -> str:
            return f"p50 {d.get('p50', 0)}  p90 {d.get('p90', 0)}  max {d.get('max', 0)}"

        if self.stage == "pt":
            return [
                f"documents: {self.samples}   tokens: {self.tokens_total}   packed into {self.blocks} blocks of cutoff_len {self.cutoff_len}"
            ]
        kind = "pairs" if self.stage in ("dpo", "rm") else "prompts" if self.stage == "grpo" else "samples"
        out = [f"{kind}: {self.samples}   prompt tokens: {stats(self.prompt)}"]
        if self.stage == "grpo":
            if self.emptied:
                out.append(
                    f"warning: {self.emptied} {kind} {dropped_words(self.stage)}; {self.samples - self.emptied} left"
                )
            return out
        out += [f"{side} tokens: {stats(d)}" for side, d in self.responses.items()]
        cut = ", ".join(f"{n} on the {side} side" for side, n in self.truncated.items())
        out.append(f"cutoff_len {self.cutoff_len}: truncates {self.truncated_any} {kind} ({cut})")
        if self.emptied:
            out.append(
                f"warning: {self.emptied} {kind} {dropped_words(self.stage)}; {self.samples - self.emptied} left"
            )
        return out


def dropped_words(stage: str) -> str:
    """Why ``survives_cutoff`` drops a sample of the stage, in words."""
    if stage == "grpo":
        return "are longer than cutoff_len (the prompt's limit; they are dropped); raise cutoff_len"
    if stage == "rm":
        return "are longer than cutoff_len on a side (the reward trainer drops them: it does not truncate); raise cutoff_len"
    return "lose the whole response (the prompt fills cutoff_len; they are dropped); raise cutoff_len"


def _dist(values: list[int]) -> dict[str, int]:
    v = sorted(values)
    return {"p50": percentile(v, 50), "p90": percentile(v, 90), "max": v[-1] if v else 0}


def prompts_report(tokenizer: Any, samples: Sequence[dict[str, Any]], cutoff: int) -> StageReport:
    """Stage grpo: the prompts' lengths (rendered with the generation prompt) and those cutoff_len drops."""
    lengths = []
    for s in samples:
        n = len(_ids(tokenizer, s["prompt"], True))
        s["_kept"] = survives_cutoff("grpo", n, [], cutoff)
        lengths.append(n)
    emptied = sum(1 for s in samples if not s["_kept"])
    return StageReport("grpo", len(samples), cutoff, _dist(lengths), emptied=emptied, tokens_total=sum(lengths))


def answers_report(stage: str, tokenizer: Any, samples: Sequence[dict[str, Any]], cutoff: int) -> StageReport:
    sides = ("chosen", "rejected") if stage in ("dpo", "rm") else ("completion",)
    prompts: list[int] = []
    lengths: dict[str, list[int]] = {s: [] for s in sides}
    cut = {s: 0 for s in sides}
    any_cut = emptied = total = 0
    for s in samples:
        p_len, a_lens = answer_lengths(tokenizer, s["prompt"], [s[side] for side in sides])
        s["_kept"] = survives_cutoff(stage, p_len, a_lens, cutoff)
        prompts.append(p_len)
        over = [p_len + n > cutoff for n in a_lens]
        for side, n, o in zip(sides, a_lens, over):
            lengths[side].append(n)
            cut[side] += o
        any_cut += any(over)
        emptied += not s["_kept"]
        total += sum(min(p_len + n, cutoff) for n in a_lens)
    return StageReport(
        stage,
        len(samples),
        cutoff,
        _dist(prompts),
        {s: _dist(v) for s, v in lengths.items()},
        cut,
        any_cut,
        emptied,
        tokens_total=total,
    )


_POOL_TOKENIZER: Any = None


def _pool_init(tokenizer: Any) -> None:
    global _POOL_TOKENIZER
    _POOL_TOKENIZER = tokenizer


def _encode(text: str) -> list[int]:
    return _POOL_TOKENIZER(text, add_special_tokens=False)["input_ids"]


def encode_texts(tokenizer: Any, texts: Sequence[str], workers: int = 1) -> list[list[int]]:
    """Token ids of each text, in order; ``preprocessing_num_workers`` > 1 splits the work over that
    many processes (a spawned pool, each with the tokenizer), as SFT's rendering does."""
    if workers <= 1 or len(texts) < 2:
        return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # never fork: see cockpit.data.prepare.render_all
    procs = min(workers, len(texts), os.cpu_count() or 1)  # more processes than cores gain nothing
    with ctx.Pool(procs, initializer=_pool_init, initargs=(tokenizer,)) as pool:
        return pool.map(_encode, list(texts), chunksize=max(1, len(texts) // (workers * 4)))


def pack_texts(tokenizer: Any, texts: Sequence[str], cutoff: int, workers: int = 1) -> list[list[int]]:
    """LLaMA-Factory's pretraining packing: each text + EOS, concatenated, cut into cutoff_len
    blocks; the remainder past the last whole block is dropped (unless there is not one whole block)."""
    eos = tokenizer.eos_token or ""
    stream: list[int] = []
    for ids in encode_texts(tokenizer, [t + eos for t in texts], workers):
        stream += ids
    usable = (len(stream) // cutoff) * cutoff if len(stream) >= cutoff else len(stream)
    return [stream[i : i + cutoff] for i in range(0, usable, cutoff)]


def with_image_tokens(cfg: RunConfig, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The samples with each pair's ``<image>`` placeholders replaced by its images' tokens in its prompt, by
    the template's plugin as SFT's rows are (:func:`cockpit.data.prepare.image_plan`), and each image's
    ``tokens`` (check's report reads them); unchanged without images. The expanded prompt is what the
    lengths count and TRL tokenizes; the collator adds the images' pixel_values
    (cockpit.train.recipes.preference.PairImages)."""
    from cockpit.data import mm_plugins
    from cockpit.data.prepare import image_plan

    plan = image_plan(cfg, samples)
    if plan is None:
        return samples
    if cfg.pref_loss in ("orpo", "simpo"):
        raise InputError(
            Problem(
                f"pref_loss {cfg.pref_loss} on pairs with images: not built yet (issue 63); DPO's losses "
                "(sigmoid, ipo, hinge) train them",
                key="pref_loss",
            )
        )
    return [
        {
            **s,
            "prompt": mm_plugins.expanded(s["prompt"], plan.texts(s["images"])),
            "images": [{**i, "tokens": plan.tokens(i["size"])} for i in s["images"]],
        }
        if s.get("images")
        else s
        for s in samples
    ]


def image_cut_problems(samples: Sequence[dict[str, Any]], cutoff: int) -> list[Problem]:
    """The pairs with images that cutoff_len drops (their prompt reaches it: TRL keeps the prompt's start
    and needs an answer after it), by file:line: as SFT's, a row whose image tokens cannot all train is
    refused, never trained cut nor dropped unsaid."""
    out = []
    for s in samples:
        if s.get("images") and not s.get("_kept", True):
            counts = [int(i["tokens"]) for i in s["images"]]
            file, _, line = s["source"].rpartition(":")
            why = (
                f"cutoff_len {cutoff} cuts this pair's prompt and its {sum(counts)} image tokens ({len(counts)} "
                f"image(s) of {'+'.join(map(str, counts))} tokens): a cut image cannot train; raise cutoff_len or "
                "give the row fewer images"
            )
            out.append(Problem(why, file=file, line=int(line)))
    return out


@dataclass
class StagePrepared:
    loaded: LoadResult
    report: StageReport
    blocks: list[list[int]] = field(default_factory=list)  # pt only

    @property
    def kept(self) -> list[dict[str, Any]]:
        """The samples that survive cutoff_len (:func:`survives_cutoff`): what the ranks train on."""
        return [s for s in self.loaded.samples if s.get("_kept", True)]


def prepare_stage_data(cfg: RunConfig, tokenizer: Any, loaded: LoadResult | None = None) -> StagePrepared:
    stage, cutoff = cfg.stage, int(cfg.cutoff_len)
    if stage != "pt":
        try:
            apply_template_choice(tokenizer, cfg.template, cfg.default_system, cfg.enable_thinking)
        except ValueError as exc:
            raise InputError(Problem(str(exc), key="template")) from None
    loaded = loaded or collect_stage_samples(cfg)
    if stage == "pt":
        workers = int(cfg.preprocessing_num_workers or 1)
        blocks = pack_texts(tokenizer, [s["text"] for s in loaded.samples], cutoff, workers)
        report = StageReport("pt", len(loaded.samples), cutoff, blocks=len(blocks), tokens_total=sum(map(len, blocks)))
        return StagePrepared(loaded, report, blocks)
    loaded.samples = with_image_tokens(cfg, loaded.samples)
    if stage == "grpo":
        report = prompts_report(tokenizer, loaded.samples, cutoff)
    else:
        report = answers_report(stage, tokenizer, loaded.samples, cutoff)
    problems = image_cut_problems(loaded.samples, cutoff)
    if problems:
        if not cfg.allow_bad_rows:
            raise InputError(problems)
        loaded.problems += problems  # allow_bad_rows: the ranks train the others (dropped as the report says)
    if report.emptied == report.samples:
        raise InputError(
            Problem(
                f"cutoff_len {cutoff}: every one of the {report.samples} samples {dropped_words(stage)}; "
                "nothing is left to train on",
                key="cutoff_len",
            )
        )
    return StagePrepared(loaded, report)
