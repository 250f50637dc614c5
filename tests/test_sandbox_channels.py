"""Covert channels, machine-wide budgets, memory and CPU of the code sandbox, checked the way a reward-hacking policy
would use them: through the public code reward (`CodeExecutionReward.score`), a reader that computes nothing beside a
writer that knows the answer (each beside its control: the reader alone), a hostile program beside what it would
take from the machine, and programs that show a refused call fails inside the sandbox.

Each answer is a random number from 1 to 63 that only the writer's program holds; the reader's program reports what it
received. Windows are short (about 1.5 s a run), so every test takes a few seconds."""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import json
import os
import platform
import random
import shutil
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from trl_ada.rewards import sandbox as sandbox_module
from trl_ada.rewards.code import CodeExecutionReward
from trl_ada.rewards.sandbox import INSTALL_HINT, Sandbox, SandboxLimits

CI = os.environ.get("CI", "").lower() == "true"
HAVE_BWRAP = shutil.which("bwrap") is not None
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP and not CI, reason=f"bubblewrap is not installed: {INSTALL_HINT}")
MACHINE = platform.machine()
needs_table = pytest.mark.skipif(MACHINE not in ("x86_64", "aarch64"), reason="system call numbers for x86_64/aarch64")

LIMITS = SandboxLimits(wall_time_s=8, cpu_time_s=5, max_processes=16)
NUMBERS = {
    "x86_64": {"futex": 202, "fanotify_init": 300, "fanotify_mark": 301, "io_setup": 206, "io_destroy": 207},
    "aarch64": {"futex": 98, "fanotify_init": 262, "fanotify_mark": 263, "io_setup": 0, "io_destroy": 1},
}.get(MACHINE, {})

pytestmark = [
    pytest.mark.usefixtures("wall_clock_guard", "no_sandbox_outlives_the_tests"),
    pytest.mark.wall_clock_limit(60),
    needs_bwrap,
    needs_table,
]


@pytest.fixture(scope="module")
def reward() -> CodeExecutionReward:
    if not HAVE_BWRAP:  # only under CI=true
        pytest.fail(f"CI=true but bubblewrap is not installed: {INSTALL_HINT}")
    return CodeExecutionReward(limits=LIMITS, concurrency=2)


def fenced(code: str) -> str:
    return f"My answer:\n```python\n{code}\n```"


def answer_tests(value: int) -> str:
    return f"assert answer() == {value}"


VALUES = random.Random(0)
"""The answers the writers hide (seeded: a failure reruns with the same values)."""


def with_value(template: str, value: int) -> str:
    return template.replace("__VALUE__", str(value))


def assert_no_channel(reward: CodeExecutionReward, writer: str, reader: str, channel: str) -> None:
    """The writer (a template holding ``__VALUE__``) scores 1.0 with a value in 1..63, the reader alone 0.0 (the
    control), and the reader beside the writer 0.0: nothing of the writer's answer reaches it through `channel`."""
    value = VALUES.randrange(1, 64)
    alone, writer_score, reader_score = side_by_side(reward, with_value(writer, value), reader, value)
    assert (alone, writer_score) == (0.0, 1.0), reward.last_row_outcomes
    assert reader_score == 0.0, f"the reader received the writer's answer through {channel}"


def side_by_side(reward: CodeExecutionReward, writer: str, reader: str, value: int) -> tuple[float, float, float]:
    """The reader alone (the control), then the writer and the reader in one batch, run at once: (reader alone, writer,
    reader beside the writer)."""
    tests = answer_tests(value)
    [alone] = reward.score([fenced(reader)], tests=[tests])
    writer_score, reader_score = reward.score([fenced(writer), fenced(reader)], tests=[tests, tests])
    return alone, writer_score, reader_score


PRELUDE = f"""
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NUMBERS = {NUMBERS!r}
STDLIB = os.path.dirname(os.__file__)
def syscall(name, *args):
    result = libc.syscall(NUMBERS[name], *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return result if result >= 0 else -ctypes.get_errno()
"""

# ---------------------------------------------------------------------------------------------------------------------
# Channels between the programs of one batch (every sandbox maps the same private copy)
# ---------------------------------------------------------------------------------------------------------------------

