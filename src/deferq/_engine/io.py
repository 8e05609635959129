"""Engine I/O helpers shared by the WAL and the dead-task store, all through ``Env``.

Rules: bounded memory everywhere (D-14): files are read in ``READ_CHUNK_BYTES``
chunks and split by the pure splitters of ``_recovery``; tail repair scans
backwards in ``TAIL_SCAN_CHUNK_BYTES`` chunks. Short writes are retried until
every byte is written (A-6); an ``OSError`` propagates to the caller, which
decides what it means for its file.
"""

from __future__ import annotations

from collections.abc import Iterator

from deferq._core.limits import READ_CHUNK_BYTES, TAIL_SCAN_CHUNK_BYTES
from deferq._core.recovery import BackwardLines, ForwardLines, RawLine, tail_cut
from deferq._engine.env import Env


def join(directory: str, name: str) -> str:
    """``directory/name`` without importing ``os.path`` into the engine."""
    return name if directory in ("", ".") else f"{directory.rstrip('/')}/{name}"


def name_file(exc: OSError, path: str) -> OSError:
    """Name ``path`` in ``exc`` if it names no file, and return it.

    A ``write``, ``fsync`` or ``ftruncate`` takes a descriptor, so the kernel's error
    (``[Errno 28] No space left on device``) does not say which file failed; the engine
    adds it before the error leaves, so every message names the file. An ``OSError``
    without an errno (the engine's own) is left alone: Python would print ``[Errno None]``.
    """
    if exc.filename is None and exc.errno is not None:
        exc.filename = path
    return exc


def write_all(env: Env, fd: int, data: bytes) -> None:
    """Write every byte of ``data``, looping over short writes (A-6)."""
    view = memoryview(data)
    while view:
        written = env.write(fd, bytes(view))
        if written <= 0:
            raise OSError(f"write returned {written} with {len(view)} bytes left")
        view = view[written:]


def chunks_forward(env: Env, fd: int, size: int, start: int = 0) -> Iterator[bytes]:
    """``fd[start:size]`` in file order, in chunks of at most ``READ_CHUNK_BYTES``."""
    offset = start
    while offset < size:
        chunk = env.pread(fd, min(READ_CHUNK_BYTES, size - offset), offset)
        if not chunk:
            break  # The file shrank under us; what was read is all there is.
        offset += len(chunk)
        yield chunk


def records_end(env: Env, fd: int, size: int) -> int:
    """Implements R-@L: where a WAL file's records end, the NUL bytes it ends with left out.

    A worker reserves space past its records (W-25), and reserved space reads as
    zeros; no record holds a NUL (F-4), so the records end after the last byte of
    ``fd[:size]`` that is not NUL. Reads backwards in ``READ_CHUNK_BYTES`` chunks
    (a worker reserves at most ``WAL_RESERVE_BYTES`` plus one record ahead).
    """
    end = size
    while end > 0:
        start = max(0, end - READ_CHUNK_BYTES)
        chunk = env.pread(fd, end - start, start)
        kept = len(chunk.rstrip(b"\0"))
        if kept:
            return start + kept
        end = start
    return 0


def lines_forward(env: Env, fd: int, size: int, start: int = 0) -> Iterator[RawLine]:
    """Every line of ``fd[start:size]`` in file order, the torn tail last (R-@F)."""
    splitter = ForwardLines(start)
    for chunk in chunks_forward(env, fd, size, start):
        yield from splitter.feed(chunk)
    tail = splitter.finish()
    if tail is not None:
        yield tail


def lines_backward(env: Env, fd: int, size: int) -> Iterator[RawLine]:
    """Every line of ``fd[:size]`` from the newest to the oldest, the torn tail first."""
    splitter = BackwardLines(size)
    end = size
    while end > 0:
        start = max(0, end - READ_CHUNK_BYTES)
        chunk = env.pread(fd, end - start, start)
        if len(chunk) != end - start:
            raise OSError(f"short read at offset {start}: file changed while locked")
        end = start
        yield from splitter.feed(chunk)
    yield from splitter.finish()


def repair_tail(env: Env, fd: int) -> int:
    """Truncate an unterminated final line (R-@F); return the file's size afterwards.

    Does nothing when the file is empty or ends with a newline. Otherwise scans
    backwards for the last newline and truncates just after it, or to zero.
    The caller makes the truncation durable with its next fsync.
    """
    size = env.fstat(fd).size
    if size == 0 or env.pread(fd, 1, size - 1) == b"\n":
        return size
    end = size
    cut = 0
    while end > 0:
        start = max(0, end - TAIL_SCAN_CHUNK_BYTES)
        found = tail_cut(env.pread(fd, end - start, start), start)
        if found is not None:
            cut = found
            break
        end = start
    env.ftruncate(fd, cut)
    return cut
