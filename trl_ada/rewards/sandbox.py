"""Run untrusted programs (a policy's code completions) in a bubblewrap sandbox with resource limits.

Pure Python and the standard library; Linux only. The interface is small::

    sandbox = Sandbox(SandboxLimits(wall_time_s=5))
    result = sandbox.run(program="print(input()[::-1])", stdin="abc")
    result.status, result.stdout  # ("ok", "cba\\n")

Under ``isolation="bwrap"`` (the default) a run sees a private read-only filesystem (``trl_ada.rewards.sandbox_root``;
``filesystem="host"`` binds the host's ``/usr`` instead), a fresh ``tmpfs`` at ``/tmp`` as its only writable place,
no network, its own namespaces, a seccomp filter, a clean environment, a uid of its own when the trainer is root,
``prlimit`` limits and, where they can be made, memory and cpu cgroups; nothing it starts outlives the call.
docs/code-rl.md ("The sandbox: what is and is not contained") says what each of these closes, and why. ``isolation="none"`` runs the
program in a plain subprocess with the same limits: it is **not a security boundary** (it exists for machines without
user namespaces and for measuring the sandbox's overhead) and it logs a warning when constructed.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import platform
import random
import selectors
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from .sandbox_root import ROOT_TOOLS, PrivateRoot, shared_root

logger = logging.getLogger(__name__)

Isolation = Literal["bwrap", "none"]
Filesystem = Literal["private", "host"]
Status = Literal["ok", "error", "timeout", "memory", "output_limit", "sandbox_error"]

INSTALL_HINT = "apt-get install bubblewrap (Debian/Ubuntu; `dnf install bubblewrap` on Fedora/RHEL)"
SCRATCH_DIR = "/tmp"
"""Where the program runs inside the sandbox: its working directory, and the only writable place."""
PROGRAM_FILE = "main.py"
"""The name ``Sandbox.run(program=...)`` writes the program under, in the working directory."""
SANDBOX_UIDS = range(0x70000000, 0x70000000 + 4096)
"""The host uids a root trainer's sandboxes run as by default, one per run at a time (see ``Sandbox``'s
``run_as_uid``): uids no account or file of a usual machine has."""

_SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
# One thread per BLAS/OpenMP pool: under the process limit a pool sized to the machine's cores would fail to start.
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")
_READ_CHUNK = 65536

# System calls a sandboxed program gets EPERM for: System V IPC and memfds hold memory no process maps (RLIMIT_AS
# does not count it); the keyring calls reach the trainer's session keyring; message queues, inotify, fanotify, file
# locks (``flock``, ``_DENIED_FCNTL_COMMANDS``) and the futex2 calls (``futex_waitv``, whose keys on a mapped file of
# the shared copy every sandbox reaches) are channels between concurrent sandboxes; ``mlock`` moves machine-wide
# counters that outlive the call; AIO contexts and ``io_uring`` draw on machine-wide budgets; ``ptrace``, the
# ``process_vm`` calls and pidfds reach the sandbox's init (a pidfd's inode number also counts every process the
# machine has started); ``userfaultfd`` stalls the kernel on a page fault of the program's choosing; sockets hold
# buffer memory no limit counts (a program needs none: it has no network) and carry a machine-wide cookie counter;
# ``sysinfo`` reads the machine's memory and thread counts. Per architecture:
# (AUDIT_ARCH_* of seccomp_data.arch, {name: number}, first number of a second ABI sharing that arch value (x32)).
_DENIED_SYSCALLS: dict[str, tuple[int, dict[str, int], int | None]] = {
    "x86_64": (
        0xC000003E,
        {
            "shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semctl": 66,
            "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "add_key": 248,
            "request_key": 249, "keyctl": 250, "memfd_create": 319, "memfd_secret": 447, "flock": 73,
            "mq_open": 240, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244,
            "mq_getsetattr": 245, "inotify_init": 253, "inotify_init1": 294, "fanotify_init": 300,
            "fanotify_mark": 301, "futex_waitv": 449, "futex_wake": 454, "futex_wait": 455, "futex_requeue": 456,
            "mlock": 149, "munlock": 150, "mlockall": 151, "munlockall": 152, "mlock2": 325, "io_setup": 206,
            "io_destroy": 207, "io_getevents": 208, "io_submit": 209, "io_cancel": 210, "io_pgetevents": 333,
            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 323,
            "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_open": 434, "pidfd_getfd": 438,
            "socket": 41, "socketpair": 53, "sysinfo": 99,
        },
        0x40000000,
    ),
    "aarch64": (
        0xC00000B7,
        {
            "msgget": 186, "msgctl": 187, "msgrcv": 188, "msgsnd": 189, "semget": 190, "semctl": 191,
            "semtimedop": 192, "semop": 193, "shmget": 194, "shmctl": 195, "shmat": 196, "shmdt": 197,
            "add_key": 217, "request_key": 218, "keyctl": 219, "memfd_create": 279, "memfd_secret": 447,
            "flock": 32, "mq_open": 180, "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183,
            "mq_notify": 184, "mq_getsetattr": 185, "inotify_init1": 26, "fanotify_init": 262, "fanotify_mark": 263,
            "futex_waitv": 449, "futex_wake": 454, "futex_wait": 455, "futex_requeue": 456, "mlock": 228,
            "munlock": 229, "mlockall": 230, "munlockall": 231, "mlock2": 284, "io_setup": 0, "io_destroy": 1,
            "io_submit": 2, "io_cancel": 3, "io_getevents": 4, "io_pgetevents": 292, "io_uring_setup": 425,
            "io_uring_enter": 426, "io_uring_register": 427, "userfaultfd": 282, "ptrace": 117,
            "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_open": 434, "pidfd_getfd": 438,
            "socket": 198, "socketpair": 199, "sysinfo": 179,
        },
        None,
    ),
}  # fmt: skip
# ``fcntl``'s number per architecture, and the commands of it that get EPERM: record locks, classic and open-file
# description ones (F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW), leases (F_SETLEASE,
# F_GETLEASE), directory notifications (F_NOTIFY) and an inode's write hints (F_GET_RW_HINT, F_SET_RW_HINT and their
# per-file forms): each is state on a file of the shared copy that another sandbox can set or see. Its other commands
# work.
_FCNTL_SYSCALL = {"x86_64": 72, "aarch64": 25}
_DENIED_FCNTL_COMMANDS = (5, 6, 7, 36, 37, 38, 1024, 1025, 1026, 1035, 1036, 1037, 1038)
# ``futex``'s number per architecture: a wait without FUTEX_PRIVATE_FLAG keys on the page of a mapped file every
# sandbox maps, so it gets EAGAIN (which glibc retries rather than aborting) and no shared key ever has a waiter to
# wake or count, while shared wakes (FUTEX_WAKE, FUTEX_WAKE_OP, FUTEX_UNLOCK_PI, FUTEX_WAKE_BITSET) stay allowed.
_FUTEX_SYSCALL = {"x86_64": 202, "aarch64": 98}
_FUTEX_PRIVATE_FLAG, _FUTEX_CLOCK_REALTIME = 128, 256
_SHARED_FUTEX_COMMANDS = (1, 5, 7, 10)
# ``clone`` with CLONE_PIDFD gets EPERM (a pidfd, as ``pidfd_open``'s); ``clone3``, whose flags sit in memory a filter
# cannot read, gets ENOSYS, so glibc falls back to ``clone``.
_CLONE_SYSCALL = {"x86_64": 56, "aarch64": 220}
_CLONE3_SYSCALL = {"x86_64": 435, "aarch64": 435}
_CLONE_PIDFD = 0x1000
# Machine-wide counters in /proc that a program can move precisely and another read back (page and memory events,
# interrupts, the machine's thread count) are masked by empty files, and /proc/sys and /proc/pressure by empty
# read-only directories; /proc/stat (forks, context switches) is replaced by zeros with one ``cpuN`` line per CPU,
# where glibc counts the CPUs for ``os.cpu_count()`` when /sys is absent. Files that only tell how busy the machine
# is (``uptime``, ``softirqs``, ``schedstat``) stay, since a program learns as much by timing its own work.
_MASKED_PROC_FILES = ("vmstat", "meminfo", "zoneinfo", "buddyinfo", "interrupts", "loadavg")
_MASKED_PROC_DIRECTORIES = ("sys", "pressure")
# The devices of the sandbox's /dev (bound from the host's), and its links; no pseudo-terminals, whose machine-wide
# count /proc/sys/kernel/pty/nr would tell.
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_DEVICE_LINKS = {
    "fd": "/proc/self/fd",
    "stdin": "/proc/self/fd/0",
    "stdout": "/proc/self/fd/1",
    "stderr": "/proc/self/fd/2",
}


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run.

    Args:
        wall_time_s: Wall-clock seconds before the caller kills the whole sandbox (status ``timeout``).
        cpu_time_s: CPU seconds of each process (``RLIMIT_CPU``; ``SIGXCPU`` then ``SIGKILL`` a second later, status
            ``timeout``). Rounded up to whole seconds.
        memory_bytes: Address space of each process (``RLIMIT_AS``); Python raises ``MemoryError`` past it
            (status ``memory``). Python itself needs ~30 MB; threads reserve their stacks from it. With a memory
            cgroup (``Sandbox.memory_cgroup``) the whole sandbox is also capped at ``memory_bytes + scratch_bytes``;
            without one a sandbox's worst case is ``memory_bytes * max_processes + scratch_bytes``: size it, times the
            sandboxes running at once, to the machine.
        file_size_bytes: Largest file a process may write (``RLIMIT_FSIZE``).
        scratch_bytes: Size of the writable ``tmpfs`` at ``/tmp`` (RAM), files given to ``run`` included.
        max_processes: Processes and threads of the sandbox's user inside its namespace (``RLIMIT_NPROC``), the
            sandbox's own init and the program included; a fork bomb gets ``EAGAIN`` past it. BLAS/OpenMP thread
            pools are set to one thread (``OMP_NUM_THREADS=1`` and the like) so numpy imports within it. Without a
            cpu cgroup (see ``cpus``) this is also what bounds the CPUs a run keeps busy at once.
        max_open_files: File descriptors per process (``RLIMIT_NOFILE``).
        output_bytes: Bytes kept of each of stdout, stderr and the channel; a program writing more is killed
            (status ``output_limit``).
        cpus: CPUs the whole sandbox may use at once (a CFS quota of ``cpus`` times its period), where a cpu cgroup
            can be made (``Sandbox.cpu_cgroup``); its processes then share that time, however many they are.
    """

    wall_time_s: float = 10.0
    cpu_time_s: float = 10.0
    memory_bytes: int = 512 << 20
    file_size_bytes: int = 16 << 20
    scratch_bytes: int = 64 << 20
    max_processes: int = 8
    max_open_files: int = 256
    output_bytes: int = 1 << 20
    cpus: float = 1.0

    def __post_init__(self) -> None:
        positive = ("wall_time_s", "cpu_time_s", "memory_bytes", "file_size_bytes", "scratch_bytes", "output_bytes")
        for name in (*positive, "cpus"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive number, got {value!r}.")
        if not math.isfinite(self.cpus):
            raise ValueError(f"SandboxLimits.cpus must be a finite number of CPUs, got {self.cpus!r}.")
        if self.memory_bytes < 64 << 20:
            raise ValueError(
                f"SandboxLimits.memory_bytes={self.memory_bytes} is below 64 MiB, where the Python interpreter itself "
                "cannot start; use at least 64 << 20 (the default is 512 << 20)."
            )
        # The sandbox's init, prlimit/the interpreter and one child at least.
        if not isinstance(self.max_processes, int) or self.max_processes < 3:
            raise ValueError(f"SandboxLimits.max_processes must be an integer >= 3, got {self.max_processes!r}.")
        if not isinstance(self.max_open_files, int) or self.max_open_files < 16:
            raise ValueError(f"SandboxLimits.max_open_files must be an integer >= 16, got {self.max_open_files!r}.")


@dataclass
class SandboxResult:
    """What one sandboxed run produced.

    Attributes:
        status: ``ok`` (exit status 0), ``error`` (another exit status, or killed by a signal other than the limits'),
            ``timeout`` (wall clock or CPU limit), ``memory`` (``MemoryError``), ``output_limit`` (an output stream or
            a file over its limit), ``sandbox_error`` (bubblewrap could not set the sandbox up, so the program did not
            run: bubblewrap's status pipe, out of the program's reach, recorded no exit status).
        returncode: The program's exit status (``128 + signal`` when a signal killed it, as bubblewrap reports it);
            ``None`` when the caller killed the sandbox.
        stdout, stderr: The program's output, decoded as UTF-8 (invalid bytes replaced), at most
            ``SandboxLimits.output_bytes`` each.
        channel: What the program wrote to the extra pipe asked for with ``run(channel=True)`` (raw bytes).
        wall_time_s: Seconds from start to the sandbox's end.
        detail: Why, in words, for a status other than ``ok`` (``"CPU limit"``, bubblewrap's message, ...).
    """

    status: Status
    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    channel: bytes = b""
    wall_time_s: float = 0.0
    detail: str = ""


def _path_reachable_by_others(path: str) -> bool:
    """Whether a user who is neither the owner nor in the group can read ``path`` (each parent directory searchable)."""
    path = os.path.realpath(path)
    try:
        if not os.stat(path).st_mode & stat.S_IROTH:
            return False
        parent = os.path.dirname(path)
        while True:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            if parent == "/":
                return True
            parent = os.path.dirname(parent)
    except OSError:
        return False


def _interpreter_prefix(python: str) -> str:
    """The installation prefix of an interpreter (``/opt/py311`` for ``/opt/py311/bin/python3``)."""
    return os.path.dirname(os.path.dirname(os.path.realpath(python)))


def _check_prefix(prefix: str) -> None:
    """Refuses to bind an interpreter prefix that would expose a home directory or the Hub's files to programs."""
    if prefix == "/usr" or prefix.startswith("/usr/"):
        return
    real = os.path.realpath(prefix)
    has_stdlib = any(
        os.path.isfile(os.path.join(real, "lib", name, "os.py"))
        for name in (os.listdir(os.path.join(real, "lib")) if os.path.isdir(os.path.join(real, "lib")) else [])
        if name.startswith("python")
    )
    sensitive = [os.path.expanduser("~"), os.environ.get("HF_HOME", ""), os.path.expanduser("~/.cache/huggingface")]
    exposes = [
        path for path in sensitive if path and (os.path.realpath(path) + "/").startswith(real.rstrip("/") + "/")
    ]
    if real == "/" or not has_stdlib or exposes:
        why = (
            f"it would expose {exposes[0]}" if exposes else "it is not a Python installation prefix (no lib/python*/)"
        )
        raise ValueError(
            f"The sandbox binds the interpreter's installation prefix {real} read-only, but {why}. Pass "
            "Sandbox(python=...) an interpreter installed in its own prefix, e.g. /usr/bin/python3."
        )


class Sandbox:
    """Runs programs under bubblewrap with the limits of a [`SandboxLimits`] (what it isolates: docs/code-rl.md).

    Construction checks the set-up once (bubblewrap and ``prlimit`` present, a trivial sandbox starts) and raises with
    the fix, so a misconfigured machine fails before any training compute. Instances are cheap, picklable and
    thread-safe.

    Args:
        limits: Resource limits of each run.
        isolation: ``"bwrap"`` (default) or ``"none"``: a plain subprocess, **not a security boundary**; a warning
            is logged.
        python: Interpreter for ``run(program=...)``. Default: this process's interpreter when the sandbox user can
            read it, else ``/usr/bin/python3``. A virtualenv's own site-packages are never visible.
        filesystem: ``"private"`` (default): a read-only copy in memory of the interpreter, its standard library and
            the libraries they load (not ``python``'s installed packages). ``"host"``: the host's ``/usr`` and the
            interpreter's prefix, read-only (every tool and installed package), but runs can time each other's lookups.
        run_as_uid: When this process is root, the unprivileged uids (each also the gid) bubblewrap runs as: a
            ``range``, from which each run takes one no other run on the machine holds (default [`SANDBOX_UIDS`]), or
            one ``int`` for every run (concurrent runs then share the kernel's per-user budgets, a covert channel).
            Ignored when not root (the sandbox then runs as the current user).

    Attributes:
        memory_cgroup: The cgroup v1 memory directory under which each run gets its own capped cgroup (this
            process's own, when it may create cgroups there); ``None`` when there is none: memory is then bounded
            per process only (see ``SandboxLimits.memory_bytes``).
        cpu_cgroup: The cgroup v1 cpu directory under which each run gets its own cgroup with a quota of
            ``SandboxLimits.cpus`` (this process's own, when it may create cgroups there); ``None`` when there is
            none: a run may then keep up to ``max_processes - 1`` CPUs busy, each process for ``cpu_time_s``.
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        isolation: Isolation = "bwrap",
        python: str | None = None,
        run_as_uid: int | range | None = None,
        filesystem: Filesystem = "private",
    ) -> None:
        self.limits = limits if limits is not None else SandboxLimits()
        if not isinstance(self.limits, SandboxLimits):
            raise TypeError(f"limits must be a SandboxLimits, got {type(self.limits).__name__}.")
        if isolation not in ("bwrap", "none"):
            raise ValueError(f"isolation must be 'bwrap' or 'none' (no security boundary), got {isolation!r}.")
        self.isolation: Isolation = isolation
        if filesystem not in ("private", "host"):
            raise ValueError(f"filesystem must be 'private' or 'host', got {filesystem!r}.")
        self.filesystem: Filesystem = filesystem
        self._as_root = os.geteuid() == 0
        if run_as_uid is None:
            run_as_uid = SANDBOX_UIDS
        single = isinstance(run_as_uid, int) and not isinstance(run_as_uid, bool)
        uids = range(run_as_uid, run_as_uid + 1) if single else run_as_uid
        if not isinstance(uids, range) or not uids or uids.start < 0:
            raise ValueError(f"run_as_uid must be a uid or a non-empty range of uids, got {run_as_uid!r}.")
        if uids.stop > (1 << 32) - 1 or uids.step != 1:
            raise ValueError(f"run_as_uid must hold consecutive uids below 2**32 - 1, got {run_as_uid!r}.")
        self.run_as_uids = uids
        if self._as_root and isolation == "bwrap" and 0 in uids:
            raise ValueError(
                "run_as_uid=0 would run sandboxed programs as root, for whom the kernel ignores the process limit "
                "(a fork bomb would not be bounded); pass an unprivileged uid such as 65534."
            )
        self._shell = shutil.which("sh", path=_SANDBOX_PATH) or "/bin/sh"
        self._prlimit = shutil.which("prlimit", path=_SANDBOX_PATH)
        if self._prlimit is None:
            raise RuntimeError("The sandbox needs util-linux's `prlimit` in /usr/bin: apt-get install util-linux.")
        if isolation == "bwrap":
            bwrap = shutil.which("bwrap")
            if bwrap is None:
                raise RuntimeError(
                    f"bubblewrap (`bwrap`) is not installed; the code sandbox needs it: {INSTALL_HINT}. To run "
                    "programs without isolation (NOT a security boundary) pass isolation='none'."
                )
            self._bwrap = bwrap
        else:
            self._bwrap = ""
            logger.warning(
                "Sandbox(isolation='none'): programs run in a plain subprocess with resource limits only. This is NOT "
                "a security boundary: they can read the trainer's files (e.g. the Hub token), use the network and "
                "leave processes behind. Use it only for trusted code or measurements."
            )
        self.python = self._resolve_python(python)
        self._seccomp_program: bytes | None = None
        self.memory_cgroup: str | None = (
            _cgroup_parent("memory", "memory.limit_in_bytes") if isolation == "bwrap" else None
        )
        self.cpu_cgroup: str | None = _cgroup_parent("cpu", "cpu.cfs_quota_us") if isolation == "bwrap" else None
        self._proc_masks = [name for name in _MASKED_PROC_FILES if os.path.isfile(f"/proc/{name}")]
        self._proc_hidden_directories = [name for name in _MASKED_PROC_DIRECTORIES if os.path.isdir(f"/proc/{name}")]
        cpu_lines = "".join(f"cpu{index} 0 0 0 0 0 0 0 0 0 0\n" for index in range(os.cpu_count() or 1))
        self._proc_stat = (
            f"cpu  0 0 0 0 0 0 0 0 0 0\n{cpu_lines}intr 0\nctxt 0\nbtime 0\nprocesses 0\nprocs_running 1\n"
            "procs_blocked 0\nsoftirq 0 0 0 0 0 0 0 0 0 0 0\n"
        ).encode()
        self._root: PrivateRoot | None = None
        self._root_args: list[str] = []
        if isolation == "bwrap" and filesystem == "private":
            self._make_root()
        if isolation == "bwrap" and filesystem == "host":
            _check_prefix(_interpreter_prefix(self.python))
        if isolation == "bwrap":
            self._seccomp_program = _seccomp_program(platform.machine())
            if self._seccomp_program is None:
                logger.warning(
                    "Sandbox: no system-call table for %s (x86_64 and aarch64 have one), so sandboxed programs can "
                    "use System V IPC, memfds and the kernel keyring: memory they hold there escapes the memory "
                    "limit, and the trainer's session keyring is reachable.",
                    platform.machine(),
                )
        self._check_works()

    def _drops_privileges(self) -> bool:
        return self._as_root and self.isolation == "bwrap"

    def _resolve_python(self, python: str | None) -> str:
        def usable(candidate: str) -> bool:
            if not os.path.isfile(candidate) or not os.access(candidate, os.X_OK):
                return False
            return _path_reachable_by_others(candidate) if self._drops_privileges() else True

        if python is not None:
            if not usable(python):
                who = "the sandbox's uids" if self._drops_privileges() else "this user"
                raise ValueError(
                    f"python={python!r} is not an executable interpreter that {who} can read; pass another "
                    "interpreter (e.g. /usr/bin/python3) or make its directories world-readable."
                )
            return os.path.realpath(python)
        for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
            if candidate and usable(candidate):
                return os.path.realpath(candidate)
        raise RuntimeError(
            f"No Python interpreter the sandbox user can run (tried {sys.executable}, /usr/bin/python3); install one "
            "(apt-get install python3) or pass Sandbox(python=...)."
        )

    def _check_works(self) -> None:
        result = self.run(["/bin/true"], _check=False)
        if result.status != "ok":
            hint = (
                " Unprivileged user namespaces may be disabled (sysctl kernel.unprivileged_userns_clone=1, "
                "user.max_user_namespaces > 0, or the AppArmor rule of Ubuntu 24.04 for bwrap)."
                if self.isolation == "bwrap"
                else ""
            )
            raise RuntimeError(
                f"The sandbox does not start on this machine (status {result.status}, exit {result.returncode}): "
                f"{(result.stderr or result.detail).strip()[:500]}.{hint}"
            )

    def _limit_args(self) -> list[str]:
        limits = self.limits
        cpu = max(1, math.ceil(limits.cpu_time_s))
        return [
            self._prlimit,
            f"--cpu={cpu}:{cpu + 1}",
            f"--as={limits.memory_bytes}",
            f"--fsize={limits.file_size_bytes}",
            f"--nproc={limits.max_processes}",
            f"--nofile={limits.max_open_files}",
            "--memlock=0",
            "--core=0",
            "--",
        ]

    def _env(self, channel_fd: int | None, home: str) -> dict[str, str]:
        env = {"PATH": _SANDBOX_PATH, "HOME": home, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        env.update(dict.fromkeys(_THREAD_VARIABLES, "1"))
        if channel_fd is not None:
            env["SANDBOX_CHANNEL_FD"] = str(channel_fd)
        return env

    def _bwrap_args(
        self,
        files: Mapping[str, int],
        channel_fd: int | None,
        status_fd: int,
        seccomp_fd: int | None,
        proc_stat_fd: int,
    ) -> list[str]:
        args = ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session"]
        args += ["--uid", "1000", "--gid", "1000", "--hostname", "sandbox"]
        args += self._root_args or self._host_binds()
        # /dev made by hand rather than with --dev, which adds /dev/ptmx and a devpts instance.
        args += ["--tmpfs", "/dev"]
        for device in _DEVICES:
            args += ["--dev-bind", f"/dev/{device}", f"/dev/{device}"]
        for link, target in _DEVICE_LINKS.items():
            args += ["--symlink", target, f"/dev/{link}"]
        args += ["--dir", "/dev/shm", "--proc", "/proc", "--ro-bind-data", str(proc_stat_fd), "/proc/stat"]
        for name in self._proc_masks:
            args += ["--dev-bind", "/dev/null", f"/proc/{name}"]
        for name in self._proc_hidden_directories:
            args += ["--tmpfs", f"/proc/{name}"]
        args += ["--size", str(self.limits.scratch_bytes), "--tmpfs", SCRATCH_DIR]
        for name, fd in files.items():
            args += ["--file", str(fd), f"{SCRATCH_DIR}/{name}"]
        args += ["--remount-ro", "/", "--remount-ro", "/dev"]
        for name in self._proc_hidden_directories:
            args += ["--remount-ro", f"/proc/{name}"]
        args += ["--chdir", SCRATCH_DIR, "--clearenv"]
        for key, value in self._env(channel_fd, SCRATCH_DIR).items():
            args += ["--setenv", key, value]
        # bubblewrap reports there the host PID of the sandbox's init and, once the program has run, its exit status:
        # out of the program's reach (bubblewrap closes it before exec), unlike its stderr.
        args += ["--json-status-fd", str(status_fd)]
        if seccomp_fd is not None:
            args += ["--seccomp", str(seccomp_fd)]
        return args

    def root_tools(self) -> list[str]:
        """The host paths of the commands the private filesystem copies besides the interpreter: ``prlimit``, which
        the sandbox runs, and `trl_ada.rewards.sandbox_root.ROOT_TOOLS` where the host has them."""
        tools = [self._prlimit, *(shutil.which(name, path=_SANDBOX_PATH) for name in ROOT_TOOLS)]
        return list(dict.fromkeys(tool for tool in tools if tool))

    def _make_root(self) -> None:
        self._root = shared_root(self.python, self.root_tools())
        self._root_args = self._root.bwrap_args()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        # In another process the copy may be gone with the process that made it: this one makes its own.
        if self._root is not None and not os.path.isdir(self._root.path):
            self._make_root()

    def _host_binds(self) -> list[str]:
        args = ["--ro-bind", "/usr", "/usr"]
        for link in ("/bin", "/lib", "/lib32", "/lib64", "/libx32", "/sbin"):
            if os.path.islink(link):
                args += ["--symlink", os.readlink(link), link]
            elif os.path.isdir(link):
                args += ["--ro-bind", link, link]
        for name in ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives"):
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        prefix = _interpreter_prefix(self.python)
        if prefix != "/usr" and not prefix.startswith("/usr/"):
            args += ["--ro-bind", prefix, prefix]
        return args

    def python_argv(self, script: str = PROGRAM_FILE, *args: str) -> list[str]:
        """The command that runs ``script`` (relative to the working directory) with the sandbox's interpreter:
        isolated mode (``-I``: no environment variables, no user site-packages, no script directory on the path)."""
        return [self.python, "-I", "-B", script, *args]

    def run(
        self,
        argv: Sequence[str] | None = None,
        *,
        program: str | None = None,
        stdin: str | bytes = b"",
        files: Mapping[str, str | bytes] | None = None,
        channel: bool = False,
        _check: bool = True,
    ) -> SandboxResult:
        """Runs one program in a fresh sandbox and returns when it and every process it started are gone.

        Args:
            argv: The command, run in the working directory (``/tmp`` inside). Default: the sandbox's Python on
                ``main.py`` (``program``, or ``files["main.py"]``).
            program: Python source, written to ``main.py`` in the working directory.
            stdin: The program's standard input (then end of file).
            files: More files for the working directory, ``{name: content}`` (plain names, no ``/``).
            channel: Give the program an extra pipe, write end at the fd number in ``$SANDBOX_CHANNEL_FD``, read back
                as ``SandboxResult.channel``; the program can write to it too, so trust only data it cannot forge.

        Raises:
            ValueError: on a bad argument (no command, a file name with a path separator), before anything runs.
        """
        files = dict(files or {})
        if program is not None:
            if PROGRAM_FILE in files:
                raise ValueError(f"Pass the program either as program= or as files[{PROGRAM_FILE!r}], not both.")
            files[PROGRAM_FILE] = program
        if argv is None:
            if PROGRAM_FILE not in files:
                raise ValueError(f"Sandbox.run needs argv, or program= (Python source to run as {PROGRAM_FILE}).")
            argv = self.python_argv()
        argv = [str(arg) for arg in argv]
        if not argv:
            raise ValueError("Sandbox.run got an empty argv.")
        for name in files:
            if not name or "/" in name or name in (".", ".."):
                raise ValueError(f"File names must be plain names in the working directory, got {name!r}.")
        stdin_bytes = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
        if self.isolation == "bwrap":
            return self._run_bwrap(argv, files, stdin_bytes, channel)
        return self._run_plain(argv, files, stdin_bytes, channel)

    def _run_bwrap(
        self, argv: list[str], files: Mapping[str, str | bytes], stdin: bytes, channel: bool
    ) -> SandboxResult:
        file_fds: dict[str, int] = {}
        read_fd = write_fd = seccomp_fd = None
        cgroup: _MemoryCgroup | None = None
        cpu_cgroup: _CpuCgroup | None = None
        uid_lease: _UidLease | None = None
        status_read, status_write = os.pipe()
        open_fds = {status_read, status_write}

        def memfd(name: str, data: bytes) -> int:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
            open_fds.add(fd)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.lseek(fd, 0, os.SEEK_SET)
            return fd

        try:
            for name, content in files.items():
                file_fds[name] = memfd(f"sandbox-{name}", content.encode() if isinstance(content, str) else content)
            if self._seccomp_program is not None:
                seccomp_fd = memfd("sandbox-seccomp", self._seccomp_program)
            proc_stat_fd = memfd("sandbox-proc-stat", self._proc_stat)
            if channel:
                read_fd, write_fd = os.pipe()
                open_fds.update((read_fd, write_fd))
            write_ends = [status_write, *([write_fd] if write_fd is not None else [])]
            user = {}
            if self._drops_privileges():
                uid_lease = _UidLease.take(self.run_as_uids)
                if uid_lease is None:
                    return SandboxResult(
                        "sandbox_error", None, detail=f"every uid of {self.run_as_uids} is held by a running sandbox"
                    )
                user = {"user": uid_lease.uid, "group": uid_lease.uid, "extra_groups": []}
            # bubblewrap reads its options from a memfd, so the sandbox's init (bubblewrap, /proc/1/cmdline inside)
            # shows none of the host's paths or descriptors; only the command it runs is on its command line.
            options = self._bwrap_args(file_fds, write_fd, status_write, seccomp_fd, proc_stat_fd)
            options_fd = memfd("sandbox-args", b"".join(option.encode() + b"\0" for option in options))
            command = [self._bwrap, "--args", str(options_fd), "--", *self._limit_args()]
            if self.memory_cgroup is not None:
                try:
                    cgroup = _MemoryCgroup(self.memory_cgroup, self.limits.memory_bytes + self.limits.scratch_bytes)
                    if uid_lease is not None:
                        cgroup.let_enter(uid_lease.uid)
                except OSError as error:
                    return SandboxResult("sandbox_error", None, detail=f"could not create a memory cgroup: {error}")
            if self.cpu_cgroup is not None:
                try:
                    cpu_cgroup = _CpuCgroup(self.cpu_cgroup, self.limits.cpus)
                    if uid_lease is not None:
                        cpu_cgroup.let_enter(uid_lease.uid)
                except (OSError, ValueError) as error:
                    return SandboxResult("sandbox_error", None, detail=f"could not create a cpu cgroup: {error}")
            run_cgroups = [group for group in (cgroup, cpu_cgroup) if group is not None]
            if run_cgroups:
                command = _entering(self._shell, run_cgroups, command)
            pass_fds = [*file_fds.values(), *write_ends, options_fd, proc_stat_fd]
            pass_fds += [seccomp_fd] if seccomp_fd is not None else []
            return self._communicate(
                command + argv,
                stdin,
                pass_fds,
                read_fd,
                write_ends,
                open_fds,
                status_read,
                cgroup,
                env={},
                cwd="/",
                **user,
            )
        finally:
            for fd in open_fds:
                os.close(fd)
            for group in (cgroup, cpu_cgroup):
                if group is not None:
                    group.remove()
            if uid_lease is not None:
                uid_lease.release()

    def _run_plain(
        self, argv: list[str], files: Mapping[str, str | bytes], stdin: bytes, channel: bool
    ) -> SandboxResult:
        with tempfile.TemporaryDirectory(prefix="trl-ada-sandbox-") as workdir:
            for name, content in files.items():
                mode = "w" if isinstance(content, str) else "wb"
                with open(os.path.join(workdir, name), mode) as handle:
                    handle.write(content)
            read_fd = write_fd = None
            open_fds: set[int] = set()
            if channel:
                read_fd, write_fd = os.pipe()
                open_fds.update((read_fd, write_fd))
            write_ends = [write_fd] if write_fd is not None else []
            try:
                return self._communicate(
                    self._limit_args() + argv,
                    stdin,
                    list(write_ends),
                    read_fd,
                    write_ends,
                    open_fds,
                    None,
                    None,
                    env=self._env(write_fd, workdir),
                    cwd=workdir,
                    start_new_session=True,
                )
            finally:
                for fd in open_fds:
                    os.close(fd)

    def _communicate(
        self,
        command: list[str],
        stdin: bytes,
        pass_fds: list[int],
        read_fd: int | None,
        write_ends: list[int],
        open_fds: set[int],
        status_fd: int | None,
        cgroup: _MemoryCgroup | None,
        **popen_kwargs: object,
    ) -> SandboxResult:
        """Starts ``command``, feeds ``stdin``, collects stdout, stderr and the channel (``read_fd``) within the limits,
        and kills the sandbox on a limit. ``write_ends`` (the sandbox's ends of our pipes) are closed once it has
        started, and removed from ``open_fds`` (what the caller closes). ``status_fd``: the read end of bubblewrap's
        ``--json-status-fd``; ``cgroup``: the run's memory cgroup (asked after a limit kill)."""
        limits = self.limits
        start = time.monotonic()
        deadline = start + limits.wall_time_s
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=pass_fds,
                close_fds=True,
                **popen_kwargs,  # type: ignore[arg-type]
            )
        except OSError as error:
            return SandboxResult("sandbox_error", None, detail=f"could not start {command[0]}: {error}")
        for fd in write_ends:  # only the sandbox holds them now: EOF when it is gone
            os.close(fd)
            open_fds.discard(fd)
        status = _BwrapStatus(status_fd)
        killed_for: Status | None = None
        assert process.stdout is not None and process.stderr is not None and process.stdin is not None
        out_fd, err_fd = process.stdout.fileno(), process.stderr.fileno()
        buffers: dict[int, bytearray] = {}
        selector = selectors.DefaultSelector()
        readers = {"stdout": out_fd, "stderr": err_fd, **({"channel": read_fd} if read_fd is not None else {})}
        for name, fd in readers.items():
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ, name)
            buffers[fd] = bytearray()
        stdin_fd = process.stdin.fileno()
        os.set_blocking(stdin_fd, False)
        pending_stdin = memoryview(stdin)
        if pending_stdin:
            selector.register(stdin_fd, selectors.EVENT_WRITE, "stdin")
        else:
            process.stdin.close()
        exited_at: float | None = None
        try:
            while killed_for is None and selector.get_map():
                now = time.monotonic()
                if now >= deadline:
                    killed_for = "timeout"
                    break
                if exited_at is None and process.poll() is not None:
                    exited_at = now
                status.read()  # the init's PID, pinned by a pidfd while bubblewrap, its parent, is alive
                if exited_at is not None and self.isolation == "none" and now - exited_at > 0.5:
                    break  # a leftover child holds a pipe open; the process group is killed below
                for key, _ in selector.select(timeout=min(0.1, deadline - now)):
                    if key.data == "stdin":
                        try:
                            pending_stdin = pending_stdin[os.write(stdin_fd, pending_stdin[:_READ_CHUNK]) :]
                        except BlockingIOError:
                            continue
                        except OSError:  # the program closed its stdin
                            pending_stdin = pending_stdin[:0]
                        if not pending_stdin:
                            selector.unregister(stdin_fd)
                            process.stdin.close()
                        continue
                    try:
                        chunk = os.read(key.fd, _READ_CHUNK)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        selector.unregister(key.fd)
                        continue
                    buffer = buffers[key.fd]
                    buffer += chunk
                    if len(buffer) > limits.output_bytes:
                        del buffer[limits.output_bytes :]
                        killed_for = "output_limit"
                        break
                if killed_for is not None:
                    break
        finally:
            selector.close()
            if killed_for is None and process.poll() is None:
                # The outputs are closed but bubblewrap is still tearing the namespace down: wait, within the limit.
                try:
                    process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    killed_for = "timeout"
                except BaseException:  # interrupted: do not leave the sandbox running
                    self._kill(process, status)
                    status.close()
                    raise
            if killed_for is not None or process.poll() is None or self.isolation == "none":
                self._kill(process, status)
            returncode = process.wait()
            status.read()
            status.wait_for_init()
            status.close()
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None and not stream.closed:
                    try:
                        stream.close()
                    except OSError:
                        pass
        wall = time.monotonic() - start
        stdout_bytes, stderr_bytes = bytes(buffers[out_fd]), bytes(buffers[err_fd])
        channel_bytes = bytes(buffers[read_fd]) if read_fd is not None else b""
        outcome: Status
        detail = ""
        if killed_for is not None:
            outcome, code = killed_for, None
            detail = {"timeout": "wall-clock limit", "output_limit": "output limit"}.get(killed_for, "")
        else:
            code = returncode if returncode >= 0 else 128 - returncode
            if status_fd is not None and status.exit_code is None:
                # bubblewrap records the exit status of every program that ran: none means it failed to set up.
                outcome, detail = "sandbox_error", (stderr_bytes.decode("utf-8", "replace").strip() or f"exit {code}")
            else:
                outcome, detail = self._classify(code, stderr_bytes)
            # bubblewrap runs in the cgroup too: at the cap the OOM killer may take it before it records the status.
            if outcome != "ok" and cgroup is not None and cgroup.oom_killed():
                outcome, detail = "memory", "sandbox memory limit (memory_bytes + scratch_bytes, all processes)"
        return SandboxResult(
            status=outcome,
            returncode=code,
            stdout=stdout_bytes.decode("utf-8", "replace"),
            stderr=stderr_bytes.decode("utf-8", "replace"),
            channel=channel_bytes,
            wall_time_s=wall,
            detail=detail,
        )

    def _classify(self, code: int, stderr: bytes) -> tuple[Status, str]:
        if code == 0:
            return "ok", ""
        if code in (128 + signal.SIGXCPU, 128 + signal.SIGKILL):
            return "timeout", "CPU limit" if code == 128 + signal.SIGXCPU else "killed (CPU hard limit)"
        if code == 128 + signal.SIGXFSZ:
            return "output_limit", "file size limit"
        tail = stderr.rstrip().rsplit(b"\n", 1)[-1]
        if tail.startswith(b"MemoryError") or b"Cannot allocate memory" in tail:
            return "memory", "memory limit"
        return "error", f"exit status {code}"

    def _kill(self, process: subprocess.Popen[bytes], status: _BwrapStatus) -> None:
        """Kills the sandbox and returns once every process in it is gone: under bubblewrap its init, not bubblewrap
        (which would return mid-teardown: the kernel kills the whole PID namespace, and the init becomes reapable only
        once it is empty), else the program's process group (a ``setsid`` child escapes it)."""
        if self.isolation == "none":
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return
        status.read()
        # Before bubblewrap has started the sandbox its init follows it (--die-with-parent).
        if not status.kill_init():
            try:
                process.kill()
            except ProcessLookupError:
                pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        status.read()
        status.wait_for_init()

    def with_limits(self, limits: SandboxLimits) -> Sandbox:
        """This sandbox with other limits (a shorter wall, a smaller output cap): a shallow copy that shares the set-up
        checked at construction, so nothing is rebuilt or checked again."""
        if not isinstance(limits, SandboxLimits):
            raise TypeError(f"limits must be a SandboxLimits, got {type(limits).__name__}.")
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__, limits=limits)
        return other

    def __repr__(self) -> str:
        return (
            f"Sandbox(isolation={self.isolation!r}, filesystem={self.filesystem!r}, python={self.python!r}, "
            f"limits={self.limits!r})"
        )


