"""Property tests of the dead-task store's index, needle scan and fast frame check.

Goal: with the per-process index (S-10..S-12), the cold needle scan of ``find`` (S-13),
the streaming compaction (S-15) and group commit in place, every ``list`` and ``find``
returns exactly what the line-by-line backward scan of the file returns, and logs the
same damage count and the same undecodable ids (S-6, S-7, R-@A..R-@K). Method:
Hypothesis draws sequences of operations on one simulated disk: adds and removes by the
store under test and by a second store ("another process", with its own lock file
description and its own index), torn tails and damaged lines appended by a raw writer,
the data file replaced by a rename, and reads that build the index (a list without a limit) or use
it. After every read the result is compared with a reference: the old scanning
algorithm, run on the file's bytes as they are at that moment. The needle scan and the
index builder are also checked alone with tiny read chunks and line limits, so lines
that span chunks and over-long lines are covered.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deferq._core.deadcodec import _decode_dead_exact, decode_dead_line, encode_dead
from deferq._core.frame import BadLine, frame
from deferq._core.recovery import BackwardLines, RawLine, capped_line
from deferq._core.types import DeadTask
from deferq._engine import deadindex as _deadindex
from deferq._engine import deadpages as _deadpages
from deferq._engine.deadindex import DeadIndex, NeedleScan, dead_line, fast_dead_id
from deferq._engine.deadstore import DeadTaskStore
from deferq._engine.env import FileStat, OpenFlag
from deferq.backends import Disk
from deferq.crashtest import SimDisk, SimEnv

PATH = "/s"
PREFIX = "p-"
DATA = f"{PATH}/{PREFIX}dead_tasks-0"
IDS = ["a", "b", "c", "dd", "é"]


# ----------------------------------------------------------------------------- the reference


@dataclass
class Outcome:
    tasks: list[DeadTask]
    corrupt: int
    undecodable: list[str] = field(default_factory=list)


def backward_lines(data: bytes, line_bytes_max: int | None = None) -> list[RawLine]:
    splitter = (BackwardLines(len(data)) if line_bytes_max is None
                else BackwardLines(len(data), line_bytes_max))
    return [*splitter.feed(data), *splitter.finish()] if data else []


def reference_list(data: bytes, offset: int, limit: int | None) -> Outcome:
    """The scanning ``list`` before the index (S-6, S-7, S-33), on a file's bytes.

    S-33: each id whose latest record has a valid frame is one place; the offset skips
    places without decoding, and the page is the next ``limit`` places, an undecodable
    one logged and left out.
    """
    out = Outcome([], 0)
    if limit == 0:
        return out
    seen: set[str] = set()
    for raw in backward_lines(data):
        framed, _, faults = dead_line(raw)
        out.corrupt += faults
        if framed is None or framed.task_id in seen:
            continue  # a damaged line supersedes nothing (R-@H before R-@G)
        seen.add(framed.task_id)
        if offset:
            offset -= 1
            continue
        task = _decode_dead_exact(framed)  # the decoder before its fast path
        if isinstance(task, BadLine):
            out.undecodable.append(framed.task_id)
        else:
            out.tasks.append(task)
        if limit is not None:
            limit -= 1
            if not limit:
                break
    return out


def reference_find(data: bytes, task_id: str) -> Outcome:
    """The scanning ``find`` before the index (S-6, S-7), on a file's bytes."""
    out = Outcome([], 0)
    needle = b"dead_task:" + task_id.encode("utf-8") + b":"
    for raw in backward_lines(data):
        if raw.data is None or needle not in raw.data:
            continue
        framed, _, faults = dead_line(raw)
        out.corrupt += faults
        if framed is None or framed.task_id != task_id:
            continue
        task = _decode_dead_exact(framed)  # the decoder before its fast path
        if isinstance(task, BadLine):
            out.undecodable.append(task_id)
        else:
            out.tasks.append(task)
        break
    return out


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def captured() -> Iterator[Captured]:
    handler = Captured()
    logger = logging.getLogger("deferq")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def first_arg(record: logging.LogRecord) -> object:
    assert isinstance(record.args, tuple) and record.args
    return record.args[0]


def observed(handler: Captured, tasks: list[DeadTask]) -> Outcome:
    corrupt = sum(int(str(first_arg(r))) for r in handler.records
                  if r.levelno == logging.WARNING and str(r.msg).startswith("Detected"))
    undecodable = [str(first_arg(r)) for r in handler.records if r.levelno == logging.ERROR]
    return Outcome(tasks, corrupt, undecodable)


# ----------------------------------------------------------------------------- operations


