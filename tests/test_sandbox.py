"""The code sandbox (`trl_ada.rewards.sandbox`) against hostile programs: each attack must fail, leak nothing, return within
its limits and leave no process behind.

Every test is bounded: small limits (a fork bomb meets a process limit of 16, a memory bomb an address-space limit),
an asserted wall time, and a SIGALRM guard per test. Without bubblewrap the tests skip naming the install command,
except under CI=true, where they fail (CI installs it)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trl_ada.rewards import sandbox as sandbox_module
from trl_ada.rewards.sandbox import INSTALL_HINT, Sandbox, SandboxLimits

CI = os.environ.get("CI", "").lower() == "true"
HAVE_BWRAP = shutil.which("bwrap") is not None
SECRET = f"hf_secret_{random.getrandbits(64):016x}"

# Under CI=true a missing bubblewrap fails these tests instead (CI installs it).
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP and not CI, reason=f"bubblewrap is not installed: {INSTALL_HINT}")

# Seconds a loaded 2-core machine may add to starting and tearing down a sandbox, on top of a limit.
SLACK = 2.0
FAST = SandboxLimits(wall_time_s=5, cpu_time_s=3, memory_bytes=512 << 20, max_processes=16, output_bytes=1 << 16)


# Every test: a wall-clock guard, and no bubblewrap process left behind (fixtures of conftest.py).
pytestmark = [
    pytest.mark.usefixtures("wall_clock_guard", "no_sandbox_outlives_the_tests"),
    pytest.mark.wall_clock_limit(60),
]


@pytest.fixture(scope="module")
def box() -> Sandbox:
    if not HAVE_BWRAP:  # only under CI=true
        pytest.fail(f"CI=true but bubblewrap is not installed: {INSTALL_HINT}")
    return Sandbox(FAST)


def processes_with(marker: str) -> list[int]:
    """PIDs (on this machine) of live processes whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry))
    return found


def run_marked(box: Sandbox, program: str, **kwargs):
    """Runs ``program`` with a unique marker in its command line (children forked from it carry it too); returns the
    result, the wall time of the call and the PIDs still alive with the marker right after it returned."""
    marker = f"marker{random.getrandbits(48):012x}"
    start = time.monotonic()
    result = box.run(box.python_argv("main.py", marker), files={"main.py": program}, **kwargs)
    elapsed = time.monotonic() - start
    return result, elapsed, processes_with(marker), marker


# ---------------------------------------------------------------------------------------------------------------------
# Honest programs, set-up and errors
# ---------------------------------------------------------------------------------------------------------------------


@needs_bwrap
def test_runs_a_program_with_stdin_files_and_a_writable_working_directory(box):
    program = (
        "import os, sys\n"
        "data = open('data.txt').read()\n"
        "open('out.txt', 'w').write(data * 2)\n"
        "print(input()[::-1], open('out.txt').read(), os.getcwd())\n"
        "print('err', file=sys.stderr)\n"
    )
    result = box.run(program=program, stdin="abc\n", files={"data.txt": "xy"})
    assert result.status == "ok" and result.returncode == 0
    assert result.stdout == "cba xyxy /tmp\n"
    assert result.stderr == "err\n"


@needs_bwrap
def test_exit_status_and_exceptions_are_errors(box):
    assert box.run(program="raise SystemExit(3)").returncode == 3
    result = box.run(program="1 / 0")
    assert result.status == "error" and "ZeroDivisionError" in result.stderr


@needs_bwrap
def test_channel_carries_bytes_back(box):
    result = box.run(program="import os\nos.write(int(os.environ['SANDBOX_CHANNEL_FD']), b'data')", channel=True)
    assert result.status == "ok" and result.channel == b"data"


@needs_bwrap
def test_bad_arguments_fail_before_running(box):
    with pytest.raises(ValueError, match="program="):
        box.run()
    with pytest.raises(ValueError, match="plain names"):
        box.run(program="pass", files={"../evil": "x"})
    with pytest.raises(ValueError, match="positive"):
        SandboxLimits(wall_time_s=0)
    with pytest.raises(ValueError, match="64 MiB"):
        SandboxLimits(memory_bytes=1 << 20)
    with pytest.raises(ValueError, match="isolation"):
        Sandbox(isolation="docker")


