"""`--build`: specs parsed and checked, files read at git revisions, a build's source compiled
through NVRTC, and a build-vs-build run on the CPU (fake timing backend)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import subprocess
from pathlib import Path

import pytest
import torch
from rich.console import Console
from run_fakes import fake_backend
from timing_fakes import FakeGpu

from moebench.cli import main
from moebench.errors import UserError
from moebench.kernels.api.arm import Arm, KernelDecl, PreparedCall
from moebench.kernels.cuda.source import KernelSource
from moebench.kernels.registry import ARMS, add_arm
from moebench.kernels.builds import (BuildSpec, compare_outputs, parse_build_spec, parse_define,
                                     read_at_revision, resolve_builds, resolve_revision)
from moebench.run.runner import RunRequest, run

# ---------------------------------------------------------------- a tiny CUDA arm family

SOURCE = "moebench_test_tiny.cu"  # the source this module's arm compiles (its source_file)
GPU = FakeGpu()
TINY = r'''
extern "C" __global__ void tiny(float* out) {
#ifdef PERTURB
  out[threadIdx.x] = 2.0f * threadIdx.x;
#else
  out[threadIdx.x] = threadIdx.x;  // %s
#endif
}
'''


@functools.lru_cache(maxsize=None)
def build_tiny(source: KernelSource):
    """Cached per process, as fused_arm.build_fused is (keyed by the source it is given)."""
    from moebench.kernels.cuda.nvrtc import compile_source
    return compile_source(source)


def plain_tiny_binary() -> str:
    """The cubin of the tiny kernel as written (comments do not reach the binary)."""
    return build_tiny(KernelSource.from_text(TINY % "", SOURCE)).build.binary_sha256


class TinyArm(Arm):
    name = "test-tiny"
    description = "copies the oracle; compiles moebench_test_tiny.cu; a kernel other than the plain one nudges four outputs"
    source_file = SOURCE

    def __init__(self, source: KernelSource | None = None):
        self.source = source

    def prepare(self, fx):
        from moebench.fixtures import fixture_reference
        if self.source is None:
            raise FileNotFoundError(f"{SOURCE} ships nowhere: only a build gives this arm a source")
        module = build_tiny(self.source)
        ref = fixture_reference(fx)
        want = ref.clone()
        if module.build.binary_sha256 != plain_tiny_binary():  # no GPU here: stand in for what it computes
            want.view(-1)[:4] *= 1.0625
        out = torch.empty_like(ref)

        def run_():
            out.copy_(want)
            GPU.launch("tiny", 3000)
        return PreparedCall(self.name, run_, out, (KernelDecl("tiny", "tiny"),),
                            identity={"build": module.build.to_dict()})


if "test-tiny" not in ARMS:
    add_arm("test-tiny", TinyArm)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A git repository with two commits of the tiny source (and a header) and a third,
    uncommitted version in the work tree; the current directory, and the compile cache."""
    root = tmp_path / "repo"
    (root / "k").mkdir(parents=True)
    git(root, "init", "-q")
    git(root, "config", "user.email", "t@example.com")
    git(root, "config", "user.name", "t")
    src = root / "k" / SOURCE
    for version in ("v1", "v2"):
        src.write_text(TINY % version)
        (root / "k" / "tiny_common.cuh").write_text(f"// header {version}\n")
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", version)
    src.write_text(TINY % "v3 (work tree)")
    monkeypatch.chdir(root)
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path / "cache"))
    from moebench.kernels.cuda import nvrtc as cuda_build
    cuda_build.clear_memo()
    return root


# ---------------------------------------------------------------- parsing


