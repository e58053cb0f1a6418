"""`--build NAME=git:REV` across the move to stage folders: a revision from before it builds from
the paths its files had then (moebench.kernels.moved), with its host module's imports read by
today's names; a file under neither path at the revision is one line, never today's file."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from test_builds import HOSTED, TINY, hosted_repo

import moebench
from moebench.cli import main
from moebench.errors import UserError
from moebench.kernels.builds import build_arm_factories, resolve_builds
from moebench.kernels.moved import BEFORE_THE_MOVE, MODULE_RENAMES, candidate_paths, with_todays_imports

ROOT = Path(moebench.__file__).resolve().parents[1]
DECODE = "moebench/kernels/cuda/sm90_fused_moe.cu"


def _before_the_move() -> str:
    """The last commit with the decode kernel at its old path (skips without that history)."""
    try:
        moved = subprocess.run(["git", "-C", str(ROOT), "log", "-n1", "--format=%H", "--diff-filter=D", "--",
                                BEFORE_THE_MOVE[DECODE]], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        moved = ""
    if not moved:
        pytest.skip("moebench is not a git checkout with its history here")
    return f"{moved}~1"


def test_every_moved_path_maps_to_a_distinct_old_path_and_every_module_to_one_name():
    assert len(set(BEFORE_THE_MOVE.values())) == len(BEFORE_THE_MOVE)
    for new in BEFORE_THE_MOVE:
        assert (ROOT / new).is_file(), new  # the map names today's files
    assert MODULE_RENAMES["moebench.kernels.fused_arm"] == "moebench.kernels.cuda.fused_arm"
    assert MODULE_RENAMES["moebench.results.schema"] == "moebench.record.schema"
    assert candidate_paths(DECODE) == (DECODE, "moebench/kernels/sm90_fused_moe.cu")
    assert candidate_paths("moebench/errors.py") == ("moebench/errors.py",)  # never moved


@pytest.mark.parametrize("old, new", [
    ("from moebench.kernels import cuda_build\n", "from moebench.kernels.cuda import nvrtc as cuda_build\n"),
    ("from moebench.kernels.fused_layout import plan\n", "from moebench.kernels.cuda.fused_layout import plan\n"),
    ("    from moebench import significance as sig\n", "    from moebench.analysis import significance as sig\n"),
    ("import moebench.determinism_child\n", "import moebench.determinism.child\n"),
    ("from moebench.determinism import check\n", "from moebench.determinism.checks import check\n"),
    ("from moebench.errors import UserError\n", "from moebench.errors import UserError\n"),
])
def test_old_imports_read_by_todays_names(old, new):
    assert with_todays_imports(old) == new


def test_a_build_from_before_the_move_takes_the_kernel_from_its_old_path(monkeypatch, tmp_path):
    rev = _before_the_move()
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path / "cache"))
    (build,) = resolve_builds([f"old=git:{rev}:{DECODE}"], cwd=ROOT, host="worktree")
    assert build.arm == "cuda-fused" and build.repo_path == BEFORE_THE_MOVE[DECODE]
    assert build.source.text == subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{BEFORE_THE_MOVE[DECODE]}"],
                                               capture_output=True, text=True, check=True).stdout


def test_a_path_missing_at_the_revision_is_one_line(monkeypatch, tmp_path, capsys):
    first = subprocess.run(["git", "-C", str(ROOT), "rev-list", "--max-parents=0", "HEAD"], capture_output=True,
                           text=True).stdout.split()
    if not first:
        pytest.skip("moebench is not a git checkout with its history here")
    if any(subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{first[0]}:{p}"], capture_output=True).returncode
           == 0 for p in candidate_paths(DECODE)):
        pytest.skip("the oldest commit here has the decode kernel (a shallow checkout)")
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--shape", "A8", "--build", f"old=git:{first[0]}:{DECODE}", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1
    assert f"{DECODE} does not exist at {first[0]}" in err


def test_a_host_module_missing_at_the_revision_is_refused_not_replaced(tmp_path, monkeypatch):
    """The revision has the kernel but not the arm's module: the build would run today's host
    code with the revision's kernel, so it is refused unless --build-host worktree."""
    commits = [{"moebench_test_hosted.cu": TINY % "v1"},
               {"hosted_tiny_arm.py": HOSTED % "v2", "moebench_test_hosted.cu": TINY % "v2"}]
    with hosted_repo(tmp_path, monkeypatch, commits):
        with pytest.raises(UserError, match=r"test-hosted's host module hosted_tiny_arm.py does not exist at HEAD~1 "
                                            r".*--build-host worktree"):
            resolve_builds(["old=git:HEAD~1:moebench_test_hosted.cu"])
        (kept,) = resolve_builds(["old=git:HEAD~1:moebench_test_hosted.cu"], host="worktree")
        assert kept.host is None and "host v2" in build_arm_factories([kept])["test-hosted@old"]().description
