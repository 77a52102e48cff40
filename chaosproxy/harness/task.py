"""`chaos_task(task, plan)`: an Inspect task whose every sample-epoch meets what the plan draws for it.

The task's solver runs inside the sample-epoch's chaos: its draw (clean, a scenario, a suite sample)
and seed, its proxies (started as its MCP sessions need them, stopped when the solver ends, so the
log is whole before scoring), its name on the model gateway (`X-Chaosproxy-Agent` in the provider's
extra headers) and its rules there. The store then holds what fired (`chaosproxy`: the draw, the
faults by type and component, the log). Each scorer is wrapped (`chaos_<name>`): its score carries
that summary in its metadata, and the chaos metrics beside the scorer's own.

Defaults for measuring robustness rather than hiding failures: `fail_on_error=False` (a sample the
faults broke is a finding, not a reason to stop the eval) and `score_on_error=True` (it is scored,
as failed); sample retries stay off (Inspect's `retry_on_error` default) and, when the model API is
in scope, so do the model's retries (`max_retries=0`), which would otherwise absorb a 429 or a 5xx
the plan injected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from inspect_ai import Task, task_with
from inspect_ai._util.registry import registry_unqualified_name
from inspect_ai.model import GenerateConfig
from inspect_ai.model._generate_config import active_generate_config, set_active_generate_config
from inspect_ai.scorer import Score, Scorer, Target, scorer
from inspect_ai.scorer._scorer import scorer_metrics
from inspect_ai.solver import Generate, Solver, TaskState, solver

from chaosproxy.engine.sessions import AGENT_HEADER
from chaosproxy.harness.metrics import chaos_metrics
from chaosproxy.harness.plan import ChaosPlan, agent_name
from chaosproxy.harness.sample import STORE_KEY, SampleChaos, running


def chaos_task(task: Task, plan: ChaosPlan, *, pass_value: float = 1.0, pass_k: int | None = None) -> Task:
    """`task` (changed in place, as Inspect's task_with does) run under `plan`.

    `pass_value`: the score (as Inspect's value_to_float reads it) at or above which a sample-epoch
    counts as passed in the chaos metrics and the imported drill. `pass_k`: the k of the pass^k metric
    (default 2 when the task has several epochs; give it when epochs are set on eval()). Its MCP
    tool sources must be
    chaosproxy.harness's (mcp_server_http, mcp_server_sse, mcp_server_stdio); for the model API, give
    the model `base_url=plan.gateway(PROVIDER_BASE_URL)`.
    """
    k = pass_k if pass_k is not None else 2 if (task.epochs or 1) > 1 else None
    config = task.config
    if plan.scope != "tools" and config.max_retries is None:
        config = config.merge(GenerateConfig(max_retries=0))
    return task_with(
        task, solver=chaos_solver(task.solver, plan, task.name),
        scorer=[_chaos_scorer(one, pass_value, k) for one in task.scorer or []] or None,
        config=config,
        fail_on_error=False if task.fail_on_error is None else task.fail_on_error,
        score_on_error=True if task.score_on_error is None else task.score_on_error)


@solver(name="chaosproxy")
def chaos_solver(inner: Solver, plan: ChaosPlan, task_name: str) -> Solver:
    """`inner` inside each sample-epoch's chaos; the store gets what fired, even when `inner` raises."""
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        draw = plan.draw(state.sample_id, state.epoch)
        agent = agent_name(task_name, state.sample_id, state.epoch)
        chaos = SampleChaos(draw, agent, plan.sample_folder(agent), tools=plan.scope != "model",
                            model=plan.scope != "tools")
        entered = []
        try:
            for gateway in plan.gateways.values():
                await gateway.enter(agent, draw.rules() if chaos.faults_model else [], chaos.gateway_lines)
                entered.append(gateway)
            with running(chaos), _named(agent):
                return await inner(state, generate)
        finally:
            for gateway in entered:
                await gateway.leave(agent)
            await chaos.aclose()
            state.store.set(STORE_KEY, {**chaos.record(), "plan_seed": plan.seed, "plan": plan.settings()})
    return solve


@contextlib.contextmanager
def _named(agent: str) -> Iterator[None]:
    """The model's requests carry the sample-epoch's name (the provider's extra headers) while it runs."""
    config = active_generate_config()
    headers = {**(config.extra_headers or {}), AGENT_HEADER: agent}
    set_active_generate_config(config.merge(GenerateConfig(extra_headers=headers)))
    try:
        yield
    finally:
        set_active_generate_config(config)


def _chaos_scorer(inner: Scorer, pass_value: float, k: int | None) -> Scorer:
    """`inner`, its score's metadata carrying the sample-epoch's chaos, with the chaos metrics beside its own."""
    metrics = scorer_metrics(inner)
    if isinstance(metrics, dict):
        raise ValueError("chaos_task: a scorer with metrics by score key (a dict) is not supported; "
                         "give its metrics as a list")

    @scorer(metrics=[*metrics, *chaos_metrics(k)],
            name=f"chaos_{registry_unqualified_name(inner)}")
    def wrapped() -> Scorer:
        async def score(state: TaskState, target: Target) -> Score | None:
            result = await inner(state, target)
            record = state.store.get(STORE_KEY)
            if result is not None and record is not None:
                result.metadata = {**(result.metadata or {}), STORE_KEY: summary(record, state.epoch, pass_value)}
            return result
        return score
    return wrapped()


def summary(record: dict[str, Any], epoch: int, pass_value: float) -> dict[str, Any]:
    """The score's metadata: the store's record without its log lines."""
    return {**{key: value for key, value in record.items() if key != "log"}, "epoch": epoch,
            "pass_value": pass_value}