def test_parse_build_spec():
    assert parse_build_spec("new=moebench/kernels/cuda/sm90_fused_moe.cu") == BuildSpec("new", "moebench/kernels/cuda/sm90_fused_moe.cu")
    assert parse_build_spec("main=git:main") == BuildSpec("main", None, "main")
    assert parse_build_spec("old=git:HEAD~3:k/x.cu") == BuildSpec("old", "k/x.cu", "HEAD~3")
    assert parse_build_spec("old=git:HEAD~3:k/x.cu").text == "old=git:HEAD~3:k/x.cu"
    for bad, needle in (("new", "expected NAME=PATH"), ("=a.cu", "expected"), ("a b=x.cu", "build name"),
                        ("main=git:", "no revision"), ("main=git::x.cu", "no revision")):
        with pytest.raises(UserError, match=needle):
            parse_build_spec(bad)


def test_parse_define():
    assert parse_define("new:BLOCK_N=64", ["new", "main"]) == ("new", "BLOCK_N", "64")
    for bad, needle in (("BLOCK_N=64", "expected NAME:KEY=VALUE"), ("new:BLOCK_N", "expected"),
                        ("other:X=1", "no build named 'other'"), ("new:1X=1", "not a C identifier")):
        with pytest.raises(UserError, match=needle):
            parse_define(bad, ["new", "main"])


def test_read_a_file_at_a_revision(repo):
    first = git(repo, "rev-list", "--max-parents=0", "HEAD")
    assert resolve_revision(repo, "HEAD~1") == first
    assert resolve_revision(repo, "no-such-rev") is None and resolve_revision(repo, "--all") is None
    assert "// v1" in read_at_revision(repo, first, f"k/{SOURCE}")
    assert read_at_revision(repo, first, "k/missing.cu") is None


def test_resolve_pins_sources_and_revisions(repo):
    builds = resolve_builds([f"new=k/{SOURCE}", "old=git:HEAD~1", f"same=git:HEAD:k/{SOURCE}"],
                            ["new:PERTURB=1"])
    new, old, same = builds
    assert [b.arm_name for b in builds] == ["test-tiny@new", "test-tiny@old", "test-tiny@same"]
    assert new.revision is None and new.dirty is True and new.commit == git(repo, "rev-parse", "HEAD")
    assert new.defines == (("PERTURB", "1"),) and old.defines == ()
    assert old.commit == git(repo, "rev-parse", "HEAD~1") and old.repo_path == f"k/{SOURCE}"
    assert "// v1" in old.path.read_text() and old.path.name == SOURCE
    assert old.source_sha256 == hashlib.sha256((TINY % "v1").encode()).hexdigest()
    assert "// v2" in same.path.read_text() and same.source_sha256 != old.source_sha256
    ident = old.identity()
    assert ident["origin"] == "git" and ident["revision"] == "HEAD~1" and ident["commit"] == old.commit


@pytest.mark.parametrize("argv, needle", [
    (["--build", "new=k/nope.cu"], "no such file k/nope.cu"),
    (["--build", f"new=k/{SOURCE}", "--build", "old=git:no-such-rev"], "unknown git revision 'no-such-rev'"),
    (["--build", "old=git:HEAD:k/gone.cu", "--build-arm", "test-tiny"], "k/gone.cu does not exist at HEAD"),
    (["--build", f"new=k/{SOURCE}", "--define", "new:PERTURB"], "expected NAME:KEY=VALUE"),
    (["--build", f"new=k/{SOURCE}", "--define", "main:PERTURB=1"], "no build named 'main'"),
    (["--build", f"new=k/{SOURCE}", "--build", f"new=k/{SOURCE}"], "given twice"),
    (["--build", "new"], "expected NAME=PATH or NAME=git:REV[:PATH]"),
    (["--define", "new:X=1"], "--define applies to a --build"),
    (["--build", "new=k/tiny_common.cuh"], "not the source of an arm"),
    (["--build", f"new=k/{SOURCE}", "--build-arm", "triton"], "--build-arm 'triton': not an arm built"),
    (["--build", "g=moebench/kernels/cuda/sm90_grouped_gemm.cu"], "choose one with --build-arm"),
])
def test_build_mistakes_are_one_line_exit_2(repo, capsys, argv, needle):
    if "sm90_grouped_gemm" in argv[-1]:
        from moebench.kernels.cuda.nvrtc import KERNELS_DIR
        argv = ["--build", f"g={KERNELS_DIR / 'sm90_grouped_gemm.cu'}"]
    with pytest.raises(SystemExit) as exc:
        main(["run", "--shape", "T8", *argv])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and needle in err and len(err.splitlines()) == 1, err
    assert err.startswith("moebench: error:")


