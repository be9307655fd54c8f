"""BLEU-4 and ROUGE-1/2/L of generated predictions against their labels, as LLaMA-Factory's
``ComputeSimilarity`` computes them (its ``predict_with_generate`` scores), so its users' numbers
carry over: both texts segmented into words by jieba (Chinese by words, other text by jieba's
runs of letters), ROUGE by rouge-chinese's f-scores over those words (0 when either side has no
word), BLEU-4 by nltk's ``sentence_bleu`` over the characters with smoothing method 3; each x100,
rounded to 4 places per sample, then the mean over the samples.

The packages (``pip install 'cockpit-tune[metrics]'``: jieba, nltk, rouge-chinese) are imported
lazily; ``cockpit check`` refuses ``do_predict`` where one is missing (config/parity.py). No torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

METRICS = ("bleu-4", "rouge-1", "rouge-2", "rouge-l")


def _segmenter() -> Any:
    import logging

    import jieba

    jieba.setLogLevel(logging.CRITICAL)  # its dictionary-building notes are not the run's business
    return jieba


def sample_scores(predict: str, label: str) -> dict[str, float]:
    """One prediction's scores (0..100), LLaMA-Factory's per-sample figures."""
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
    from rouge_chinese import Rouge

    jieba = _segmenter()
    hypothesis, reference = " ".join(jieba.cut(predict)), " ".join(jieba.cut(label))
    if not hypothesis.split() or not reference.split():
        rouge = {"rouge-1": 0.0, "rouge-2": 0.0, "rouge-l": 0.0}
    else:
        found = Rouge().get_scores(hypothesis, reference)[0]
        rouge = {name: float(found[name]["f"]) for name in ("rouge-1", "rouge-2", "rouge-l")}
    bleu = sentence_bleu([list(label)], list(predict), smoothing_function=SmoothingFunction().method3)
    scores = {name: round(value * 100, 4) for name, value in rouge.items()}
    scores["bleu-4"] = round(float(bleu) * 100, 4)
    return scores


def mean_scores(pairs: Iterable[tuple[str, str]]) -> dict[str, float]:
    """The mean of :func:`sample_scores` over (prediction, label) pairs; 0 for each with none."""
    per_sample = [sample_scores(predict, label) for predict, label in pairs]
    if not per_sample:
        return {name: 0.0 for name in METRICS}
    return {name: round(sum(s[name] for s in per_sample) / len(per_sample), 4) for name in METRICS}
