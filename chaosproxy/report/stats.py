"""Success rates with 95% confidence intervals that behave at small n and at 0% and 100%."""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion; (0, 1) when there is nothing to go on."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True, slots=True)
class Rate:
    successes: int
    n: int

    @property
    def value(self) -> float | None:
        return self.successes / self.n if self.n else None

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.successes, self.n)


def difference_interval(first: Rate, second: Rate) -> tuple[float, float] | None:
    """95% interval of the first minus the second success rate (clean minus perturbed, new minus base):
    Newcombe's hybrid score method, which combines the two Wilson intervals (it stays inside [-1, 1]
    and is sound at small n)."""
    p1, p2 = first.value, second.value
    if p1 is None or p2 is None:
        return None
    (l1, u1), (l2, u2) = first.interval, second.interval
    d = p1 - p2
    return d - math.hypot(p1 - l1, u2 - p2), d + math.hypot(u1 - p1, p2 - l2)