def dead(task_id: str, variant: int) -> DeadTask:
    return DeadTask(id=task_id, task_class="job.T", attempts=variant + 1, enqueued_at=0,
                    failed_at=1_700_000_000 + variant, exception_class="ValueError",
                    exception_message="m" * (variant * 7), backtrace=("f",) * (variant % 3),
                    context=bytes([variant]) * variant)


def damaged_line(kind: int, task_id: str, variant: int) -> bytes:
    good = encode_dead(dead(task_id, variant))
    if kind == 0:  # R-@C: a bad CRC on a line that carries the id's prefix
        return b"00000000" + good[8:]
    if kind == 1:  # R-@K: a zero-filled hole in front of a valid record
        return b"\0" * (variant + 1) + good
    if kind == 2:  # R-@K: a hole and nothing after it
        return b"\0" * (variant + 3) + b"\n"
    if kind == 3:  # R-@G: a valid frame whose JSON is not a dead task
        return frame(b"dead_task:" + task_id.encode() + b":{}")
    if kind == 4:  # R-@B: garbage with the id's prefix inside
        return b"xx dead_task:" + task_id.encode() + b": yy\n"
    return b"\n"  # R-@B: an empty line


ops = st.one_of(
    st.tuples(st.just("add"), st.booleans(), st.sampled_from(IDS), st.integers(0, 5)),
    st.tuples(st.just("remove"), st.booleans(), st.sets(st.sampled_from([*IDS, "zz"]),
                                                         min_size=1, max_size=3)),
    st.tuples(st.just("list"), st.integers(0, 6), st.one_of(st.none(), st.integers(1, 4))),
    st.tuples(st.just("find"), st.sampled_from([*IDS, "zz"])),
    st.tuples(st.just("torn"), st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b)),
    st.tuples(st.just("damage"), st.integers(0, 5), st.sampled_from(IDS), st.integers(0, 5)),
    st.tuples(st.just("replace"), st.integers(0, 3)),
)


def raw_append(env: SimEnv, data: bytes) -> None:
    fd = env.open(DATA, OpenFlag.WRITE | OpenFlag.APPEND | OpenFlag.CREATE)
    try:
        env.write(fd, data)
    finally:
        env.close(fd)


def file_bytes(env: SimEnv) -> bytes:
    try:
        fd = env.open(DATA, OpenFlag.READ)
    except FileNotFoundError:
        return b""
    try:
        return env.pread(fd, env.fstat(fd).size, 0)
    finally:
        env.close(fd)


class _Exc(Exception):
    pass


def run(steps: list[tuple[object, ...]]) -> tuple[int, int]:
    disk = SimDisk(1)
    mine = Disk(path=PATH, prefix=PREFIX, fsync_frequency=0, env=disk.process())
    other = Disk(path=PATH, prefix=PREFIX, fsync_frequency=0, env=disk.process())
    raw = disk.process()
    indexed_reads = reads = 0
    try:
        for step in steps:
            kind = step[0]
            if kind == "add":
                _, by_me, task_id, variant = step
                task = dead(str(task_id), int(str(variant)))
                (mine if by_me else other)._dead.add(task)
            elif kind == "remove":
                _, by_me, ids = step
                (mine if by_me else other).remove_dead_tasks(ids)  # type: ignore[arg-type]
            elif kind == "torn":
                raw_append(raw, step[1])  # type: ignore[arg-type]
            elif kind == "damage":
                _, how, task_id, variant = step
                data = file_bytes(raw)
                prefix = b"" if not data or data.endswith(b"\n") else b"\n"
                raw_append(raw, prefix + damaged_line(int(str(how)), str(task_id),
                                                      int(str(variant))))
            elif kind == "replace":
                # Another program rewrites the file (a new inode): keep every other line.
                lines = file_bytes(raw).split(b"\n")
                keep = b"".join(x + b"\n" for i, x in enumerate(lines[:-1])
                                if i % 4 != int(str(step[1])))
                tmp = DATA + ".other"
                fd = raw.open(tmp, OpenFlag.WRITE | OpenFlag.CREATE | OpenFlag.TRUNCATE)
                raw.write(fd, keep) if keep else None
                raw.close(fd)
                raw.rename(tmp, DATA)
            else:
                reads += 1
                data = file_bytes(raw)
                with captured() as handler:
                    if kind == "fold":  # stats through the cache (S-86)
                        folded = mine._dead.fold_tasks(list)  # None: S-87's fallback
                        got = folded if folded is not None else list(mine._dead.iter_tasks())
                        want = reference_list(data, 0, None)
                    elif kind == "page":  # a process with no index of its own (S-72)
                        _, offset, limit, stepped = step
                        mine._dead._drop_index()
                        got = (list(mine._dead.iter_tasks(int(str(offset)), int(str(limit))))
                               if stepped else mine.list_dead_tasks(
                                   limit=int(str(limit)), offset=int(str(offset))))
                        want = reference_list(data, int(str(offset)), int(str(limit)))
                    elif kind == "list":
                        _, offset, limit = step
                        got = mine.list_dead_tasks(limit=limit,  # type: ignore[arg-type]
                                                   offset=offset)  # type: ignore[arg-type]
                        want = reference_list(data, int(str(offset)),
                                              None if limit is None else int(str(limit)))
                    else:
                        found = mine.find_dead_task(str(step[1]))
                        got = [] if found is None else [found]
                        want = reference_find(data, str(step[1]))
                assert observed(handler, got) == want, (step, data)
                indexed_reads += mine._dead._index is not None
    finally:
        mine.close()
        other.close()
    return reads, indexed_reads