class _BwrapStatus:
    """What bubblewrap writes to its ``--json-status-fd``: ``{"child-pid": N, ...}`` once the sandbox's init exists,
    ``{"exit-code": N}`` once the program has run (none when the set-up failed). Holds a pidfd of that init, opened
    while bubblewrap still keeps it from being reaped, so the signal and the wait reach that process and no other."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.data = bytearray()
        self.child_pid: int | None = None
        self.exit_code: int | None = None
        self.pidfd: int | None = None
        self.ended = False  # end of file: bubblewrap and its init have closed it
        if fd is not None:
            os.set_blocking(fd, False)

    def read(self) -> None:
        if self.fd is None:
            return
        try:
            while chunk := os.read(self.fd, 4096):
                self.data += chunk
            self.ended = True
        except OSError:  # BlockingIOError: nothing more for now
            pass
        for line in bytes(self.data).split(b"\n"):
            try:
                record = json.loads(line)
            except ValueError:  # the line is not complete yet
                continue
            if not isinstance(record, dict):
                continue
            pid, code = record.get("child-pid"), record.get("exit-code")
            if self.child_pid is None and isinstance(pid, int) and pid > 1:
                self.child_pid = pid
                try:
                    self.pidfd = os.pidfd_open(pid)
                except OSError:  # already gone
                    pass
            if isinstance(code, int):
                self.exit_code = code

    def kill_init(self) -> bool:
        """SIGKILLs the sandbox's init; whether its PID was known."""
        if self.child_pid is None:
            return False
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self.child_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return True

    def wait_for_init(self, timeout_s: float = 10.0) -> None:
        """Returns once the sandbox's init has exited (so every process of its PID namespace is gone), and reaps it
        if it was reparented to this process (a trainer that is PID 1): else a zombie per run. The wait names the
        init's pidfd, so no other child's exit status (``subprocess``'s, ``asyncio``'s) is taken."""
        if self.pidfd is None:
            return
        if not _wait_readable(self.pidfd, time.monotonic() + timeout_s):  # a pidfd is readable once it has exited
            logger.warning(
                "The sandbox's init (PID %s) did not exit within %s s of bubblewrap.", self.child_pid, timeout_s
            )
            return
        try:
            os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            pass

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


