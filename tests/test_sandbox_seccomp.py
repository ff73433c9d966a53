"""The seccomp filter: its BPF program checked by a small evaluator, and the blocked calls failing in a sandbox."""

from __future__ import annotations

import platform
import struct

import pytest

from srt_agent.tools import LocalSandbox
from srt_agent.tools.local import bwrap_path
from srt_agent.tools.seccomp import (
    AUDIT_ARCH,
    BLOCKED,
    SYSCALL_NUMBERS,
    X32_SYSCALL_BIT,
    seccomp_program,
)

ALLOW, KILL, EPERM = 0x7FFF0000, 0x80000000, 0x00050001


def evaluate(program: bytes, arch: int, nr: int) -> int:
    """Run a classic-BPF seccomp program (the opcodes the filter uses) on one syscall."""
    insns = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    data = {0: nr, 4: arch}
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:
            acc = data[k]
            pc += 1
        elif code in (0x15, 0x35):
            taken = acc == k if code == 0x15 else acc >= k
            pc += 1 + (jt if taken else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


@pytest.mark.parametrize("machine", sorted(SYSCALL_NUMBERS))
def test_program_denies_exactly_the_blocked_calls(machine):
    program = seccomp_program(machine)
    arch = AUDIT_ARCH[machine]
    blocked = {SYSCALL_NUMBERS[machine][name] for name in BLOCKED}
    assert set(SYSCALL_NUMBERS[machine]) == set(BLOCKED)
    for nr in range(460):
        assert evaluate(program, arch, nr) == (EPERM if nr in blocked else ALLOW), nr
    assert evaluate(program, 0x40000003, 0) == KILL  # i386 calls
    if machine == "x86_64":
        assert evaluate(program, arch, X32_SYSCALL_BIT | 0) == EPERM


def test_unknown_machine_gets_no_filter():
    assert seccomp_program("mips") is None


@pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")
@pytest.mark.skipif(
    platform.machine() not in SYSCALL_NUMBERS, reason="hardware: no syscall table for this CPU architecture"
)
def test_blocked_calls_fail_with_eperm_inside_and_others_work():
    numbers = SYSCALL_NUMBERS[platform.machine()]
    code = (
        "import ctypes, subprocess\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"for name, nr in {sorted(numbers.items())!r}:\n"
        "    ctypes.set_errno(0)\n    print(name, libc.syscall(nr, 0, 0, 0, 0), ctypes.get_errno())\n"
        "print(subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout.strip())\n"
    )
    with_filter = LocalSandbox(timeout_s=10).run(code)
    lines = with_filter.stdout.splitlines()
    assert with_filter.status == "ok" and lines[-1] == "child"
    assert all(line.endswith(" -1 1") for line in lines[:-1]), with_filter.stdout
    without = LocalSandbox(timeout_s=10, seccomp=False).run(code)
    assert any(not line.endswith(" 1") for line in without.stdout.splitlines()[:-1])
