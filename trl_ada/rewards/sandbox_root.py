"""The private filesystem of sandboxed programs: a read-only copy, in memory, of the files an interpreter runs from.

Made once per process on a ``tmpfs`` (``/dev/shm`` by default), where a run's failed lookups and reads leave nothing
in the kernel's caches for a later run to time (docs/code-rl.md): the interpreter, its standard library (no installed
packages, no ``test`` package), the shared libraries these load (``ldd`` lists them), the dynamic linker's cache and
[`ROOT_TOOLS`], each file at its host path. Removed when the process exits, or by the next process that makes one.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

ROOT_TOOLS = ("sh", "prlimit", "env", "echo", "cat", "true", "false", "sleep")
"""The commands, besides the interpreter, that a sandboxed program finds on its ``PATH``."""
ROOT_ROOM_BYTES = 160 << 20
"""Free space a ``tmpfs`` must have to hold the copy, with a margin (docs/code-rl.md gives its measured size)."""
TMPFS_CANDIDATES = ("/dev/shm", "/run/shm", "/tmp")
"""Where the copy is made: the first of these that is a writable ``tmpfs`` with room for it."""

_PREFIX = "trl-ada-sandbox-root-"
# Beside the bound entries, never bound itself: a file its maker holds a lock on for as long as it lives (a lock,
# not a PID, since a PID names another process in another PID namespace).
_OWNER_FILE = ".owner"
_held: dict[str, int] = {}
# Names left out of the standard library's tree: installed packages are not the standard library, and the ``test``
# package and the build configuration (``config-3.x-*``, with a static libpython) are most of its size and no program
# needs them.
_SKIPPED_DIRECTORIES = frozenset({"site-packages", "dist-packages"})
_SKIPPED_TOP_LEVEL = re.compile(r"test|config-\d.*")
# Directories the sandbox mounts fresh per run; a copied file there would be hidden.
_PER_RUN_MOUNTS = frozenset({"tmp", "dev", "proc"})
# A merged-/usr system's links (/bin -> usr/bin): commands are found under either name.
_MERGED_USR_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_EXTRA_FILES = ("/etc/ld.so.cache", "/etc/localtime")
_EXTRA_TREES = ("/usr/lib/locale/C.utf8",)
_MAX_LINKS = 40


@dataclass(frozen=True)
class PrivateRoot:
    """A read-only tree on a ``tmpfs`` whose top-level entries become the sandbox's ``/usr``, ``/lib``, ``/etc``, ...

    Attributes:
        path: The tree's directory on the host.
        size_bytes: Bytes of the files copied (memory the copy holds for as long as it exists).
    """

    path: str
    size_bytes: int

    def bwrap_args(self) -> list[str]:
        """bubblewrap's options that lay the tree over the sandbox's empty root: each top-level directory bound
        read-only, each top-level link made again."""
        args: list[str] = []
        for name in sorted(os.listdir(self.path)):
            if name.startswith("."):  # the lock file, not part of the tree
                continue
            host = os.path.join(self.path, name)
            if os.path.islink(host):
                args += ["--symlink", os.readlink(host), f"/{name}"]
            else:
                args += ["--ro-bind", host, f"/{name}"]
        return args


class _Copier:
    """Copies host paths into ``root`` at the same paths, replicating the symbolic links met on the way."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.size_bytes = 0

    def add(self, path: str, *, _depth: int = 0) -> None:
        if _depth > _MAX_LINKS:
            raise OSError(f"too many levels of symbolic links copying {path}")
        parts = [part for part in os.path.normpath(path).split("/") if part]
        current = "/"
        for index, part in enumerate(parts):
            host = os.path.join(current, part)
            status = os.lstat(host)
            mode = status.st_mode
            copy = self.root + host
            if stat.S_ISLNK(mode):
                target = os.readlink(host)
                if not os.path.lexists(copy):
                    os.symlink(target, copy)
                resolved = os.path.normpath(os.path.join(current, target, *parts[index + 1 :]))
                self.add(resolved, _depth=_depth + 1)
                return
            if stat.S_ISDIR(mode):
                if not os.path.isdir(copy):
                    os.mkdir(copy, 0o755)
                current = host
                continue
            if index != len(parts) - 1 or not stat.S_ISREG(mode):
                return  # a device, socket or fifo: nothing a program needs from the host
            if not os.path.lexists(copy):
                shutil.copyfile(host, copy)
                os.chmod(copy, 0o755 if mode & 0o111 else 0o644)
                # Byte code is used only where its source's modification time is the one it was compiled from.
                os.utime(copy, ns=(status.st_atime_ns, status.st_mtime_ns))
                self.size_bytes += os.path.getsize(copy)
            return

    def add_tree(self, top: str) -> None:
        self.add(top)
        for directory, subdirectories, files in os.walk(top):
            subdirectories[:] = [
                name
                for name in subdirectories
                if name not in _SKIPPED_DIRECTORIES and not (directory == top and _SKIPPED_TOP_LEVEL.fullmatch(name))
            ]
            for name in subdirectories:
                path = os.path.join(directory, name)
                if os.path.islink(path):
                    self.add(path)
            for name in files:
                if ".opt-" in name and name.endswith(".pyc"):
                    continue  # optimised byte code: the sandbox never runs with -O
                self.add(os.path.join(directory, name))