class _UidLease:
    """A host uid held by one run, so no two sandboxes share the kernel's per-user budgets. The hold is a bound
    abstract unix socket named after the uid, released when this process closes it or dies, so trainer processes on
    one machine (one network namespace) never hand out the same uid at once."""

    def __init__(self, uid: int, holder: socket.socket) -> None:
        self.uid, self._holder = uid, holder

    @classmethod
    def take(cls, uids: range) -> _UidLease | None:
        """A free uid of ``uids`` (tried from a random one on), or ``None`` when every one is held."""
        first = random.randrange(len(uids))
        for index in range(len(uids)):
            uid = uids[(first + index) % len(uids)]
            holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                holder.bind(f"\0trl-ada-sandbox-uid-{uid}")
            except OSError:
                holder.close()
                continue
            return cls(uid, holder)
        return None

    def release(self) -> None:
        self._holder.close()


_cgroups_to_remove: list[str] = []  # of runs whose processes had not all exited when the run ended


def _cgroup_parent(controller: str, control_file: str) -> str | None:
    """This process's directory in the cgroup v1 hierarchy of ``controller`` (``memory``, ``cpu``) when it may create
    cgroups there (root on a host or VM with cgroup v1 or hybrid) and the directory has ``control_file``, else
    ``None``."""
    try:
        with open("/proc/self/mountinfo") as handle:
            mounts = [line.split() for line in handle]
        with open("/proc/self/cgroup") as handle:
            memberships = [line.rstrip("\n").split(":", 2) for line in handle]
    except OSError:
        return None
    for fields in mounts:
        tail = fields[fields.index("-") + 1 :] if "-" in fields else []
        if len(tail) < 3 or tail[0] != "cgroup" or controller not in tail[2].split(","):
            continue
        root, mount_point = fields[3], fields[4]
        for membership in memberships:
            if len(membership) != 3 or controller not in membership[1].split(","):
                continue
            path = membership[2]
            if not (path + "/").startswith(root.rstrip("/") + "/"):
                continue
            parent = os.path.join(mount_point, path[len(root.rstrip("/")) :].lstrip("/"))
            if os.path.isfile(os.path.join(parent, control_file)) and os.access(parent, os.W_OK):
                return parent
    return None


