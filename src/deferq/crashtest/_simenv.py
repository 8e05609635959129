"""SimEnv: one simulated process's ``deferq._engine.env.Env`` on a ``SimDisk``.

Rules. Each process has its own descriptor table and its own seeded ``random.Random``.
Semantics and errnos follow Linux (checked against the real OS by tests/conformance).
Process facts are simulated: ``time``/``monotonic`` read the machine's ``SimClock``;
``sleep`` advances it at once; ``random_u32`` comes from the seeded generator;
``local_date`` is the simulated time's UTC date; ``call_every`` registers a timer that
fires only when the test calls ``SimDisk.fire_timers`` or ``run_timers``.

Fault rules (``_faults``) are checked at the start of every file and namespace call;
for descriptor calls the path is the one the descriptor was opened with. A dead
process (killed, crashed by a fault, or powered off) raises ``SimulatedCrash`` from
every call and changes nothing.

Theory of operation: the class is assembled from three parts with one job each:
``SimProcess`` (``_simproc``: the shared state, the fault and liveness checks, and
the process facts), ``FileCalls`` (``_simfiles``: descriptor calls, flocks, fsync,
mappings) and ``NameCalls`` (``_simnames``: rename, unlink, makedirs, listdir,
fsync_dir). Each module states its own rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deferq.crashtest._simfiles import (
    DIR_SIZE_BYTES,
    SIM_DEVICE,
    SIM_MAP_GRANULARITY,
    SIM_RESERVE_BYTES,
    FileCalls,
)
from deferq.crashtest._simnames import NameCalls

if TYPE_CHECKING:
    from deferq._engine.env import Env

__all__ = ["DIR_SIZE_BYTES", "SIM_DEVICE", "SIM_MAP_GRANULARITY", "SIM_RESERVE_BYTES", "SimEnv"]


class SimEnv(FileCalls, NameCalls):
    """One simulated process: implements ``deferq._engine.env.Env`` on a ``SimDisk``."""


if TYPE_CHECKING:
    def _implements_env(env: SimEnv) -> Env:
        return env