def _interpreter_paths(python: str) -> list[str]:
    """The directories the interpreter imports its standard library from (no site, so no site-packages)."""
    probe = (
        "import json, sys, sysconfig; "
        "print(json.dumps([sysconfig.get_path('stdlib'), sysconfig.get_path('platstdlib'), *sys.path]))"
    )
    output = subprocess.run(
        [python, "-I", "-S", "-c", probe], capture_output=True, text=True, check=True, timeout=60, env={}
    ).stdout
    paths = [os.path.realpath(path) for path in json.loads(output) if path and os.path.isdir(path)]
    # A directory inside another one listed is copied with it.
    return [path for path in dict.fromkeys(paths) if not any(path.startswith(other + "/") for other in paths)]


def _shared_libraries(files: Iterable[str]) -> set[str]:
    """The shared libraries and dynamic linker that ``files`` load, as ``ldd`` lists them (absent ones are left out)."""
    libraries: set[str] = set()
    batch = sorted(files)
    for start in range(0, len(batch), 200):
        output = subprocess.run(
            ["ldd", *batch[start : start + 200]], capture_output=True, text=True, check=False, timeout=120
        ).stdout
        for match in re.finditer(r"(?:=>\s*)?(/\S+)\s+\(0x", output):
            libraries.add(match.group(1))
    # glibc loads libgcc_s at run time (thread cancellation, unwinding), where ldd does not see it.
    for library in list(libraries):
        if os.path.basename(library).startswith("libc.so"):
            candidate = os.path.join(os.path.dirname(library), "libgcc_s.so.1")
            if os.path.exists(candidate):
                libraries.add(candidate)
    return libraries


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"\x7fELF"
    except OSError:
        return False


def build_root(python: str, tools: Sequence[str], directory: str) -> PrivateRoot:
    """Copies ``python``'s standard library and the ``tools`` (absolute paths), with the shared libraries of both,
    into a new directory under ``directory``; returns the tree. Raises ``OSError`` (no room, an unreadable file) or
    ``subprocess.CalledProcessError`` (the interpreter does not start)."""
    # The name is random: a program reads it in /proc/self/mountinfo, so it must say nothing of the trainer.
    root = tempfile.mkdtemp(prefix=_PREFIX, dir=directory)
    try:
        os.chmod(root, 0o755)
        _hold(root)
        copier = _Copier(root)
        for path in (python, *tools):
            copier.add(path)
        for name in ("python3", "python"):  # the names a program may call the interpreter by
            alias = os.path.join(os.path.dirname(python), name)
            if os.path.realpath(alias) == os.path.realpath(python):
                copier.add(alias)
        for link in _MERGED_USR_LINKS:
            if os.path.islink(link):
                copier.add(link)
        for tree in _interpreter_paths(python):
            copier.add_tree(tree)
        for path in _EXTRA_FILES:
            if os.path.exists(path):
                copier.add(path)
        for tree in _EXTRA_TREES:
            if os.path.isdir(tree):
                copier.add_tree(tree)
        elf_files = [
            os.path.join(directory_, name)
            for directory_, _, names in os.walk(root)
            for name in names
            if _is_elf(os.path.join(directory_, name))
        ]
        for library in sorted(_shared_libraries(path[len(root) :] for path in elf_files)):
            copier.add(library)
        hidden = _PER_RUN_MOUNTS.intersection(os.listdir(root))
        if hidden:
            raise OSError(
                f"the interpreter or its libraries live under /{sorted(hidden)[0]}, which the sandbox mounts fresh "
                "for each run; install the interpreter elsewhere (e.g. /usr/bin/python3)"
            )
        return PrivateRoot(root, copier.size_bytes)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


