"""``deferq queue-demo``: a small service on a real Disk, narrated as it happens.

Rules: it uses only the public queue API and the operator commands of
``_cli_ops``; tasks live in a private registry; retry intervals are fractions
of a second so the walk-through takes about two seconds; the queue's log
lines are shown in one line each (no tracebacks) and the logger is restored
afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

import deferq
from deferq._cli.dead import (
    DeadStoreView,
    dead_list,
    dead_remove,
    dead_retry,
    dead_show,
)
from deferq._cli.ops import file_size_text, pending_list
from deferq.backends import Disk

REGISTRY = deferq.TaskRegistry()
_state = {"charge_calls": 0, "upload_fixed": False}


class SendWelcome(deferq.Task, name="demo.SendWelcome", registry=REGISTRY):
    def perform(self, user: str) -> None:
        print(f"   SendWelcome({user!r}) ok")


class ChargeCard(deferq.Task, name="demo.ChargeCard", registry=REGISTRY):
    """Fails twice (a flaky gateway), then succeeds."""

    def perform(self, order: int) -> None:
        _state["charge_calls"] += 1
        if _state["charge_calls"] < 3:
            print(f"   ChargeCard({order}) attempt {self.attempt}: gateway timeout")
            raise TimeoutError("gateway timeout")
        print(f"   ChargeCard({order}) attempt {self.attempt}: ok")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return 0.3 * attempt


class SyncCrm(deferq.Task, name="demo.SyncCrm", registry=REGISTRY):
    """Always fails; gives up after 3 executions."""

    max_retries = 2

    def perform(self, account: str) -> None:
        print(f"   SyncCrm({account!r}) attempt {self.attempt}: CRM says 503")
        raise ConnectionError("CRM unavailable (503)")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return 0.2


class ParseUpload(deferq.Task, name="demo.ParseUpload", registry=REGISTRY):
    """A bad input: gives up at once (retrying would not help) until it is fixed."""

    def perform(self, name: str) -> None:
        if not _state["upload_fixed"]:
            print(f"   ParseUpload({name!r}) attempt {self.attempt}: malformed CSV, giving up")
            raise ValueError(f"{name}: line 3 has 4 fields, expected 5")
        print(f"   ParseUpload({name!r}) attempt {self.attempt}: ok (the parser was fixed)")

    def retry_interval(self, exception: BaseException, attempt: int) -> object:
        return None if isinstance(exception, ValueError) else 1


class MonthlyReport(deferq.Task, name="demo.MonthlyReport", registry=REGISTRY):
    def perform(self, month: str) -> None:
        print(f"   MonthlyReport({month!r}) ok")


class _OneLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"   log {record.levelname.lower()}: {record.getMessage()}"


def _show_files(path: str) -> None:
    print(f"   files in {path}:")
    for file in sorted(Path(path).iterdir()):
        print(f"     {file.name:<46} {file_size_text(str(file))}")


def _args(path: str, **values: object) -> argparse.Namespace:
    """The parsed arguments the operator commands read."""
    defaults: dict[str, object] = {
        "path": path, "prefix": "deferred-", "json": False, "limit": None, "offset": 0,
        "task_class": None, "exception_class": None, "ids": [], "all": False, "dry_run": False}
    return argparse.Namespace(**{**defaults, **values})


async def _service(path: str) -> None:
    print("1. A service starts a Queue on a Disk and enqueues five tasks.")
    with Disk(path=path, fsync_frequency=0) as disk:
        queue = deferq.Queue(disk, registry=REGISTRY)
        await queue.start()
        queue.enqueue(SendWelcome, "ada")
        queue.enqueue(ChargeCard, 1042)
        queue.enqueue(SyncCrm, "acme")
        queue.enqueue(ParseUpload, "leads.csv")
        queue.enqueue(MonthlyReport, "2026-11", delay=3600)
        print("   all five are in the WAL; they run in the background:")
        for _ in range(200):  # at most 10 s
            if _state["charge_calls"] >= 3 and len(disk.list_dead_tasks()) >= 2:
                break
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError("the demo service did not reach its expected state")
        await queue.wait_idle()
        print("\n2. The service stops; the delayed report has not run and stays in the WAL.")
        await queue.stop(timeout=2)
        _show_files(path)


async def _restart(path: str) -> None:
    print("\n5. The service restarts: it adopts the WAL files left behind and replays them.")
    with Disk(path=path, fsync_frequency=0) as disk:
        queue = deferq.Queue(disk, registry=REGISTRY)
        await queue.start()
        await queue.wait_idle()
        print(f"   still delayed in this process: {queue.delayed} (the report, due in an hour)")
        await queue.stop(timeout=2)


def queue_demo(path: str) -> int:
    """Run the walk-through in ``path`` (created)."""
    logger = logging.getLogger("deferq.queue")
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(_OneLine())
    saved = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    _state.update(charge_calls=0, upload_fixed=False)
    try:
        print(f"deferq queue demo in {path}\n")
        asyncio.run(_service(path))
        print("\n3. An operator looks at the dead tasks (deferq dead list / dead show).")
        dead_list(_args(path))
        view = DeadStoreView(path, "deferred-")
        try:
            upload = [t.id for t in view.list_dead_tasks() if t.task_class == "demo.ParseUpload"][0]
        finally:
            view.close()
        dead_show(_args(path, id=upload))
        print("\n4. The parser is fixed: retry the upload (deferq dead retry ID), drop the CRM"
              " sync (deferq dead remove --all --task-class demo.SyncCrm).")
        _state["upload_fixed"] = True
        dead_retry(_args(path, ids=[upload]))
        dead_remove(_args(path, all=True, task_class="demo.SyncCrm"))
        pending_list(_args(path))
        asyncio.run(_restart(path))
        print("\n6. What is left: the report in the WAL, no dead tasks.")
        pending_list(_args(path))
        dead_list(_args(path))
    finally:
        logger.removeHandler(handler)
        logger.propagate = saved
    print("\nqueue demo: ok")
    return 0
