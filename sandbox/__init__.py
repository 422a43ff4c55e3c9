"""Run untrusted, model-written Python so that it cannot hurt the host.

Used by the code and swe graders (RL reward, HumanEval/MBPP eval).  Standard
library only, and nothing from the rest of the project: the graders in stages/
depend on it, never the other way round.  Linux only.

Modules: ``supervisor`` (the caller's side: picks the layers, launches and
limits the child, judges its report), ``child`` (the sandbox's side, run as a
script), ``seccomp`` (the syscall filter the child installs), ``cgroup`` (a
memory and pids group per run).

What it provides (strongest layers first; ``isolation_mode()`` says which ran)
-------------------------------------------------------------------------------
Every program runs under a small launcher: sandbox/child.py executed as a
script ("bootstrap", B), which forks an init (I) that forks the user program (U).

* ``netns``   - a fresh network namespace: only a downed loopback, so neither
  the internet nor the host's 127.0.0.1 services are reachable.
* ``pidns``   - a fresh pid namespace with its own /proc: the program sees no
  host process, cannot signal one, and everything it spawns dies with I.
* ``mntns``   - a private mount namespace in which every mount is remounted
  read-only and nosuid; /tmp is an empty read-only tmpfs holding the working
  directory (a small writable tmpfs, the only writable place apart from a
  private /dev/shm; both bounded in bytes and in inodes, so a flood of empty
  files cannot pin kernel memory either); /var/tmp, /run, /root, /home, the
  caller's $HOME and this project's checkout are hidden under empty read-only
  tmpfs mounts.
* ``userns``  - only when the caller is not root: a user namespace so that the
  namespaces above can be created unprivileged; U then drops every capability.
* ``setuid``  - only when the caller is root: U runs as an otherwise unused uid
  (one per concurrent sandbox, from 65000 up, configurable with
  CASCADE_SANDBOX_UID_BASE; a uid that still owns processes is skipped), so
  RLIMIT_NPROC is enforced (root ignores it) and nothing owned by root
  (/root, /etc/shadow, the caller) is reachable or signallable.
* ``seccomp`` - a seccomp-bpf filter; these fail with EPERM:
  - socket() of every family, AF_UNIX included: netns separates only abstract
    Unix sockets, and a read-only mount does not stop connect(), so a host
    service on a socket file the sandbox uid may write (a world-writable
    /dev/log, a chmod-ed docker.sock) would otherwise be reachable;
  - socketpair() other than AF_UNIX/SOCK_STREAM: a stream pair is born
    connected and cannot be pointed at a socket file (a datagram pair can be,
    with sendto); asyncio and multiprocessing's pipes need nothing more;
  - memfd_create, memfd_secret and SysV shmget/semget/msgget: their memory is
    in no address space, so RLIMIT_AS does not count it;
  - setsockopt SO_SNDBUF/SO_RCVBUF (and their FORCE forms): a socket keeps the
    kernel's default buffer size, so socket pairs cannot hoard kernel memory;
  - namespace/mount syscalls, ptrace, bpf, io_uring, keyrings, perf and
    userfaultfd.
  Survives exec, so it covers subprocesses too.
* ``cgroup``  - where a cgroup memory controller is writable (cgroup.py): the
  program's processes together, kernel memory (socket buffers, pipes) included,
  may hold at most memory_mb; passing it kills a process of the program and
  the verdict is "fail" with a "memory limit ... exceeded" note.  A pids
  controller, where writable too, bounds the tree to max_processes.  The init
  is not in the group.  Where no memory controller is writable, the sandbox
  logs one warning when it starts.
* ``rlimits`` - CPU seconds, address space, processes, file size, open files,
  no core dumps.  Always on.  Without ``cgroup``, RLIMIT_AS is the only memory
  limit, per process (see below).
* ``socket-preamble`` - last resort when neither netns nor seccomp can run:
  socket.socket is replaced before the program starts so that no new socket
  of any family can be made (socketpair() still works).  Python-level only:
  ctypes, _socket or a subprocess bypass it.  The mode string says so when it
  is used.

Always: a minimal environment built from scratch (no AWS_*, MLFLOW_*, tokens,
keys or passwords of the caller), ``-I -B`` isolated interpreter, a fresh
working directory removed afterwards, its own process session and group, a wall
clock limit enforced by I and, as a backstop, by the caller killing the whole
process group (after killing every process of the sandbox uid when there is
no pid namespace), stdout/stderr each read through a bounded reader (the rest is
drained and discarded; stderr may end with one "[sandbox] ..." line saying
why a run did not pass), and a reaping init (child subreaper) so no zombie or
orphan survives a verdict.

What it does NOT provide
------------------------
* No kernel isolation: a kernel exploit escapes (use a VM/gVisor for that).
* Without ``cgroup``: total memory is per-process RLIMIT_AS times
  max_processes (plus the tmpfs sizes); kernel memory held in pipes and socket
  buffers is bounded only through the open-file and process limits (with
  ``seccomp`` sockets keep the default buffer: about 13 MiB per process at 64
  open files).  Without ``seccomp`` (an architecture other than x86_64/aarch64)
  memfd and SysV shared memory escape RLIMIT_AS and socket buffers may grow to
  the kernel's wmem_max/rmem_max.
  CPU contention with the host is not throttled, only bounded in time.
* Without mntns the host's world-writable directories (/tmp, /var/tmp, /dev/shm)
  stay writable and world-readable files stay readable, and the working
  directory is on the host's /tmp, bounded by RLIMIT_FSIZE per file only.
  Without pidns and setuid (non-root caller, no namespaces) the program runs
  as the caller's uid: it can read the caller's files and /proc/<pid>/environ
  and signal the caller's processes.  Such modes are reported honestly in ``isolation``.
* World-readable files outside the hidden paths (/usr, /etc/passwd, other
  checkouts) stay readable; nothing can be written there.
* Without ``seccomp`` a host service on a socket file that the program's uid
  may write is reachable.  With it, programs that need socket() fail:
  multiprocessing's Manager and forkserver start method (the default fork one
  works), logging's SysLogHandler.
* Only the exit status is judged: a program that calls os._exit(0) before
  the grader's appended asserts run "passes".  Graders that need more should
  print a per-run nonce after the asserts and check stdout for it.
* A root caller whose uid drop fails (e.g. a container without those uids
  mapped) gets a mode without ``setuid``: RLIMIT_NPROC is then not enforced.
* Two caller processes starting sandboxes at the same instant may pick the
  same uid and share its RLIMIT_NPROC budget (the busy-uid check is racy).

Interpreter choice: the program runs under ``sys.executable`` when the sandbox
uid can execute it; otherwise (here: pyenv lives under /root, mode 700) under
the first world-executable of /usr/bin/python3 or /usr/local/bin/python3, or
CASCADE_SANDBOX_PYTHON if set.  Graded programs only need the standard library.
The real binary is run (never a venv shim), so venv packages are not visible,
and ``-I`` keeps the working directory off sys.path: programs are single files.
The program runs at nice 10 so that the host and the init stay responsive.
"""

from __future__ import annotations

from cascade.sandbox.supervisor import SandboxLimits, Verdict, isolation_mode, run_many, run_python

__all__ = ["SandboxLimits", "Verdict", "isolation_mode", "run_python", "run_many"]