def find_tmpfs(candidates: Sequence[str] | None = None, needed_bytes: int = 0) -> str | None:
    """The first of ``candidates`` (default [`TMPFS_CANDIDATES`]) that is a ``tmpfs`` mount this process can write to,
    mounted without ``noexec`` (the interpreter and its libraries are run from it), with ``needed_bytes`` free."""
    if candidates is None:
        candidates = TMPFS_CANDIDATES
    mounts: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/self/mounts") as handle:
        for line in handle:
            fields = line.split()
            if len(fields) >= 3:
                mounts[fields[1].replace("\\040", " ")] = fields[2]
    for candidate in candidates:
        real = os.path.realpath(candidate)
        containing = [point for point in mounts if real == point or real.startswith(point.rstrip("/") + "/")]
        mount = max(containing, key=len, default=None)
        if mount is None or mounts[mount] != "tmpfs" or not os.access(real, os.W_OK | os.X_OK):
            continue
        usage = os.statvfs(real)
        if usage.f_flag & (os.ST_NOEXEC | os.ST_RDONLY):
            continue
        if usage.f_bavail * usage.f_frsize >= needed_bytes:
            return real
    return None


def remove_stale_roots(directory: str) -> None:
    """Removes the copies in ``directory`` that this user's processes made and did not remove (they died first: no
    process holds the copy's lock)."""
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if not name.startswith(_PREFIX) or os.lstat(path).st_uid != os.geteuid():
            continue
        try:
            fd = os.open(os.path.join(path, _OWNER_FILE), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # being made right now
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its maker lives
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)


_roots: dict[tuple[str, tuple[str, ...]], PrivateRoot] = {}
_roots_lock = threading.Lock()


def shared_root(python: str, tools: Sequence[str]) -> PrivateRoot:
    """This process's copy for ``python`` and ``tools``, made on first use and removed at exit.

    Raises:
        RuntimeError: when no ``tmpfs`` has room for it, or the copy cannot be made; the message names the fix.
    """
    key = (python, tuple(tools))
    with _roots_lock:
        if key in _roots and os.path.isdir(_roots[key].path):
            return _roots[key]
        directory = find_tmpfs(needed_bytes=ROOT_ROOM_BYTES)
        instead = (
            "or pass Sandbox(filesystem='host') to bind the host's /usr instead (runs can then time each other's file "
            "lookups: see the Sandbox docs)."
        )
        if directory is None:
            raise RuntimeError(
                "The sandbox's private filesystem is a copy of the interpreter's files in memory, and needs a "
                f"writable tmpfs, mounted without noexec, with {ROOT_ROOM_BYTES >> 20} MiB free (tried "
                f"{', '.join(TMPFS_CANDIDATES)}). Give it one (Docker mounts /dev/shm noexec and 64 MiB: "
                f"`docker run --tmpfs /tmp:exec,size=1g`), {instead}"
            )
        remove_stale_roots(directory)
        try:
            root = build_root(python, tools, directory)
        except (OSError, subprocess.SubprocessError, ValueError) as error:
            raise RuntimeError(
                f"Could not copy the interpreter's files into {directory} for the sandbox ({error}). Give it room "
                f"(`docker run --tmpfs /tmp:exec,size=1g`), {instead}"
            ) from error
        logger.info("Sandbox: a private filesystem of %.1f MiB in %s", root.size_bytes / (1 << 20), root.path)
        _roots[key] = root
        atexit.register(_remove, root.path, os.getpid())
        return root


def _hold(root: str) -> None:
    """Takes the lock that says the copy is in use; the file gets its name only once locked, so no sweeper sees it
    unlocked."""
    pending = os.path.join(root, _OWNER_FILE + ".new")
    fd = os.open(pending, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(pending, os.path.join(root, _OWNER_FILE))
    _held[root] = fd


def _remove(path: str, owner_pid: int) -> None:
    # A forked child inherits the exit handler but not the copy.
    if os.getpid() == owner_pid:
        shutil.rmtree(path, ignore_errors=True)
