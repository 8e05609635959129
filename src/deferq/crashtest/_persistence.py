"""Persistence models: which crash states a power loss may leave, and how to enumerate them.

Rules. A model looks only at a ``CrashInput`` (the durable image plus the log of
un-persisted operations, see ``_oplog``) and describes its crash states as
*dimensions*: independent choices, each a list of options, each option an outcome for
some logged operations. A crash state is one option per dimension, realized by
``_oplog.realize``. All three models share that one realizer, so every outcome
vocabulary is the same and ``weakest`` can be checked to contain the others.

What the simulated disk itself guarantees under every model (A-3, A-4): a successful
``fsync(fd)`` makes that file's data and size durable, but not its name; a successful
``fsync_dir(d)`` makes every create, rename, unlink and mkdir recorded in ``d`` durable.
A crash never loses those and never invents bytes nobody wrote, except where a model
below says "garbage".

weakest (``Weakest``): the weakest Linux file system behaviour we know of (A-5), a
superset of ALICE's APM. Each logged operation is independent. A write is lost, lands
whole, lands as a byte prefix torn at any byte, lands as a prefix followed by garbage up
to the end of the 512- or 4096-byte sector the tear falls in (never outside the write's
own range: powersafe overwrite holds), or lands "size only" (the file grows to cover it
but its bytes are holes). A truncate is lost or applied. The persisted data operations
of one file apply in program order: a newer write is never overwritten by an older one.
Holes, i.e. bytes beyond what survived of the durable image that no persisted write
covers, read as zeros or as garbage. Each namespace micro-operation is lost or applied
independently, so an unsynced create, unlink or mkdir may be lost, and
``rename(src, dst)`` is *not atomic*: afterwards ``dst`` may name the old inode, the
new one or nothing, and ``src`` may still name the inode or not (all six combinations:
both names gone, and both names present as a hard link, included);
``Weakest(atomic_rename=True)`` keeps each rename whole, which is exactly A-5 ("an
unsynced rename may be lost"). Forbidden: losing
what an fsync or fsync_dir made durable; garbage anywhere but holes and torn sectors;
an older write's bytes over a newer persisted write's bytes.

ext4_ordered (``Ext4Ordered``): ext4 with ``data=ordered`` and delayed allocation, as
seen on real power cuts of a loop-mounted ext4 (docs/power-test.md).
Namespace: whole user-level operations (rename is atomic) persist as a prefix of their
global order, and every operation before the last successful fsync or fsync_dir of
*any* file or directory is durable, because jbd2 commits the whole running transaction
(so, unlike weakest, a file fsync does persist an earlier create or rename). Data, per
file and independently of the namespace (delayed allocation decouples them; and jbd2
commits on its own every few seconds, so a size may be committed at any moment): with the
file's un-fsynced data operations o1..om, pick q <= p; o1..oq land whole and o(q+1)..op
land as metadata only (truncates cut, writes grow the size and read as zeros). So the
file keeps its durable bytes, or a prefix of its writes, or a committed size whose new
bytes read as zeros (an appended tail comes back as zeros), and a file created or
renamed without an fsync of its data may come back zero-length. Writes are not torn
and nothing reads as garbage. Simplification: pages of one file are written back in
write order, and ``auto_da_alloc`` is not modelled (it is "not a guarantee").

prefix (``Prefix``): LazyFS-like, but stricter about names. The crash state applies
the first k operations of the un-persisted log, for some k, in program order: data
operations one by one (whole, never torn) and namespace operations as whole user-level
calls (rename atomic). Unlike LazyFS, an unsynced create or rename is *not* durable at
once; it is just one more operation in the prefix. Forbidden: any gap (a later
operation persisting while an earlier one is lost), tears, zeros or garbage.

Enumeration (``Bound``): when the product of the dimensions' primary options is at most
``exhaustive_max`` (4096 = every subset of 12 binary operations), every combination;
otherwise ALICE's set: every prefix, every prefix with one operation omitted (all
prefixes up to 64 dimensions, only the full one beyond), and every primary option of
every dimension in three contexts (earlier dimensions at most, later at least; all
others at most; all others at least). Secondary options (weakest's tears, damaged
sectors and size-only writes) are always taken one dimension at a time in two
contexts: after a prefix of the earlier dimensions, and with every other dimension at
most. Then ``random_states`` seeded random combinations of all options. States with
holes are yielded with zeros and, if the model allows garbage, again with garbage.
``complete=True`` instead takes the full product of every option (small logs only).
"""

from __future__ import annotations

import abc
import itertools
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from deferq.crashtest._oplog import (
    CrashInput,
    Damaged,
    DataOp,
    Fate,
    Fill,
    LinkOp,
    NameOp,
    Outcome,
    Plan,
    Torn,
    TruncateOp,
    UnlinkOp,
    WriteOp,
)