@pytest.mark.slow
@pytest.mark.spec("S-6", "S-7", "S-10", "S-11", "S-12", "S-13", "S-15", "S-33", "S-45", "S-46",
                  "S-82", "R-@H", "R-@K")
@settings(max_examples=300)
@given(st.lists(ops, max_size=40))
def test_every_read_equals_the_line_by_line_scan_of_the_file_as_it_is(
        steps: list[tuple[object, ...]]) -> None:
    run(steps)


page_ops = st.one_of(ops, st.tuples(st.just("page"), st.integers(0, 6), st.integers(1, 4),
                                     st.booleans()), st.tuples(st.just("fold")))


@pytest.mark.slow
@pytest.mark.spec("S-65", "S-67", "S-68", "S-69", "S-70", "S-74", "S-72", "S-73", "S-85", "S-86",
                  "S-90", "F-60")
@settings(max_examples=300)
@given(st.lists(page_ops, max_size=40), st.integers(0, 400), st.integers(0, 1200),
       st.integers(1, 300), st.sampled_from([0, 0, 0, 4]))
def test_every_page_through_the_index_cache_equals_the_scan_of_the_file_as_it_is(
        steps: list[tuple[object, ...]], tail_max: int, merge_max: int, step_bytes: int,
        scan_share: int) -> None:
    """Every page is a deep page here: read through the cache (with the tail appended
    since it was written, under any tail limit, merged into a new cache or not), or built
    in steps of any size."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DeadTaskStore, "_cache_offset_min", 0)
        patch.setattr(DeadTaskStore, "_cache_tail_max", tail_max)
        patch.setattr(DeadTaskStore, "_cache_merge_max", merge_max)
        patch.setattr(DeadTaskStore, "_cache_scan_share", scan_share)  # 0: never S-90's scan
        patch.setattr(_deadpages, "DEAD_READ_STEP_BYTES", step_bytes)
        run(steps)


@pytest.mark.spec("S-10", "S-11")
def test_the_random_runs_do_use_the_index() -> None:
    """The property above exercises the index, not just the scans: a fixed run shows it."""
    steps: list[tuple[object, ...]] = [
        ("add", True, "a", 1), ("add", False, "b", 2), ("list", 0, None),
        ("add", False, "c", 3), ("find", "c"), ("torn", b"xyz"), ("list", 1, 1),
        ("damage", 1, "a", 2), ("find", "a"), ("remove", False, {"b"}), ("list", 0, None),
        ("find", "a"),
    ]
    reads, indexed = run(steps)
    assert reads == 6 and indexed == 6


# ----------------------------------------------------------------------------- the pieces alone


pieces = st.lists(st.sampled_from([b"\n", b"ab", b"dead_task:a:", b"dead_task:ab:", b"\0",
                                   b"xyzw", b"dead_task:", b":"]), max_size=30).map(b"".join)


@pytest.mark.spec("S-13", "S-7", "R-@K")
@given(pieces, st.sampled_from([b"dead_task:a:", b"dead_task:ab:", b"a:"]),
       st.integers(1, 40), st.integers(1, 50))
def test_the_needle_scan_yields_exactly_the_lines_that_hold_the_needle(
        data: bytes, needle: bytes, chunk: int, line_max: int) -> None:
    """With any chunk size and line limit, newest first, each byte read once on a miss."""
    disk = SimDisk(2)
    env = disk.process()
    env.makedirs("/d")
    fd = env.open("/d/f", OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE)
    env.write(fd, data) if data else None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_deadindex, "READ_CHUNK_BYTES", max(chunk, len(needle)))
        patch.setattr(_deadindex, "LINE_BYTES_MAX", line_max)
        scan = NeedleScan(env, fd, len(data), needle)
        got = list(scan.lines())
    # Each line as its bytes (find counts a damaged one when it holds the id), except that a
    # complete line over the limit is cut at its last NUL first (R-@K before R-@E).
    want = []
    offset = 0
    for piece in data.split(b"\n"):
        torn = offset + len(piece) == len(data)
        raw = (RawLine(offset, piece if len(piece) <= line_max else None, False) if torn
               else capped_line(offset, piece, line_max))
        if piece and raw.data is not None and needle in raw.data:
            want.append(raw)
        offset += len(piece) + 1
    want.reverse()
    assert got == want
    if needle not in data:
        assert scan.bytes_read == len(data)


@pytest.mark.spec("S-10", "S-12", "R-@E", "R-@K")
@given(st.lists(st.one_of(
    st.tuples(st.sampled_from(IDS), st.integers(0, 5)).map(lambda t: encode_dead(dead(*t))),
    st.tuples(st.integers(0, 5), st.sampled_from(IDS), st.integers(0, 5)).map(
        lambda t: damaged_line(*t)),
    st.binary(max_size=30)), max_size=12).map(b"".join),
    st.integers(1, 200), st.integers(200, 400), st.lists(st.integers(0, 2000), max_size=3))
def test_the_index_built_in_any_steps_and_chunks_records_every_line_as_the_splitter_does(
        data: bytes, chunk: int, line_max: int, cuts: list[int]) -> None:
    """Extending the index over any prefixes equals one build, and matches ``dead_line``."""
    disk = SimDisk(3)
    env = disk.process()
    fd = env.open("/f", OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE)
    env.write(fd, data) if data else None
    stat = FileStat(1, 1, len(data), 1, 0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_deadindex, "READ_CHUNK_BYTES", chunk)
        patch.setattr(_deadindex, "LINE_BYTES_MAX", line_max)
        index = DeadIndex(stat, 0)
        for cut in sorted(c for c in cuts if c <= len(data)):
            index.extend(env, fd, cut)
        index.extend(env, fd, len(data))
    records: list[tuple[str, int, int]] = []
    damage: list[tuple[int, int]] = []
    lines = list(reversed(backward_lines(data, line_max)))
    for raw in lines:
        if not raw.complete:
            continue
        framed, body, faults = dead_line(raw)
        # The splitter hands a line over the limit on cut at its last NUL (R-@K before
        # R-@E); the index places its damage at that NUL, where a reader's bytes start.
        end = data.index(b"\n", raw.offset)
        seen = raw.offset if raw.data is None or end - raw.offset <= line_max else end - len(raw.data)
        if faults:
            damage.append((seen, faults))
        if framed is not None and body is not None:
            records.append((framed.task_id, end - len(body), len(body)))
    assert list(zip(index.ids, index.offs, index.lens)) == records
    assert [(d.start, d.faults) for d in index.damage] == damage
    complete_end = data.rfind(b"\n") + 1
    assert index.end == complete_end


def _line(kind: int, task_id: str, variant: int) -> bytes:
    """A record (kind -1) or one of ``damaged_line``'s kinds."""
    return encode_dead(dead(task_id, variant)) if kind < 0 else damaged_line(kind, task_id, variant)


