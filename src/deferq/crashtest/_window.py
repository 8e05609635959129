"""Simulated ``MappedWindow``s (W-26): a store is a positional write of the simulated file.

On the operating system a store into a shared mapping is a memory copy into the page
cache: it leaves the descriptor's offset alone and cannot fail. ``SimWindow`` stores through
``SimEnv.store_at``, which writes at the mapped position without moving any offset and goes
through the same machinery as ``write``: the fault rules of ``write`` (a short store is
completed by another store, so a crash between the two is a torn store; a failed store is
not possible on the OS, so the engine's handling of one is only ever more careful than it
needs to be), crash points, and unsynced bytes lost at a power cut. ``ForwardingWindow``
lets an ``Env`` wrapper (tracing, scheduling) see each store before the inner window makes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from deferq._engine.env import MappedWindow


class _Storing(Protocol):
    def store_at(self, fd: int, position: int, data: bytes) -> int:
        """Write ``data`` at ``position`` of ``fd``'s file, the offset unmoved; return the count."""

    def forget_window(self, window: SimWindow) -> None:
        """The window was closed."""


class SimWindow:
    """``window[a:b] = data`` writes ``data`` at ``base + a`` of ``fd`` (``SimEnv.store_at``)."""

    __slots__ = ("_base", "_env", "_fd", "_length")

    def __init__(self, env: _Storing, fd: int, base: int, length: int) -> None:
        self._env = env
        self._fd = fd
        self._base = base
        self._length = length

    @property
    def span(self) -> tuple[int, int]:
        """The file offsets ``[base, base + length)`` this window maps."""
        return self._base, self._base + self._length

    def __setitem__(self, index: slice[int, int, None], value: bytes, /) -> None:
        if self._length < 0:
            raise ValueError("mmap closed or invalid")  # what mmap raises after close()
        start, stop = index.start, index.stop
        if (index.step is not None or not 0 <= start <= stop <= self._length
                or stop - start != len(value)):
            # mmap raises IndexError for a slice past its end and a store of another size.
            raise IndexError(f"store of {len(value)} bytes at [{start}:{stop}] of a "
                             f"{self._length}-byte window")
        done = 0
        while done < len(value):
            count = self._env.store_at(self._fd, self._base + start + done, value[done:])
            if count <= 0:
                raise OSError(f"store returned {count} with {len(value) - done} bytes left")
            done += count

    def close(self) -> None:
        if self._length >= 0:
            self._length = -1
            self._env.forget_window(self)


class ForwardingWindow:
    """An inner window whose every store is announced to ``before(size)`` first, and whose
    closing to ``closing()`` when given."""

    __slots__ = ("_before", "_closing", "_inner")

    def __init__(self, inner: MappedWindow, before: Callable[[int], None],
                 closing: Callable[[], None] | None = None) -> None:
        self._inner = inner
        self._before = before
        self._closing = closing

    def __setitem__(self, index: slice[int, int, None], value: bytes, /) -> None:
        self._before(len(value))
        self._inner[index] = value

    def close(self) -> None:
        if self._closing is not None:
            self._closing()
        self._inner.close()
