"""Replaying one case of an exploration from its token, verbosely.

Rules. ``replay`` re-runs exactly the case a violation's token names: the same engine
(the caller resolves the token's engine name), workload, crash point, seed and bound,
and checks only the named crash state. It prints the trace with the crash point
marked, the state, what the fresh worker recovered and every violation, and returns
the violation messages (empty: the case passes now).
"""

from __future__ import annotations

from collections.abc import Callable

from deferq.crashtest._crashengine import Engine
from deferq.crashtest._crashpoints import CrashPoint
from deferq.crashtest._crashrecover import Recovered
from deferq.crashtest._crashrun import trace_workload
from deferq.crashtest._explore import BOUNDS, check_case, explore_models
from deferq.crashtest._explorereport import decode_token
from deferq.crashtest._persistence import Bound
from deferq.crashtest._workloads import Workload


def replay(engine: Engine, token: str, *, out: Callable[[str], None] = print) -> list[str]:
    """Re-run one case from a replay token, verbosely; return its violation messages."""
    data = decode_token(token)
    wj = data["w"]
    assert isinstance(wj, dict)
    workload = Workload.from_json(wj)
    point = CrashPoint.parse(str(data["p"]))
    crash = str(data["c"])
    index = data["i"]
    seed = data["s"]
    assert isinstance(index, int) and isinstance(seed, int)
    bound = BOUNDS[str(data["b"])]
    models = explore_models(["weakest", "ext4_ordered", "prefix"],
                            tear_head_bytes=bound.tear_head_bytes,
                            tear_points_max=bound.tear_points_max)
    out(f"engine:   {engine.name}")
    out(f"workload: {workload}")
    trace = trace_workload(engine, workload, seed)
    out(f"trace:    {len(trace)} calls")
    for k, call in enumerate(trace, start=1):
        mark = "  <-- crash point" if k == point.index and point.kind != "op" else ""
        out(f"  {k:4d} pid {call.pid} {call.op:<18} {call.path} "
            f"{call.nbytes if call.op == 'write' else ''}{mark}")
    out(f"crash:    {point} then {crash} state #{index} (seed {seed}, bound {bound.name})")
    messages: list[str] = []

    def show(kind: str, i: int, desc: str, got: Recovered, msgs: list[str]) -> None:
        out(f"state:    {kind} #{i}: {desc}")
        out(f"recovered pending: {sorted(got.pending.items())}")
        out(f"recovered dead:    {sorted((k, v.context) for k, v in got.dead.items())}")
        for message in msgs:
            out(f"VIOLATION: {message}")
        messages.extend(msgs)

    state_bound = Bound(exhaustive_max=bound.bound.exhaustive_max,
                        random_states=bound.bound.random_states, seed=seed)
    check_case(engine, workload, point, seed=seed, models=models, bound=state_bound,
               only=(crash, index), on_state=show, trace=trace)
    if not messages:
        out("no violation")
    return messages