class _RunCgroup:
    """A cgroup (v1) of one run, in the hierarchy of ``parent``: bubblewrap is started in it (``_entering``), so it
    is the root of the sandbox's cgroup namespace."""

    def __init__(self, parent: str) -> None:
        for path in list(_cgroups_to_remove):  # earlier runs' leftovers, empty by now
            try:
                os.rmdir(path)
                _cgroups_to_remove.remove(path)
            except (OSError, ValueError):
                pass
        # A random name, which nothing inside the sandbox sees; a later run gets another.
        self.path = os.path.join(parent, f"trl-ada-sandbox-{os.urandom(8).hex()}")
        os.mkdir(self.path)

    def _write(self, name: str, value: int) -> None:
        with open(os.path.join(self.path, name), "w") as handle:
            handle.write(str(value))

    def let_enter(self, uid: int) -> None:
        """Lets ``uid`` (the run's) move its own process in, through the cgroup's ``tasks`` file."""
        os.chown(os.path.join(self.path, "tasks"), uid, uid)

    def remove(self) -> None:
        """Removes the cgroup once the sandbox's processes are gone."""
        deadline = time.monotonic() + 1
        while True:
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:  # EBUSY: a process of the sandbox has not exited yet
                if time.monotonic() > deadline:
                    _cgroups_to_remove.append(self.path)
                    return
                time.sleep(0.001)


