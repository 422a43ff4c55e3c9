"""The seccomp-bpf filter of the sandbox: which syscalls a graded program may not make.

The supervisor builds the filter for this machine's architecture and hands it to the child in its
config; the child installs it just before exec (child._install_seccomp).  Built here, not in the child,
because the child runs as a bare script and can import nothing of ours, and the filter is pure data.
What it denies, and why, is listed in the package docstring (``seccomp`` layer).  Standard library only.
"""

from __future__ import annotations

import os

from cascade.sandbox.child import CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER, CLONE_NEWUTS

__all__ = ["filter_program", "supported"]


# Syscall numbers from the kernel's uapi headers (x86_64: asm/unistd_64.h;
# aarch64: asm-generic/unistd.h).  audit arch: AUDIT_ARCH_X86_64 / _AARCH64.
_ARCHES = {
    "x86_64": {
        "audit": 0xC000003E,
        "socket": 41,
        "socketpair": 53,
        "setsockopt": 54,
        "clone": 56,
        "clone3": 435,
        "deny": [
            101,
            155,
            161,
            165,
            166,
            175,
            246,
            248,
            249,
            250,
            272,
            298,
            308,
            313,
            321,
            323,
            425,
            428,
            429,
            430,
            431,
            432,
            442,
        ],
        "unaccounted": [29, 64, 68, 319, 447],
    },
    "aarch64": {
        "audit": 0xC00000B7,
        "socket": 198,
        "socketpair": 199,
        "setsockopt": 208,
        "clone": 220,
        "clone3": 435,
        "deny": [
            39,
            40,
            41,
            51,
            97,
            104,
            105,
            117,
            217,
            218,
            219,
            241,
            268,
            273,
            280,
            282,
            425,
            428,
            429,
            430,
            431,
            432,
            442,
        ],
        "unaccounted": [194, 190, 186, 279, 447],
    },
}
# deny = ptrace, pivot_root, chroot, mount, umount2, init_module, kexec_load,
# add_key, request_key, keyctl, unshare, perf_event_open, setns, finit_module,
# bpf, userfaultfd, io_uring_setup (io_uring could open sockets), open_tree,
# move_mount, fsopen, fsconfig, fsmount, mount_setattr.
# unaccounted = shmget, semget, msgget, memfd_create, memfd_secret: memory that
# is in no address space, so RLIMIT_AS does not see it (40 memfds of 16 MB held
# 640 MiB under a 128 MB limit); SysV objects would even outlive the run where
# there is no IPC namespace.  Nothing in the standard library needs them.


_SOL_SOCKET, _SO_SNDBUF, _SO_RCVBUF, _SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 1, 7, 8, 32, 33  # asm-generic/socket.h


def supported() -> bool:
    """Whether this machine's architecture has a filter here."""
    return _this_arch() is not None


def _this_arch() -> dict | None:
    return _ARCHES.get(os.uname().machine)


def filter_program() -> list[tuple[int, int, int, int]]:
    """The filter as classic BPF instructions (code, jt, jf, k), for this machine's architecture."""
    arch = _this_arch()
    if arch is None:
        raise OSError("seccomp filter not available for this architecture")
    ld_abs, jeq, jge, jset, and_k, ret = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
    clone_new_mask = (
        CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | 0x02000000
    )
    prog = [(ld_abs, 0, 0, 4), (jeq, 1, 0, arch["audit"]), (ret, 0, 0, kill), (ld_abs, 0, 0, 0)]
    if arch["audit"] == 0xC000003E:  # x32 ABI numbers (bit 30) on x86_64
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]
    for nr in arch["deny"] + arch["unaccounted"]:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, eperm)]
    # clone3 hides its flags in memory; glibc falls back to clone on ENOSYS.
    prog += [(jeq, 0, 1, arch["clone3"]), (ret, 0, 0, enosys)]
    # No socket() of any family: netns cuts AF_INET* off, but an AF_UNIX socket
    # can connect() to any socket file the uid may write (a read-only mount
    # does not stop that), e.g. a world-writable /dev/log or docker.sock.
    prog += [(jeq, 0, 1, arch["socket"]), (ret, 0, 0, eperm)]
    # socketpair(): AF_UNIX SOCK_STREAM only (asyncio and multiprocessing use
    # it).  A stream pair is born connected and refuses connect() and sendto()
    # with an address; a datagram pair could still address any socket file.
    # args[0] (family) and args[1] (type, flags masked off) at offsets 16, 24.
    prog += [
        (jeq, 0, 7, arch["socketpair"]),
        (ld_abs, 0, 0, 16),
        (jeq, 0, 4, 1),
        (ld_abs, 0, 0, 24),
        (and_k, 0, 0, 0xF),
        (jeq, 0, 1, 1),
        (ret, 0, 0, allow),
        (ret, 0, 0, eperm),
    ]
    # setsockopt(): no SO_SNDBUF/SO_RCVBUF(FORCE) at SOL_SOCKET (args[1], args[2]): a socket keeps the
    # kernel's default buffer (about 208 KiB), where a program raising it to wmem_max held 470 MiB of
    # kernel memory in 30 socket pairs, outside RLIMIT_AS (a memory cgroup counts it where there is one).
    prog += [(jeq, 0, 9, arch["setsockopt"]), (ld_abs, 0, 0, 24), (jeq, 0, 6, _SOL_SOCKET), (ld_abs, 0, 0, 32)]
    prog += [
        (jeq, 3, 0, _SO_SNDBUF),
        (jeq, 2, 0, _SO_RCVBUF),
        (jeq, 1, 0, _SO_SNDBUFFORCE),
        (jeq, 0, 1, _SO_RCVBUFFORCE),
        (ret, 0, 0, eperm),
        (ret, 0, 0, allow),
    ]
    # clone(): no new namespaces (flags are args[0]).
    prog += [
        (jeq, 0, 4, arch["clone"]),
        (ld_abs, 0, 0, 16),
        (jset, 0, 1, clone_new_mask),
        (ret, 0, 0, eperm),
        (ret, 0, 0, allow),
    ]
    prog += [(ret, 0, 0, allow)]
    return prog
