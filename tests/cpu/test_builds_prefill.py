"""`--build` of the prefill pair's source (sm90_fused_prefill.cu): it builds `cuda-fused` with
that source for its prefill kernels, compiles through NVRTC like the shipped file, refuses what
would not run it, and a git build of it is refused where this tree's launcher differs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import moebench
from moebench.errors import UserError
from moebench.fixtures import build_fixture
from moebench.fixtures.shapes import Family, ShapeSpec
from moebench.kernels.cuda import fused_prefill
from moebench.kernels.build_specs import read_moved_at_revision
from moebench.kernels.builds import build_arm_factories, resolve_builds
from moebench.kernels.moved import with_todays_imports
from moebench.kernels.cuda.fused_arm import CudaFusedArm, CudaFusedDetArm
from moebench.kernels.cuda.source import KERNELS_DIR, KernelSource

PREFILL = fused_prefill.SOURCE
ROOT = Path(moebench.__file__).resolve().parents[1]


@pytest.fixture
def copy(tmp_path, monkeypatch):
    """The shipped prefill source with a comment added (another source hash, the same binary)."""
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path / "cache"))
    (tmp_path / PREFILL).write_text((KERNELS_DIR / PREFILL).read_text() + "\n// a build of its own\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path / PREFILL


def test_a_build_of_the_prefill_source_is_cuda_fused_with_that_source(copy):
    (build,) = resolve_builds([f"new={PREFILL}"])
    assert (build.arm, build.source_name) == ("cuda-fused", PREFILL)
    arm = build_arm_factories([build])["cuda-fused@new"]()
    assert arm.inner.prefill_source == build.source and arm.inner.path == "auto"
    assert arm.inner.source == KernelSource.shipped("sm90_fused_moe.cu")  # the decode kernel as shipped
    # the prefill kernels compile from the build: its hash, the shipped binary (a comment differs)
    built, shipped = fused_prefill.build_prefill(fused_prefill.STAGES, build.source), fused_prefill.build_prefill()
    assert built.build.source_sha256 == build.source_sha256 != shipped.build.source_sha256
    assert built.build.binary_sha256 == shipped.build.binary_sha256


def test_a_prefill_build_takes_the_prefill_options_and_refuses_the_decode_kernels(copy):
    (build,) = resolve_builds([f"new={PREFILL}"])
    factory = build_arm_factories([build])["cuda-fused@new"]
    assert factory(chunk=2).inner.path == "prefill"
    src = build.source
    for kwargs, why in (({"path": "decode"}, "path=decode does not launch them"),
                        ({"path": "grouped"}, "path=grouped does not launch them"),
                        ({"block_m": 8}, "block_m set the decode kernel")):
        with pytest.raises(UserError, match=f"a build of {PREFILL} is of the prefill kernels, but {why}"):
            CudaFusedArm(prefill_source=src, **kwargs)
    with pytest.raises(UserError, match="the deterministic build is the decode kernel's"):
        CudaFusedDetArm(prefill_source=src)


def test_a_prefill_build_at_a_decode_shape_is_one_line(copy):
    (build,) = resolve_builds([f"new={PREFILL}"])
    arm = build_arm_factories([build])["cuda-fused@new"]()
    fam = Family("K", "one k block", K=128, E=8, top_k=2, N=256, routed_scale=1.0, shared_expert=False)
    fx = build_fixture(ShapeSpec("K4", fam, 4, seed=1))  # 8 slots on at most 8 experts: the decode path
    with pytest.raises(UserError, match=r"cuda-fused@new: at K4 the route plan takes path=decode, which does "
                                        r"not run the build of sm90_fused_prefill.cu"):
        arm.prepare(fx)


def test_builds_of_two_sources_of_one_arm_are_refused(copy):
    (copy.parent / "sm90_fused_moe.cu").write_text((KERNELS_DIR / "sm90_fused_moe.cu").read_text())
    with pytest.raises(UserError, match="different sources of cuda-fused"):
        resolve_builds([f"a={PREFILL}", "b=sm90_fused_moe.cu"])


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def _text_at(commit: str, path: str) -> str | None:
    found = read_moved_at_revision(ROOT, commit, path)
    return None if found is None else with_todays_imports(found[1])


def _head_and_last_change(path: str, clean: str) -> tuple[str, str]:
    """This checkout's HEAD and the last commit that changed what `path` says (a move to the
    stage folders, which renamed only its imports, is no change); skips where there is no such
    history, or `clean` (a path) has uncommitted changes."""
    try:
        head = _git("rev-parse", "HEAD")
        touched = _git("log", "--follow", "--format=%H", "--", path).split()
        last = next((c for c in touched if _text_at(f"{c}~1", path) != _text_at(c, path)), "")
        dirty = _git("status", "--porcelain", "--", clean)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("moebench is not a git checkout here")
    if not last or dirty:
        pytest.skip(f"{path} has no history here, or {clean} has uncommitted changes")
    return head, last


def test_a_git_prefill_build_runs_this_trees_launcher_only_where_it_is_the_revisions(monkeypatch, tmp_path):
    head, last = _head_and_last_change("moebench/kernels/cuda/fused_prefill.py", "moebench/kernels/cuda/fused_prefill.py")
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path / "cache"))
    spec = "moebench/kernels/cuda/sm90_fused_prefill.cu"
    (build,) = resolve_builds([f"now=git:{head}:{spec}"], cwd=ROOT)
    assert build.source_name == PREFILL and build.commit == head
    # before the last change to the launcher, the revision's host code is not this tree's
    with pytest.raises(UserError, match=r"runs this tree's moebench/kernels/cuda/fused_prefill.py, which differs at "
                                        r".*; --build-host worktree times it with this tree's"):
        resolve_builds([f"old=git:{last}~1:{spec}"], cwd=ROOT)
    (old,) = resolve_builds([f"old=git:{last}~1:{spec}"], cwd=ROOT, host="worktree")
    assert old.source_name == PREFILL and old.host is None


def test_a_build_of_the_decode_source_is_cuda_fused_not_also_its_deterministic_arm(monkeypatch, tmp_path):
    # cuda-fused-det compiles sm90_fused_moe.cu too, as a cuda-fused: the file names cuda-fused
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(ROOT)
    (build,) = resolve_builds(["new=moebench/kernels/cuda/sm90_fused_moe.cu"])
    assert (build.arm, build.source_name) == ("cuda-fused", "sm90_fused_moe.cu")
    (det,) = resolve_builds(["new=moebench/kernels/cuda/sm90_fused_moe.cu"], build_arm="cuda-fused-det")
    assert det.arm == "cuda-fused-det"
    # the grouped GEMMs' file is two arms' alike: still one to choose
    with pytest.raises(UserError, match="builds cuda-gemm and cuda-swapab; choose one with --build-arm"):
        resolve_builds(["g=moebench/kernels/cuda/sm90_grouped_gemm.cu"])


def test_a_variant_of_a_prefill_build_forces_the_pair(copy):
    from moebench.kernels.registry import load_builtin_arms
    from moebench.run.variants import parse_variant, variant_factory
    (build,) = resolve_builds([f"new={PREFILL}"])
    known = {**load_builtin_arms(), **build_arm_factories([build])}
    arm = variant_factory(parse_variant("p=cuda-fused@new:path=prefill"), known)()
    assert arm.name == "p" and arm.inner.inner.path == "prefill"
    assert arm.inner.inner.prefill_source == build.source


def test_a_git_decode_build_is_refused_where_a_helper_of_the_arm_differs(monkeypatch, tmp_path):
    # a git build takes fused_arm.py from its revision, not fused_policy.py (shared memory,
    # occupancy, placement): timed at a revision where that differs, the revision's kernel would be
    # launched with this tree's arithmetic
    head, last = _head_and_last_change("moebench/kernels/cuda/fused_policy.py", "moebench/kernels")
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path / "cache"))
    spec = "moebench/kernels/cuda/sm90_fused_moe.cu"
    (now,) = resolve_builds([f"now=git:{head}:{spec}"], cwd=ROOT)
    assert now.arm == "cuda-fused" and now.host is None
    # (fused_policy.py or a helper that changed with it, the first of them named)
    with pytest.raises(UserError, match=rf"cuda-fused's launch also runs this tree's moebench/kernels/cuda/fused_\w+\.py, "
                                        rf"which differs at {last[:7]}.*~1 .*--build-host worktree times it with this "
                                        rf"tree's"):
        resolve_builds([f"old=git:{last}~1:{spec}"], cwd=ROOT)
    (old,) = resolve_builds([f"old=git:{last}~1:{spec}"], cwd=ROOT, host="worktree")
    assert old.arm == "cuda-fused" and old.host is None
