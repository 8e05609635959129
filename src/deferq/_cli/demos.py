"""``deferq demo`` and ``deferq queue-demo``: their arguments; the demos (``deferq._demos``)
are imported only when one runs.
"""

from __future__ import annotations

import argparse

from deferq._cli.parser import Subcommands
from deferq.backends._options import check_path


def _storage_demo(args: argparse.Namespace) -> int:
    from deferq._demos.storage import demo  # noqa: PLC0415 - a demo, on demand

    return demo(check_path(args.path))


def _queue_demo(args: argparse.Namespace) -> int:
    from deferq._demos.queue import queue_demo  # noqa: PLC0415 - a demo, on demand

    return queue_demo(check_path(args.path))


def register(sub: Subcommands) -> None:
    demo = sub.add_parser("demo", help="run the storage demo")
    demo.add_argument("--path", default="deferq-demo-storage",
                      help="storage directory (created; default %(default)s)")
    demo.set_defaults(handler=_storage_demo)

    queue = sub.add_parser("queue-demo", help="run the queue demo: a small service, narrated")
    queue.add_argument("--path", default="deferq-queue-demo",
                       help="storage directory (created; default %(default)s)")
    queue.set_defaults(handler=_queue_demo)
