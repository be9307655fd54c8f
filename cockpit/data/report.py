"""The truncation report: token-length percentiles and what ``cutoff_len`` cuts away."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cockpit.data.render import Rendered


def percentile(sorted_values: Sequence[int], q: float) -> int:
    """Nearest-rank percentile (q in 0..100) of an ascending sequence."""
    if not sorted_values:
        return 0
    rank = max(1, -(-len(sorted_values) * q // 100))  # ceil
    return int(sorted_values[int(min(rank, len(sorted_values))) - 1])


@dataclass
class TruncationReport:
    samples: int
    cutoff_len: int
    p50: int
    p90: int
    p99: int
    max: int
    truncated: int
    truncated_pct: float
    target_tokens: int
    target_tokens_lost: int
    target_lost_pct: float
    emptied: int  # samples with no assistant token left after truncation
    tokens_total: int  # tokens trained on per epoch, after truncation (all, not only targets)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        out = [
            f"samples: {self.samples}   tokens per sample: p50 {self.p50}  p90 {self.p90}  p99 {self.p99}  max {self.max}",
            f"cutoff_len {self.cutoff_len}: truncates {self.truncated} samples ({self.truncated_pct:.1f}%), "
            f"loses {self.target_tokens_lost} of {self.target_tokens} assistant tokens ({self.target_lost_pct:.1f}%)",
        ]
        if self.emptied:
            out.append(
                f"warning: {self.emptied} samples keep no assistant token after truncation (they teach nothing); raise cutoff_len"
            )
        return out


def truncation_report(rendered: Sequence[Rendered], cutoff_len: int) -> TruncationReport:
    lengths = sorted(r.full_length for r in rendered)
    truncated = sum(1 for r in rendered if r.full_length > cutoff_len)
    target = sum(r.target_tokens for r in rendered)
    lost = sum(r.target_tokens - r.target_kept for r in rendered)
    n = len(rendered)
    return TruncationReport(
        samples=n,
        cutoff_len=cutoff_len,
        p50=percentile(lengths, 50),
        p90=percentile(lengths, 90),
        p99=percentile(lengths, 99),
        max=lengths[-1] if lengths else 0,
        truncated=truncated,
        truncated_pct=100.0 * truncated / n if n else 0.0,
        target_tokens=target,
        target_tokens_lost=lost,
        target_lost_pct=100.0 * lost / target if target else 0.0,
        emptied=sum(1 for r in rendered if r.target_kept == 0),
        tokens_total=sum(len(r.input_ids) for r in rendered),
    )
