"""Configuration: ``Config.backend`` as in the reference, and nothing more (spec/api.md, C-1..C-6).

Rules: the setter validates at once, so a bad configuration fails where it is
written, with a ``ValueError`` naming what is wrong and what is supported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from deferq._core.limits import DEFAULT_FSYNC_FREQUENCY_S, DEFAULT_PATH, DEFAULT_PREFIX
from deferq.backends import Disk, Nil
from deferq.backends._options import check_fsync_frequency, check_path, check_prefix

_SUPPORTED_OPTIONS = ("path", "prefix", "fsync_frequency")


@dataclass(frozen=True, slots=True, kw_only=True)
class DiskOptions:
    """The validated options of the Disk backend."""

    path: str = DEFAULT_PATH
    prefix: str = DEFAULT_PREFIX
    fsync_frequency: float = DEFAULT_FSYNC_FREQUENCY_S


def _parse(value: object) -> DiskOptions | None:
    if value is None:
        return None
    options: object = {}
    if isinstance(value, tuple):
        if len(value) != 2:
            raise ValueError("backend must be 'disk', ('disk', {options}) or None;"
                             f" got a tuple of {len(value)} items")
        value, options = value
    if value != "disk":
        raise ValueError(f"unsupported backend value {value!r}; supported values are 'disk' and None")
    if not isinstance(options, Mapping):
        raise ValueError(f"backend options must be a mapping, not {type(options).__name__}")
    unknown = sorted(str(k) for k in options if k not in _SUPPORTED_OPTIONS)
    if unknown:
        raise ValueError(f"unsupported backend option(s) {', '.join(map(repr, unknown))};"
                         f" supported options are 'path', 'prefix', 'fsync_frequency'")
    path, prefix, freq = (options.get(k) for k in _SUPPORTED_OPTIONS)
    return DiskOptions(
        path=DEFAULT_PATH if path is None else check_path(path),
        prefix=DEFAULT_PREFIX if prefix is None else check_prefix(prefix),
        fsync_frequency=DEFAULT_FSYNC_FREQUENCY_S if freq is None else check_fsync_frequency(freq),
    )


class Config:
    """deferq configuration.

    ``config.backend = "disk"`` (defaults), ``config.backend = "disk", {"path": ...,
    "prefix": ..., "fsync_frequency": ...}``, or ``config.backend = None`` (Nil).
    An option given as None takes its default. Never set: Disk with defaults.
    """

    def __init__(self) -> None:
        self._backend: DiskOptions | None = DiskOptions()
        self.configured = False

    @property
    def backend(self) -> DiskOptions | None:
        """The validated Disk options, or None for the Nil backend."""
        return self._backend

    @backend.setter
    def backend(self, value: object) -> None:
        self._backend = _parse(value)
        self.configured = True

    def build_backend(self) -> Disk | Nil:
        """A new backend instance (the queue builds one per process) (C-2)."""
        if self._backend is None:
            return Nil()
        return Disk(path=self._backend.path, prefix=self._backend.prefix,
                    fsync_frequency=self._backend.fsync_frequency)
