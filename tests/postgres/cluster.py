"""A throwaway PostgreSQL cluster for the tests: initdb, pg_ctl start, stop, immediate stop.

Goal: a real server, no mocks (issue 19), started once per pytest process (so each xdist
worker has its own cluster and nothing is shared between workers), reachable only over a
Unix socket in its own temporary directory, with ``fsync=on`` so that later crash tests
(``stop(mode="immediate")``, a SIGKILL of the postmaster) test what production runs.

PostgreSQL refuses to run as root: when the tests run as root (CI), every server command runs
as the unprivileged user ``nobody`` (``subprocess``'s ``user=``) in a directory it owns;
otherwise as the current user. Authentication is ``trust`` on the socket only.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

SUPERUSER = "deferq"
UNPRIVILEGED = "nobody"


def server_bin_dir() -> Path | None:
    """The newest installed PostgreSQL server's bin directory (Debian's layout), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class Cluster:
    """One PostgreSQL cluster in a fresh temporary directory, on a Unix socket there."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self._as_root = os.geteuid() == 0
        # As root, in /tmp itself: the unprivileged user must be able to reach the directory,
        # which a $TMPDIR under root's home would not let it do. A short path, too: a Unix
        # socket's path is limited to about 100 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="deferq-pg-",
                                          dir="/tmp" if self._as_root else None))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        if self._as_root:
            shutil.chown(self.root, user=UNPRIVILEGED)
        self.running = False

    @property
    def dsn(self) -> str:
        return f"host={self.root} port=5432 user={SUPERUSER} dbname=postgres"

    def _run(self, *argv: str, timeout: float = 60) -> None:
        user = UNPRIVILEGED if self._as_root else None
        result = subprocess.run([str(self.bin_dir / argv[0]), *argv[1:]], user=user,
                                capture_output=True, text=True, timeout=timeout,
                                cwd=self.root, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{argv[0]} failed ({result.returncode}): {result.stderr.strip()}"
                               f"\n{log}")

    def init(self) -> None:
        # --no-sync only skips initdb's own final flush of a directory we throw away; the
        # server itself runs with fsync=on.
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
                  "--no-sync", "-E", "UTF8", "--locale=C")
        with open(self.data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(f"\nlisten_addresses = ''\nunix_socket_directories = '{self.root}'\n"
                       "fsync = on\nsynchronous_commit = on\nmax_connections = 60\n"
                       "shared_buffers = 16MB\n")

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                  "start")
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server; ``mode="immediate"`` is a crash as far as the data goes."""
        if self.running:
            self.running = False
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def kill(self) -> None:
        """A real crash: SIGKILL the postmaster and every server process it started, at once
        (the postmaster is stopped first so that it forks nothing meanwhile), then wait until
        they are all gone. The next ``start`` runs PostgreSQL's crash recovery."""
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGSTOP)
        victims = [pid, *_children(pid)]
        for victim in victims:
            try:
                os.kill(victim, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.running = False
        deadline = time.monotonic() + 20
        while any(_alive(victim) for victim in victims):
            if time.monotonic() > deadline:
                raise RuntimeError(f"server processes {victims} outlived SIGKILL by 20 s")
            time.sleep(0.01)
        # The dead postmaster may stay a zombie (a container's init need not reap it), and
        # PostgreSQL takes a lock file whose pid still exists for a live server: remove them
        # (the data directory's and the socket's), as a reboot would have made that pid
        # meaningless.
        for lock in (self.data / "postmaster.pid", self.root / ".s.PGSQL.5432.lock"):
            lock.unlink(missing_ok=True)

    def destroy(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` still exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(what: str, check: Callable[[], bool], timeout: float, poll: float) -> None:
    """Poll ``check`` every ``poll`` seconds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(poll)
