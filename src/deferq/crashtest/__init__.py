"""deferq.crashtest: a simulated machine for crash-testing the storage engine.

``SimDisk`` is one machine's storage (a ``SimFs``), clock and process table; ``SimDisk.process()``
returns a ``SimEnv``, a ``deferq._engine.env.Env`` for one simulated process. Crash it with
``kill`` (process death), ``power_loss`` (reboot into a state a persistence model
allows) or enumerate what a power loss could leave with ``crash_states``. Models:
``weakest``, ``ext4_ordered`` and ``prefix`` (see ``_persistence``). Faults: see
``_faults``. Standard library only.

Example::

    disk = SimDisk(seed=1)
    backend = Disk(path="/s", env=disk.process(), fsync_frequency=0)
    backend.add_task(b"x")
    for state in disk.crash_states("weakest"):
        rebooted = state.to_disk()
        ...
"""

from deferq.crashtest._clock import SimClock
from deferq.crashtest._faults import (
    Crash,
    Eio,
    Enospc,
    FaultInjector,
    FaultRule,
    FiredFault,
    FsyncEio,
    LyingFsync,
    ShortWrite,
    SimulatedCrash,
)
from deferq.crashtest._damage import flip_bit, zero_sector
from deferq.crashtest._oplog import (
    CrashInput,
    Damaged,
    Fate,
    Fill,
    Garbage,
    Image,
    LinkOp,
    Node,
    Op,
    Plan,
    Torn,
    TruncateOp,
    UnlinkOp,
    WriteOp,
)
from deferq.crashtest._persistence import (
    MODELS,
    Bound,
    Dimension,
    Ext4Ordered,
    Option,
    PersistenceModel,
    Prefix,
    Weakest,
    resolve_model,
)
from deferq.crashtest._scheduler import Scheduler
from deferq.crashtest._simdisk import CrashState, SimDisk
from deferq.crashtest._simenv import SimEnv
from deferq.crashtest._crashrun import Engine
from deferq.crashtest._explore import ExploreReport, explore
from deferq.crashtest._mutants import Mutant
from deferq.crashtest._workloads import Step, Workload

__all__ = [
    "MODELS",
    "Bound",
    "Crash",
    "CrashInput",
    "CrashState",
    "Damaged",
    "Dimension",
    "Eio",
    "Engine",
    "Enospc",
    "ExploreReport",
    "Ext4Ordered",
    "Fate",
    "FaultInjector",
    "FaultRule",
    "Fill",
    "FiredFault",
    "FsyncEio",
    "Garbage",
    "Image",
    "LinkOp",
    "LyingFsync",
    "Mutant",
    "Node",
    "Op",
    "Option",
    "PersistenceModel",
    "Plan",
    "Prefix",
    "Scheduler",
    "ShortWrite",
    "SimClock",
    "SimDisk",
    "SimEnv",
    "SimulatedCrash",
    "Step",
    "Torn",
    "TruncateOp",
    "UnlinkOp",
    "Weakest",
    "Workload",
    "WriteOp",
    "explore",
    "flip_bit",
    "resolve_model",
    "zero_sector",
]