def test_missing_bubblewrap_names_the_install_command(monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real_which(name, *a, **k))
    with pytest.raises(RuntimeError, match="apt-get install bubblewrap") as error:
        Sandbox(FAST)
    assert "isolation='none'" in str(error.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid is dropped only when running as root")
def test_refuses_to_run_programs_as_root():
    with pytest.raises(ValueError, match="unprivileged uid"):
        Sandbox(FAST, run_as_uid=0)
    with pytest.raises(ValueError, match="unprivileged uid"):
        Sandbox(FAST, run_as_uid=range(0, 8))
    for bad in (range(5, 5), -1, "65534", range(10, 20, 2)):
        with pytest.raises(ValueError, match="run_as_uid"):
            Sandbox(FAST, run_as_uid=bad)


@needs_bwrap
def test_an_interpreter_prefix_that_would_expose_a_home_is_refused(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "lib" / "python3.11").mkdir(parents=True)
    (home / "lib" / "python3.11" / "os.py").write_text("")
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(ValueError, match="would expose"):
        sandbox_module._check_prefix(str(home))  # e.g. python at ~/bin/python3: the whole home would be bound
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a Python installation prefix"):
        sandbox_module._check_prefix(str(tmp_path / "empty"))
    sandbox_module._check_prefix("/usr")
    with pytest.raises(ValueError, match="not an executable interpreter"):
        Sandbox(FAST, python=str(tmp_path / "no-python"))


def test_no_isolation_is_an_explicit_opt_in_that_warns(caplog):
    with caplog.at_level("WARNING", logger="trl_ada.rewards.sandbox"):
        plain = Sandbox(FAST, isolation="none")
    assert "NOT a security boundary" in caplog.text
    result = plain.run(program="import os\nprint(sorted(os.environ))")
    assert result.status == "ok"
    names = eval(result.stdout)
    assert set(names) == {"HOME", "LANG", "PATH", "PYTHONDONTWRITEBYTECODE", *sandbox_module._THREAD_VARIABLES}


# ---------------------------------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------------------------------


def _host_ipv4_addresses() -> list[str]:
    addresses = {"127.0.0.1"}
    try:
        import psutil

        for entries in psutil.net_if_addrs().values():
            addresses.update(entry.address for entry in entries if entry.family == socket.AF_INET)
    except ImportError:
        pass
    return sorted(addresses)


@needs_bwrap
def test_no_network_not_even_to_this_machine(box):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp_port = udp.getsockname()[1]
    addresses = _host_ipv4_addresses()
    program = f"""
import socket
import struct
for host in {addresses!r}:
    try:
        socket.create_connection((host, {port}), timeout=1).sendall(b"{SECRET}")
        print("CONNECTED", host)
    except OSError as error:
        print("refused", host, error.errno)
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"{SECRET}", ("127.0.0.1", {udp_port}))
    print("udp sent")
except OSError as error:
    print("udp failed", error.errno)
try:
    socket.getaddrinfo("huggingface.co", 443)
    print("RESOLVED")
except OSError:
    print("no dns")
print(open("/proc/net/dev").read())
"""
    try:
        result, elapsed, left, _ = run_marked(box, program)
        listener.settimeout(0.2)
        with pytest.raises((TimeoutError, socket.timeout)):
            listener.accept()
        udp.settimeout(0.2)
        with pytest.raises((TimeoutError, socket.timeout)):
            udp.recvfrom(1024)
    finally:
        listener.close()
        udp.close()
    assert result.status == "ok", result.stderr
    assert "CONNECTED" not in result.stdout and "RESOLVED" not in result.stdout
    assert result.stdout.count("refused") == len(addresses)
    interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines() if ":" in line and "|" not in line]
    assert interfaces == ["lo"], result.stdout  # a network namespace of its own: loopback only (down)
    assert elapsed < FAST.wall_time_s + SLACK and not left


# ---------------------------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------------------------


@needs_bwrap
def test_cannot_read_the_hub_token_home_or_files_outside(box, tmp_path, monkeypatch):
    home = tmp_path / "home"
    token = home / ".cache" / "huggingface" / "token"
    token.parent.mkdir(parents=True)
    token.write_text(SECRET)
    hf_home = tmp_path / "hf_home"
    hf_home.mkdir()
    (hf_home / "token").write_text(SECRET)
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_text(SECRET)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HOME", str(hf_home))
    targets = [
        str(token),
        str(hf_home / "token"),
        str(home / ".ssh" / "id_ed25519"),
        os.path.expanduser("~/.cache/huggingface/token"),
        "/root/.cache/huggingface/token",
        "/root/.ssh/id_rsa",
        str(Path(__file__).resolve()),  # the checkout
        "/etc/shadow",
        "/etc/passwd",
        "/etc/hostname",
        "/proc/1/root/etc/shadow",
    ]
    program = f"""
import os
for path in {targets!r}:
    try:
        print("READ", path, open(path).read())
    except OSError as error:
        print("denied", path, type(error).__name__)
print("ROOT", sorted(os.listdir("/")))
print("HOMEVAR", os.path.expanduser("~"))
for path in ("/root", "/home", "/work", "/run", "/var", "/mnt", "/opt", "/srv", "/sys"):
    print("EXISTS" if os.path.exists(path) else "absent", path)
"""
    result, elapsed, left, _ = run_marked(box, program)
    assert result.status == "ok", result.stderr
    assert SECRET not in result.stdout + result.stderr
    assert "READ" not in result.stdout, result.stdout
    assert result.stdout.count("denied") == len(targets)
    root = eval(result.stdout.split("ROOT ", 1)[1].splitlines()[0])
    assert set(root) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr", "root"}
    if "root" in root:  # only when the interpreter's prefix lives under /root (then only that prefix is bound)
        assert box.python.startswith("/root/")
    assert "EXISTS" not in result.stdout.replace("EXISTS /root", "") or box.python.startswith("/root/")
    assert "HOMEVAR /tmp" in result.stdout
    assert elapsed < FAST.wall_time_s + SLACK and not left


@needs_bwrap
def test_cannot_write_outside_its_scratch_directory(box, tmp_path):
    outside = tmp_path / "pwned"
    targets = [str(outside), "/usr/pwned", "/etc/pwned", "/pwned", "/dev/pwned", "/dev/shm/pwned", "/proc/pwned"]
    scratch_name = f"/tmp/trl-ada-sandbox-{os.getpid()}-{tmp_path.name}"  # a name the host's /tmp does not hold yet
    program = f"""
import os
for path in {targets!r}:
    try:
        with open(path, "w") as handle:
            handle.write("x")
        print("WROTE", path)
    except OSError as error:
        print("denied", path, type(error).__name__)
try:
    os.chmod("/usr/bin", 0o777)
    print("CHMOD")
except OSError:
    print("denied chmod")
open({scratch_name!r}, "w").write("{SECRET}")
print("scratch ok")
"""
    result, elapsed, left, _ = run_marked(box, program)
    assert result.status == "ok", result.stderr
    assert "WROTE" not in result.stdout and "CHMOD" not in result.stdout
    assert result.stdout.count("denied") == len(targets) + 1 and "scratch ok" in result.stdout
    assert not outside.exists() and not Path("/usr/pwned").exists() and not Path("/pwned").exists()
    # The scratch directory was the sandbox's own tmpfs: nothing of it reached the host's /tmp.
    assert not Path(scratch_name).exists()
    assert elapsed < FAST.wall_time_s + SLACK and not left


