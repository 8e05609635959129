"""The real filesystem: requirements, a fresh ext4 image, loop mounts and the power cut.

Rules: every mount happens inside a private mount namespace (``unshare -m
--propagation private``), so nothing leaks into the host's mount table even if
the harness dies; images are mounted with ``mount -o loop``, whose loop device
is auto-cleared when the filesystem is unmounted, and ``Image.close`` still
unmounts, detaches any loop device left on the image and deletes the image.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Final

EXT4_IOC_SHUTDOWN: Final = 0x8004587D  # _IOR('X', 125, __u32); the same number as XFS_IOC_GOINGDOWN
SHUTDOWN_NOLOGFLUSH: Final = 2  # flush neither data nor journal: a power cut
NAMESPACE_ENV: Final = "DEFERQ_POWER_NAMESPACE"
IMAGE_MIB: Final = 512  # sparse: only what the run writes uses host disk
TOOLS: Final = ("mkfs.ext4", "mount", "umount", "losetup", "unshare")


@dataclass(frozen=True, slots=True)
class Requirements:
    """What a power test needs from the machine (all are checked before anything runs)."""

    root: bool
    loop_devices: bool
    tools_missing: tuple[str, ...]


def probe_requirements() -> Requirements:
    loops = os.path.exists("/dev/loop-control") or any(
        os.path.exists(f"/dev/loop{n}") for n in range(8))
    return Requirements(root=os.geteuid() == 0, loop_devices=loops,
                        tools_missing=tuple(t for t in TOOLS if shutil.which(t) is None))


def missing_requirements() -> str | None:
    """A message naming what is missing, or None when the machine has everything."""
    req = probe_requirements()
    problems = []
    if not req.root:
        problems.append("root (mounting a loop device needs CAP_SYS_ADMIN; run as root)")
    if not req.loop_devices:
        problems.append("loop devices (/dev/loop-control or /dev/loop0-7)")
    if req.tools_missing:
        problems.append("the tools " + ", ".join(req.tools_missing)
                        + " (e2fsprogs, util-linux, mount)")
    if not problems:
        return None
    return "power-test needs " + "; ".join(problems)


def in_private_namespace() -> bool:
    return os.environ.get(NAMESPACE_ENV) == "1"


def namespace_command(argv: list[str]) -> list[str]:
    """``argv`` run in a new private mount namespace (the harness re-executes itself)."""
    return ["unshare", "-m", "--propagation", "private", "--", *argv]


def _run(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise MountError(f"{' '.join(cmd)} failed ({result.returncode}): "
                         f"{(result.stderr or result.stdout).strip()}")


class MountError(RuntimeError):
    """mkfs, mount or umount failed (for example: no CAP_SYS_ADMIN in a container)."""


class Image:
    """A fresh ext4 image under a temporary directory, mounted at ``mountpoint``."""

    def __init__(self, fs: str = "ext4", size_mib: int = IMAGE_MIB) -> None:
        if fs != "ext4":
            raise ValueError(f"unsupported filesystem {fs!r}: only ext4 has been validated")
        self.fs = fs
        self.workdir = tempfile.mkdtemp(prefix="deferq-power-")
        self.image = os.path.join(self.workdir, "fs.img")
        self.mountpoint = os.path.join(self.workdir, "mnt")
        self.mounted = False
        try:
            os.mkdir(self.mountpoint)
            with open(self.image, "wb") as f:
                f.truncate(size_mib * 1024 * 1024)
            _run(["mkfs.ext4", "-q", "-F", self.image])
            self.mount()
        except BaseException:
            self.close()
            raise

    def mount(self) -> None:
        """Mount the image (a remount replays the journal, as after a reboot)."""
        _run(["mount", "-t", self.fs, "-o", "loop", self.image, self.mountpoint])
        self.mounted = True

    def unmount(self) -> None:
        if self.mounted:
            _run(["umount", self.mountpoint])
            self.mounted = False

    def power_cut(self) -> None:
        """Shut the filesystem down without flushing data or journal: every later I/O fails."""
        fd = os.open(self.mountpoint, os.O_RDONLY)
        try:
            fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, struct.pack("I", SHUTDOWN_NOLOGFLUSH))
        finally:
            os.close(fd)

    def remount(self) -> None:
        self.unmount()
        self.mount()

    def close(self) -> None:
        """Unmount, detach every loop device still on the image, delete everything."""
        try:
            if self.mounted:
                try:
                    self.unmount()
                except MountError:
                    subprocess.run(["umount", "-l", self.mountpoint], capture_output=True,
                                   check=False)
                    self.mounted = False
        finally:
            for dev in loop_devices_of(self.image):
                subprocess.run(["losetup", "-d", dev], capture_output=True, check=False)
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Image:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def loop_devices_of(image: str) -> list[str]:
    """The loop devices backed by ``image`` (``losetup -j``)."""
    if shutil.which("losetup") is None:
        return []
    result = subprocess.run(["losetup", "-j", image], capture_output=True, text=True, check=False)
    return [line.split(":", 1)[0] for line in result.stdout.splitlines() if ":" in line]
