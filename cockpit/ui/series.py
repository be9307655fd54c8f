"""A bounded metric series: at most ``capacity`` buckets, whatever the number of points.

Points are added in order. Each bucket holds the mean, min and max of ``width`` consecutive
points. When all buckets are used, neighbouring pairs merge and ``width`` doubles, so memory
and redraw cost stay constant while a run goes from ten steps to a million.
"""

from __future__ import annotations

import math


class BucketSeries:
    __slots__ = ("capacity", "width", "xs", "sums", "counts", "mins", "maxs", "last", "last_x", "n", "skipped")

    def __init__(self, capacity: int = 512):
        if capacity < 2 or capacity % 2:
            raise ValueError("capacity must be an even number >= 2")
        self.capacity = capacity
        self.width = 1
        self.xs: list[float] = []
        self.sums: list[float] = []
        self.counts: list[int] = []
        self.mins: list[float] = []
        self.maxs: list[float] = []
        self.last: float | None = None
        self.last_x: float | None = None
        self.n = 0
        self.skipped = 0  # None / NaN / inf values (not plotted)

    def __len__(self) -> int:
        return len(self.xs)

    def add(self, x: float, y: float | None) -> None:
        if y is None or not math.isfinite(y):
            self.skipped += 1
            return
        self.n += 1
        self.last, self.last_x = y, x
        if self.counts and self.counts[-1] < self.width:
            self.sums[-1] += y
            self.counts[-1] += 1
            self.mins[-1] = min(self.mins[-1], y)
            self.maxs[-1] = max(self.maxs[-1], y)
            return
        if len(self.xs) >= self.capacity:
            self._halve()
            if self.counts[-1] < self.width:
                self.add_to_last(y)
                return
        self.xs.append(x)
        self.sums.append(y)
        self.counts.append(1)
        self.mins.append(y)
        self.maxs.append(y)

    def add_to_last(self, y: float) -> None:
        self.sums[-1] += y
        self.counts[-1] += 1
        self.mins[-1] = min(self.mins[-1], y)
        self.maxs[-1] = max(self.maxs[-1], y)

    def _halve(self) -> None:
        xs, sums, counts, mins, maxs = [], [], [], [], []
        for i in range(0, len(self.xs) - 1, 2):
            xs.append(self.xs[i])
            sums.append(self.sums[i] + self.sums[i + 1])
            counts.append(self.counts[i] + self.counts[i + 1])
            mins.append(min(self.mins[i], self.mins[i + 1]))
            maxs.append(max(self.maxs[i], self.maxs[i + 1]))
        if len(self.xs) % 2:
            xs.append(self.xs[-1])
            sums.append(self.sums[-1])
            counts.append(self.counts[-1])
            mins.append(self.mins[-1])
            maxs.append(self.maxs[-1])
        self.xs, self.sums, self.counts, self.mins, self.maxs = xs, sums, counts, mins, maxs
        self.width *= 2

    def means(self) -> list[float]:
        return [s / c for s, c in zip(self.sums, self.counts)]

    def tail(self, n: int) -> list[float]:
        """The last ``n`` bucket means (for a sparkline of width ``n``)."""
        start = max(0, len(self.xs) - n)
        return [self.sums[i] / self.counts[i] for i in range(start, len(self.xs))]
