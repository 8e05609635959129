"""Build the conformance corpus: ``python conformance/build_corpus.py [--out DIR]``.

Rules: the output is a pure function of this file and deferq's codec: fixed ids, times,
names and contents (no clock, no pid, no unseeded randomness), so rebuilding gives the
same bytes and tests/conformance/test_corpus.py can fail on a stale corpus. Valid records
come from deferq's codec (``encode_add``, ``encode_rem``, ``encode_dead``, ``frame``,
``wal_file_name``); damage is written byte by byte as spec/recovery.md describes it.
Every case declares the damage it is meant to show, and the build stops unless:

1. deferq's own reader (``deferq.conformance.deferq_reader``: a ``Disk`` opened on a copy,
   plus the engine's line classification) reports exactly that damage, and
2. the reference reader (``conformance/reference_reader.py``, written from spec/ alone)
   reports exactly what deferq's reader reports.

So ``expected.json`` is the engine's outcome only where the engine and a reading of the
spec agree; the cases where they did not (or the spec is silent) are left out and listed
in conformance/README.md. The default output is the package data of ``deferq.conformance``
(one copy, shipped in the wheel and found from a checkout).

Why one module of about 600 lines: most of it is the list of cases, one short function per
case, each read next to its neighbours (the clean stores, then one recovery-table row after
another); split across files, the corpus's coverage could no longer be read in one place.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from deferq._core.deadcodec import encode_dead
from deferq._core.frame import frame
from deferq._core.names import dead_data_name, dead_lock_name, dead_tmp_name, wal_file_name
from deferq._core.types import DeadTask
from deferq._core.walcodec import encode_add, encode_rem
from deferq.conformance.cases import EXPECTED, GENERATED, Case, default_corpus, materialize
from deferq.conformance.compare import differences, shown
from deferq.conformance.deferq_reader import read as deferq_read
from deferq.conformance.report import Json

HERE = Path(__file__).resolve().parent
REFERENCE_READER = HERE / "reference_reader.py"

P = "deferred-"
DATE = "20260807"
T0 = 1796206789  # 2026-12-02T... : the seed of every generated-looking id
LINE_BYTES_MAX = 8_388_608
CONTEXT_BYTES_MAX = 4_194_304
Files = dict[str, bytes]


@dataclass(frozen=True)
class CaseDef:
    """One corpus case: its store files and the damage it is built to show."""

    name: str
    files: Files
    wal_damage: dict[str, int] = field(default_factory=dict)
    dead_damage: dict[str, int] = field(default_factory=dict)
    prefix: str = P
    # Too large to ship as files: written as byte segments, runs of these units folded.
    generated_units: tuple[bytes, ...] = ()


# ----------------------------------------------------------------------------- helpers


def wal(pid: int = 4242, rand: int = 1, prefix: str = P, date: str = DATE) -> str:
    return wal_file_name(prefix, date, pid, rand)


def tid(n: int, pid: int = 4242, seed: int = T0) -> str:
    return f"{seed}-{pid}-{n}"


def add(task_id: str, context: bytes = b"", at: int | None = None) -> bytes:
    return encode_add(task_id, at, context)


def rem(task_id: str) -> bytes:
    return encode_rem(task_id)


def marker(pid: int = 4242, seed: int = T0) -> bytes:
    """The seed marker a fresh copy starts with (W-28): a rem of an id that is never pending."""
    return rem(f"{seed}-{pid}-0")


def ctx(n: int) -> bytes:
    return b'{"n": %d}' % n


def dead(task_id: str, **changes: object) -> DeadTask:
    fields: dict[str, object] = {
        "id": task_id, "task_class": "ChargeCard", "attempts": 21,
        "enqueued_at": T0, "failed_at": T0 + 3600, "exception_class": "RuntimeError",
        "exception_message": "card declined", "backtrace": ("app/tasks.py:12:in perform",),
        "context": b'{"order": 42}',
    }
    fields.update(changes)
    return DeadTask(**fields)  # type: ignore[arg-type]


def dline(task_id: str, **changes: object) -> bytes:
    return encode_dead(dead(task_id, **changes))


def dead_payload(task_id: str, payload: bytes) -> bytes:
    """A dead-task line with a valid frame around an arbitrary JSON payload (R-@G cases)."""
    return frame(b"dead_task:" + task_id.encode() + b":" + payload)


def compact_json(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def payload_with(task_id: str, **changes: object) -> dict[str, object]:
    """The F-10 object of ``dead(task_id)`` as a dict, to be broken on purpose."""
    obj = json.loads(dline(task_id).split(b":", 3)[3])
    assert isinstance(obj, dict)
    obj.update(changes)
    return obj


def bad_crc(line: bytes) -> bytes:
    """The same line with one bit of the body flipped (its CRC no longer matches: R-@C)."""
    index = len(line) - 2
    return line[:index] + bytes([line[index] ^ 0x01]) + line[index + 1:]


def store(wal_files: dict[str, bytes] | None = None, dead_file: bytes | None = b"",
          lock: bytes | None = b"", prefix: str = P) -> Files:
    """A directory as a running deferq leaves it: WAL files, the data file, the lock file."""
    files = dict(wal_files or {})
    if dead_file is not None:
        files[dead_data_name(prefix)] = dead_file
    if lock is not None:
        files[dead_lock_name(prefix)] = lock
    return files


def one_wal(data: bytes, dead_file: bytes | None = b"") -> Files:
    return store({wal(): data}, dead_file)


# ----------------------------------------------------------------------------- the cases


def clean_cases() -> list[CaseDef]:
    golden = (add(tid(1), b"hello") + add(tid(2), b'{"order": 42}', 2000000000) + rem(tid(1)))
    golden_dead = encode_dead(dead(
        tid(2), attempts=21, failed_at=1796210389, exception_message="card declined (42 \u20ac)",
        backtrace=("app/tasks.py:12:in perform", "app/billing.py:88:in charge")))
    many = b"".join(add(tid(n), ctx(n), None if n % 3 else T0 + n) for n in range(1, 21))
    many += b"".join(rem(tid(n)) for n in range(1, 21, 2))
    return [
        CaseDef("clean-empty-directory", {}),
        CaseDef("clean-fresh-store", one_wal(marker())),
        CaseDef("clean-spec-worked-example", one_wal(golden, golden_dead)),
        CaseDef("clean-one-worker", one_wal(marker() + many, b"".join(
            dline(tid(n, pid=77), attempts=n, failed_at=T0 + n) for n in range(1, 6)))),
    ]


def multi_wal_cases() -> list[CaseDef]:
    a, b, c = wal(101, 5), wal(202, 7), wal(303, 9)
    return [
        CaseDef("wal-several-workers", store({
            a: marker(101) + add(tid(1, 101), ctx(1)) + add(tid(2, 101), ctx(2)) + rem(tid(1, 101)),
            b: marker(202) + add(tid(1, 202), ctx(3), T0 + 60),
            c: add(tid(1, 303), ctx(4)) + add(tid(2, 303), ctx(5)),
        })),
        # W-15: name order, not time order and not numeric pid order ("10" < "9" as names).
        CaseDef("wal-name-order-not-pid-order", store({
            wal(9, 1): add("job", b"from pid 9 (named last)") + add("only-9", b"9"),
            wal(10, 1): add("job", b"from pid 10 (named first)") + add("only-10", b"10"),
        })),
        CaseDef("wal-name-order-not-date-order", store({
            wal(1, 1, date="20251231"): add("x", b"old date, first by name"),
            wal(1, 1, date="20260101"): add("x", b"new date, applies last") + add("y", b"y"),
        })),
        # R-@J across files: the place is the first add's, the content the last one's.
        CaseDef("wal-readd-in-later-file", store({
            wal(1, 1): add("a", b"a1") + add("b", b"b1", T0) + add("c", b"c1"),
            wal(2, 1): add("b", b"b2") + add("d", b"d2"),
        })),
        # A removed id re-added later goes to the end.
        CaseDef("wal-readd-after-remove", store({
            wal(1, 1): add("a", b"a1") + add("b", b"b1") + rem("a"),
            wal(2, 1): add("a", b"a2"),
        })),
        # Removes apply in name order: a rem in an earlier file cannot remove a later add.
        CaseDef("wal-removes-across-files", store({
            wal(1, 1): add("a", b"a") + add("b", b"b") + rem("z"),
            wal(2, 1): rem("a") + add("z", b"z") + add("c", b"c"),
            wal(3, 1): rem("c") + rem("never-added"),
        })),
        # W-4 / W-10: a crash after a fresh copy was fsynced and before the old file was
        # unlinked leaves both; replaying both in name order gives the same pending set.
        CaseDef("wal-adoption-copy-beside-orphan", store({
            wal(500, 1): (add(tid(1, 500), ctx(1)) + add(tid(2, 500), ctx(2))
                          + rem(tid(1, 500)) + add(tid(3, 500), ctx(3), T0 + 9)),
            wal(600, 2): marker(600, T0 + 100) + add(tid(2, 500), ctx(2))
            + add(tid(3, 500), ctx(3), T0 + 9),
        })),
        CaseDef("wal-rotation-leftover-new-file-first", store({
            wal(42, 1): marker(42, T0 + 50) + add("keep", b"k"),
            wal(42, 2): add("keep", b"k") + add("done", b"d") + rem("done"),
        })),
    ]


def name_cases() -> list[CaseDef]:
    """F-1 and F-9: which names are store files. Every non-matching name holds a valid add."""
    def nope(name: str) -> tuple[str, bytes]:
        return name, add("not-" + name.replace(":", "_")[:200], b"must not be read")
    base = f"{P}0-{DATE}"
    decoys = dict([
        nope(f"{P}1-{DATE}-4242-abc"),  # another WAL version (F-15)
        nope(f"other-0-{DATE}-4242-abc"),  # another prefix
        nope(f"{base}-4242-ABC"),  # uppercase rand
        nope(f"{base}-4242-abcdefgh"),  # 8 rand characters
        nope(f"{base}-4242-1z141z4"),  # rand = 2^32
        nope(f"{base}-12345678901-abc"),  # 11 pid digits
        nope(f"{base}--abc"),  # empty pid
        nope(f"{base}-4242-"),  # empty rand
        nope(f"{P}0-2026080-4242-abc"),  # 7 date digits
        nope(f"{P}0-202608070-4242-abc"),  # 9 date digits
        nope(f"{base}-4242-abc-1"),  # a fourth part
        nope(f"{base}-4242-abc.tmp"),
        nope(f"{P}0-2026o807-4242-abc"),  # a letter in the date
        nope(f"{P}dead_tasks-1"),  # another dead-task version (F-15)
        nope(f"{base}-\u0664\u0662-abc"),  # Arabic-Indic digits are not ASCII digits
        nope(f"{P}0-\uff12\uff10\uff12\uff16\uff10\uff18\uff10\uff17-1-abc"),  # fullwidth
        nope(f"{P.upper()}0-{DATE}-4242-abc"),  # the prefix is case-sensitive
    ])
    decoys["other-dead_tasks-0"] = dline("other-prefix")
    decoys[dead_tmp_name(P)] = dline("staged-only")
    valid = {
        wal(4242, 4294967295): add("rand-max", b"1z141z3 = 2^32 - 1"),
        f"{base}-0004242-00abc": add("leading-zeros", b"accepted by readers (F-1 notes)"),
        f"{base}-1234567890-0": add("pid-ten-digits", b"10 digits, rand 0"),
    }
    return [
        CaseDef("names-only-f1-names-are-wal-files", store({**decoys, **valid})),
        # Prefixes that are prefixes of each other: a-0- is not a WAL of a- (F-1 notes).
        CaseDef("names-nested-prefix-outer", store({
            wal(1, 1, prefix="a-"): add("outer", b"a-"),
            wal(1, 1, prefix="a-0-"): add("inner", b"a-0-"),
        }, dline("outer-dead"), prefix="a-") | {dead_data_name("a-0-"): dline("inner-dead")},
            prefix="a-"),
        CaseDef("names-nested-prefix-inner", store({
            wal(1, 1, prefix="a-"): add("outer", b"a-"),
            wal(1, 1, prefix="a-0-"): add("inner", b"a-0-"),
        }, dline("outer-dead"), prefix="a-") | {dead_data_name("a-0-"): dline("inner-dead")},
            prefix="a-0-"),
        CaseDef("names-non-ascii-prefix", store(
            {wal(7, 7, prefix="w\u00f6rk-\u4e2d-"): add("t\u00e4sk", "k\u00e4se".encode())},
            dline("t\u00e4sk"), prefix="w\u00f6rk-\u4e2d-"), prefix="w\u00f6rk-\u4e2d-"),
    ]


def leftover_cases() -> list[CaseDef]:
    records = dline("a") + dline("b") + dline("c")
    return [
        # S-5: a crash before the rename leaves a staging file nobody reads.
        CaseDef("compaction-staging-file-left", store(
            {wal(): add("t", b"t")}, records) | {dead_tmp_name(P): dline("a")}),
        # S-9: a crash between the rename and the directory fsync leaves the mark set.
        CaseDef("compaction-mark-set", store({wal(): marker()}, dline("b"), lock=b"\0")),
        CaseDef("compaction-mark-and-staging", store(
            {}, dline("a") + dline("c"), lock=b"\0") | {dead_tmp_name(P): dline("c")}),
        CaseDef("dead-data-file-missing", store({}, None) | {dead_tmp_name(P): records}),
        CaseDef("dead-lock-file-missing", store({wal(): add("t")}, records, lock=None)),
    ]


def wal_recovery_cases() -> list[CaseDef]:
    good = add("a", b"a") + add("b", b"b")
    good_dead = dline("d1")
    hdr = [
        add("x", b"x")[:8].upper() + add("x", b"x")[8:],  # uppercase hex CRC, else valid
        b"zzzzzzzz:add:x:0:\n",
        add("x", b"x")[:8] + b";" + add("x", b"x")[9:],  # byte 8 is not ':'
        b"1234567\n",  # shorter than 9 bytes
        b"\n",  # the empty line
        b"12345678\n",  # 8 hex digits and nothing else
    ]
    bodies = [
        b"upd:x:0:", b"ADD:x:0:", b"add:x:0", b"add:x", b"add::0:", b"add:x:00:",
        b"add:x:0123:", b"add:x:123456789012345678901:", b"add:x:-1:", b"add:x:+1:",
        b"add:x: 1:", b"add:x:0:aGVsbG9=", b"add:x:0:aGVsbG8", b"add:x:0:aGVs bG8=",
        b"add:x:0:aGVs:bG8=", b"add:x:0:aGVsbG8=\r", b"add:" + b"i" * 257 + b":0:",
        b"add:\xff\xfe:0:", b"add:\xed\xa0\x80:0:", b"rem:", b"rem:a:b", b"rem",
        b"dead_task:a:{}", b"", b"add:x:0:-_-_",
    ]
    torn = add("c", b"c")
    return [
        CaseDef("wal-r-b-bad-header", one_wal(add("pre") + b"".join(hdr) + good),
                wal_damage={"R-@B": len(hdr)}),
        CaseDef("wal-r-c-crc-mismatch", one_wal(
            add("a", b"a") + bad_crc(add("b", b"b")) + bad_crc(rem("a"))
            + b"00000000:" + add("c", b"c")[9:]),
            wal_damage={"R-@C": 3}),
        CaseDef("wal-r-d-body-does-not-parse", one_wal(
            add("keep", b"k") + b"".join(frame(b) for b in bodies)),
            wal_damage={"R-@D": len(bodies)}),
        # A reader that splits on CRLF or strips CR changes the body: CR is body (F-2).
        CaseDef("wal-r-c-crlf-line-ends", one_wal(
            add("a") + add("b")[:-1] + b"\r\n" + add("c")), wal_damage={"R-@C": 1}),
        CaseDef("wal-r-f-torn-tail", one_wal(good + torn[:-1]), wal_damage={"R-@F": 1}),
        CaseDef("wal-r-f-torn-tail-before-reserved-space", one_wal(
            good + torn[:20] + b"\0" * 300), wal_damage={"R-@F": 1}),
        CaseDef("wal-r-f-only-a-torn-tail", one_wal(torn[:-1]), wal_damage={"R-@F": 1}),
        CaseDef("wal-r-i-remove-of-absent-id", one_wal(
            marker() + rem("ghost") + add("a") + rem("a") + rem("a"))),
        CaseDef("wal-r-j-readd-keeps-place", one_wal(
            add("a", b"1") + add("b", b"2") + add("a", b"3", T0) + add("c") + add("b", b"5"))),
        CaseDef("wal-r-k-zero-hole-before-record", one_wal(
            add("a", b"a") + b"\0" * 64 + add("b", b"b") + add("c")),
            wal_damage={"R-@K": 1}),
        CaseDef("wal-r-k-zero-hole-before-damage", one_wal(
            b"\0" * 10 + bad_crc(add("a", b"a")) + b"\0\0" + frame(b"nope:x") + add("c")),
            wal_damage={"R-@K": 2, "R-@C": 1, "R-@D": 1}),
        CaseDef("wal-r-k-line-of-zeros-only", one_wal(
            add("a") + b"\0" * 40 + b"\n" + add("b")), wal_damage={"R-@K": 1}),
        CaseDef("wal-r-k-torn-record-then-hole", one_wal(
            add("a") + add("b", b"bb")[:15] + b"\0" * 5 + add("c")),
            wal_damage={"R-@K": 1}),
        CaseDef("wal-r-k-garbage-before-record", one_wal(
            add("a") + b"#garbage" + add("b") + add("c")), wal_damage={"R-@B": 1}),
        CaseDef("wal-r-l-reserved-space", one_wal(good + b"\0" * 4096)),
        CaseDef("wal-r-l-all-reserved", one_wal(b"\0" * 256)),
        CaseDef("wal-r-l-hole-and-reserved", one_wal(
            add("a") + b"\0" * 7 + add("b") + b"\0" * 100), wal_damage={"R-@K": 1}),
        CaseDef("wal-several-kinds-of-damage-in-several-files", store({
            wal(1, 1): add("a") + bad_crc(add("b")) + add("c")[:-1],
            wal(2, 2): b"\0" * 3 + add("d") + b"xx\n" + rem("c") + b"\0" * 9,
        }, good_dead), wal_damage={"R-@C": 1, "R-@F": 1, "R-@K": 1, "R-@B": 1}),
    ]


def dead_recovery_cases() -> list[CaseDef]:
    a, b = dline("a", attempts=1), dline("b", attempts=2)
    bodies = [b"dead_task:", b"dead_task:x", b"dead_task::{}", b"add:x:0:",
              b"dead_task:" + b"i" * 257 + b":{}", b"dead_task:\xff:{}", b"DEAD_TASK:x:{}", b""]
    bad = {
        "not-json": b"{not json",
        "empty": b"",
        "array": b"[]",
        "trailing-garbage": compact_json(payload_with("trailing-garbage")) + b"x",
        "duplicate-key": compact_json(payload_with("duplicate-key"))[:-1] + b',"id":"x"}',
        "missing-key": compact_json({k: v for k, v in payload_with("missing-key").items()
                                     if k != "backtrace"}),
        "extra-key": compact_json(payload_with("extra-key", extra=1)),
        "attempts-true": compact_json(payload_with("attempts-true", attempts=True)),
        "attempts-float": compact_json(payload_with("attempts-float")).replace(
            b'"attempts":21', b'"attempts":21.0'),
        "attempts-exponent": compact_json(payload_with("attempts-exponent")).replace(
            b'"attempts":21', b'"attempts":2e1'),
        "attempts-negative": compact_json(payload_with("attempts-negative", attempts=-1)),
        "attempts-string": compact_json(payload_with("attempts-string", attempts="21")),
        "id-mismatch": compact_json(payload_with("id-mismatch", id="other")),
        "context-not-canonical": compact_json(payload_with("context-not-canonical",
                                                           context="aGVsbG9=")),
        "context-unpadded": compact_json(payload_with("context-unpadded", context="aGVsbG8")),
        "task-class-empty": compact_json(payload_with("task-class-empty", task_class="")),
        "backtrace-not-strings": compact_json(payload_with("backtrace-not-strings",
                                                           backtrace=["a", 1])),
        "backtrace-string": compact_json(payload_with("backtrace-string", backtrace="a")),
        "invalid-utf8": compact_json(payload_with("invalid-utf8")).replace(
            b"card declined", b"card \xff declined"),
        # F-31 to F-33: the bytes, the JSON dialect, the strings.
        "bom": b"\xef\xbb\xbf" + compact_json(payload_with("bom")),
        "attempts-minus-zero": compact_json(payload_with("attempts-minus-zero")).replace(
            b'"attempts":21', b'"attempts":-0'),
        "encoded-surrogate": compact_json(payload_with("encoded-surrogate")).replace(
            b"card declined", b"card \xed\xa0\x80 declined"),
        "lone-high-surrogate": compact_json(payload_with("lone-high-surrogate")).replace(
            b"card declined", b"card \\ud83d declined"),
        "lone-low-surrogate-frame": compact_json(payload_with("lone-low-surrogate-frame")).replace(
            b"in perform", b"in \\ude00perform"),
        "reversed-surrogate-pair": compact_json(payload_with("reversed-surrogate-pair")).replace(
            b"card declined", b"card \\ude00\\ud83d declined"),
        "raw-control-character": compact_json(payload_with("raw-control-character")).replace(
            b"card declined", b"card\tdeclined"),
    }
    bad["reordered-keys"] = compact_json(dict(reversed(payload_with("reordered-keys").items())))
    reordered = json.loads(bad["reordered-keys"])
    assert list(reordered)[0] == "context"
    g_lines = b"".join(dead_payload(k, v) for k, v in bad.items())
    return [
        CaseDef("dead-r-b-bad-header", store({}, a + b"ZZZZZZZZ:dead_task:q:{}\n" + b"x\n" + b"\n"
                                             + a[:8].upper() + a[8:] + b),
                dead_damage={"R-@B": 4}),
        CaseDef("dead-r-c-crc-mismatch", store({}, a + bad_crc(dline("c")) + b),
                dead_damage={"R-@C": 1}),
        CaseDef("dead-r-d-body-does-not-parse", store(
            {}, a + b"".join(frame(x) for x in bodies) + b), dead_damage={"R-@D": len(bodies)}),
        CaseDef("dead-r-f-torn-tail", store({}, a + b[:-1]), dead_damage={"R-@F": 1}),
        # The dead-task files are never reserved ahead: trailing zeros are a torn tail (R-@F).
        CaseDef("dead-r-f-zero-fill", store({}, a + b + b"\0" * 512), dead_damage={"R-@F": 1}),
        CaseDef("dead-r-g-payload-does-not-decode", store({}, a + g_lines + b),
                dead_damage={"R-@G": len(bad)}),
        # R-@G hides older records; an undecodable record that is not the latest is not read.
        CaseDef("dead-r-g-latest-record-decides", store({}, (
            dline("hidden") + dead_payload("hidden", b"{}") + dead_payload("revived", b"{}")
            + dline("revived", attempts=3))), dead_damage={"R-@G": 1}),
        # R-@H is checked before R-@G (recovery.md step 6): records superseded by a later
        # record of the same id are never decoded, so they are never R-@G, and R-@G counts
        # ids (each id's latest record), not undecodable lines.
        CaseDef("dead-r-h-before-r-g-superseded-bad-records", store({}, (
            dead_payload("fixed", b"{}") + dead_payload("fixed", b"[]")
            + dead_payload("broken", b"{}") + dead_payload("fixed", b"1")
            + dline("fixed", attempts=4) + dead_payload("broken", b"[]")
            + dead_payload("broken", b"null"))), dead_damage={"R-@G": 1}),
        # A damaged line (no valid frame) never supersedes: the undecodable record before it
        # is still the latest record of its id.
        CaseDef("dead-r-h-before-r-g-damaged-line-does-not-supersede", store({}, (
            dline("k", attempts=1) + dead_payload("k", b"{}") + bad_crc(dline("k", attempts=2)))),
            dead_damage={"R-@G": 1, "R-@C": 1}),
        CaseDef("dead-r-h-latest-wins-once", store({}, (
            dline("x", attempts=1) + dline("y", attempts=1) + dline("x", attempts=2)
            + dline("z", attempts=1) + dline("y", attempts=2) + dline("x", attempts=3)))),
        CaseDef("dead-r-h-damaged-latest-does-not-hide", store({}, (
            dline("x", attempts=1) + bad_crc(dline("x", attempts=2))
            + dline("x", attempts=3)[:-1])), dead_damage={"R-@C": 1, "R-@F": 1}),
        CaseDef("dead-r-k-zero-hole-before-record", store(
            {}, a + b"\0" * 100 + b + b"\0\0\n" + b"\0" + bad_crc(dline("c"))),
            dead_damage={"R-@K": 3, "R-@C": 1}),
    ]


def field_cases() -> list[CaseDef]:
    id_256 = "i" * 256
    id_256_utf8 = "\U0001f600" * 64  # 64 four-byte characters: 256 bytes, 128 UTF-16 units
    id_odd = "\t \x01\x7f\"\\/{}[],=+%\u00e9\u4e2d"
    all_bytes = bytes(range(256))
    wal_data = (
        add(id_256, b"longest ascii id") + add(id_256_utf8, b"longest utf-8 id")
        + add("x", b"") + add(id_odd, all_bytes) + add("-", "gr\u00fc\u00df \U0001f600".encode())
        + add("p1", b"p", 1) + add("p-2^63-1", b"p", 2**63 - 1)
        + add("p-2^53+1", b"p", 2**53 + 1) + add("ctx-3", b"\x00\x00\x00")
        + add("carriage\rreturn", b"CR is allowed in an id (F-5 forbids only ':', LF, NUL)")
        + add("ctx-1", b"\xff") + add("ctx-2", b"\xff\xfe")
    )
    dead_data = (
        dline(id_256) + dline(id_256_utf8) + dline(id_odd, context=all_bytes)
        + dline("zero", attempts=0, enqueued_at=0, failed_at=0, backtrace=(),
                exception_message="", exception_class="", context=b"")
        + dline("large", attempts=2**63 - 1, enqueued_at=2**53 + 1, failed_at=2**63 - 1)
        + dline("non-ascii", task_class="Zahlung\u20ac\u4e2d", exception_class="m\u00f6d.\u00c4rger",
                exception_message="gr\u00fc\u00df \U0001f600 \"q\" \\ \n\t\x00\x1f\u2028",
                backtrace=("app/\u00e4.py:1:in f\u00fc", "b:2:in \U0001f600"))
        + dline("no-traceback", backtrace=())
    )
    # F-11 says when a payload decodes, not that it must be F-10's exact bytes.
    accepted = [
        ("spaces", json.dumps(payload_with("spaces"), separators=(" , ", " : ")).encode()),
        ("raw-utf8", json.dumps(payload_with("raw-utf8", exception_message="gr\u00fc\u00df \U0001f600"),
                                ensure_ascii=False).encode()),
        ("escaped", compact_json(payload_with("escaped")).replace(
            b'{"id":"escaped"', b'{"\\u0069d":"\\u0065scaped"').replace(b"/", b"\\/")),
        ("whitespace-around", b" \t" + compact_json(payload_with("whitespace-around")) + b"\t "),
        # F-33: an escaped pair is one character; F-30's writer output is plain backslash text.
        ("surrogate-pair", compact_json(payload_with("surrogate-pair")).replace(
            b"card declined", b"card \\ud83d\\ude00 \\u00E9 declined")),
        ("escaped-lone-surrogate", compact_json(payload_with(
            "escaped-lone-surrogate", exception_message="card \\ud800 declined"))),
        ("carriage-return-whitespace", compact_json(payload_with(
            "carriage-return-whitespace")).replace(b'{"id"', b'{\r"id"')),
    ]
    queue_context = (b'{"v":1,"task":"billing.Charge","args":[42],"kwargs":{},"attempts":3,'
                     b'"enqueued_at":%d,"meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736'
                     b'-00f067aa0ba902b7-01"}}' % (T0 - 120))
    chain_trace = ("app/tasks.py:12:in perform", "app/billing.py:88:in charge",
                   "[cause] KeyError: 'card'", "app/billing.py:80:in charge",
                   "app/store.py:7:in lookup",
                   "[context] ConnectionError: reset", "app/store.py:5:in lookup")
    return [
        CaseDef("fields-edge-values", one_wal(wal_data, dead_data)),
        # Inside F-6's grammar (up to 20 digits) but past 2**63 - 1 (F-19): the WAL adds do not
        # parse (R-@D) and the dead records do not decode (R-@G); 2**63 - 1 itself is read
        # (fields-edge-values).
        CaseDef("fields-integers-beyond-64-bits", one_wal(
            frame(b"add:p-max-20-digits:99999999999999999999:cA==")
            + frame(b"add:p-2^64:%d:cA==" % 2**64) + frame(b"add:p-2^63:%d:cA==" % 2**63)
            + add("kept", b"p", 2**63 - 1),
            dead_payload("beyond", compact_json(payload_with("beyond", attempts=2**64)))
            + dead_payload("t-2^63", compact_json(payload_with("t-2^63", failed_at=2**63)))
            + dead_payload("e-10^30", compact_json(payload_with("e-10^30", enqueued_at=10**30)))
            + dline("kept", attempts=2**63 - 1)),
            wal_damage={"R-@D": 3}, dead_damage={"R-@G": 3}),
        CaseDef("dead-f11-payloads-that-decode", store({}, b"".join(
            dead_payload(name, payload) for name, payload in accepted))),
        # Spec 1.1 in records whose layout is unchanged: a queue's context with enqueued_at
        # and meta, a dead record whose enqueued_at is that time (F-17), before
        # its failed_at, and whose backtrace carries the exception chain (F-18); ids with
        # seeds of 13 and 19 digits (W-28).
        CaseDef("fields-spec-1-1-records", one_wal(
            add("1000000000000-1-1", queue_context) + add(f"{2**62 + 1}-1-1", queue_context)
            + add(f"{2**63 - 1}-x", b"", 2**63 - 1),
            dline("1000000000000-1-2", enqueued_at=T0 - 120, failed_at=T0, context=queue_context,
                  backtrace=chain_trace))),
        CaseDef("fields-context-64k", one_wal(
            add("big", bytes((i * 7919) % 251 for i in range(65536))),
            dline("big", context=bytes((i * 31) % 256 for i in range(65536))))),
    ]


def big_cases() -> list[CaseDef]:
    """Cases that would not fit the corpus as files: generated.json holds them as segments."""
    context = b"\xab\xcd\xef" * (CONTEXT_BYTES_MAX // 3) + b"\xab"  # exactly 4 MiB
    assert len(context) == CONTEXT_BYTES_MAX
    euro, grin = "\u20ac", "\U0001f600"
    at_limits = dline(
        "limits", task_class=euro * 341 + "a",  # 1024 UTF-8 bytes, 342 characters
        exception_class="E" * 1024,
        # 65,536 characters, 65,537 UTF-16 code units: the limit counts characters.
        exception_message=euro * 65535 + grin,
        backtrace=tuple(f"{n:02d}" + "x" * 4094 for n in range(20)))
    over = [
        dline("over-ok", exception_message="m"),
        dead_payload("task-class-1025-bytes", compact_json(payload_with(
            "task-class-1025-bytes", task_class=euro * 341 + "ab"))),
        dead_payload("exception-class-1025", compact_json(payload_with(
            "exception-class-1025", exception_class="E" * 1025))),
        dead_payload("message-65537", compact_json(payload_with(
            "message-65537", exception_message="m" * 65537))),
        dead_payload("backtrace-21-frames", compact_json(payload_with(
            "backtrace-21-frames", backtrace=["f"] * 21))),
        dead_payload("frame-4097", compact_json(payload_with(
            "frame-4097", backtrace=["f" * 4097]))),
        dead_payload("context-4mib-plus-1", compact_json(payload_with(
            "context-4mib-plus-1",
            context=base64.b64encode(context + b"\xcd").decode("ascii")))),
    ]
    overlong = b"=" * (LINE_BYTES_MAX + 1) + b"\n"  # one byte past the limit (R-@E)
    at_limit_garbage = b"=" * LINE_BYTES_MAX + b"\n"  # exactly the limit: judged (R-@B)
    # R-@K before R-@E: a hole is cut off first, then the rest is over-long all the same.
    overlong_nul = b"\0" * 10 + b"=" * LINE_BYTES_MAX + add("hidden")
    hole = b"\0" * (LINE_BYTES_MAX + 100)  # a zero-filled hole longer than a line may be
    units = (b"q83v", b"\\u20ac", b"x", b"E", b"m", b"=", b"\0")
    return [
        CaseDef("big-context-at-limit", one_wal(
            add("ctx-4mib", context, T0), dline("ctx-4mib", context=context)),
            generated_units=units),
        CaseDef("big-dead-fields-at-limits", store({}, at_limits + b"".join(over)),
                dead_damage={"R-@G": len(over) - 1}, generated_units=units),
        CaseDef("big-wal-r-e-overlong-line", one_wal(
            add("a") + overlong + add("b") + at_limit_garbage + overlong_nul + add("c")),
            wal_damage={"R-@E": 2, "R-@B": 1, "R-@K": 1}, generated_units=units),
        # The record after a hole of more than 8 MiB is kept (R-@K before R-@E; D-5, D-7).
        CaseDef("big-wal-r-k-hole-over-the-line-limit", one_wal(add("a") + hole + add("kept")),
                wal_damage={"R-@K": 1}, generated_units=units),
        CaseDef("big-dead-r-k-hole-over-the-line-limit", store(
            {}, dline("a") + hole + dline("kept")), dead_damage={"R-@K": 1},
            generated_units=units),
        # An over-long torn tail is a torn tail (step 1 before step 2).
        CaseDef("big-dead-r-e-overlong-line-and-torn-tail", store(
            {}, dline("a") + overlong + dline("b") + b"=" * (LINE_BYTES_MAX + 5)),
            dead_damage={"R-@E": 1, "R-@F": 1}, generated_units=units),
    ]


CASE_GROUPS: tuple[Callable[[], list[CaseDef]], ...] = (
    clean_cases, multi_wal_cases, name_cases, leftover_cases, wal_recovery_cases,
    dead_recovery_cases, field_cases, big_cases)


# ----------------------------------------------------------------------------- writing


def segments(data: bytes, units: tuple[bytes, ...]) -> list[dict[str, str | int]]:
    """``data`` as generated.json segments: literal runs, and runs of a unit folded."""
    min_run = 256
    out: list[dict[str, str | int]] = []
    pos = 0
    while pos < len(data):
        starts = [(data.find(u * min_run, pos), u) for u in units]
        found = [(s, u) for s, u in starts if s >= 0]
        if not found:
            out.append({"base64": base64.b64encode(data[pos:]).decode("ascii")})
            break
        start, unit = min(found, key=lambda f: (f[0], -len(f[1])))
        if start > pos:
            out.append({"base64": base64.b64encode(data[pos:start]).decode("ascii")})
        end = start
        while data.startswith(unit, end):
            end += len(unit)
        out.append({"base64": base64.b64encode(unit).decode("ascii"),
                    "repeat": (end - start) // len(unit)})
        pos = end
    return out


def expected_text(expected: Json) -> bytes:
    return (json.dumps(expected, ensure_ascii=True, sort_keys=True, indent=1) + "\n").encode()


def reference_report(directory: Path, prefix: str) -> Json:
    done = subprocess.run([sys.executable, str(REFERENCE_READER), str(directory), prefix],
                          capture_output=True, check=True)
    found: Json = json.loads(done.stdout)
    return found


def write_case(case: CaseDef, out: Path, check_reference: bool) -> None:
    target = out / case.name
    target.mkdir()
    if case.generated_units:
        spec: dict[str, list[dict[str, str | int]]] = {
            name: segments(data, case.generated_units) for name, data in sorted(case.files.items())}
    else:
        for name, data in case.files.items():
            (target / name).write_bytes(data)
    with tempfile.TemporaryDirectory(prefix="deferq-corpus-") as scratch:
        directory = Path(scratch) / case.name
        directory.mkdir()
        for name, data in case.files.items():
            (directory / name).write_bytes(data)
        expected = deferq_read(str(directory), case.prefix)
        assert isinstance(expected, dict)
        intended: Json = {"wal": dict(case.wal_damage), "dead": dict(case.dead_damage)}
        if expected["damage"] != intended:
            raise SystemExit(f"{case.name}: deferq reports damage {expected['damage']}, "
                             f"the case is built to show {intended}")
        if check_reference:
            found = differences(expected, reference_report(directory, case.prefix))
            if found:
                raise SystemExit(f"{case.name}: the reference reader disagrees with deferq:\n" +
                                 "\n".join(f"  {d.path}: deferq {shown(d.expected)}, reference "
                                           f"{shown(d.got)}" for d in found[:20]))
    text = expected_text(expected)
    if case.generated_units:
        spec[EXPECTED] = segments(text, tuple(base64.b64encode(u) for u in case.generated_units)
                                  + case.generated_units)
        (target / GENERATED).write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
        with tempfile.TemporaryDirectory(prefix="deferq-corpus-") as scratch:
            again = materialize(Case(case.name, target), Path(scratch))
        assert again == expected, "generated.json does not give back the case"
    else:
        (target / EXPECTED).write_bytes(text)


def build(out: Path, check_reference: bool = True) -> list[str]:
    """Write every case into ``out`` (replacing a previous corpus there); return their names."""
    if out.exists():
        strays = [p for p in out.iterdir()
                  if not ((p / EXPECTED).is_file() or (p / GENERATED).is_file())]
        if strays:
            raise SystemExit(f"{out} holds something that is not a corpus case: {strays[0]}")
    # Built beside the old corpus and swapped in at the end: a failed build (a case whose
    # readers disagree) leaves the previous corpus whole, never half a case.
    building = out.with_name(out.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    names = []
    try:
        for group in CASE_GROUPS:
            for case in group():
                write_case(case, building, check_reference)
                names.append(case.name)
        if len(set(names)) != len(names):
            raise SystemExit("two cases share a name")
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    building.rename(out)
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=default_corpus(),
                        help="corpus directory (default: deferq.conformance's package data)")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the check against the reference reader")
    args = parser.parse_args(argv)
    names = build(args.out, check_reference=not args.no_reference)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"build_corpus: cases={len(names)} bytes={size} out={args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