@needs_bwrap
def test_scratch_space_and_file_size_are_bounded(tmp_path):
    small = Sandbox(SandboxLimits(wall_time_s=10, cpu_time_s=5, scratch_bytes=8 << 20, file_size_bytes=1 << 20))
    program = """
import os
chunk = b"x" * (1 << 16)
try:
    with open("big", "wb") as handle:
        while True:
            handle.write(chunk)
except OSError as error:
    print("one file stops at", os.path.getsize("big"), error.errno)
total = 0
try:
    for i in range(10000):
        with open(f"f{i}", "wb") as handle:
            handle.write(b"y" * ((1 << 20) - 1))
        total += (1 << 20) - 1
except OSError as error:
    print("scratch stops at", total, error.errno)
"""
    start = time.monotonic()
    result = small.run(program=program)
    assert time.monotonic() - start < 10
    assert result.status == "ok", result.stderr
    single = int(result.stdout.split("one file stops at ")[1].split()[0])
    total = int(result.stdout.split("scratch stops at ")[1].split()[0])
    assert single <= 1 << 20
    assert total <= 8 << 20


# ---------------------------------------------------------------------------------------------------------------------
# Environment, /proc, ctypes
# ---------------------------------------------------------------------------------------------------------------------


@needs_bwrap
def test_the_trainers_environment_does_not_leak(box, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("TRL_ADA_TEST_SECRET", SECRET)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    program = """
import os
print("ENV", sorted(os.environ))
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for name in ("environ", "cmdline"):
        try:
            print(pid, name, open(f"/proc/{pid}/{name}", "rb").read())
        except OSError as error:
            print(pid, name, "denied", type(error).__name__)
"""
    result, elapsed, left, _ = run_marked(box, program)
    assert result.status == "ok", result.stderr
    assert SECRET not in result.stdout + result.stderr
    env = eval(result.stdout.split("ENV ", 1)[1].splitlines()[0])
    allowed = {"PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE", "PWD", "LC_CTYPE", *sandbox_module._THREAD_VARIABLES}
    assert set(env) <= allowed
    assert "1 environ" in result.stdout  # it did look at the sandbox's init
    assert elapsed < FAST.wall_time_s + SLACK and not left


@needs_bwrap
def test_proc_shows_only_the_sandbox_and_ptrace_reaches_nothing_outside(box):
    parent = os.getpid()
    program = f"""
import ctypes, os
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print("PIDS", pids)
print("PARENT_VISIBLE", os.path.exists("/proc/{parent}/environ") and b"{SECRET}" in open("/proc/{parent}/environ", "rb").read())
for line in open("/proc/1/status"):
    if line.startswith(("CapPrm", "CapEff", "Uid")):
        print("INIT", line.split(":")[0], line.split()[1])
print("uid", os.getuid(), "euid", os.geteuid())
try:
    os.setuid(0)
    print("BECAME ROOT")
except OSError:
    print("no setuid")
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH = 16
ok = libc.ptrace(PTRACE_ATTACH, {parent}, None, None)
print("ptrace trainer", ok, ctypes.get_errno(), flush=True)
# Attaching to the sandbox's own init would stop it, leaving the run to end at its wall-clock limit: refused too.
print("ptrace init", libc.ptrace(PTRACE_ATTACH, 1, None, None), ctypes.get_errno(), flush=True)
"""
    os.environ["TRL_ADA_PARENT_SECRET"] = SECRET
    limits = SandboxLimits(wall_time_s=1.5, max_processes=16)
    try:
        result, elapsed, left, _ = run_marked(Sandbox(limits), program)
    finally:
        del os.environ["TRL_ADA_PARENT_SECRET"]
    assert result.status == "ok", result.stderr
    assert SECRET not in result.stdout + result.stderr
    pids = eval(result.stdout.split("PIDS ", 1)[1].splitlines()[0])
    assert max(pids) < FAST.max_processes + 8  # a PID namespace of its own
    assert "PARENT_VISIBLE False" in result.stdout
    assert "ptrace trainer -1 1" in result.stdout and "ptrace init -1 1" in result.stdout  # EPERM: the filter
    assert "INIT CapPrm 0000000000000000" in result.stdout  # ptrace into the init gains no capability
    assert "BECAME ROOT" not in result.stdout
    assert elapsed < limits.wall_time_s + SLACK and not left


@needs_bwrap
def test_proc_tells_the_program_nothing_of_the_trainer(box):
    """``/proc/self/cgroup`` names the run's memory cgroup without the trainer's PID or a run counter, and the
    sandbox's init (bubblewrap) has none of the host's paths or descriptors on its command line."""
    program = (
        "print(open('/proc/self/cgroup').read())\nprint('INIT', open('/proc/1/cmdline', 'rb').read().split(b'\\0'))"
    )
    first, second = box.run(program=program), box.run(program=program)
    assert first.status == second.status == "ok", first.stderr
    cgroup_lines = first.stdout.split("INIT")[0].split()
    assert str(os.getpid()) not in str(cgroup_lines), cgroup_lines
    # The sandbox is started in its run's memory cgroup, the root of its cgroup namespace: no name, no counter.
    assert cgroup_lines and all(line.split(":", 2)[2] == "/" for line in cgroup_lines), cgroup_lines
    init = eval(first.stdout.split("INIT ", 1)[1].splitlines()[0])
    assert init[:2] == [box._bwrap.encode(), b"--args"] and init[3] == b"--", init
    assert init[4:] == [arg.encode() for arg in box._limit_args()] + [arg.encode() for arg in box.python_argv()] + [
        b""
    ]


@needs_bwrap
def test_message_queues_inotify_and_file_locks_are_refused(box):
    """Kernel objects that concurrent sandboxes could signal each other through: per-user budgets (POSIX message
    queues, inotify instances) and locks on the read-only files every sandbox sees. Other fcntl commands work."""
    numbers = sandbox_module._DENIED_SYSCALLS[sandbox_module.platform.machine()][1]
    program = f"""
import ctypes, fcntl, os
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    result = libc.syscall({numbers["mq_open"]} if name == "mq_open" else {numbers["inotify_init1"]}, *args)
    return result if result >= 0 else -ctypes.get_errno()
print("mq_open", call("mq_open", b"q", os.O_CREAT | os.O_RDWR, 0o600, None))
print("inotify_init1", call("inotify_init1", 0))
handle = open("/usr/bin/env", "rb")
for name, lock in (("flock", lambda: fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)),
                   ("lockf", lambda: fcntl.lockf(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)),
                   ("getlk", lambda: fcntl.fcntl(handle, fcntl.F_GETLK, bytes(32)))):
    try:
        lock()
        print(name, "locked")
    except OSError as error:
        print(name, -error.errno)
print("getfl", fcntl.fcntl(handle, fcntl.F_GETFL) >= 0)
"""
    result = box.run(program=program)
    assert result.status == "ok", result.stderr
    eperm = -1
    for name in ("mq_open", "inotify_init1", "flock", "lockf", "getlk"):
        assert f"{name} {eperm}\n" in result.stdout, (name, result.stdout)
    assert "getfl True" in result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="each run gets a uid of its own only when the trainer is root")
