"""fold_error_state: calls that fail with EIO/EROFS after a kernel finding of the workload are
that finding's consequences (the file system stopped itself), not findings of their own."""

from __future__ import annotations

from checkers.findings import Finding, fold_error_state, kernel_finding


def kernel(phase: str = "workload") -> Finding:
    return kernel_finding({"event": "warning", "phase": phase, "line": "WARNING: at fs/btrfs/disk-io.c:344"})


def semantics(op: str, errno: str | None) -> Finding:
    ev = {"op": op, "expected": "success"} | ({"errno": errno} if errno else {})
    return Finding("semantics", f"{op}: expected success, the kernel returned {errno}", evidence=ev)


def test_eio_and_erofs_after_a_workload_kernel_finding_are_folded_into_it() -> None:
    k, durable = kernel(), Finding("durability", "foo: lost")
    other = semantics("rename(foo, bar)", "EINVAL")
    out = fold_error_state([k, semantics("mkdir(A)", "EIO"), other, semantics("unlink(foo)", "EROFS"), durable])
    assert out == [k, other, durable]
    assert [d.split(":")[0] for d in k.evidence["calls_failed_after"]] == ["mkdir(A)", "unlink(foo)"]
    assert k.detail.endswith("2 later call(s) failed with EIO/EROFS")


def test_without_a_workload_kernel_finding_every_semantics_finding_stays() -> None:
    eio = [semantics("mkdir(A)", "EIO")]
    assert fold_error_state(list(eio)) == eio
    recovery = kernel("recovery mount")   # a crash image's recovery: says nothing of the workload's calls
    assert fold_error_state([recovery, *eio]) == [recovery, *eio]
    assert "calls_failed_after" not in recovery.evidence
    success = semantics("unlink(missing)", None)   # the kernel succeeded where the model expected an error
    k = kernel()
    assert fold_error_state([k, success]) == [k, success]