FUTEX_PAGE = (
    PRELUDE
    + """
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open(os.path.join(STDLIB, "wsgiref", "util.py"), os.O_RDONLY)
PAGE = libc.mmap(None, 4096, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED: the page every sandbox maps
def word(bit):
    return ctypes.c_void_p(PAGE + 4 * bit)
"""
)
FUTEX_WRITER = (
    FUTEX_PAGE
    + """
import threading
V = __VALUE__
def wait(bit):  # FUTEX_WAIT without FUTEX_PRIVATE_FLAG: a key on the file's page
    expected = ctypes.c_uint32.from_address(PAGE + 4 * bit).value
    syscall("futex", word(bit), 0, expected, (ctypes.c_long * 2)(2, 500_000_000), None, 0)
waiters = [threading.Thread(target=wait, args=(bit,)) for bit in range(6) if V >> bit & 1]
for waiter in waiters:
    waiter.start()
for waiter in waiters:
    waiter.join()
def answer():
    return V
"""
)
FUTEX_READER = (
    FUTEX_PAGE
    + """
time.sleep(1.0)
V = sum(1 << bit for bit in range(6) if syscall("futex", word(bit), 1, 1, None, None, 0) == 1)  # FUTEX_WAKE
def answer():
    return V
"""
)


def test_shared_futex_keys_on_the_copys_files_carry_nothing(reward):
    """A writer waits on futex keys of a page of a stdlib file, one per set bit of its answer; the reader wakes each key
    and counts who woke. Shared waits are refused (EAGAIN), so no key of the copy ever has a waiter."""
    assert_no_channel(reward, FUTEX_WRITER, FUTEX_READER, "shared futex keys")


FANOTIFY_FILES = (
    PRELUDE
    + """
FOLDER = os.path.join(STDLIB, "wsgiref")
FILES = [os.path.join(FOLDER, name) for name in sorted(os.listdir(FOLDER)) if name.endswith(".py")][:6]
"""
)
FANOTIFY_WRITER = (
    FANOTIFY_FILES
    + """
V = __VALUE__
start = time.monotonic()
time.sleep(0.3)
while time.monotonic() - start < 1.3:
    for bit, path in enumerate(FILES):
        if V >> bit & 1:
            os.close(os.open(path, os.O_RDONLY))
    time.sleep(0.05)
def answer():
    return V
"""
)
FANOTIFY_READER = (
    FANOTIFY_FILES
    + """
import select
groups = []
for path in FILES:  # one group per bit, FAN_CLASS_NOTIF | FAN_REPORT_FID (what an unprivileged user may make)
    group = syscall("fanotify_init", 0x200, os.O_RDONLY)
    if group >= 0:  # FAN_MARK_ADD of FAN_OPEN on the file's inode
        syscall("fanotify_mark", group, 1, ctypes.c_uint64(0x20), -100, path.encode())
    groups.append(group)
time.sleep(1.5)
V = sum(1 << bit for bit, group in enumerate(groups) if group >= 0 and select.select([group], [], [], 0)[0])
def answer():
    return V
"""
)


def test_fanotify_marks_on_the_copys_files_carry_nothing(reward):
    """The reader marks six stdlib files for open events; the writer opens those of its answer's set bits. fanotify is
    refused as inotify is."""
    assert_no_channel(reward, FANOTIFY_WRITER, FANOTIFY_READER, "fanotify")


DNOTIFY_DIRECTORIES = (
    PRELUDE
    + """
DIRECTORIES = [os.path.join(STDLIB, name) for name in ("wsgiref", "xmlrpc", "dbm", "curses", "tomllib", "zoneinfo")]
"""
)
DNOTIFY_WRITER = (
    DNOTIFY_DIRECTORIES
    + """
V = __VALUE__
start = time.monotonic()
time.sleep(0.3)
while time.monotonic() - start < 1.3:
    for bit, directory in enumerate(DIRECTORIES):
        if V >> bit & 1:
            with open(os.path.join(directory, "__init__.py"), "rb") as handle:
                handle.read()
    time.sleep(0.05)
def answer():
    return V
"""
)
DNOTIFY_READER = (
    DNOTIFY_DIRECTORIES
    + """
import fcntl, signal
SIGNALS = [signal.SIGRTMIN + bit for bit in range(6)]
signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
handles = []
for bit, directory in enumerate(DIRECTORIES):  # each directory's reads raise its own realtime signal
    handle = os.open(directory, os.O_RDONLY)
    try:
        fcntl.fcntl(handle, 10, SIGNALS[bit])  # F_SETSIG
        fcntl.fcntl(handle, fcntl.F_NOTIFY, fcntl.DN_ACCESS | fcntl.DN_MULTISHOT)
    except OSError:
        pass
    handles.append(handle)
V, deadline = 0, time.monotonic() + 1.5
while (left := deadline - time.monotonic()) > 0:
    info = signal.sigtimedwait(SIGNALS, left)
    if info is not None:
        V |= 1 << SIGNALS.index(info.si_signo)
def answer():
    return V
"""
)


