"""deferq.testing: a simulated machine for crash-testing the storage engine.

``SimDisk`` is one machine's storage, clock and process table; ``SimDisk.process()``
returns a ``SimEnv``, a ``deferq._env.Env`` for one simulated process. Crash it with
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

from deferq.testing._clock import SimClock
from deferq.testing._faults import (
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
    flip_bit,
    zero_sector,
)
from deferq.testing._oplog import (
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
from deferq.testing._persistence import (
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
from deferq.testing._scheduler import Scheduler
from deferq.testing._simdisk import CrashState, SimDisk
from deferq.testing._simenv import SimEnv
from deferq.testing._crashrun import Engine
from deferq.testing._explore import ExploreReport, explore
from deferq.testing._mutants import Mutant
from deferq.testing._workloads import Step, Workload

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
