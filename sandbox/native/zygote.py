"""rlhost's native Python sandbox: a pre-forked zygote.

For code that needs C extensions (numpy, scipy), which the WebAssembly sandbox cannot load. The
host starts this program with a real interpreter; it imports the requested libraries once, checks
that this kernel lets it isolate a child, then serves requests, one JSON line each on stdin,
answering one JSON line each on stdout:

    {"code": "...", "timeout_ms": 10000, "memory_mib": 512, "max_output_bytes": 65536}
    {"stdout": "...", "stderr": "...", "exit_code": 0, "timed_out": false}

Every request runs in a child forked from the zygote (its own process group, so the zygote can
kill everything it started at once), which moves into new mount, network, IPC and PID namespaces
(a user namespace too when not root) and forks the process that runs the code: PID 1 of the new
PID namespace, so no process outside it can be named. Before running any user code that process
chroots into an empty directory, drops to an unprivileged uid (as root: 65534), dies with its
parent, sets rlimits (address space, CPU, file size, open files, core dumps), forbids new
privileges and installs a seccomp filter that refuses sockets, exec, fork (clone without
CLONE_THREAD), ptrace, sending signals (kill, tkill, tgkill, rt_(tg)sigqueueinfo, pidfds),
leaving its process group, mounts, namespaces, module loading and other escape hatches. If any
step fails the child runs nothing; if the self check at start-up fails the zygote refuses to
serve: model code never runs unsandboxed.

The host starts it with a fixed, minimal environment (user code sees only that) and passes its own
configuration as arguments: `zygote.py --tmp DIR [--preload numpy,scipy]`.
"""

import argparse
import atexit
import ctypes
import errno
import json
import os
import platform
import resource
import select
import signal
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import runner  # noqa: E402

libc = ctypes.CDLL(None, use_errno=True)

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_THREAD = 0x00010000
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
AUDIT_ARCH_X86_64 = 0xC000003E
NOBODY = 65534

# x86_64 syscall numbers refused with EPERM.
DENIED = {
    "socket": 41, "connect": 42, "accept": 43, "bind": 49, "listen": 50, "socketpair": 53,
    "accept4": 288, "execve": 59, "execveat": 322, "fork": 57, "vfork": 58, "ptrace": 101,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272,
    "setns": 308, "kexec_load": 246, "init_module": 175, "finit_module": 313,
    "delete_module": 176, "bpf": 321, "perf_event_open": 298, "keyctl": 250, "add_key": 248,
    "request_key": 249, "process_vm_readv": 310, "process_vm_writev": 311, "userfaultfd": 323,
    "io_uring_setup": 425, "open_by_handle_at": 304, "name_to_handle_at": 303, "reboot": 169,
    "swapon": 167, "swapoff": 168, "setpriority": 141,
    # Signals and process handles: nothing in the sandbox may signal, inspect or reach into another
    # process (the PID namespace already hides every other pid; this holds without it too).
    "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
    "pidfd_send_signal": 424, "pidfd_open": 434, "pidfd_getfd": 438, "process_madvise": 440,
    "process_mrelease": 448, "kcmp": 312, "ioprio_set": 251,
    # The zygote kills a call through its process group: the code may not leave it.
    "setpgid": 109, "setsid": 112,
}
# What the self check calls (by number, with harmless arguments: signal 0, bad descriptors, "pid"
# standing for its own pid) and requires to fail with EPERM before the zygote serves.
SIGNAL_PROBES = [
    ("kill", 62, ("pid", 0)),
    ("tkill", 200, ("pid", 0)),
    ("tgkill", 234, ("pid", "pid", 0)),
    ("rt_sigqueueinfo", 129, ("pid", 0, 0)),
    ("rt_tgsigqueueinfo", 297, ("pid", "pid", 0, 0)),
    ("pidfd_open", 434, ("pid", 0)),
    ("pidfd_send_signal", 424, (-1, 0, 0, 0)),
    ("pidfd_getfd", 438, (-1, 0, 0)),
    ("process_madvise", 440, (-1, 0, 0, 0, 0)),
    ("kcmp", 312, ("pid", "pid", 0, 0, 0)),
    ("setpgid", 109, (0, -1)),
]
SYS_CLONE = 56
SYS_CLONE3 = 435