def test_directory_notifications_on_the_copy_carry_nothing(reward):
    """The reader asks ``fcntl(F_NOTIFY)`` for reads in six stdlib directories; the writer reads a file in those of its
    answer's set bits. F_NOTIFY is refused, as are leases."""
    assert_no_channel(reward, DNOTIFY_WRITER, DNOTIFY_READER, "F_NOTIFY")


PTY_WRITER = """
import os, time
V = __VALUE__
time.sleep(0.3)
held = []
try:
    held = [os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY) for _ in range(V)]
except OSError:
    pass
time.sleep(1.0)
for handle in held:
    os.close(handle)
def answer():
    return V
"""
PTY_READER = """
import time
counts, deadline = [], time.monotonic() + 1.8
while time.monotonic() < deadline:
    try:
        with open("/proc/sys/kernel/pty/nr") as handle:
            counts.append(int(handle.read()))
    except (OSError, ValueError):
        break
    time.sleep(0.02)
V = max(counts) - min(counts) if counts else -1
def answer():
    return V
"""


def test_the_machines_pseudo_terminal_count_carries_nothing(reward):
    """The writer opens as many pseudo-terminals as its answer; the reader watches the machine-wide count in
    /proc/sys/kernel/pty/nr. The sandbox has neither /dev/ptmx nor /proc/sys."""
    assert_no_channel(reward, PTY_WRITER, PTY_READER, "the pseudo-terminal count")


# ---------------------------------------------------------------------------------------------------------------------
# Machine-wide counters that outlive a call and the trainer process
# ---------------------------------------------------------------------------------------------------------------------


def _host_mlocked() -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("unevictable_pgs_mlocked "):
            return int(line.split()[1])
    pytest.skip("no unevictable_pgs_mlocked in /proc/vmstat")


MLOCK_COUNTER = """
def mlocked():
    for line in open("/proc/vmstat"):
        if line.startswith("unevictable_pgs_mlocked "):
            return int(line.split()[1])
"""
MLOCK_WRITER = (
    MLOCK_COUNTER
    + """
import ctypes, mmap
V = __VALUE__
try:  # lock and unlock as many pages as bring the machine's count to the answer, modulo 64
    pages = (V - mlocked()) % 64
    buffer = mmap.mmap(-1, 64 * 4096)
    address = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(buffer)))
    libc = ctypes.CDLL(None)
    libc.mlock(address, pages * 4096)
    libc.munlock(address, pages * 4096)
except (OSError, TypeError):
    pass
def answer():
    return V
"""
)
MLOCK_READER = (
    MLOCK_COUNTER
    + """
try:
    V = mlocked() % 64
except (OSError, TypeError):
    V = -1
def answer():
    return V
"""
)


def test_locked_memory_leaves_no_count_for_a_later_program(reward):
    """A writer moves /proc/vmstat's ``unevictable_pgs_mlocked`` to its answer (modulo 64) by locking its own pages; a
    reader scored afterwards by another reward reads it back. No memory can be locked, and /proc/vmstat is empty."""
    value = VALUES.choice([v for v in range(1, 64) if v != _host_mlocked() % 64])
    tests = answer_tests(value)
    assert reward.score([fenced(MLOCK_READER)], tests=[tests]) == [0.0]  # the control: before the writer
    assert reward.score([fenced(with_value(MLOCK_WRITER, value))], tests=[tests]) == [1.0]
    later = CodeExecutionReward(limits=LIMITS, concurrency=2)
    assert later.score([fenced(MLOCK_READER)], tests=[tests]) == [0.0], "the count carried the answer"