_OMISSION_PREFIXES_DIMENSIONS_MAX: Final = 64


@dataclass(frozen=True, slots=True)
class Option:
    """One way a dimension can turn out: outcomes for some logged operations."""

    label: str
    outcomes: tuple[tuple[int, Outcome], ...]


@dataclass(frozen=True, slots=True)
class Dimension:
    """An independent choice of a model; ``primary[0]`` persists least, ``primary[-1]`` most."""

    label: str
    primary: tuple[Option, ...]
    secondary: tuple[Option, ...] = ()

    @property
    def options(self) -> tuple[Option, ...]:
        return self.primary + self.secondary


@dataclass(frozen=True, slots=True, kw_only=True)
class Bound:
    """How many crash states ``SimDisk.crash_states`` explores (see the module docstring).

    Args:
        exhaustive_max: take every combination of primary options when there are at most
            this many (4096 = all subsets of 12 binary operations).
        random_states: seeded random combinations added after the structured ones.
        seed: seeds the random combinations and the garbage pattern.
        complete: take every combination of every option instead (tests on small logs).
        complete_max: refuse a complete enumeration larger than this.
    """

    exhaustive_max: int = 4096
    random_states: int = 64
    seed: int = 0
    complete: bool = False
    complete_max: int = 200_000

    def __post_init__(self) -> None:
        if self.exhaustive_max < 1 or self.random_states < 0 or self.complete_max < 1:
            raise ValueError(f"invalid bound {self!r}")


class PersistenceModel(abc.ABC):
    """A strategy: the crash states a power loss may leave from a ``CrashInput``."""

    name: str = "abstract"
    fills: tuple[Fill, ...] = (Fill.ZEROS,)
    secondary_probability: float = 0.0

    @abc.abstractmethod
    def dimensions(self, crash: CrashInput) -> list[Dimension]:
        """The model's independent choices for this log, in program order."""

    def plan(self, dims: Sequence[Dimension], choice: Sequence[int],
             fills: Mapping[int, Fill], garbage_seed: int) -> Plan:
        """The plan of one combination (an index into each dimension's ``options``)."""
        outcomes: dict[int, Outcome] = {}
        for dim, index in zip(dims, choice, strict=True):
            outcomes.update(dim.options[index].outcomes)
        return Plan(outcomes, dict(fills), garbage_seed)

    def random_choice(self, dims: Sequence[Dimension], rng: random.Random) -> tuple[int, ...]:
        """One random combination: primaries uniformly, secondaries with some probability."""
        out = []
        for dim in dims:
            if dim.secondary and rng.random() < self.secondary_probability:
                out.append(len(dim.primary) + rng.randrange(len(dim.secondary)))
            else:
                out.append(rng.randrange(len(dim.primary)))
        return tuple(out)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _binary(label: str, seq: int) -> Dimension:
    return Dimension(label, (Option(f"{label}=omit", ((seq, Fate.OMIT),)),
                             Option(f"{label}=apply", ((seq, Fate.APPLY),))))


