"""What a drill runs: the agent, the tool server behind the proxy, the matrix, the limits.

Given as flags, as a drill YAML (the same names, `--randomize` is `randomize:`), or both: a flag
wins over the file. Paths are taken relative to the directory `chaosproxy drill` runs in.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from yarl import URL

from chaosproxy.cassette.format import cassette_kind
from chaosproxy.engine.scenario import MAX_SEED, ScenarioError
from chaosproxy.telemetry.redact import redacted_url


class DrillConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # a timeout is finite

    agent: str  # a command line, split like a shell would but run without one
    upstream: str | None = None  # the tool server's URL; its path is kept in CHAOSPROXY_URL
    stdio: str | None = None  # or: an MCP server command line, for stdio
    # the upstream (or stdio server) replayed from this cassette: the drill runs offline (upstream's path is
    # kept for the agent's URL; without upstream or stdio, the cassette's kind says which)
    replay_cassette: Path | None = None
    scenarios: list[Path] = Field(default_factory=list)
    suite: Path | None = None
    randomize: int = Field(0, ge=0)
    repeat: int = Field(1, ge=1)
    baseline: int | None = Field(None, ge=0)  # clean runs (0: none); unset: as many as `repeat`
    timeout: float = Field(120, gt=0)
    jobs: int = Field(1, ge=1)
    judge: str | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    out: Path | None = None
    executor: Literal["local", "ray"] = "local"  # local processes, or a Ray task per run
    ray_address: str | None = None  # the cluster to join; unset: RAY_ADDRESS, else a local one
    ray_num_cpus: float = Field(1, gt=0)  # CPUs each run's task reserves on its node
    workdir: Path | None = None  # where the agent and judge run; a drill file's folder when it names them

    @field_validator("agent", "stdio", "judge")
    @classmethod
    def _command_line(cls, value: str | None) -> str | None:
        if value is not None and not shlex.split(value):
            raise ValueError("an empty command line")
        return value

    @field_validator("upstream")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None:
            url = URL(value)
            if url.scheme not in ("http", "https") or not url.host:
                raise ValueError(f"expected an http:// or https:// URL, got {value!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.replay_cassette is not None:
            kind = cassette_kind(self.replay_cassette)  # (a CassetteError is a ValueError: said as the others)
            if (self.stdio if kind == "http" else self.upstream) is not None:
                raise ValueError(f"replay_cassette {self.replay_cassette} is a {kind} cassette: give it alone, or with "
                                 f"{'upstream (whose URL path the agent keeps)' if kind == 'http' else 'stdio'}")
        elif (self.upstream is None) == (self.stdio is None):
            raise ValueError("give exactly one of upstream (an HTTP tool server) and stdio (a command)")
        if (self.randomize > 0) != (self.suite is not None):
            raise ValueError("randomize and suite go together: --randomize N --suite FILE")
        if self.ray_address is not None and self.executor != "ray":
            raise ValueError("ray_address is for --executor ray")
        return self

    @property
    def over_http(self) -> bool:
        """Runs go through `chaosproxy run` (an HTTP upstream, live or replayed), not `chaosproxy stdio`."""
        if self.upstream is not None or self.stdio is not None or self.replay_cassette is None:
            return self.upstream is not None
        return cassette_kind(self.replay_cassette) == "http"

    @property
    def baseline_runs(self) -> int:
        return self.baseline if self.baseline is not None else self.repeat

    def recorded(self) -> dict[str, Any]:
        """The settings as a drill's folder keeps them: the upstream URL as the proxy shows URLs (its
        userinfo and signed-URL values redacted: a folder is shared, compared, attached to reports)."""
        data = self.model_dump(mode="json")
        data["upstream"] = shown_upstream(self.upstream)
        return data


def shown_upstream(upstream: str | None) -> str | None:
    """An upstream URL as a drill writes it down (see `DrillConfig.recorded`)."""
    return redacted_url(upstream) if upstream is not None else None


def load_config(drill_file: Path | None, overrides: dict[str, Any]) -> DrillConfig:
    """The drill file's settings with the flags that were given (not None) on top."""
    data: dict[str, Any] = {}
    source = str(drill_file) if drill_file is not None else "flags"
    if drill_file is not None:
        try:
            loaded = yaml.safe_load(drill_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ScenarioError([f"{drill_file}: cannot read the drill: {exc}"]) from None
        if not isinstance(loaded, dict):
            raise ScenarioError([f"{drill_file}: a drill file is a mapping (agent:, upstream:, ...)"])
        data = _relative_to(loaded, drill_file.parent)
    data |= {key: value for key, value in overrides.items() if value not in (None, [])}
    if drill_file is not None and "agent" in data and overrides.get("agent") is None:
        data.setdefault("workdir", drill_file.parent)  # the file's agent command runs beside the file
    try:
        return DrillConfig.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError([f"{source}: {'.'.join(map(str, e['loc'])) or 'drill'}: "
                             f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors()]) from None


def _relative_to(data: dict[str, Any], folder: Path) -> dict[str, Any]:
    """A drill file's paths are read from the file's own folder, so the file works from any directory."""
    data = dict(data)
    for key in ("suite", "out", "workdir", "replay_cassette"):
        if isinstance(data.get(key), str):
            data[key] = folder / data[key]
    if isinstance(data.get("scenarios"), list):
        data["scenarios"] = [folder / p if isinstance(p, str) else p for p in data["scenarios"]]
    return data
