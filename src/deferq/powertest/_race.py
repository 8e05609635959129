"""Calibrate the power cut itself: can an fsync that returns 0 still lose its data?

Theory of operation. No deferq code runs here: a child appends numbered lines
to one file, fsyncing each and reporting over a pipe the CLOCK_MONOTONIC
moment each fsync returned; the parent cuts power (``Image.power_cut``) at a
random moment, remounts and compares. Run it as root in a private mount
namespace: ``unshare -m --propagation private python -m deferq.powertest._race 300``.

Finding (kernel 6.18, ext4 on a loop device): ``EXT4_IOC_SHUTDOWN`` with
NOLOGFLUSH takes a few milliseconds, and an fsync that overlaps it can return
0 although its data is lost after the remount. Every such fsync returned after
the ioctl began; none that returned before it was ever lost. So the harness
takes the start of the ioctl as the crash point and treats acknowledgements
that returned after it as in flight (docs/power-test.md).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time

from deferq.powertest._fs import Image


def main(argv: list[str]) -> int:
    cycles = int(argv[0]) if argv else 100
    lost_before = lost_after = acked_after = 0
    with Image() as image:
        for cycle in range(cycles):
            path = os.path.join(image.mountpoint, f"f{cycle}")
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                os.close(read_fd)
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                    os.fsync(fd)
                    directory = os.open(image.mountpoint, os.O_RDONLY)
                    os.fsync(directory)
                    n = 0
                    while True:
                        n += 1
                        os.write(fd, b"%08d" % n + b"x" * random.choice((30, 100, 1200)) + b"\n")
                        began = time.monotonic()
                        os.fsync(fd)
                        os.write(write_fd, b"%d %.6f %.6f\n" % (n, began, time.monotonic()))
                except OSError:
                    pass
                os._exit(0)
            os.close(write_fd)
            time.sleep(random.uniform(0.02, 0.1))
            cut = time.monotonic()
            image.power_cut()
            cut_end = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            data = b""
            while chunk := os.read(read_fd, 1 << 16):
                data += chunk
            os.close(read_fd)
            acks = [(int(n), float(b), float(t))
                    for n, b, t in (line.split() for line in data.splitlines())]
            image.remount()
            try:
                with open(path, "rb") as f:
                    lines = [line for line in f.read().split(b"\n") if line]
            except FileNotFoundError:
                lines = []  # the cut came before the child made the file durable
            present = int(lines[-1][:8]) if lines else 0
            for n, began, returned in acks:
                if returned >= cut:
                    acked_after += 1
                if n > present:
                    if returned < cut:
                        lost_before += 1
                    else:
                        lost_after += 1
                    print(f"cycle {cycle}: line {n} lost; its fsync began {began - cut:+.6f} s and "
                          f"returned {returned - cut:+.6f} s after the cut began (the ioctl took "
                          f"{cut_end - cut:.6f} s)", flush=True)
    print(f"race: cycles={cycles} acks_after_cut={acked_after} lost_after_cut={lost_after} "
          f"lost_before_cut={lost_before}")
    return 1 if lost_before else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