lines_of = st.lists(st.builds(_line, st.integers(-3, 5), st.sampled_from(IDS), st.integers(0, 5)),
                    max_size=12).map(b"".join)


@pytest.mark.spec("S-85", "S-69", "S-71")
@given(lines_of, lines_of)
def test_a_tail_merged_into_the_cache_gives_the_cache_a_build_of_the_whole_file_gives(
        before: bytes, after: bytes) -> None:
    """Any file and any lines appended to it: the cache of the file merged with the tail
    is byte for byte the cache of one build over both."""
    from deferq._engine.deadcache import (
        CachedIndex,
        cache_chunks,
        merged_chunks,
        superseded_places,
    )

    if before and not before.endswith(b"\n"):
        before += b"\n"  # the cache covers complete lines only
    disk = SimDisk(4)
    env = disk.process()
    fd = env.open("/f", OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE)
    env.write(fd, before) if before else None
    stat = FileStat(1, 1, len(before), 1, 0)
    first = DeadIndex(stat, 0)
    first.extend(env, fd, len(before))
    cache_fd = env.open("/c", OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE)
    env.write(cache_fd, b"".join(cache_chunks(first)))
    env.close(cache_fd)
    env.write(fd, after) if after else None
    whole = before + after
    stat = FileStat(1, 1, len(whole), 1, 0)
    cache = CachedIndex.open(env, "/c", len(whole))
    assert cache is not None
    tail = DeadIndex(stat, 0)
    tail.end = cache.end
    tail.extend(env, fd, len(whole))
    merged = b"".join(merged_chunks(cache, tail, superseded_places(env, fd, cache, tail)))
    cache.close()
    built = DeadIndex(stat, 0)
    built.extend(env, fd, len(whole))
    assert merged == b"".join(cache_chunks(built))


