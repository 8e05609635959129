"""The simulated ``MappedWindow`` (W-26): a store is a ``seek`` and a ``write`` through an Env.

On the operating system a store into a shared mapping is a memory copy into the page
cache: it cannot fail, and it leaves the descriptor's offset alone. Here each store goes
through the Env's own ``seek`` and ``write`` calls, so every simulated machinery sees it
as the write it is to the file's data: the fault rules (a failed or short store is not
possible on the OS, so the engine's handling of one is only ever more careful than it
needs to be), crash points, unsynced data lost at a power cut, traces and schedules. The
engine never relies on the descriptor's offset after a store (W-26), so that the offset
moving here is no difference it can observe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deferq._io import write_all

if TYPE_CHECKING:
    from collections.abc import Callable

    from deferq._env import Env, MappedWindow


class StoreThroughWindow:
    """``window[a:b] = data`` writes ``data`` at ``base + a`` of ``fd`` through ``env``."""

    __slots__ = ("_base", "_env", "_fd", "_inner", "_length", "_on_close")

    def __init__(self, env: Env, fd: int, base: int, length: int, *,
                 inner: MappedWindow | None = None,
                 on_close: Callable[[StoreThroughWindow], None] | None = None) -> None:
        self._env = env
        self._fd = fd
        self._base = base
        self._length = length
        self._inner = inner  # the wrapped Env's own window, closed with this one
        self._on_close = on_close

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
        self._env.seek(self._fd, self._base + start)
        write_all(self._env, self._fd, value)

    def close(self) -> None:
        if self._length < 0:
            return
        self._length = -1
        try:
            if self._inner is not None:
                self._inner.close()
        finally:
            if self._on_close is not None:
                self._on_close(self)