@needs_bwrap
def test_concurrent_sandboxes_share_no_per_user_budget():
    """A sender pushes its uid's pipe pages over the kernel's soft limit: a receiver running as the same uid would
    get 8 KiB pipes instead of 64 KiB, a bit it could read. Each run holds a uid of its own, so it reads nothing."""
    box = Sandbox(SandboxLimits(wall_time_s=8, cpu_time_s=5, max_open_files=512))
    sender = """
import fcntl, os, sys, time
held = []
for _ in range(100):
    read, write = os.pipe()
    try:
        fcntl.fcntl(write, 1031, 1 << 20)  # F_SETPIPE_SZ: count 256 pages against this uid
    except OSError:
        break
    held.append((read, write))
held += [os.pipe() for _ in range(40)]
read, write = os.pipe()
print(fcntl.fcntl(write, 1032), flush=True)  # F_GETPIPE_SZ: over the soft limit, a new pipe is small
os.write(int(os.environ["SANDBOX_CHANNEL_FD"]), b"ready")
time.sleep(4)
"""
    receiver = "import fcntl, os\nread, write = os.pipe()\nprint(fcntl.fcntl(write, 1032))"
    soft_limit_pages = int(Path("/proc/sys/fs/pipe-user-pages-soft").read_text())
    if not 0 < soft_limit_pages <= 256 * 90:
        pytest.skip(f"fs.pipe-user-pages-soft is {soft_limit_pages}: the sender cannot pass it here")
    results = {}
    thread = threading.Thread(target=lambda: results.setdefault("sender", box.run(program=sender, channel=True)))
    thread.start()
    time.sleep(2.0)  # the sender holds its pipes now (it sleeps 4 s after)
    results["receiver"] = box.run(program=receiver)
    thread.join(15)
    assert int(results["sender"].stdout) < 65536, results["sender"]  # the sender's own uid is over the limit
    assert results["receiver"].stdout.strip() == "65536", results["receiver"]


@needs_bwrap
def test_no_descriptor_can_be_put_in_flight(box):
    """Descriptors in flight over a unix socket count against a per-user budget (and, for a trainer that is not root,
    the trainer's): a sender holding its limit's worth would stop a concurrent run of the same uid from passing one
    (ETOOMANYREFS), a bit it could read. A program can make no socket, so it puts none in flight."""
    sender = """
import socket
try:
    left, right = socket.socketpair()
    socket.send_fds(left, [b"x"], [0])
    print("sent")
except OSError as error:
    print("refused", error.errno)
"""
    result = box.run(program=sender)
    assert result.status == "ok" and result.stdout == "refused 1\n", result  # EPERM from the seccomp filter


@needs_bwrap
def test_signals_cannot_reach_the_trainer(box):
    received = []
    handlers = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in (signal.SIGUSR1,)}
    parent = os.getpid()
    program = f"""
import os, signal
for target, sig in (({parent}, signal.SIGUSR1), ({parent}, signal.SIGKILL), (os.getppid(), signal.SIGKILL),
                    (1, signal.SIGKILL), (0, signal.SIGKILL)):
    try:
        os.kill(target, sig)
        print("sent", target)
    except OSError as error:
        print("failed", target, error.errno, flush=True)
os.kill(-1, signal.SIGKILL)
"""
    try:
        result, elapsed, left, _ = run_marked(box, program)
        time.sleep(0.1)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert received == []  # and this process is alive to check it
    assert result.status in ("ok", "error", "timeout")
    assert elapsed < FAST.wall_time_s + SLACK and not left


# ---------------------------------------------------------------------------------------------------------------------
# Resource exhaustion
# ---------------------------------------------------------------------------------------------------------------------


@needs_bwrap
def test_fork_bomb_hits_the_process_limit(box):
    program = """
import os, sys, time
children = 0
try:
    for _ in range(10000):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
except OSError as error:
    print("limit after", children, error.errno, flush=True)
"""
    result, elapsed, left, _ = run_marked(box, program)
    assert result.status == "ok", result.stderr
    children = int(result.stdout.split("limit after ")[1].split()[0])
    assert children < FAST.max_processes
    assert elapsed < FAST.wall_time_s, elapsed  # the sleeping children died with the namespace, not after 30 s
    assert not left


@needs_bwrap
def test_exponential_fork_bomb_is_bounded_and_killed(box):
    program = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""
    limits = SandboxLimits(wall_time_s=1.5, cpu_time_s=5, max_processes=16, memory_bytes=256 << 20)
    bomb_box = Sandbox(limits)
    result, elapsed, left, _ = run_marked(bomb_box, program)
    assert result.status == "timeout"
    assert elapsed < limits.wall_time_s + SLACK, elapsed
    assert not left


@needs_bwrap
def test_fork_bomb_does_not_starve_a_concurrent_sandbox():
    limits = SandboxLimits(wall_time_s=3, cpu_time_s=5, max_processes=12, memory_bytes=256 << 20)
    bomb_box = Sandbox(limits)
    bomb = "import os, time\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)\n"
    honest = "import subprocess\nprint(subprocess.run(['echo', 'hi'], capture_output=True, text=True).stdout)"
    results = {}
    thread = threading.Thread(target=lambda: results.setdefault("bomb", bomb_box.run(program=bomb)))
    thread.start()
    time.sleep(0.5)  # the bomb is at its limit now
    results["honest"] = bomb_box.run(program=honest)
    thread.join(10)
    assert results["honest"].status == "ok" and results["honest"].stdout.strip() == "hi"
    assert results["bomb"].status == "timeout"