class _MemoryCgroup(_RunCgroup):
    """The capped memory cgroup (v1) of one run: every process of the sandbox and the kernel memory they cause are
    charged to it. It is removed without ``memory.force_empty``, which would evict pages the next runs need
    (docs/code-rl.md)."""

    def __init__(self, parent: str, limit_bytes: int) -> None:
        super().__init__(parent)
        try:
            self._write("memory.limit_in_bytes", limit_bytes)
            try:  # with swap accounting, swap counts too (memsw >= memory)
                self._write("memory.memsw.limit_in_bytes", limit_bytes)
            except OSError:
                pass
        except OSError:
            os.rmdir(self.path)
            raise

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the sandbox at the cgroup's limit."""
        try:
            with open(os.path.join(self.path, "memory.oom_control")) as handle:
                counters = dict(line.split(None, 1) for line in handle if line.strip())
        except OSError:
            return False
        return counters.get("oom_kill", "0").strip() != "0"


class _CpuCgroup(_RunCgroup):
    """The cpu cgroup (v1) of one run, with a CFS quota of ``cpus`` CPUs: the sandbox's processes share that much CPU
    time per period, however many they are."""

    def __init__(self, parent: str, cpus: float) -> None:
        super().__init__(parent)
        try:
            with open(os.path.join(self.path, "cpu.cfs_period_us")) as handle:
                period_us = int(handle.read())
            self._write("cpu.cfs_quota_us", max(1000, round(cpus * period_us)))  # the kernel's smallest quota: 1 ms
        except (OSError, ValueError):
            os.rmdir(self.path)
            raise