def _bpf(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)


def seccomp_program():
    """A classic-BPF seccomp filter: kill on a foreign architecture, EPERM for DENIED, clone only
    with CLONE_THREAD (threads, not processes), clone3 as ENOSYS (libc falls back to clone)."""
    ld_w_abs, jeq_k, jset_k, ret_k = 0x20, 0x15, 0x45, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    prog = [_bpf(ld_w_abs, 0, 0, 4), _bpf(jeq_k, 1, 0, AUDIT_ARCH_X86_64), _bpf(ret_k, 0, 0, kill)]
    prog.append(_bpf(ld_w_abs, 0, 0, 0))  # syscall number
    for nr in sorted(DENIED.values()):
        prog += [_bpf(jeq_k, 0, 1, nr), _bpf(ret_k, 0, 0, eperm)]
    prog += [_bpf(jeq_k, 0, 1, SYS_CLONE3), _bpf(ret_k, 0, 0, enosys)]
    prog += [
        _bpf(jeq_k, 0, 4, SYS_CLONE),
        _bpf(ld_w_abs, 0, 0, 16),  # clone flags (args[0], low 32 bits)
        _bpf(jset_k, 1, 0, CLONE_THREAD),
        _bpf(ret_k, 0, 0, eperm),
        _bpf(ret_k, 0, 0, allow),
    ]
    prog.append(_bpf(ret_k, 0, 0, allow))
    return b"".join(prog)


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18