@needs_bwrap
def test_memory_bomb_hits_the_address_space_limit(box):
    for program in ("x = bytearray(8 << 30)", "x = []\nwhile True:\n    x.append(b'x' * (1 << 22))"):
        result, elapsed, left, _ = run_marked(box, program)
        assert result.status == "memory", (program, result)
        assert elapsed < FAST.wall_time_s + SLACK and not left


@needs_bwrap
def test_infinite_loops_time_out(box):
    result, elapsed, left, _ = run_marked(Sandbox(SandboxLimits(wall_time_s=10, cpu_time_s=1)), "while True: pass")
    assert result.status == "timeout" and "CPU" in result.detail
    assert elapsed < FAST.wall_time_s + SLACK and not left
    result, elapsed, left, _ = run_marked(
        Sandbox(SandboxLimits(wall_time_s=1, cpu_time_s=5)), "import time\ntime.sleep(100)"
    )
    assert result.status == "timeout" and result.detail == "wall-clock limit"
    assert 1 <= elapsed < 1 + SLACK and not left


@needs_bwrap
def test_huge_output_is_cut_and_killed(box):
    for program in (
        "while True: print('x' * 1000)",
        "import sys\nwhile True: sys.stderr.write('y' * 1000)",
        "import os\nwhile True: os.write(int(os.environ['SANDBOX_CHANNEL_FD']), b'z' * 1000)",
    ):
        result, elapsed, left, _ = run_marked(box, program, channel=True)
        assert result.status == "output_limit", program
        assert max(len(result.stdout), len(result.stderr), len(result.channel)) == FAST.output_bytes
        assert elapsed < FAST.wall_time_s + SLACK and not left


# ---------------------------------------------------------------------------------------------------------------------
# Processes that try to outlive the call
# ---------------------------------------------------------------------------------------------------------------------


@needs_bwrap
def test_daemons_die_with_the_call(box):
    program = """
import os, subprocess, sys, time
marker = sys.argv[1]
# A double-forked, setsid daemon that execs into a long sleep carrying the marker.
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sh", ["sh", "-c", "sleep 300; echo " + marker])
    os._exit(0)
# A setsid'd child, and one that ignores SIGHUP/SIGTERM.
subprocess.Popen(["sh", "-c", "sleep 300 # " + marker], start_new_session=True)
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "signal.signal(signal.SIGHUP, signal.SIG_IGN); time.sleep(300)", marker])
time.sleep(0.3)
print("parent exits")
"""
    result, elapsed, left, marker = run_marked(box, program)
    assert result.status == "ok", result.stderr
    assert "parent exits" in result.stdout
    assert elapsed < FAST.wall_time_s, elapsed  # ok, not timeout: it did not wait for the daemons
    assert not left, f"processes left behind: {left}"


@needs_bwrap
def test_timeout_kills_every_process_of_the_sandbox():
    program = """
import os, subprocess, sys, time
for _ in range(3):
    subprocess.Popen(["sh", "-c", "sleep 300 # " + sys.argv[1]], start_new_session=True)
time.sleep(300)
"""
    result, elapsed, left, _ = run_marked(Sandbox(SandboxLimits(wall_time_s=1)), program)
    assert result.status == "timeout"
    assert elapsed < 1 + SLACK and not left


def test_no_isolation_still_bounds_time_but_is_not_a_boundary(tmp_path):
    # Documented behaviour of the opt-out: it reads the host's files (here, this test file).
    plain = Sandbox(SandboxLimits(wall_time_s=1), isolation="none")
    result = plain.run(program=f"print(open({str(Path(__file__).resolve())!r}).read()[:20])")
    assert result.status == "ok" and result.stdout.startswith('"""The code sandbox')
    start = time.monotonic()
    assert plain.run(program="while True: pass").status == "timeout"
    assert time.monotonic() - start < 1 + SLACK


