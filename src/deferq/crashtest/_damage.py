"""Damage at rest (A-9): direct actions on a simulated disk's durable bytes, outside any process."""

from __future__ import annotations

from deferq.crashtest._simdisk import SimDisk


def flip_bit(disk: SimDisk, path: str, bit_index: int) -> None:
    """Flip one bit of a file at rest (bit 0 is the lowest bit of byte 0)."""
    offset, bit = divmod(bit_index, 8)
    current = disk.read_durable(path)
    if not 0 <= offset < len(current):
        raise ValueError(f"bit {bit_index} is outside the {len(current)} durable bytes of {path}")
    disk.damage_at_rest(path, offset, bytes([current[offset] ^ (1 << bit)]))


def zero_sector(disk: SimDisk, path: str, sector_index: int, sector_bytes: int = 512) -> None:
    """Zero one sector of a file at rest (clipped to the file's durable size)."""
    size = len(disk.read_durable(path))
    start = sector_index * sector_bytes
    if not 0 <= start < size:
        raise ValueError(f"sector {sector_index} is outside the {size} durable bytes of {path}")
    disk.damage_at_rest(path, start, bytes(min(sector_bytes, size - start)))