def _mount(source, target, fstype, flags, data=None):
    enc = lambda v: v.encode() if v is not None else None  # noqa: E731
    _check(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def python_paths():
    """What the interpreter needs to import modules: its prefixes and sys.path entries."""
    paths = {sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    # Drop paths inside other paths: one bind mount covers them.
    ordered = sorted(os.path.realpath(p) for p in paths)
    keep = []
    for p in ordered:
        if not any(p == k or p.startswith(k.rstrip("/") + "/") for k in keep):
            keep.append(p)
    return keep


def build_root(root):
    """A fresh root in this (new) mount namespace: an empty tmpfs with the Python installation
    bind-mounted read-only and /dev/null. Nothing else of the host is visible."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("rlhost", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path in python_paths():
        target = root + path
        os.makedirs(target, exist_ok=True)
        _mount(path, target, None, MS_BIND | MS_REC)
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.makedirs(root + "/dev", exist_ok=True)
    open(root + "/dev/null", "w").close()
    _mount("/dev/null", root + "/dev/null", None, MS_BIND)
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=0755")


def enter_namespaces():
    """In the call's parent process: new user (when not root), mount, network, IPC and PID
    namespaces. The PID namespace applies to the processes forked after this, not to this one."""
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWPID
    if uid == 0:
        _check(libc.unshare(flags), "unshare")
    else:
        _check(libc.unshare(CLONE_NEWUSER | flags), "unshare")
        with open("/proc/self/setgroups", "w") as f:
            f.write("deny")
        with open("/proc/self/uid_map", "w") as f:
            f.write(f"0 {uid} 1")
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"0 {gid} 1")


def cpu_seconds(limits):
    """The CPU-time limit of a call: its deadline rounded up, plus one second."""
    return max(1, -(-limits["timeout_ms"] // 1000) + 1)


def isolate(empty_dir, limits, as_root):
    """Everything the process that runs the code (PID 1 of its namespace) does before user code
    runs. Raises on any failure."""
    build_root(empty_dir)
    os.chroot(empty_dir)
    os.chdir("/")
    if as_root:
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
    # After the uid change, which clears it: die with the parent (the zygote kills the parent's
    # process group; this also covers a parent that dies some other way).
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    mem = limits["memory_mib"] << 20
    cpu = cpu_seconds(limits)
    for res, value in [
        (resource.RLIMIT_AS, mem),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_FSIZE, 0),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_CORE, 0),
    ]:
        resource.setrlimit(res, (value, value))
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    prog = seccomp_program()
    fprog = SockFprog(len(prog) // 8, prog)
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def _die_like(status, cpu_limit, cpu_used):
    """Ends this process the way its child ended, so the zygote reads the child's status."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        # PID 1 of a namespace ignores SIGXCPU, so the CPU limit shows as the kernel's SIGKILL at
        # the hard limit: tell it apart by the CPU time used.
        if sig == signal.SIGKILL and cpu_used >= cpu_limit - 0.05:
            sig = signal.SIGXCPU
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def run_contained(request, empty_dir):
    """The call's parent process (stdout and stderr already on the pipes): enters the
    namespaces, forks the process that runs the code, waits for it and exits like it."""
    as_root = os.getuid() == 0
    enter_namespaces()
    pid = os.fork()
    if pid == 0:
        try:
            isolate(empty_dir, request, as_root)
        except BaseException as e:  # noqa: BLE001
            os.write(2, f"Error: the sandbox could not isolate this call: {e}\n".encode())
            os._exit(70)
        sys.argv = [""]
        status = runner.run_cell(request["code"], runner.new_namespace())
        os._exit(status if 0 <= status < 256 else 1)
    # Hold no end of the output pipes, so the zygote sees them close when the code ends.
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)
    os.dup2(null, 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _, status, usage = os.wait4(pid, 0)
    _die_like(status, cpu_seconds(request), usage.ru_utime + usage.ru_stime)


# Bytes (or lines) past the cap after which a call is stopped as a flood; below that, output past
# the cap is dropped and the program carries on (the WebAssembly sandbox's limits too).
FLOOD_SLACK = 4 << 20
FLOOD_LINES = 100_000


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read_capped(fds, cap, deadline, pgid):
    """Reads both pipes until EOF, the deadline or a flood; keeps `cap` bytes of each."""
    data = {fd: bytearray() for fd in fds}
    cut = {fd: False for fd in fds}
    open_fds = list(fds)
    timed_out = flooded = False
    dropped = dropped_lines = 0
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            _kill_group(pgid)
            break
        ready, _, _ = select.select(open_fds, [], [], left)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                open_fds.remove(fd)
                continue
            room = max(cap - len(data[fd]), 0)
            data[fd] += chunk[:room]
            if len(chunk) > room:
                cut[fd] = True
                dropped += len(chunk) - room
                dropped_lines += chunk.count(b"\n", room)
        if dropped > FLOOD_SLACK or dropped_lines > FLOOD_LINES:
            # Printing forever: stop it now rather than at its deadline.
            flooded = True
            _kill_group(pgid)
            break
    return data, cut, timed_out, flooded


def _wait_until(pid, deadline):
    """Reaps the call's parent (which exits when the code ends), killing its group at the
    deadline: code that closed its output is still on the clock. Returns (status, timed out)."""
    pause = 0.0005
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status, False
        if time.monotonic() >= deadline:
            # Still unreaped, so the group id cannot have been reused: only the call is killed.
            _kill_group(pid)
            return os.waitpid(pid, 0)[1], True
        time.sleep(pause)
        pause = min(pause * 2, 0.01)


def serve_one(request, empty_dir):
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            os.close(out_r)
            os.close(err_r)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.close(out_w)
            os.close(err_w)
            sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
            sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
            # fd 0 is the zygote's request pipe: the call must neither read the requests that
            # follow nor keep the pipe open, so it becomes /dev/null like sys.stdin.
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            # Nothing else the zygote holds or inherited (a descriptor whoever started the host
            # left open without close-on-exec: a pipe, a socket, a file) reaches the call.
            os.closerange(3, os.sysconf("SC_OPEN_MAX"))
            sys.stdin = os.fdopen(0, "r", closefd=False)
            run_contained(request, empty_dir)
        except BaseException as e:  # noqa: BLE001
            os.write(2, f"Error: the sandbox could not isolate this call: {e}\n".encode())
        os._exit(70)
    try:
        # Also here, so the group exists before any kill (whichever of the two runs first).
        os.setpgid(pid, pid)
    except OSError:
        pass
    os.close(out_w)
    os.close(err_w)
    deadline = time.monotonic() + request["timeout_ms"] / 1000
    data, cut, timed_out, flooded = _read_capped(
        [out_r, err_r], request["max_output_bytes"], deadline, pid
    )
    os.close(out_r)
    os.close(err_r)
    status, late = _wait_until(pid, deadline)
    timed_out |= late
    stdout = data[out_r].decode("utf-8", "replace")
    stderr = data[err_r].decode("utf-8", "replace")
    note = f"\n[output truncated after {request['max_output_bytes']} bytes]"
    if cut[out_r]:
        stdout += note
    if cut[err_r]:
        stderr += note
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    if flooded:
        return {"stdout": stdout, "stderr": stderr, "exit_code": 1, "timed_out": False}
    if timed_out or sig == signal.SIGXCPU:
        secs = request["timeout_ms"] / 1000
        secs = int(secs) if secs == int(secs) else secs
        stderr += ("\n" if stderr and not stderr.endswith("\n") else "")
        stderr += f"Error: Code execution timed out after {secs} seconds"
        return {"stdout": stdout, "stderr": stderr, "exit_code": 124, "timed_out": True}
    if sig:
        stderr += ("\n" if stderr and not stderr.endswith("\n") else "")
        stderr += f"Error: the Python interpreter crashed ({signal.Signals(sig).name})"
        return {"stdout": stdout, "stderr": stderr, "exit_code": 128 + sig, "timed_out": False}
    return {"stdout": stdout, "stderr": stderr, "exit_code": os.WEXITSTATUS(status), "timed_out": False}


SELF_CHECK = """
import ctypes, os, socket
problems = []
try:
    socket.socket()
    problems.append("sockets are allowed")
except OSError:
    pass
try:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    problems.append("fork is allowed")
except OSError:
    pass
if os.path.exists("/etc/passwd"):
    problems.append("host files are visible")
if os.getpid() != 1 or os.getppid() != 0:
    problems.append("no PID namespace")
libc = ctypes.CDLL(None, use_errno=True)
for name, nr, args in PROBES:
    args = [ctypes.c_long(os.getpid() if a == "pid" else a) for a in args]
    ctypes.set_errno(0)
    if libc.syscall(ctypes.c_long(nr), *args) != -1 or ctypes.get_errno() != 1:
        problems.append(name + " is allowed")
try:
    os.setsid()
    problems.append("setsid is allowed")
except OSError:
    pass
print(";".join(problems) or "contained")
""".replace("PROBES", repr(SIGNAL_PROBES))


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="zygote.py")
    parser.add_argument("--tmp", default=None, help="where the empty root folder goes")
    parser.add_argument("--preload", default="", help="modules to import once, comma-separated")
    return parser.parse_args(argv)


def main():
    args = parse_args(sys.argv[1:])
    # Nothing of the zygote's own configuration is left for the code it runs to read.
    sys.argv = [sys.argv[0]]
    if platform.machine() != "x86_64":
        print(json.dumps({"ready": False, "error": f"the native sandbox supports x86_64 only, not {platform.machine()}"}), flush=True)
        return 2
    for name in filter(None, args.preload.split(",")):
        try:
            __import__(name)
        except ImportError as e:
            print(json.dumps({"ready": False, "error": f"cannot preload {name}: {e}"}), flush=True)
            return 2
    empty_dir = tempfile.mkdtemp(prefix="rlhost-sandbox-root-", dir=args.tmp)
    os.chmod(empty_dir, 0o555)
    # Children mount their root over it in their own namespace; here it stays empty.
    atexit.register(os.rmdir, empty_dir)
    check = serve_one(
        {"code": SELF_CHECK, "timeout_ms": 10000, "memory_mib": 512, "max_output_bytes": 4096},
        empty_dir,
    )
    if check["stdout"].strip() != "contained":
        reason = (check["stdout"] + check["stderr"]).strip()
        print(json.dumps({"ready": False, "error": f"this kernel does not let the sandbox isolate code: {reason}"}), flush=True)
        return 2
    print(json.dumps({"ready": True, "python": platform.python_version()}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            reply = serve_one(request, empty_dir)
        except Exception as e:  # noqa: BLE001 - a broken request must not kill the zygote
            reply = {"stdout": "", "stderr": f"Error: the sandbox failed: {e}", "exit_code": 1, "timed_out": False}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