class Weakest(PersistenceModel):
    """weakest: every operation independent, writes torn or damaged, non-atomic rename.

    Args:
        tears: offer torn writes and damaged sectors.
        size_only: offer writes that only grow the file (their bytes read as holes).
        garbage: let holes read as garbage (else only zeros).
        tear_head_bytes: tear at every byte among a write's first this many bytes.
        tear_points_max: at most this many tear points per write (sector boundaries
            beyond it are thinned evenly).
        sector_sizes: sector sizes for damaged-sector outcomes.
        atomic_rename: a rename's micro-operations persist all or none (A-5 exactly:
            an unsynced rename may be lost, never half done); the default splits them.
    """

    name = "weakest"
    secondary_probability = 0.15

    def __init__(self, *, tears: bool = True, size_only: bool = True, garbage: bool = True,
                 tear_head_bytes: int = 64, tear_points_max: int = 128,
                 sector_sizes: tuple[int, ...] = (512, 4096), atomic_rename: bool = False) -> None:
        if tear_head_bytes < 0 or tear_points_max < 1 or any(s < 1 for s in sector_sizes):
            raise ValueError("tear_head_bytes >= 0, tear_points_max >= 1, sectors >= 1")
        self.tears = tears
        self.size_only = size_only
        self.fills = (Fill.ZEROS, Fill.GARBAGE) if garbage else (Fill.ZEROS,)
        self.tear_head_bytes = tear_head_bytes
        self.tear_points_max = tear_points_max
        self.sector_sizes = sector_sizes
        self.atomic_rename = atomic_rename

    def __repr__(self) -> str:
        return (f"Weakest(tears={self.tears}, size_only={self.size_only}, "
                f"garbage={Fill.GARBAGE in self.fills}, atomic_rename={self.atomic_rename})")

    def tear_points(self, offset: int, length: int) -> list[int]:
        """Bytes kept by the torn variants of a write: the head bytes, the last, sectors."""
        points = set(range(1, min(length - 1, self.tear_head_bytes) + 1))
        if length > 1:
            points.add(length - 1)
        step = min(self.sector_sizes)
        boundaries = list(range((offset // step + 1) * step, offset + length, step))
        if len(boundaries) > self.tear_points_max:
            stride = -(-len(boundaries) // self.tear_points_max)
            boundaries = boundaries[::stride]
        points.update(b - offset for b in boundaries)
        return sorted(points)

    def _write_secondary(self, op: WriteOp, may_grow: bool) -> tuple[Option, ...]:
        label = f"w{op.seq}"
        out: list[Option] = []
        if self.size_only and may_grow:
            out.append(Option(f"{label}=size-only", ((op.seq, Fate.SIZE_ONLY),)))
        if not self.tears or not op.data:
            return tuple(out)
        points = self.tear_points(op.offset, len(op.data))
        out.extend(Option(f"{label}=torn({k})", ((op.seq, Torn(k)),)) for k in points)
        seen: set[tuple[int, int]] = set()
        for keep in [0, *points]:
            start = op.offset + keep
            for sector in self.sector_sizes:
                end = min(op.offset + len(op.data), (start // sector + 1) * sector)
                if end > start and (keep, end) not in seen:
                    seen.add((keep, end))
                    out.append(Option(f"{label}=damaged({keep},{end})",
                                      ((op.seq, Damaged(keep, end)),)))
        return tuple(out)

    def dimensions(self, crash: CrashInput) -> list[Dimension]:
        low_size = {ino: len(node.data) for ino, node in crash.inodes.items() if not node.is_dir}
        linkable = crash.linkable()
        groups = {g[0].group: g for g in crash.name_groups() if len(g) > 1}  # renames
        done: set[int] = set()
        dims: list[Dimension] = []
        for op in crash.ops:
            if isinstance(op, (WriteOp, TruncateOp)) and op.ino not in linkable:
                continue
            if isinstance(op, WriteOp):
                low = low_size.get(op.ino, 0)
                base = _binary(f"w{op.seq}", op.seq)
                secondary = self._write_secondary(op, op.offset + len(op.data) > low)
                dims.append(Dimension(base.label, base.primary, secondary))
            elif isinstance(op, TruncateOp):
                low_size[op.ino] = min(low_size.get(op.ino, 0), op.size)
                dims.append(_binary(f"t{op.seq}", op.seq))
            elif self.atomic_rename and op.group in groups:
                if op.group not in done:
                    done.add(op.group)
                    dims.append(_group_dimension(f"r{op.seq}", groups[op.group]))
            else:
                dims.append(_binary(f"{'l' if isinstance(op, LinkOp) else 'u'}{op.seq}", op.seq))
        return dims


def _group_dimension(label: str, group: Sequence[NameOp]) -> Dimension:
    """A user-level call whose micro-operations persist all or none."""
    return Dimension(label, (Option(f"{label}=omit", tuple((op.seq, Fate.OMIT) for op in group)),
                             Option(f"{label}=apply",
                                    tuple((op.seq, Fate.APPLY) for op in group))))


def _size_ops(ops: Sequence[DataOp], q: int, p: int) -> tuple[tuple[int, Outcome], ...]:
    """ext4's (q, p): ops[:q] whole, ops[q:p] metadata only, the rest lost."""
    out: list[tuple[int, Outcome]] = []
    for index, op in enumerate(ops):
        if index < q:
            out.append((op.seq, Fate.APPLY))
        elif index < p:
            out.append((op.seq, Fate.APPLY if isinstance(op, TruncateOp) else Fate.SIZE_ONLY))
        else:
            out.append((op.seq, Fate.OMIT))
    return tuple(out)


def _group_outcomes(groups: Sequence[Sequence[NameOp]], k: int) -> tuple[tuple[int, Outcome], ...]:
    return tuple((op.seq, Fate.APPLY if index < k else Fate.OMIT)
                 for index, group in enumerate(groups) for op in group)


class Ext4Ordered(PersistenceModel):
    """ext4_ordered: namespace journal prefix (commit at any fsync), per-file (q, p) data."""

    name = "ext4_ordered"

    def dimensions(self, crash: CrashInput) -> list[Dimension]:
        dims: list[tuple[int, Dimension]] = []
        groups = crash.name_groups()
        if groups:
            forced = sum(1 for g in groups if g[0].seq < crash.barrier_seq)
            options = tuple(Option(f"ns={k}/{len(groups)}", _group_outcomes(groups, k))
                            for k in range(forced, len(groups) + 1))
            dims.append((groups[0][0].seq, Dimension("ns", options)))
        linkable = crash.linkable()
        for ino, ops in crash.data_ops().items():
            if ino not in linkable:
                continue
            pairs = sorted(((q, p) for p in range(len(ops) + 1) for q in range(p + 1)),
                           key=lambda qp: (qp[0] + qp[1], qp[1]))
            options = tuple(Option(f"f{ino}=({q},{p})", _size_ops(ops, q, p)) for q, p in pairs)
            dims.append((ops[0].seq, Dimension(f"f{ino}", options)))
        dims.sort(key=lambda pair: pair[0])
        return [dim for _, dim in dims]


class Prefix(PersistenceModel):
    """prefix: the first k un-persisted operations in program order (renames whole)."""

    name = "prefix"

    def dimensions(self, crash: CrashInput) -> list[Dimension]:
        units: list[list[DataOp | NameOp]] = []
        group_index: dict[int, int] = {}
        linkable = crash.linkable()
        for op in crash.ops:
            if isinstance(op, (WriteOp, TruncateOp)) and op.ino not in linkable:
                continue
            if isinstance(op, (LinkOp, UnlinkOp)):
                if op.group in group_index:
                    units[group_index[op.group]].append(op)
                    continue
                group_index[op.group] = len(units)
            units.append([op])
        if not units:
            return []
        options = tuple(
            Option(f"prefix={k}/{len(units)}",
                   tuple((op.seq, Fate.APPLY if index < k else Fate.OMIT)
                         for index, unit in enumerate(units) for op in unit))
            for k in range(len(units) + 1))
        return [Dimension("prefix", options)]


MODELS: Final[Mapping[str, PersistenceModel]] = {
    "weakest": Weakest(),
    "ext4_ordered": Ext4Ordered(),
    "prefix": Prefix(),
}


def resolve_model(model: str | PersistenceModel) -> PersistenceModel:
    """A model object from a name in ``MODELS`` or the object itself."""
    if isinstance(model, PersistenceModel):
        return model
    try:
        return MODELS[model]
    except KeyError:
        raise ValueError(f"unknown persistence model {model!r}; known: {sorted(MODELS)}") from None


def _product_size(sizes: Sequence[int], cap: int) -> int:
    total = 1
    for size in sizes:
        total *= size
        if total > cap:
            return cap + 1
    return total


def choices(dims: Sequence[Dimension], bound: Bound, model: PersistenceModel,
            rng: random.Random) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Combinations to realize, each with the name of the set it comes from.

    May repeat a combination; the caller deduplicates realized images.
    """
    if bound.complete:
        sizes = [len(d.options) for d in dims]
        if _product_size(sizes, bound.complete_max) > bound.complete_max:
            raise ValueError(f"a complete enumeration would exceed {bound.complete_max} states")
        for combo in itertools.product(*(range(s) for s in sizes)):
            yield "complete", combo
        return
    n = len(dims)
    low = [0] * n
    high = [len(d.primary) - 1 for d in dims]

    def prefix(k: int) -> list[int]:
        return high[:k] + low[k:]

    if _product_size([len(d.primary) for d in dims], bound.exhaustive_max) <= bound.exhaustive_max:
        for combo in itertools.product(*(range(len(d.primary)) for d in dims)):
            yield "product", combo
    else:
        for k in range(n + 1):
            yield "prefix", tuple(prefix(k))
        for k in (range(1, n + 1) if n <= _OMISSION_PREFIXES_DIMENSIONS_MAX else (n,)):
            for j in range(k):
                omitted = prefix(k)
                omitted[j] = low[j]
                yield "omission", tuple(omitted)
        for i, dim in enumerate(dims):
            for option in range(len(dim.primary)):
                for base in (prefix(i), list(high), list(low)):
                    base[i] = option
                    yield "option", tuple(base)
    for i, dim in enumerate(dims):
        for option in range(len(dim.primary), len(dim.options)):
            for base in (prefix(i), list(high)):
                base[i] = option
                yield "split", tuple(base)
    for _ in range(bound.random_states):
        yield "random", model.random_choice(dims, rng)


def describe(dims: Sequence[Dimension], choice: Sequence[int]) -> str:
    """The options a combination picked, leaving out dimensions at their least."""
    picked = [dim.options[index].label for dim, index in zip(dims, choice, strict=True)
              if index != 0]
    return " ".join(picked) if picked else "nothing persisted"