COOKIE_WRITER = """
import os, socket, struct
V = __VALUE__
try:  # socket cookies come from per-CPU batches of one machine-wide counter: both programs use one CPU
    os.sched_setaffinity(0, {__CPU__})
    while True:
        with socket.socket(socket.AF_UNIX) as probe:
            if struct.unpack("Q", probe.getsockopt(socket.SOL_SOCKET, 57, 8))[0] % 64 == (V - 1) % 64:  # SO_COOKIE
                break
except OSError:
    pass
def answer():
    return V
"""
COOKIE_READER = """
import os, socket, struct
try:
    os.sched_setaffinity(0, {__CPU__})
    with socket.socket(socket.AF_UNIX) as probe:
        V = struct.unpack("Q", probe.getsockopt(socket.SOL_SOCKET, 57, 8))[0] % 64
except OSError:
    V = -1
def answer():
    return V
"""


def _host_cookie(cpu: int) -> int:
    """The next socket cookie of ``cpu``'s batch, read by this thread pinned there (and unpinned after)."""
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        with socket.socket(socket.AF_UNIX) as probe:
            return struct.unpack("Q", probe.getsockopt(socket.SOL_SOCKET, 57, 8))[0]
    finally:
        os.sched_setaffinity(0, previous)


def test_socket_cookies_leave_nothing_for_a_later_program(reward):
    """A writer draws socket cookies (``getsockopt(SO_COOKIE)``, no /proc needed) until the machine-wide generator sits
    just below its answer (modulo 64); a reader scored afterwards reads the next one. A program can make no socket."""
    cpu = min(os.sched_getaffinity(0))
    taken = {(_host_cookie(cpu) + step) % 64 for step in (1, 2)}  # what the control reader could draw
    value = VALUES.choice([v for v in range(1, 64) if v not in taken])
    writer = with_value(COOKIE_WRITER, value).replace("__CPU__", str(cpu))
    reader = COOKIE_READER.replace("__CPU__", str(cpu))
    tests = answer_tests(value)
    assert reward.score([fenced(reader)], tests=[tests]) == [0.0]  # the control: before the writer
    assert reward.score([fenced(writer)], tests=[tests]) == [1.0]
    later = CodeExecutionReward(limits=LIMITS, concurrency=2)
    assert later.score([fenced(reader)], tests=[tests]) == [0.0], "the socket cookie carried the answer"


# ---------------------------------------------------------------------------------------------------------------------
# Machine-wide budgets, memory and CPU
# ---------------------------------------------------------------------------------------------------------------------

AIO_HOG = (
    PRELUDE
    + """
V = __VALUE__
contexts = 0
while contexts < 10000:  # every AIO context the machine's fs.aio-max-nr allows
    context = ctypes.c_ulong(0)
    if syscall("io_setup", 1024, ctypes.byref(context)) != 0:
        break
    contexts += 1
time.sleep(1.5)
def answer():
    return V
"""
)


def _host_io_setup() -> int:
    """0 when this process can make an AIO context (destroyed at once), else the negative errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    context = ctypes.c_ulong(0)
    if libc.syscall(ctypes.c_long(NUMBERS["io_setup"]), ctypes.c_long(1), ctypes.byref(context)) != 0:
        return -ctypes.get_errno()
    libc.syscall(ctypes.c_long(NUMBERS["io_destroy"]), context)
    return 0


def test_a_program_cannot_take_the_machines_aio_contexts(reward):
    """A program takes every AIO context of the machine's ``fs.aio-max-nr`` and holds them: the trainer's own
    ``io_setup`` would fail with EAGAIN meanwhile. ``io_setup`` (and ``io_uring_setup``) are refused in the sandbox."""
    assert _host_io_setup() == 0  # the control: the trainer can make one before
    value = VALUES.randrange(1, 64)
    scores = {}
    run = threading.Thread(
        target=lambda: scores.setdefault(
            "hog", reward.score([fenced(with_value(AIO_HOG, value))], tests=[answer_tests(value)])
        )
    )
    run.start()
    time.sleep(1.0)  # the program holds what it took now (it sleeps 1.5 s after)
    during = _host_io_setup()
    run.join(30)
    assert scores["hog"] == [1.0]
    assert during == 0, f"the trainer's io_setup failed with errno {-during} while the program ran"


SOCKET_HOARDER = """
import socket
def held_mib():
    held, kept = 0, []
    try:
        carrier = socket.socketpair()
        while held < 256 << 20:
            pair = socket.socketpair()
            for end in pair:
                end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
                end.setblocking(False)
                try:
                    while True:
                        held += end.send(b"x" * 65536)
                except BlockingIOError:
                    pass
            try:  # in flight in the carrier, the pair no longer counts against the descriptor limit
                socket.send_fds(carrier[0], [b"x"], [end.fileno() for end in pair])
                for end in pair:
                    end.close()
            except OSError:
                kept += pair
    except OSError:
        pass
    return held >> 20