def _entering(shell: str, cgroups: Sequence[_RunCgroup], command: list[str]) -> list[str]:
    """``command`` started in ``cgroups``: a shell writes ``0`` (itself) to each one's ``tasks`` file, then execs it,
    and fails with the kernel's message if it cannot. Moving only itself skips the kernel's global lock that a move by
    PID takes (an RCU grace period each time)."""
    tasks = [os.path.join(group.path, "tasks") for group in cgroups]
    script = " && ".join(['echo 0 >"$0"', *['echo 0 >"$1" && shift'] * (len(tasks) - 1), 'exec "$@"'])
    return [shell, "-c", script, *tasks, *command]


def _wait_readable(fd: int, deadline: float) -> bool:
    """Waits until ``fd`` is readable (data or end of file); ``False`` at the deadline."""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        return bool(selector.select(timeout=max(0.0, deadline - time.monotonic())))


def _seccomp_program(machine: str) -> bytes | None:
    """The classic-BPF program for bubblewrap's ``--seccomp``: EPERM for the calls of ``_DENIED_SYSCALLS`` on
    ``machine`` (``platform.machine()``), for ``fcntl``'s commands of ``_DENIED_FCNTL_COMMANDS``, for ``clone`` with
    CLONE_PIDFD and for every call of another ABI (32-bit, x32), whose numbers differ; EAGAIN for a ``futex`` wait on a
    shared key; ENOSYS for ``clone3``; ``None`` on an architecture without a table."""
    if machine not in _DENIED_SYSCALLS:
        return None
    arch, numbers, second_abi = _DENIED_SYSCALLS[machine]
    # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_JMP|BPF_JGE|BPF_K, BPF_JMP|BPF_JSET|BPF_K, BPF_ALU|BPF_AND|BPF_K,
    # BPF_RET|BPF_K
    load_word, jump_equal, jump_greater_equal, jump_set, alu_and, ret = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
    allow, errno_action = 0x7FFF0000, 0x00050000  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO
    # Offsets in struct seccomp_data: nr, arch, then args[] from 16, 8 bytes each; the arguments read here are ints
    # (fcntl's command, futex's operation) or flags in the low word (clone's), which comes first on a little-endian
    # machine.
    nr_offset, arch_offset = 0, 4
    low_word = 0 if sys.byteorder == "little" else 4
    first_argument, second_argument = 16 + low_word, 16 + 8 + low_word
    # Instructions as (code, value, label taken, label not taken); labels are resolved to relative jumps below.
    code: list[tuple[int, int, str | None, str | None]] = [
        (load_word, arch_offset, None, None),
        (jump_equal, arch, None, "deny"),
        (load_word, nr_offset, None, None),
    ]
    if second_abi is not None:
        code.append((jump_greater_equal, second_abi, "deny", None))
    code += [(jump_equal, number, "deny", None) for number in sorted(set(numbers.values()))]
    code.append((jump_equal, _FCNTL_SYSCALL[machine], "fcntl", None))
    code.append((jump_equal, _FUTEX_SYSCALL[machine], "futex", None))
    code.append((jump_equal, _CLONE_SYSCALL[machine], "clone", None))
    code.append((jump_equal, _CLONE3_SYSCALL[machine], "enosys", None))
    code.append((ret, allow, None, None))
    labels = {"fcntl": len(code)}
    code.append((load_word, second_argument, None, None))
    code += [(jump_equal, command, "deny", None) for command in _DENIED_FCNTL_COMMANDS]
    code.append((ret, allow, None, None))
    labels["futex"] = len(code)
    code.append((load_word, second_argument, None, None))
    code.append((jump_set, _FUTEX_PRIVATE_FLAG, "allow", None))
    code.append((alu_and, 0xFFFFFFFF & ~_FUTEX_CLOCK_REALTIME, None, None))
    code += [(jump_equal, command, "allow", None) for command in _SHARED_FUTEX_COMMANDS]
    code.append((ret, errno_action | errno.EAGAIN, None, None))
    labels["clone"] = len(code)
    code.append((load_word, first_argument, None, None))
    code.append((jump_set, _CLONE_PIDFD, "deny", "allow"))
    labels["allow"] = len(code)
    code.append((ret, allow, None, None))
    labels["enosys"] = len(code)
    code.append((ret, errno_action | errno.ENOSYS, None, None))
    labels["deny"] = len(code)
    code.append((ret, errno_action | errno.EPERM, None, None))

    def offset(index: int, label: str | None) -> int:
        return 0 if label is None else labels[label] - index - 1

    return b"".join(
        struct.pack("=HBBI", op, offset(i, taken), offset(i, not_taken), value)
        for i, (op, value, taken, not_taken) in enumerate(code)
    )


def bwrap_available() -> bool:
    """Whether bubblewrap is installed (on ``PATH``)."""
    return shutil.which("bwrap") is not None


__all__ = [
    "INSTALL_HINT",
    "PROGRAM_FILE",
    "SCRATCH_DIR",
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "bwrap_available",
]
