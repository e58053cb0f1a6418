"""`--build` on an H100/H200: a CUDA arm made from a build's KernelSource compiles and runs that
source (a copy of the shipped file that differs in a comment: another source hash, the same
binary) and passes parity."""

from __future__ import annotations

import pytest
import torch

from moebench.fixtures import ShapeRegistry, build_fixture
from moebench.kernels.builds import build_arm_factories, resolve_builds
from moebench.kernels.cuda.source import KERNELS_DIR
from moebench.kernels.api.parity import References, check_parity
from moebench.kernels.registry import make_arm

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("arm, source", [("cuda-fused", "sm90_fused_moe.cu"), ("cuda-swapab", "sm90_grouped_gemm.cu")])
def test_a_build_runs_its_own_source(arm, source, tmp_path, monkeypatch):
    shipped = make_arm(arm)
    reason = shipped.unavailable_reason(torch.device("cuda"))
    if reason:
        pytest.skip(reason)
    (tmp_path / source).write_text((KERNELS_DIR / source).read_text() + "\n// a build of its own\n")
    monkeypatch.chdir(tmp_path)
    (build,) = resolve_builds([f"copy={source}"], build_arm=arm)
    built = build_arm_factories([build])[f"{arm}@copy"]()
    fx = build_fixture(ShapeRegistry().resolve("A8")).to("cuda")
    refs = References(fx)
    calls = [shipped.prepare(fx), built.prepare(fx)]
    for call in calls:
        assert check_parity(call, refs, "A8").passed
    base, copy = calls
    assert copy.identity["build"]["source_sha256"] == build.source_sha256 != base.identity["build"]["source_sha256"]
    assert copy.identity["compiled"][0]["binary_sha256"] == base.identity["build"]["binary_sha256"]


def test_a_build_of_the_prefill_source_runs_the_prefill_kernels_it_names(tmp_path, monkeypatch):
    shipped = make_arm("cuda-fused", path="prefill")
    reason = shipped.unavailable_reason(torch.device("cuda"))
    if reason:
        pytest.skip(reason)
    source = "sm90_fused_prefill.cu"
    (tmp_path / source).write_text((KERNELS_DIR / source).read_text() + "\n// a build of its own\n")
    monkeypatch.chdir(tmp_path)
    (build,) = resolve_builds([f"copy={source}"])
    built = build_arm_factories([build])["cuda-fused@copy"]()  # the route plan picks the prefill pair
    fx = build_fixture(ShapeRegistry().resolve("Q512")).to("cuda")
    refs = References(fx)
    calls = [shipped.prepare(fx), built.prepare(fx)]
    for call in calls:
        assert call.identity["path"] == "prefill" and check_parity(call, refs, "Q512").passed
    base, copy = calls
    assert copy.identity["build"]["source_sha256"] == build.source_sha256 != base.identity["build"]["source_sha256"]
    assert copy.identity["compiled"][0]["binary_sha256"] == base.identity["build"]["binary_sha256"]