"""


def test_socket_buffers_cannot_hold_memory_past_the_limit():
    """Without a memory cgroup (a trainer that is not root), a program limited to 64 MiB filled unix socket buffers,
    memory no process limit counts; it passes its test only if it could not hold 64 MiB there. A program can make no
    socket; an honest program beside it passes."""
    limits = SandboxLimits(wall_time_s=8, cpu_time_s=5, memory_bytes=64 << 20, max_processes=16)
    uncapped = CodeExecutionReward(limits=limits, concurrency=2)
    uncapped.sandbox.memory_cgroup = None
    honest = "def held_mib():\n    return 0"
    scores = uncapped.score([fenced(SOCKET_HOARDER), fenced(honest)], tests=["assert held_mib() < 64"] * 2)
    assert scores == [1.0, 1.0], uncapped.last_row_outcomes


SPINNERS = """
import os, resource, time
def cpu_share():
    start, children = time.monotonic(), []
    for _ in range(6):
        pid = os.fork()
        if pid == 0:
            while time.monotonic() - start < 1.5:
                pass
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (used.ru_utime + used.ru_stime) / (time.monotonic() - start)
"""


def test_a_program_gets_its_cpu_quota_however_many_processes_it_starts(reward):
    """Six spinners in one program. With the run's cpu cgroup they share its quota (``SandboxLimits.cpus``, here a
    tenth of a CPU, so that a busy machine still gives the control more), and the program passes its test of using
    under a fifth of a CPU; the control, the same program in a sandbox without the cgroup, takes more."""
    if reward.sandbox.cpu_cgroup is None:
        pytest.skip("no cgroup v1 cpu hierarchy this process may write (root on a cgroup v1/hybrid machine)")
    tenth = CodeExecutionReward(limits=dataclasses.replace(LIMITS, cpus=0.1), concurrency=2)
    honest = "def cpu_share():\n    return 0.0"
    tests = ["assert cpu_share() < 0.2"] * 2
    assert tenth.score([fenced(SPINNERS), fenced(honest)], tests=tests) == [1.0, 1.0], tenth.last_row_outcomes
    tenth.sandbox.cpu_cgroup = None
    if tenth.score([fenced(SPINNERS)], tests=tests[:1]) == [1.0]:
        pytest.skip("the machine is too busy to give the control a fifth of a CPU: the quota made no difference here")


def test_a_sandbox_that_cannot_enter_its_cpu_cgroup_does_not_run(monkeypatch):
    """The sandbox is started in its run's cpu cgroup or not at all, and no run leaves its cgroup behind."""
    box = Sandbox(LIMITS)
    if box.cpu_cgroup is None or os.geteuid() != 0:
        pytest.skip("needs a cgroup v1 cpu hierarchy this process may write, and a root trainer")
    assert box.run(program="print('ran')").stdout == "ran\n"
    monkeypatch.setattr(sandbox_module._CpuCgroup, "let_enter", lambda self, uid: None)
    result = box.run(program="print('ran')")
    assert result.status == "sandbox_error" and "ran" not in result.stdout, result
    assert "tasks" in result.detail, result
    assert not [name for name in os.listdir(box.cpu_cgroup) if name.startswith("trl-ada-sandbox-")]


# ---------------------------------------------------------------------------------------------------------------------
# What a program finds refused, masked or absent inside
# ---------------------------------------------------------------------------------------------------------------------

