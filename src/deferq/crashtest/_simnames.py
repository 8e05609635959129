"""NameCalls: a simulated process's namespace calls of the ``Env`` seam, Linux semantics.

Rules. Paths resolve in the machine's volatile namespace (relative paths start at the
root). ``rename`` follows rename(2) and checks in the order of Linux's do_renameat2 and
vfs_rename: EISDIR, ENOTDIR, ENOTEMPTY, EINVAL for a directory into itself, a no-op
onto itself. ``makedirs`` is ``os.makedirs(path, mode, exist_ok=True)``. ``listdir``
returns names in creation order: deterministic, and deliberately unsorted so that code
relying on order is caught. ``fsync_dir`` makes the directory's logged links and
unlinks durable (A-4), and nothing else.

Theory of operation: each call passes the fault rules with its paths, checks its
arguments, and applies the change to the machine's ``SimFs``, which logs it as link
and unlink micro-operations for the crash model.
"""

from __future__ import annotations

import errno

from deferq.crashtest._faults import LyingFsync
from deferq.crashtest._inode import Inode, os_error
from deferq.crashtest._simproc import SimProcess


class NameCalls(SimProcess):
    """The namespace calls of ``deferq._engine.env.Env`` (mixed into ``SimEnv``)."""

    def rename(self, src: str, dst: str) -> None:
        with self._disk.lock:
            fault = self._enter("rename", (src, dst))
            old = self._fs.resolve(src)
            new = self._fs.resolve(dst)
            # The checks in the order of Linux's do_renameat2 and vfs_rename.
            if old.node is None:
                raise os_error(errno.ENOENT, src)
            if not old.name or not new.name:
                raise os_error(errno.EBUSY, src)
            if not old.node.is_dir and new.slash:
                raise os_error(errno.ENOTDIR, dst)  # a file cannot be named "dst/"
            if new.node is old.node:
                self._leave(fault, "rename", (src, dst))
                return
            if old.node.is_dir and self._contains(old.node, new.parent):
                raise os_error(errno.EINVAL, src)  # a directory into itself
            if new.node is not None and new.node.is_dir and self._contains(new.node, old.parent):
                raise os_error(errno.ENOTEMPTY, dst)  # over one of the source's ancestors
            if old.node.is_dir and new.node is not None:
                if not new.node.is_dir:
                    raise os_error(errno.ENOTDIR, dst)
                if new.node.entries:
                    raise os_error(errno.ENOTEMPTY, dst)
            elif new.node is not None and new.node.is_dir:
                raise os_error(errno.EISDIR, dst)
            self._fs.rename(old.parent, old.name, new.parent, new.name)
            self._leave(fault, "rename", (src, dst))

    def unlink(self, path: str) -> None:
        with self._disk.lock:
            fault = self._enter("unlink", (path,))
            found = self._fs.resolve(path)
            if found.node is None:
                raise os_error(errno.ENOENT, path)
            if found.node.is_dir:
                raise os_error(errno.EISDIR, path)
            self._fs.unlink(found.parent, found.name)
            self._leave(fault, "unlink", (path,))

    def makedirs(self, path: str, mode: int = 0o700) -> None:
        """Like ``os.makedirs(path, mode, exist_ok=True)``."""
        with self._disk.lock:
            fault = self._enter("makedirs", (path,))
            if not path:
                raise os_error(errno.ENOENT, path)
            comps = [c for c in path.split("/") if c and c != "."]
            for count in range(1, len(comps) + 1):
                prefix = "/" + "/".join(comps[:count])
                found = self._fs.resolve(prefix)
                if found.node is None:
                    self._fs.mkdir(found.parent, found.name, mode)
                elif not found.node.is_dir:
                    raise os_error(errno.EEXIST if count == len(comps) else errno.ENOTDIR, path)
            self._leave(fault, "makedirs", (path,))

    def listdir(self, path: str) -> list[str]:
        with self._disk.lock:
            fault = self._enter("listdir", (path,))
            node = self._dir_at(path)
            names = list(node.entries)  # creation order: deterministic, deliberately unsorted
            self._leave(fault, "listdir", (path,))
            return names

    def fsync_dir(self, path: str) -> None:
        with self._disk.lock:
            fault = self._enter("fsync_dir", (path,))
            node = self._dir_at(path)
            if isinstance(fault, LyingFsync):
                return
            self._fs.persist_dir(node.ino)
            self._fs.barrier()
            self._leave(fault, "fsync_dir", (path,))

    def _contains(self, directory: Inode, target: Inode) -> bool:
        """Whether ``target`` is ``directory`` or lies beneath it."""
        stack = [directory]
        seen: set[int] = set()
        while stack:
            node = stack.pop()
            if node is target:
                return True
            seen.add(node.ino)
            stack.extend(self._fs.node(ino) for ino in node.entries.values()
                         if ino not in seen and self._fs.node(ino).is_dir)
        return False