@pytest.mark.spec("S-15", "F-3", "F-10")
@given(st.sampled_from(IDS), st.integers(0, 5),
       st.binary(max_size=60).filter(lambda b: b"\n" not in b))
def test_the_fast_frame_check_takes_every_written_line_and_agrees_with_the_decoder(
        task_id: str, variant: int, junk: bytes) -> None:
    line = encode_dead(dead(task_id, variant))[:-1]
    # Every line deferq writes with an ASCII id takes the fast path; others take the slow one.
    assert fast_dead_id(line) == (task_id if task_id.isascii() else None)
    for other in (junk, line[:9] + junk, b"%08x:" % 0 + junk, frame(b"dead_task:" + junk)[:-1]):
        fast = fast_dead_id(other)
        full = decode_dead_line(other)
        assert fast is None or (not isinstance(full, BadLine) and full.task_id == fast)


@pytest.mark.spec("S-15", "F-3")
@given(st.sampled_from(IDS), st.integers(0, 5), st.integers(0, 400), st.integers(1, 255))
def test_a_flipped_byte_is_rejected_by_the_fast_frame_check_as_by_the_decoder(
        task_id: str, variant: int, where: int, xor: int) -> None:
    line = bytearray(encode_dead(dead(task_id, variant))[:-1])
    where %= len(line)
    line[where] ^= xor
    if b"\n" in line:
        return
    fast = fast_dead_id(bytes(line))
    full = decode_dead_line(bytes(line))
    assert (fast is None) or (not isinstance(full, BadLine) and full.task_id == fast)


def reference_compaction(data: bytes, task_ids: set[str],
                         line_bytes_max: int) -> tuple[bytes, set[str], int]:
    """Compaction before S-15: every line through the splitter and ``dead_line``."""
    out: list[bytes] = []
    found: set[str] = set()
    dropped = 0
    for raw in reversed(backward_lines(data, line_bytes_max)):
        framed, body, faults = dead_line(raw)
        dropped += faults
        if framed is None or body is None:
            continue
        if framed.task_id in task_ids:
            found.add(framed.task_id)
        else:
            out.append(body + b"\n")
    return b"".join(out), found, dropped


@pytest.mark.spec("S-15", "S-5", "R-@B", "R-@E", "R-@F", "R-@K")
@given(st.lists(st.one_of(
    st.tuples(st.sampled_from(IDS), st.integers(0, 5)).map(lambda t: encode_dead(dead(*t))),
    st.tuples(st.integers(0, 5), st.sampled_from(IDS), st.integers(0, 5)).map(
        lambda t: damaged_line(*t)),
    st.binary(max_size=30)), max_size=12).map(b"".join),
    st.sets(st.sampled_from([*IDS, "zz"]), min_size=1, max_size=3),
    st.integers(1, 300), st.integers(150, 400))
def test_streaming_compaction_writes_exactly_what_the_line_by_line_compaction_wrote(
        data: bytes, task_ids: set[str], chunk: int, line_max: int) -> None:
    """Any chunking, any damage: the same survivors, the same found ids, the same count."""
    from deferq._engine import compact as _compact
    from deferq._engine import deadstore as _deadstore
    from deferq._engine import io as _io

    disk = SimDisk(4)
    env = disk.process()
    store = _deadstore.DeadTaskStore(env, "/", "p-")
    fd = env.open(DATA.replace(PATH, ""), OpenFlag.WRITE | OpenFlag.APPEND)
    env.write(fd, data) if data else None
    env.close(fd)
    tmp = env.open("/out", OpenFlag.READ | OpenFlag.WRITE | OpenFlag.CREATE)
    with pytest.MonkeyPatch.context() as patch, captured() as handler:
        patch.setattr(_io, "READ_CHUNK_BYTES", chunk)  # compaction reads with chunks_forward
        patch.setattr(_compact, "LINE_BYTES_MAX", line_max)
        found = store._copy_survivors(tmp, task_ids)
    written = env.pread(tmp, env.fstat(tmp).size, 0)
    want, want_found, dropped = reference_compaction(data, task_ids, line_max)
    assert (written, found) == (want, want_found)
    warned = [r.args for r in handler.records if r.levelno == logging.WARNING]
    assert warned == ([(store._data, dropped)] if found and dropped else [])
    store.close()