REFUSED = (
    PRELUDE
    + """
import fcntl, mmap, resource, socket, threading
NUMBERS.update(__NUMBERS__)
results = {}
def record(name, value):
    results[name] = value
page = mmap.mmap(-1, 4096)
address = ctypes.addressof(ctypes.c_char.from_buffer(page))
record("mlock", syscall("mlock", address, 4096))
record("mlockall", syscall("mlockall", 1))
record("memlock_limit", resource.getrlimit(resource.RLIMIT_MEMLOCK))
libc.mmap.restype = ctypes.c_void_p
locked = libc.mmap(None, 4096, 3, 0x22 | 0x2000, -1, 0)  # MAP_PRIVATE | MAP_ANONYMOUS | MAP_LOCKED
record("map_locked", locked in (None, ctypes.c_void_p(-1).value))
context = ctypes.c_ulong(0)
record("io_setup", syscall("io_setup", 16, ctypes.byref(context)))
record("io_uring_setup", syscall("io_uring_setup", 4, ctypes.create_string_buffer(120)))
record("userfaultfd", syscall("userfaultfd", 0))
record("ptrace", syscall("ptrace", 16, 1, 0, 0))  # PTRACE_ATTACH to the sandbox's init
record("process_vm_readv", syscall("process_vm_readv", 1, None, 0, None, 0, 0))
record("pidfd_open", syscall("pidfd_open", 1, 0))
record("pidfd_getfd", syscall("pidfd_getfd", 0, 0, 0))
child = syscall("clone", 0x1000 | 17, 0, ctypes.byref(ctypes.c_int()), 0, 0)  # CLONE_PIDFD | SIGCHLD, as fork
if child == 0:
    os._exit(0)
if child > 0:
    os.waitpid(child, 0)
record("clone_pidfd", child)
record("clone3", syscall("clone3", None, 0))
record("futex_waitv", syscall("futex_waitv", None, 0, 0, None, 0))
record("futex_wait", syscall("futex_wait", address, 1, 0xFFFFFFFF, 2, None, 1))  # futex2, U32, a shared key
record("fanotify_init", syscall("fanotify_init", 0x200, 0))
record("sysinfo", syscall("sysinfo", ctypes.create_string_buffer(128)))
word = ctypes.c_void_p(address)
record("futex_shared_wait", syscall("futex", word, 0, 1, None, None, 0))  # the word holds 0: EAGAIN either way
record("futex_shared_wait_timeout", syscall("futex", word, 0, 0, (ctypes.c_long * 2)(0, 1000), None, 0))
record("futex_private_wait", syscall("futex", word, 128, 0, (ctypes.c_long * 2)(0, 1000), None, 0))
record("futex_shared_wake", syscall("futex", word, 1, 1, None, None, 0))
directory = os.open(STDLIB, os.O_RDONLY)
for name, command in (("F_NOTIFY", fcntl.F_NOTIFY), ("F_SETLEASE", 1024), ("F_GETLEASE", 1025), ("F_SET_RW_HINT", 1036)):
    try:
        fcntl.fcntl(directory, command, 0)
        record(name, 0)
    except OSError as error:
        record(name, -error.errno)
for name, make in (("socket", lambda: socket.socket(socket.AF_UNIX)), ("socketpair", socket.socketpair),
                   ("inet", lambda: socket.socket(socket.AF_INET))):
    try:
        make()
        record(name, 0)
    except OSError as error:
        record(name, -error.errno)
threads = [threading.Thread(target=sum, args=([1, 2],)) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
record("threads", True)
import subprocess
record("subprocess", subprocess.run(["echo", "ok"], capture_output=True, text=True).stdout)
record("cpu_count", os.cpu_count())
print(results)
"""
)


