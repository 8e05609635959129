"""Real crashes on a real filesystem: SIGKILLed workers and power cuts on loop-mounted ext4.

Theory of operation (docs/power-test.md). ``_fs`` creates a fresh ext4 image,
loop-mounts it inside a private mount namespace and cuts power with the ext4
shutdown ioctl (NOLOGFLUSH); ``_workers`` runs worker and operator processes
that use ``Disk`` directly and report every issue and acknowledgement over a
pipe to the harness; ``_queue_roles`` runs real ``Queue`` workers, a queue
operator and the final drain over a reporting ``Disk``; ``_observe`` reads the
files after each crash with the engine's own decoders and ``_check`` judges them with
``deferq._core.model.StorageModel`` (``_deadwrites`` excusing overlapping dead-store
writes); ``_qcheck`` follows every enqueued task to its end (D-13, Q-3, Q-9, Q-33);
``_harness`` is the fault loop, with ``_children`` (the role processes and their
pipes), ``_recheck`` (the check after each cycle) and ``_results`` (config and
summary); ``_inject`` runs a probe under strace to inject
fsync EIO and write errors on real syscalls; ``_enospc`` makes real short writes
on a full filesystem; ``_race`` calibrates the power cut itself.
"""

from __future__ import annotations

from deferq.powertest._fs import Requirements, missing_requirements
from deferq.powertest._harness import PowerConfig, Summary, run_power_test

__all__ = ["PowerConfig", "Requirements", "Summary", "missing_requirements", "run_power_test"]