def test_sandbox_module_has_no_heavy_imports():
    code = (
        "import sys, trl_ada.rewards.sandbox, trl_ada.rewards.code; print(sorted({'torch', 'trl'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
    assert sandbox_module.Sandbox is Sandbox


# ---------------------------------------------------------------------------------------------------------------------
# Memory no process maps, the kernel keyring, zombies, and who says the sandbox failed
# ---------------------------------------------------------------------------------------------------------------------


def _shmem_kib() -> int:
    """Machine-wide shared memory (System V segments, tmpfs, memfds) in KiB, from /proc/meminfo."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1])
    raise AssertionError("no Shmem line in /proc/meminfo")


@needs_bwrap
def test_memory_no_process_maps_cannot_be_held(box):
    # System V segments created, filled and detached stay resident, charged to no process (RLIMIT_AS counts mapped
    # memory only), until the sandbox's IPC namespace is freed after the call; a memfd's pages live as long as its fd.
    program = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
held = 0
for _ in range(3):
    segment = libc.shmget(0, 64 << 20, 0o1600)
    if segment < 0:
        print("shmget refused", ctypes.get_errno())
        break
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 1, 64 << 20)
    libc.shmdt(ctypes.c_void_p(address))
    held += 64 << 20
print("HELD", held)
print("msgget", libc.msgget(0, 0o1600), ctypes.get_errno())
print("semget", libc.semget(0, 1, 0o1600), ctypes.get_errno())
try:
    fd = os.memfd_create("x")
    os.ftruncate(fd, 8 << 20)
    print("MEMFD", fd)
except OSError as error:
    print("memfd refused", error.errno)
"""
    before = _shmem_kib()
    result, elapsed, left, _ = run_marked(box, program)
    grown_mib = (_shmem_kib() - before) / 1024
    assert result.status == "ok", result.stderr
    assert "HELD 0" in result.stdout and "shmget refused 1" in result.stdout  # EPERM from the seccomp filter
    assert "msgget -1 1" in result.stdout and "semget -1 1" in result.stdout
    assert "memfd refused 1" in result.stdout and "MEMFD" not in result.stdout
    assert grown_mib < 96, f"shared memory grew by {grown_mib:.0f} MiB across the call"  # 192 MiB when held
    assert elapsed < FAST.wall_time_s + SLACK and not left


_KEYRING_PROBE = """
import ctypes, json, os, platform, sys
sys.path[:0] = {paths!r}
from trl_ada.rewards.sandbox import Sandbox, SandboxLimits
ADD_KEY, KEYCTL = {{"x86_64": (248, 250), "aarch64": (217, 219)}}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
def call(number, *args):
    result = libc.syscall(number, *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return result, ctypes.get_errno()
JOIN_SESSION, READ, SESSION = 1, 11, -3
if call(KEYCTL, JOIN_SESSION, b"trl-ada-trainer")[0] < 0:  # a new session keyring for this process
    print(json.dumps({{"skip": os.strerror(ctypes.get_errno())}}))
    sys.exit(0)
secret = {secret!r}.encode()
key, _ = call(ADD_KEY, b"user", b"trl-ada-trainer-key", secret, len(secret), SESSION)
assert key > 0
def read(serial):
    buffer = ctypes.create_string_buffer(4096)
    size, error = call(KEYCTL, READ, serial, buffer, 4096)
    return buffer.raw[:size] if size >= 0 else error
result = Sandbox(SandboxLimits(wall_time_s=5)).run(program={program!r})
print(json.dumps({{
    "status": result.status, "stdout": result.stdout, "stderr": result.stderr,
    "key_intact": read(key) == secret,
    "session_keys": len(read(SESSION)) // 4,  # serials, 4 bytes each
    "planted_seen": "planted" in open("/proc/keys").read(),
}}))
"""

_KEYRING_ATTACK = """
import ctypes, platform
ADD_KEY, KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
def call(number, *args):
    result = libc.syscall(number, *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return result, ctypes.get_errno()
GET_ID, REVOKE, SEARCH, READ = 0, 3, 10, 11
print("session", call(KEYCTL, GET_ID, -3, 0))
found, _ = call(KEYCTL, SEARCH, -3, b"user", b"trl-ada-trainer-key", 0)
print("search", found)
if found > 0:
    buffer = ctypes.create_string_buffer(4096)
    call(KEYCTL, READ, found, buffer, 4096)
    print("READ", buffer.value)
    print("revoke", call(KEYCTL, REVOKE, found))
for ring in (-1, -2, -3, -4, -5):  # thread, process, session, user, user-session keyrings
    print("add", ring, call(ADD_KEY, b"user", b"planted", b"x", 1, ring))
print(open("/proc/keys").read())
"""


@needs_bwrap
@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="syscall numbers for x86_64/aarch64 only")
def test_the_trainers_kernel_keyring_is_out_of_reach(tmp_path):
    # The trainer (a child process here, so this process's keyring is untouched) joins a session keyring holding a
    # secret, as after a PAM login or `keyctl session`; the program tries to read, revoke and outlive it.
    paths = [str(Path(sandbox_module.__file__).resolve().parents[1])]
    probe = _KEYRING_PROBE.format(paths=paths, secret=SECRET, program=_KEYRING_ATTACK)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    if "skip" in report:  # e.g. Docker's default seccomp profile refuses keyctl to the trainer itself
        pytest.skip(f"this process cannot join a session keyring: {report['skip']}")
    assert report["status"] == "ok", report["stderr"]
    assert SECRET not in report["stdout"] + report["stderr"]
    assert "READ" not in report["stdout"] and "search -1" in report["stdout"]
    assert report["key_intact"], "the trainer's key was revoked or changed"
    assert report["session_keys"] == 1 and not report["planted_seen"], "a key planted by the program outlived it"


_ZOMBIE_PROBE = """
import os, sys
sys.path[:0] = {paths!r}
from trl_ada.rewards.sandbox import Sandbox, SandboxLimits
assert os.getpid() == 1, os.getpid()
box = Sandbox(SandboxLimits(wall_time_s=1))
statuses = [box.run(program="print(1)").status for _ in range({runs})]
statuses.append(box.run(program="import time; time.sleep(30)").status)  # killed at its wall-clock limit
zombies = 0
for entry in os.listdir("/proc"):
    try:
        zombies += entry.isdigit() and open(f"/proc/{{entry}}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        pass
print(statuses, zombies)
"""


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and util-linux unshare")
def test_no_zombie_is_left_when_the_trainer_is_pid_1():
    # A container whose entry point is the trainer: it is PID 1, so the sandbox's init, orphaned when bubblewrap's
    # monitor exits first, is reparented to it, and nobody else would reap it.
    runs = 4
    probe = _ZOMBIE_PROBE.format(paths=[str(Path(sandbox_module.__file__).resolve().parents[1])], runs=runs)
    command = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", probe]
    out = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    statuses, zombies = out.stdout.strip().rsplit("]", 1)
    assert statuses == "[" + ", ".join(["'ok'"] * runs + ["'timeout'"]), out.stdout
    assert int(zombies) == 0, f"{zombies.strip()} zombies after {runs + 2} sandboxes (the check run included)"


@needs_bwrap
def test_sandbox_error_is_what_bubblewrap_reports_not_the_programs_stderr(box, monkeypatch, tmp_path):
    forged = box.run(
        program="import sys\nsys.stderr.write('bwrap: Can\\'t mount proc on /newroot/proc\\n')\nsys.exit(1)"
    )
    assert forged.status == "error" and forged.returncode == 1, forged
    # A real set-up failure: bubblewrap cannot bind a path that does not exist, so the program never runs.
    real_args = box._bwrap_args
    missing = str(tmp_path / "missing")
    monkeypatch.setattr(
        box, "_bwrap_args", lambda *a: real_args(*a)[:1] + ["--ro-bind", missing, "/x"] + real_args(*a)[1:]
    )
    failed = box.run(program="print('ran')")
    assert failed.status == "sandbox_error" and "ran" not in failed.stdout, failed
    assert missing in failed.detail


