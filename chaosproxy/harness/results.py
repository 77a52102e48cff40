"""A scored sample-epoch as a drill run's result: what Inspect's metrics and `import-inspect` both read.

One function makes the result from a Score (its value and the `chaosproxy` metadata the chaos scorer
adds), and the metrics compute over those results with the drill report's own code (report.profile),
so an eval's chaos metrics and `chaosproxy report` on the imported eval give the same numbers.
A value is read as Inspect's metrics read it (value_to_float: C 1, P 0.5, I and N 0).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from inspect_ai.scorer import value_to_float

from chaosproxy.harness.sample import STORE_KEY

_to_float = value_to_float()


def run_name(sample_id: int | str, epoch: int, epochs: int) -> str:
    """A sample-epoch's run name, the same whichever shard of the eval it ran in: from its position
    when sample ids are Inspect's numbers (1, 2, ...), else from a digest of the id."""
    if isinstance(sample_id, int) and sample_id >= 1:
        return f"run-{(sample_id - 1) * epochs + epoch}"
    digest = int.from_bytes(hashlib.sha256(str(sample_id).encode()).digest()[:5], "big")
    return f"run-{digest * 1000 + epoch}"


def sample_result(value: Any, metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """A results.jsonl line for one scored sample-epoch, or None when the chaos scorer did not score it.
    An unscored value (NaN) is an `error`: it counts for nothing, as a drill run its machinery failed."""
    chaos = (metadata or {}).get(STORE_KEY)
    if not isinstance(chaos, dict):
        return None
    number = _to_float(value)
    status = "error" if math.isnan(number) else "passed" if number >= chaos["pass_value"] else "failed"
    return {"label": chaos["label"], "kind": chaos["kind"],
            "seed": chaos["seed"], "status": status, "success": None if status == "error" else status == "passed",
            "faults": chaos["faults"], "components": chaos["components"]}
