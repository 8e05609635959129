"""The dead-task store's logger, imported on its first message.

Why: ``logging`` (with ``traceback``, ``string`` and their imports) was about a tenth of a
reading command's start-up (``deferq dead list``), and a read that meets no damage logs
nothing. ``Log("deferq")`` stands for ``logging.getLogger("deferq")``: each message goes to
that logger, with the caller's file and line, so handlers, levels and ``caplog`` see what
they saw before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import logging


class Log:
    """``logging.getLogger(name)``, looked up when the first message is logged."""

    __slots__ = ("_name", "_logger")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: logging.Logger | None = None

    def _get(self) -> logging.Logger:
        if self._logger is None:
            import logging  # noqa: PLC0415 - the point of this module

            self._logger = logging.getLogger(self._name)
        return self._logger

    def info(self, message: str, *args: object) -> None:
        self._get().info(message, *args, stacklevel=2)

    def warning(self, message: str, *args: object) -> None:
        self._get().warning(message, *args, stacklevel=2)

    def error(self, message: str, *args: object) -> None:
        self._get().error(message, *args, stacklevel=2)