@needs_bwrap
def test_the_sandboxs_total_memory_is_bounded_where_a_memory_cgroup_can_be_made(box):
    if box.memory_cgroup is None:
        pytest.skip("no cgroup v1 memory hierarchy this process may write (root on a cgroup v1/hybrid machine)")
    limits = SandboxLimits(wall_time_s=8, cpu_time_s=8, memory_bytes=64 << 20, scratch_bytes=8 << 20)
    small = Sandbox(limits)
    # Kernel memory no process maps: empty files cost the tmpfs no scratch_bytes, but each costs an inode and a
    # dentry (long names: ~1.5 KiB a file).
    inodes = (
        "import os\nn = 0\nwhile True:\n    os.close(os.open(f'{n:0200d}', os.O_CREAT | os.O_WRONLY))\n    n += 1\n"
    )
    # Processes each within their address-space limit, together over the sandbox's total.
    processes = (
        "import os, signal, time\n"
        "children = []\n"
        "for _ in range(3):\n"
        "    if (pid := os.fork()) == 0:\n"
        "        block = bytearray(48 << 20)\n"
        "        time.sleep(1)\n"
        "        os._exit(0)\n"
        "    children.append(pid)\n"
        "killed = sum(os.waitpid(pid, 0)[1] == signal.SIGKILL for pid in children)\n"
        "print('KILLED', killed)\n"
        "raise SystemExit(killed)\n"
    )
    for program in (inodes, processes):
        result, elapsed, left, _ = run_marked(small, program)
        assert result.status == "memory" and "sandbox memory limit" in result.detail, (program, result)
        assert elapsed < limits.wall_time_s, (program, elapsed)  # killed at the limit, not at the wall clock
        assert not left
    assert not [name for name in os.listdir(small.memory_cgroup) if name.startswith("trl-ada-sandbox-")]


_DENTRY_BYTES = 192  # the kernel's struct dentry (slabinfo's objsize of dentry on x86_64 and aarch64)


_LOOKUPS = 60_000


def _name_writer() -> str:
    """A program that spells an answer as names that do not exist, looked up in the directories a program sees; new
    names on each call."""
    return f"""
import os
tag = "{random.getrandbits(48):012x}"
for directory in ("/usr/lib", "/usr/bin", "/etc", "/lib", "/"):
    for i in range({_LOOKUPS} // 5):
        try:
            os.stat(f"{{directory}}/answer-{{tag}}-{{i}}")
        except OSError:
            pass
print("looked up")
"""


def _negative_dentries() -> int:
    """The machine's negative directory-cache entries (``nr_negative`` of /proc/sys/fs/dentry-state)."""
    return int(Path("/proc/sys/fs/dentry-state").read_text().split()[4])


@needs_bwrap
def test_a_run_leaves_no_directory_cache_entries_behind(box):
    """A writer's lookups of names that do not exist (an answer spelt as names) would leave negative entries in the
    host's directory cache, which a later run could time and which hold kernel memory after the call. The sandbox
    sees only its private copy on a tmpfs, where the kernel keeps no negative entry: the machine's count does not grow
    by the lookups (it grows by all of them with ``filesystem="host"``)."""
    box.run(program="print(1)")
    before = _negative_dentries()
    result = box.run(program=_name_writer())
    assert result.status == "ok" and "looked up" in result.stdout, result
    # Other processes of the machine make a few negative entries of their own meanwhile: a quarter is far above that.
    assert _negative_dentries() - before < _LOOKUPS // 4, (before, _negative_dentries())


@needs_bwrap
def test_a_run_leaves_no_kernel_memory_charged_above_it(box):
    """What the lookups would leave is charged to the cgroup above the run's once the run's cgroup is removed: measured
    in a parent cgroup of the test's own, which no other process of the machine charges."""
    if box.memory_cgroup is None:
        pytest.skip("no cgroup v1 memory hierarchy this process may write (root on a cgroup v1/hybrid machine)")
    parent = Path(box.memory_cgroup) / f"trl-ada-test-{random.getrandbits(48):012x}"
    parent.mkdir()
    try:
        private = box.with_limits(box.limits)
        private.memory_cgroup = str(parent)

        def charged() -> int:
            return int((parent / "memory.usage_in_bytes").read_text())

        private.run(program="print(1)")
        result = private.run(program=_name_writer())
        assert result.status == "ok" and "looked up" in result.stdout, result
        # Freed slab objects are uncharged after an RCU grace period: wait for it, generously. On the host's
        # filesystems every entry would stay charged here (about 192 bytes a lookup) for as long as the kernel keeps it.
        deadline = time.monotonic() + 10
        while charged() > _LOOKUPS * _DENTRY_BYTES // 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert charged() <= _LOOKUPS * _DENTRY_BYTES // 4, (charged(), _LOOKUPS * _DENTRY_BYTES)
    finally:
        (parent / "memory.force_empty").write_text("0")
        parent.rmdir()


@needs_bwrap
def test_every_directory_a_program_sees_is_in_memory_and_names_nothing_of_the_trainer(box):
    """No directory of the host's disks is mounted in the sandbox (a lookup or read there would leave state a later
    run can time): every directory mount is the copy's tmpfs or the run's own tmpfs or proc (the devices of /dev, and
    /dev/null over the machine's counters in /proc, are files); and the mounts' sources name neither the trainer's PID
    nor a host path outside the copy."""
    result = box.run(program="print(open('/proc/self/mountinfo').read())")
    assert result.status == "ok", result
    mounts = [
        line.split(" - ")[0].split() + line.split(" - ")[1].split() for line in result.stdout.splitlines() if line
    ]
    directories = {
        fields[4]: fields[6]
        for fields in mounts
        if fields[4] != "/" and "/dev/" not in fields[4] + "/" and fields[3] != "/null"
    }
    assert directories and set(directories.values()) <= {"tmpfs", "proc"}, mounts
    assert {"/usr", "/etc", "/tmp", "/proc"} <= set(directories), directories
    assert not re.search(rf"\b{os.getpid()}\b", result.stdout), result.stdout


