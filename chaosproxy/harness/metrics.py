"""Inspect metrics of a chaos eval: accuracy clean vs faulted, by POMDP component and fault type, pass^k.

Every metric takes the scores unreduced (one per sample-epoch: each epoch met its own faults) and
turns them into drill results (harness.results), then asks the drill report's profile for the
numbers, so they are the ones `chaosproxy report` prints for the imported eval: a sample-epoch is
faulted when a fault fired in it, clean when it was drawn clean, and neither when it was drawn
faulty but nothing fired. The drop is clean minus faulted accuracy, with Newcombe's 95% interval.
Undefined values (no clean or no faulted sample-epoch) are NaN.
"""

from __future__ import annotations

import math
from typing import Any

from inspect_ai.scorer import Metric, SampleScore, Score, metric, pass_k

from chaosproxy.harness.results import sample_result
from chaosproxy.report.profile import Profile, ProfileRow, build_profile

NAN = math.nan


def _results(scores: list[SampleScore]) -> list[dict[str, Any]]:
    results = [sample_result(s.score.value, s.score.metadata) for s in scores]
    return [result for result in results if result is not None]


def _profile(scores: list[SampleScore]) -> Profile:
    return build_profile(_results(scores))


def _value(rate: float | None) -> float:
    return NAN if rate is None else rate


def _drop(row: ProfileRow) -> dict[str, float]:
    interval = row.drop_interval or (NAN, NAN)
    return {"drop": _value(row.drop), "drop_ci95_low": interval[0], "drop_ci95_high": interval[1]}


@metric(scores="unreduced")
def chaos_accuracy() -> Metric:
    """Accuracy of clean and of faulted sample-epochs, and the drop between them with its 95% interval."""
    def compute(scores: list[SampleScore]) -> dict[str, float]:
        overall = _profile(scores).overall
        return {"clean": _value(overall.clean.value), "faulted": _value(overall.perturbed.value), **_drop(overall)}
    return compute


@metric(scores="unreduced")
def chaos_by_component() -> Metric:
    """Faulted accuracy of the sample-epochs where a fault of each POMDP component fired, and its drop."""
    def compute(scores: list[SampleScore]) -> dict[str, float]:
        return _rows(_profile(scores).by_component)
    return compute


@metric(scores="unreduced")
def chaos_by_fault() -> Metric:
    """Faulted accuracy of the sample-epochs where each fault type fired, and its drop."""
    def compute(scores: list[SampleScore]) -> dict[str, float]:
        return _rows(_profile(scores).by_fault)
    return compute


def _rows(rows: list[ProfileRow]) -> dict[str, float]:
    values: dict[str, float] = {}
    for row in rows:
        values[row.name] = _value(row.perturbed.value)
        values[f"{row.name}_drop"] = _value(row.drop)
    return values


@metric(scores="unreduced")
def chaos_pass_k(k: int = 2) -> Metric:
    """Inspect's pass_k (tau-bench's pass^k: all k tries succeed) over each sample's clean epochs and
    over its faulted ones (`passK_clean`, `passK_faulted`), averaged over the samples with at least k
    such epochs (NaN when none has)."""
    reduce = pass_k(k)

    def compute(scores: list[SampleScore]) -> dict[str, float]:
        by_sample: dict[tuple[str, str], list[Score]] = {}
        for score, result in zip(scores, [sample_result(s.score.value, s.score.metadata)
                                          for s in scores], strict=True):
            if result is None or result["status"] == "error":
                continue
            group = "clean" if result["kind"] == "clean" else "faulted" if result["faults"] else None
            if group is not None:
                passed = 1.0 if result["status"] == "passed" else 0.0
                by_sample.setdefault((group, str(score.sample_id)), []).append(Score(value=passed))
        values: dict[str, float] = {}
        for group in ("clean", "faulted"):
            estimates = [float(reduce(epochs).as_float()) for (name, _), epochs in by_sample.items()
                         if name == group and len(epochs) >= k]
            values[f"pass{k}_{group}"] = sum(estimates) / len(estimates) if estimates else NAN
        return values
    return compute


def chaos_metrics(k: int | None = None) -> list[Metric]:
    """The chaos metrics a chaos task's scorers carry (pass^k when the eval has k epochs or more)."""
    return [chaos_accuracy(), chaos_by_component(), chaos_by_fault(), *([chaos_pass_k(k)] if k else [])]
