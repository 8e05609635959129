"""Progress of long operator work, shown on a terminal and nowhere else (issue: long verify,
bulk retry and remove, crash-test and power-test runs).

Rules: progress goes to standard error, and only when standard error is a terminal, so a
pipe or a file receives exactly the command's output. The line is rewritten in place
(``\\r``) at most every ``INTERVAL_S`` seconds and cleared when the work ends.
"""

from __future__ import annotations

import sys
import time
from typing import Final, TextIO

INTERVAL_S: Final = 0.2


def on_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal (a closed or odd stream is not)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """``label done/total`` on one rewritten line of a terminal; silent anywhere else."""

    def __init__(self, label: str, total: int | None = None,
                 stream: TextIO | None = None) -> None:
        self._stream = sys.stderr if stream is None else stream
        self._on = on_terminal(self._stream)
        self._label = label
        self._total = total
        self._done = 0
        self._shown_at = 0.0
        self._width = 0

    def step(self, count: int = 1) -> None:
        """``count`` more units are done."""
        self._done += count
        if not self._on:
            return
        now = time.monotonic()
        if now - self._shown_at >= INTERVAL_S:
            self._shown_at = now
            total = "" if self._total is None else f"/{self._total}"
            text = f"{self._label} {self._done}{total}"
            self._width = max(self._width, len(text))
            self._stream.write("\r" + text.ljust(self._width))
            self._stream.flush()

    def close(self) -> None:
        """Clear the line (when one was shown)."""
        if self._on and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
            self._width = 0
