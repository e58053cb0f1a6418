from moebench.record.schema import DeclaredKernel, KernelRecord, Sample
from moebench.timing.audit import audit_intervals, audit_samples, kernel_mismatch
from moebench.timing.records import TaggedKernel

D = (DeclaredKernel("gemm", r"gemm\d", 2), DeclaredKernel("combine", "combine", 1))
DECL = {("A8", "x"): D}


def sample(kernels, ext=1, index=0, round_=1):
    return Sample("A8", "x", round_, index, ext, tuple(KernelRecord(*k) for k in kernels))


def tagged(s):
    return [TaggedKernel(k.name, k.start_ns, k.end_ns, s.external_id) for k in s.kernels]


GOOD = [("gemm1", 100, 200), ("gemm2", 210, 300), ("combine", 310, 320)]


def test_exact_declared_kernels_pass():
    s = sample(GOOD)
    flush = TaggedKernel("reduce_kernel", 0, 90, 0)
    audit = audit_samples([s], DECL, tagged(s) + [flush])
    assert audit.passed and audit.samples_passed == 1 and not audit.findings


def test_mismatch_reasons():
    assert kernel_mismatch(["gemm1", "gemm2", "combine"], D) is None
    r = kernel_mismatch(["gemm1", "combine"], D)
    assert "2 kernels, expected 3" in r and "missing gemm x1" in r
    r = kernel_mismatch(["gemm1", "gemm2", "combine", "elementwise"], D)
    assert "unexpected 'elementwise'" in r
    assert "0 kernels" in kernel_mismatch([], D)


def test_foreign_kernel_inside_window_fails():
    s = sample(GOOD)
    stray = TaggedKernel("stray", 250, 260, 0)
    audit = audit_samples([s], DECL, tagged(s) + [stray])
    assert not audit.passed and "foreign kernel 'stray' (untagged)" in audit.findings[0].reason
    other = TaggedKernel("gemm9", 90, 101, 2)  # another sample's kernel overlapping the start
    audit = audit_samples([s], DECL, tagged(s) + [other])
    assert "external id 2" in audit.findings[0].reason


def test_long_kernel_spanning_the_window_is_found():
    s = sample(GOOD)
    long = TaggedKernel("long", 0, 10_000, 0)
    audit = audit_samples([s], DECL, tagged(s) + [long])
    assert not audit.passed


def test_nonpositive_duration_fails():
    s = sample([("gemm1", 100, 100), ("gemm2", 210, 300), ("combine", 310, 320)])
    audit = audit_samples([s], DECL, tagged(s))
    assert "duration 0 ns" in audit.findings[0].reason


def test_findings_name_the_sample_and_count():
    good = sample(GOOD, ext=1, index=0)
    bad = sample(GOOD[:2], ext=2, index=1)
    audit = audit_samples([good, bad], DECL, [])
    assert audit.samples_total == 2 and audit.samples_passed == 1
    f = audit.findings[0]
    assert (f.shape, f.arm, f.round, f.index) == ("A8", "x", 1, 1)


def test_events_samples():
    ok = Sample("A8", "x", 1, 0, 0, (), 5000)
    bad = Sample("A8", "x", 1, 1, 0, (), 0)
    audit = audit_intervals([ok, bad])
    assert audit.samples_passed == 1 and "not positive" in audit.findings[0].reason
