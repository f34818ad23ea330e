"""f2fs on the host backends: where the host kernel has no f2fs, one line says to use the vm backend."""

from __future__ import annotations

import pytest

from conftest import WORKLOADS, PcEnv
from foundation.filesystems import host_kernel_lacks


@pytest.mark.parametrize("backend", ["fuse", "auto"])
def test_a_host_without_f2fs_says_so_in_one_line(pc: PcEnv, backend: str) -> None:
    if not host_kernel_lacks("f2fs"):
        pytest.skip("this host's kernel has f2fs")
    p = pc.run("run", str(WORKLOADS / "small.sh"), "--fs", "f2fs", "--backend", backend,
               "--out", str(pc.tmp / "out"), check_rc=2)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "the kernel has no f2fs" in lines[0] and "--backend vm" in lines[0], p.stderr
    assert pc.leftovers() == []