def test_git_build_outside_a_repository(tmp_path, monkeypatch):
    (tmp_path / SOURCE).write_text(TINY % "x")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="is not in a git repository"):
        resolve_builds([f"a={SOURCE}", "b=git:HEAD"])


def test_compare_outputs():
    a = torch.arange(6, dtype=torch.bfloat16)
    assert compare_outputs(a, a.clone()).bitwise_equal
    b = a.clone()
    b[2] += 0.5
    d = compare_outputs(b, a)
    assert not d.bitwise_equal and d.mismatched == 1 and d.max_abs_diff == pytest.approx(0.5)
    z = torch.zeros(2, dtype=torch.bfloat16)
    assert compare_outputs(-z, z).mismatched == 2  # -0 and +0: equal values, other bits


# ---------------------------------------------------------------- NVRTC and the runner

cuda_core = pytest.importorskip("cuda.core")


def test_a_build_source_compiles_its_text_with_its_define(repo):
    from moebench.kernels.cuda.nvrtc import compile_source
    (old,) = resolve_builds([f"old=git:HEAD~1:k/{SOURCE}"], build_arm="test-tiny")
    with pytest.raises(FileNotFoundError):
        compile_source(SOURCE)  # not a built-in source: only a build's KernelSource compiles
    with pytest.raises(FileNotFoundError):
        TinyArm().prepare(None)
    source = old.source.with_defines({"PERTURB": "1"})
    m = compile_source(source, defines={"UNUSED": "0"})
    assert m.build.source_sha256 == old.source_sha256 and m.build.binary_sha256 != plain_tiny_binary()
    assert dict(m.build.defines) == {"PERTURB": "1", "UNUSED": "0"} and "tiny" in m.build.resources
    assert compile_source(old.source).build.binary_sha256 == plain_tiny_binary()
    with pytest.raises(UserError, match="UNUSED is set by the arm itself"):
        compile_source(old.source.with_defines({"UNUSED": "1"}), defines={"UNUSED": "0"})


def test_build_vs_build_run(repo, tmp_path):
    req = RunRequest(shapes=("T8",), arms=(), ref="old", rounds=2, samples=3, warmup=0,
                     out_dir=str(tmp_path / "out"), measure_bandwidth=False,
                     builds=(f"new=k/{SOURCE}", "old=git:HEAD~1", "same=git:HEAD~1"),
                     defines=("new:PERTURB=1",))
    result, path = run(req, fake_backend(GPU))
    assert result.settings.arms == ("test-tiny@new", "test-tiny@old", "test-tiny@same")
    assert result.settings.ref == "test-tiny@old" and result.audit.passed
    assert all(p.passed for p in result.parity)
    bp = {p.arm: p for p in result.build_parity}
    assert set(bp) == {"test-tiny@new", "test-tiny@same"} and bp["test-tiny@same"].base == "test-tiny@old"
    assert bp["test-tiny@same"].bitwise_equal and bp["test-tiny@same"].max_abs_diff == 0
    assert not bp["test-tiny@new"].bitwise_equal and bp["test-tiny@new"].mismatched == 4
    assert bp["test-tiny@new"].max_abs_diff > 0
    ids = {a.name: a.identity for a in result.arms}
    new, old = ids["test-tiny@new"], ids["test-tiny@old"]
    assert old["build_spec"]["revision"] == "HEAD~1" and old["build_spec"]["commit"] == git(repo, "rev-parse", "HEAD~1")
    assert new["build_spec"]["dirty"] is True and new["build_spec"]["defines"] == {"PERTURB": "1"}
    assert new["compiled"][0]["defines"] == {"PERTURB": "1"} and old["compiled"][0]["defines"] == {}
    assert new["compiled"][0]["binary_sha256"] != old["compiled"][0]["binary_sha256"]
    assert old["build"]["source_sha256"] == old["build_spec"]["source_sha256"]  # the lru_cache was seen through
    assert result.settings.options["builds"][1] == "old=git:HEAD~1"

    from moebench.views.markdown import render_markdown
    from moebench.analysis.load import load
    from moebench.views.tables import print_tables
    assert load(path) == result
    buf = io.StringIO()
    print_tables(result, Console(file=buf, width=200))
    text = buf.getvalue()
    assert "output vs test-tiny@old" in text and "bitwise equal" in text and "4 differ" in text
    md = render_markdown(result)
    assert "output vs `test-tiny@old`" in md and "bitwise equal" in md and "| base |" in md.replace("`", "")