@needs_bwrap
def test_the_standard_library_imports_in_the_sandbox_as_on_the_host(box):
    """The private copy holds what the interpreter needs: every standard-library module that imports on the host
    imports in the sandbox (its shared libraries, data files and byte code came along)."""
    probe = """
import importlib, json, sys
skipped = {"antigravity", "this", "__main__"}
ok = []
for name in sorted(sys.stdlib_module_names - skipped):
    try:
        importlib.import_module(name)
        ok.append(name)
    except BaseException:
        pass
print(json.dumps(ok))
"""
    host = subprocess.run([box.python, "-I", "-c", probe], capture_output=True, text=True, timeout=60, env={})
    result = box.with_limits(dataclasses.replace(box.limits, wall_time_s=30, cpu_time_s=20)).run(program=probe)
    assert result.status == "ok", result
    on_host = set(json.loads(host.stdout))
    assert len(on_host) > 150, host.stderr
    assert on_host - set(json.loads(result.stdout)) == set()


@needs_bwrap
def test_a_sandbox_that_cannot_enter_its_memory_cgroup_does_not_run(box, monkeypatch):
    """The sandbox is started in its run's memory cgroup or not at all: a program never runs uncapped."""
    if box.memory_cgroup is None or os.geteuid() != 0:
        pytest.skip("needs a cgroup v1 memory hierarchy this process may write, and a root trainer")
    monkeypatch.setattr(sandbox_module._MemoryCgroup, "let_enter", lambda self, uid: None)
    result = box.run(program="print('ran')")
    assert result.status == "sandbox_error" and "ran" not in result.stdout, result
    assert "tasks" in result.detail, result
    assert not [name for name in os.listdir(box.memory_cgroup) if name.startswith("trl-ada-sandbox-")]


def _run_classic_bpf(program: bytes, arch: int, number: int, first_argument: int = 0, second_argument: int = 0) -> int:
    """What a seccomp classic-BPF program returns for a system call: the few instructions ``_seccomp_program`` uses."""
    instructions = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    low = 0 if sys.byteorder == "little" else 4  # an argument's low word in seccomp_data
    data = {0: number, 4: arch, 16 + low: first_argument, 20 - low: 0, 24 + low: second_argument, 28 - low: 0}
    accumulator, pc = 0, 0
    while True:
        code, true_offset, false_offset, value = instructions[pc]
        if code == 0x20:  # load a word of seccomp_data
            accumulator = data[value]
        elif code in (0x15, 0x35, 0x45):  # jump if equal / greater or equal / any bit set
            taken = {0x15: accumulator == value, 0x35: accumulator >= value, 0x45: bool(accumulator & value)}[code]
            pc += true_offset if taken else false_offset
        elif code == 0x54:  # and a constant into the accumulator
            accumulator &= value
        elif code == 0x06:
            return value
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
        pc += 1


@pytest.mark.parametrize("machine", sorted(sandbox_module._DENIED_SYSCALLS))
def test_the_seccomp_filter_refuses_exactly_its_calls_on_each_architecture(machine):
    arch, numbers, second_abi = sandbox_module._DENIED_SYSCALLS[machine]
    program = sandbox_module._seccomp_program(machine)
    allow, eperm, eagain, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 11, 0x00050000 | 38
    assert {name for name in numbers} >= {"shmget", "msgget", "semget", "memfd_create", "keyctl", "add_key"}
    for number in numbers.values():
        assert _run_classic_bpf(program, arch, number) == eperm
    assert {"mq_open", "inotify_init1", "flock", "fanotify_init", "futex_waitv", "mlock", "io_setup"} <= set(numbers)
    assert {"io_uring_setup", "userfaultfd", "ptrace", "process_vm_readv", "pidfd_open", "pidfd_getfd"} <= set(numbers)
    assert {"socket", "socketpair", "mlockall", "mlock2"} <= set(numbers)
    fcntl_number = sandbox_module._FCNTL_SYSCALL[machine]
    futex_number = sandbox_module._FUTEX_SYSCALL[machine]
    clone_number = sandbox_module._CLONE_SYSCALL[machine]
    clone3_number = sandbox_module._CLONE3_SYSCALL[machine]
    special = {fcntl_number, futex_number, clone_number, clone3_number}
    for number in set(range(470)) - set(numbers.values()) - special:
        assert _run_classic_bpf(program, arch, number) == allow, number
    for command in range(1100):  # fcntl's lock, lease, notification and write-hint commands are refused
        expected = eperm if command in sandbox_module._DENIED_FCNTL_COMMANDS else allow
        assert _run_classic_bpf(program, arch, fcntl_number, second_argument=command) == expected, command
    assert {5, 6, 7, 36, 37, 38, 1024, 1025, 1026} <= set(sandbox_module._DENIED_FCNTL_COMMANDS)
    for command in range(14):  # futex: private operations pass; on a shared key only wakes do
        for clock in (0, 256):
            private = command | 128 | clock
            assert _run_classic_bpf(program, arch, futex_number, second_argument=private) == allow, private
            shared = command | clock
            expected = allow if command in (1, 5, 7, 10) else eagain  # WAKE, WAKE_OP, UNLOCK_PI, WAKE_BITSET
            assert _run_classic_bpf(program, arch, futex_number, second_argument=shared) == expected, shared
    fork_flags = 0x01000000 | 0x00200000 | 17  # CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD, as glibc's fork
    assert _run_classic_bpf(program, arch, clone_number, first_argument=fork_flags) == allow
    assert _run_classic_bpf(program, arch, clone_number, first_argument=fork_flags | 0x1000) == eperm  # CLONE_PIDFD
    assert _run_classic_bpf(program, arch, clone3_number) == enosys  # glibc falls back to clone
    assert _run_classic_bpf(program, 0x40000003, 0) == eperm  # another architecture's ABI (i386 on x86_64)
    if second_abi is not None:
        assert _run_classic_bpf(program, arch, second_abi + 1) == eperm  # x32
    assert sandbox_module._seccomp_program("riscv64") is None