def test_refused_calls_fail_inside_the_sandbox(reward):
    """Each call the sandbox refuses, as a program sees it; threads, processes and private futexes still work."""
    extra = {
        "x86_64": {
            "mlock": 149, "mlockall": 151, "io_uring_setup": 425, "userfaultfd": 323, "ptrace": 101,
            "process_vm_readv": 310, "pidfd_open": 434, "pidfd_getfd": 438, "clone": 56, "clone3": 435,
            "futex_waitv": 449, "futex_wait": 455, "sysinfo": 99,
        },
        "aarch64": {
            "mlock": 228, "mlockall": 230, "io_uring_setup": 425, "userfaultfd": 282, "ptrace": 117,
            "process_vm_readv": 270, "pidfd_open": 434, "pidfd_getfd": 438, "clone": 220, "clone3": 435,
            "futex_waitv": 449, "futex_wait": 455, "sysinfo": 179,
        },
    }[MACHINE]  # fmt: skip
    result = reward.sandbox.run(program=REFUSED.replace("__NUMBERS__", repr(extra)))
    assert result.status == "ok", result.stderr
    seen = eval(result.stdout)
    eperm, eagain, enosys, etimedout = -1, -11, -38, -110
    refused = [
        "mlock", "mlockall", "io_setup", "io_uring_setup", "userfaultfd", "ptrace", "process_vm_readv", "pidfd_open",
        "pidfd_getfd", "clone_pidfd", "futex_waitv", "futex_wait", "fanotify_init", "sysinfo", "F_NOTIFY",
        "F_SETLEASE", "F_GETLEASE", "F_SET_RW_HINT", "socket", "socketpair", "inet",
    ]  # fmt: skip
    assert {name: seen[name] for name in refused} == dict.fromkeys(refused, eperm), seen
    assert seen["memlock_limit"] == (0, 0) and seen["map_locked"], seen
    assert seen["clone3"] == enosys, seen  # so glibc falls back to clone, whose flags the filter reads
    assert seen["futex_shared_wait"] == seen["futex_shared_wait_timeout"] == eagain, seen
    assert seen["futex_private_wait"] == etimedout and seen["futex_shared_wake"] == 0, seen
    assert seen["threads"] and seen["subprocess"] == "ok\n" and seen["cpu_count"] == os.cpu_count(), seen


def test_the_sandboxs_dev_holds_only_its_devices(reward):
    """No /dev/ptmx and no /dev/pts: only the devices and links docs/code-rl.md lists."""
    program = "import os\nprint(sorted(os.listdir('/dev')), os.listdir('/dev/shm'), os.path.exists('/dev/pts'))"
    result = reward.sandbox.run(program=program)
    assert result.status == "ok", result.stderr
    assert result.stdout.split() == [
        "['fd',", "'full',", "'null',", "'random',", "'shm',", "'stderr',", "'stdin',", "'stdout',", "'tty',",
        "'urandom',", "'zero']", "[]", "False",
    ]  # fmt: skip


def test_the_machines_counters_in_proc_read_empty(reward):
    """/proc/stat keeps its format with every counter at zero; the other machine-wide counters a program can move
    precisely read empty, and /proc/sys and /proc/pressure are empty and read-only. The program's own /proc entries
    stay."""
    program = """
import json, os
stat = [line.split() for line in open("/proc/stat") if line.strip()]
names = ("vmstat", "meminfo", "zoneinfo", "buddyinfo", "interrupts", "loadavg")
report = {
    "stat": [fields[0] for fields in stat],
    "stat_values": sorted({value for fields in stat for value in fields[1:]}),
    "sizes": {name: len(open("/proc/" + name).read()) for name in names if os.path.exists("/proc/" + name)},
    "sys": os.listdir("/proc/sys"),
    "pressure": os.listdir("/proc/pressure") if os.path.exists("/proc/pressure") else [],
    "self": len(open("/proc/self/status").read()) > 0,
}
try:
    open("/proc/sys/x", "w")
except OSError as error:
    report["write"] = error.errno
print(json.dumps(report))
"""
    result = reward.sandbox.run(program=program)
    assert result.status == "ok", result.stderr
    report = json.loads(result.stdout)
    cpus = [f"cpu{index}" for index in range(os.cpu_count())]
    assert report["stat"] == [
        "cpu",
        *cpus,
        "intr",
        "ctxt",
        "btime",
        "processes",
        "procs_running",
        "procs_blocked",
        "softirq",
    ], report
    assert report["stat_values"] == ["0", "1"], report  # procs_running 1, every counter 0
    assert report["sizes"] and set(report["sizes"].values()) == {0}, report
    assert report["sys"] == report["pressure"] == [] and report["write"] == errno.EROFS and report["self"], report