HOSTED = '''
from moebench.kernels.api.arm import Arm, register_arm

SOURCE = "moebench_test_hosted.cu"
VERSION = "%s"


@register_arm("test-hosted")
class HostedArm(Arm):
    name = "test-hosted"
    description = "host " + VERSION
    source_file = SOURCE

    def __init__(self, source=None):
        self.source = source

    def prepare(self, fx):
        raise NotImplementedError
'''


@contextlib.contextmanager
def hosted_repo(tmp_path: Path, monkeypatch, commits):
    """A git repository of the hosted arm, one commit per mapping of file name to text, as the
    current directory, with the arm registered from its last commit (the registry restored after)."""
    import importlib
    import sys

    from moebench.kernels import registry as arm_module
    root = tmp_path / "hosted"
    root.mkdir()
    git(root, "init", "-q")
    git(root, "config", "user.email", "t@example.com")
    git(root, "config", "user.name", "t")
    for n, files in enumerate(commits):
        for name, text in files.items():
            (root / name).write_text(text)
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", f"commit {n}")
    monkeypatch.chdir(root)
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(arm_module, "ARMS", dict(arm_module.ARMS))
    try:
        arm_module.add_module_arms(importlib.import_module("hosted_tiny_arm"))
        yield arm_module
    finally:
        sys.modules.pop("hosted_tiny_arm", None)


def test_git_builds_take_the_host_module_at_their_revision(tmp_path, monkeypatch):
    """A kernel and its host wrapper change together: a git build loads the arm's module as it
    is at the revision (privately), unless --build-host worktree."""
    from moebench.kernels.builds import build_arm_factories
    versions = [{"hosted_tiny_arm.py": HOSTED % v, "moebench_test_hosted.cu": TINY % v} for v in ("v1", "v2")]
    with hosted_repo(tmp_path, monkeypatch, versions) as arm_module:
        builds = resolve_builds(["new=moebench_test_hosted.cu", "old=git:HEAD~1", "head=git:HEAD"])
        new, old, head = builds
        assert new.host is None and head.host is None  # same text as this tree's: nothing to load
        assert old.host == "hosted_tiny_arm.py" and old.identity()["host_module"] == "hosted_tiny_arm.py"
        arms = {n: f() for n, f in build_arm_factories(builds).items()}
        assert "host v1" in arms["test-hosted@old"].description
        assert "host v2" in arms["test-hosted@new"].description and "host v2" in arms["test-hosted@head"].description
        assert "test-hosted" in arm_module.ARMS and arm_module.ARMS["test-hosted"].__module__ == "hosted_tiny_arm"
        (kept,) = resolve_builds(["old=git:HEAD~1:moebench_test_hosted.cu"], build_arm="test-hosted", host="worktree")
        assert kept.host is None
