"""Builds: one CUDA arm family compiled from several sources and timed as arms of one run.

    moebench run --shape A8 --build new=moebench/kernels/sm90_fused_moe.cu --build main=git:main

A build spec is `NAME=PATH` (a file) or `NAME=git:REV[:PATH]` (the file as it is at a
revision of the git repository you are in; PATH defaults to the other builds' file). The
file's name says which arm it builds (`sm90_fused_moe.cu` -> `cuda-fused`); a source that
several arms compile, or a file named otherwise, needs `--build-arm`. `--define
NAME:KEY=VALUE` adds a preprocessor define to build NAME only; flags are the arm's own, the
same for every build.

Each build becomes the arm `ARM@NAME` (`cuda-fused@new`): the registered arm, prepared while
cuda_build.source_override substitutes the build's file for the arm's source, so the arm's
code is untouched and its compile goes through the same cache (keyed by the source hash).
A kernel and its host wrapper change together (launch shape, arguments, weight layout), so a
git build also takes the arm's Python module (e.g. fused_arm.py) as it is at the revision,
loaded under a private name, when it exists there and differs from this tree's
(`--build-host worktree` keeps this tree's host code for every build).
Its identity in the result holds the spec, the git revision and commit, the source SHA-256,
and every module compiled for it (binary SHA-256, flags, defines).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import types
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import torch

from moebench.errors import UserError
from moebench.fixtures import Fixture
from moebench.kernels.arm import Arm, ArmFactory, PreparedCall, load_builtin_arms

BUILD_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
DEFINE_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SPEC_FORMS = "NAME=PATH or NAME=git:REV[:PATH]"


# ---------------------------------------------------------------------------- specs

@dataclass(frozen=True)
class BuildSpec:
    """One `--build` as given: a file, or a file at a git revision."""

    name: str
    path: str | None  # None: a git build that takes the other builds' file
    revision: str | None = None  # git builds only

    @property
    def text(self) -> str:
        if self.revision is None:
            return f"{self.name}={self.path}"
        return f"{self.name}=git:{self.revision}" + (f":{self.path}" if self.path else "")


def parse_build_spec(text: str) -> BuildSpec:
    name, sep, rest = text.partition("=")
    name, rest = name.strip(), rest.strip()
    if not sep or not name or not rest:
        raise UserError(f"--build {text!r}: expected {SPEC_FORMS}")
    if not BUILD_NAME_RE.fullmatch(name):
        raise UserError(f"--build {text!r}: a build name is letters, digits, '_', '.', '-' (got {name!r})")
    if not rest.startswith("git:"):
        return BuildSpec(name, rest)
    rev, _, path = rest[4:].partition(":")
    if not rev.strip():
        raise UserError(f"--build {text!r}: no revision after 'git:' (expected {SPEC_FORMS})")
    return BuildSpec(name, path.strip() or None, rev.strip())


def parse_define(text: str, build_names: Sequence[str]) -> tuple[str, str, str]:
    """`NAME:KEY=VALUE` -> (build name, key, value)."""
    m = re.fullmatch(r"([^:=]+):([^=]+)=(.+)", text.strip())
    if m is None:
        raise UserError(f"--define {text!r}: expected NAME:KEY=VALUE, NAME one of the builds "
                        f"({', '.join(build_names) or 'none given'})")
    name, key, value = (g.strip() for g in m.groups())
    if name not in build_names:
        raise UserError(f"--define {text!r}: no build named {name!r} (builds: {', '.join(build_names) or 'none'})")
    if not DEFINE_KEY_RE.fullmatch(key):
        raise UserError(f"--define {text!r}: {key!r} is not a C identifier")
    return name, key, value


# ---------------------------------------------------------------------------- git

def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        raise UserError(f"cannot run git: {err}") from None


def repo_root(start: Path) -> Path | None:
    """The top of the git work tree holding `start` (a directory), or None."""
    try:
        p = _git(start, "rev-parse", "--show-toplevel")
    except UserError:
        return None
    return Path(p.stdout.decode().strip()).resolve() if p.returncode == 0 else None


def resolve_revision(root: Path, rev: str) -> str | None:
    """The full commit hash `rev` names in the repository at `root`, or None."""
    if rev.startswith("-"):
        return None
    p = _git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    return p.stdout.decode().strip() if p.returncode == 0 else None


def read_at_revision(root: Path, commit: str, repo_path: str) -> str | None:
    """The text of `repo_path` (relative to the repository root) at `commit`, or None."""
    p = _git(root, "show", f"{commit}:{repo_path}")
    return p.stdout.decode() if p.returncode == 0 else None


def headers_at_revision(root: Path, commit: str, repo_path: str, text: str) -> dict[str, str]:
    """Local headers the source includes, as they are at `commit` (next to the source);
    a header absent there is left to the compiler's search (moebench/kernels of this tree)."""
    from moebench.kernels.cuda_build import include_closure
    base = Path(repo_path).parent
    return include_closure(text, lambda name: read_at_revision(root, commit, (base / name).as_posix()))


# ---------------------------------------------------------------------------- resolved builds

@dataclass(frozen=True)
class ResolvedBuild:
    """A build checked and pinned: the file that compiles, and where it came from."""

    name: str
    spec: str  # as given
    arm: str  # the arm family it builds, e.g. cuda-fused
    source_name: str  # the built-in source it stands in for
    path: Path  # the file compiled (a revision's text is written to the cache first)
    source_sha256: str
    defines: tuple[tuple[str, str], ...] = ()
    revision: str | None = None  # git builds: as given
    commit: str | None = None  # git builds: the revision's commit; file builds: HEAD of the file's repo
    repo: str | None = None
    repo_path: str | None = None  # the file, relative to the repository root
    dirty: bool | None = None  # file builds: the file differs from HEAD
    headers: tuple[str, ...] = ()  # git builds: headers taken from the revision
    host: str | None = None  # the arm's module loaded from the revision (repo path), None: this tree's
    host_sha256: str | None = None

    @property
    def arm_name(self) -> str:
        return f"{self.arm}@{self.name}"

    def override(self):
        from moebench.kernels.cuda_build import SourceOverride
        return SourceOverride(self.source_name, self.path, self.defines)

    def identity(self) -> dict:
        return {"name": self.name, "spec": self.spec, "origin": "git" if self.revision else "file",
                "path": self.repo_path or str(self.path), "revision": self.revision, "commit": self.commit,
                "repo": self.repo, "dirty": self.dirty, "source_sha256": self.source_sha256,
                "defines": dict(self.defines), "headers_from_revision": list(self.headers),
                "host_module": self.host or "working tree", "host_sha256": self.host_sha256}


def source_arms() -> dict[str, str]:
    """Arm name -> the .cu source it compiles (its module's SOURCE), for the registered arms."""
    out = {}
    for name, factory in load_builtin_arms().items():
        src = getattr(factory, "source", None) or getattr(sys.modules.get(factory.__module__), "SOURCE", None)
        if isinstance(src, str) and src.endswith(".cu"):
            out[name] = src
    return out


def _family(specs: Sequence[BuildSpec], build_arm: str | None, sources: dict[str, str]) -> str:
    if build_arm is not None:
        if build_arm not in sources:
            raise UserError(f"--build-arm {build_arm!r}: not an arm built from a CUDA source "
                            f"(those are: {', '.join(sorted(sources))})")
        return build_arm
    families = set()
    for s in specs:
        if s.path is None:
            continue
        base = Path(s.path).name
        arms = sorted(a for a, src in sources.items() if src == base)
        if not arms:
            raise UserError(f"--build {s.text}: {base} is not the source of an arm (known: "
                            f"{', '.join(sorted(set(sources.values())))}); say which arm it builds with --build-arm")
        if len(arms) > 1:
            raise UserError(f"--build {s.text}: {base} builds {' and '.join(arms)}; choose one with --build-arm")
        families.add(arms[0])
    if len(families) > 1:
        raise UserError(f"--build: the builds are sources of different arms ({', '.join(sorted(families))}); "
                        "builds compare one arm family")
    if not families:
        raise UserError("--build: no build names a file; give one a PATH or pass --build-arm")
    return families.pop()


def _materialize(text: str, filename: str, headers: dict[str, str]) -> Path:
    """Write a revision's source and headers to a content-addressed folder of the cache."""
    from moebench.atomic_write import atomic_write
    from moebench.kernels.cuda_build import cache_dir
    h = hashlib.sha256(text.encode())
    for k, v in headers.items():
        h.update(f"\0{k}\0{v}".encode())
    folder = cache_dir().parent / "build-sources" / h.hexdigest()[:24]
    for name, body in ((filename, text), *headers.items()):
        p = folder / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if not p.is_file() or p.read_text() != body:
            atomic_write(p, body.encode())
    return folder / filename


HOST_MODES = ("revision", "worktree")


def resolve_builds(spec_texts: Sequence[str], define_texts: Sequence[str] = (), build_arm: str | None = None,
                   cwd: str | os.PathLike | None = None, host: str = "revision") -> list[ResolvedBuild]:
    """Parse, check and pin every `--build`: each user mistake is one UserError line."""
    if host not in HOST_MODES:
        raise UserError(f"--build-host {host!r}: expected one of {', '.join(HOST_MODES)}")
    if not spec_texts:
        if define_texts:
            raise UserError("--define applies to a --build; none given")
        if build_arm is not None:
            raise UserError("--build-arm applies to --build; none given")
        return []
    cwd = Path(cwd or os.getcwd()).resolve()
    specs = [parse_build_spec(t) for t in spec_texts]
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UserError(f"--build: build name(s) given twice: {', '.join(dupes)}")
    defines: dict[str, dict[str, str]] = {n: {} for n in names}
    for t in define_texts:
        name, key, value = parse_define(t, names)
        if key in defines[name]:
            raise UserError(f"--define {t!r}: {key} given twice for build {name!r}")
        defines[name][key] = value
    for s in specs:  # a missing file is the first thing to say
        if s.revision is None and not (Path(s.path) if Path(s.path).is_absolute() else cwd / s.path).is_file():
            raise UserError(f"--build {s.text}: no such file {s.path}")
    git_builds = [s for s in specs if s.revision is not None]
    if git_builds and repo_root(cwd) is None:
        raise UserError(f"--build {git_builds[0].text}: {cwd} is not in a git repository (a git: build reads "
                        f"the file at a revision of the repository you are in)")
    sources = source_arms()
    arm = _family(specs, build_arm, sources)
    default_path = next((s.path for s in specs if s.path is not None), None)
    if default_path is None:  # only git builds without a path: the arm's own source in this repository
        from moebench.kernels.cuda_build import KERNELS_DIR
        default_path = str(KERNELS_DIR / sources[arm])
    builds = [_resolve(s, arm, sources[arm], default_path, tuple(sorted(defines[s.name].items())), cwd)
              for s in specs]
    return [_with_host(b) if host == "revision" and b.revision else b for b in builds]


def _resolve(s: BuildSpec, arm: str, source_name: str, default_path: str, defines, cwd: Path) -> ResolvedBuild:
    path = Path(s.path or default_path)
    path = path if path.is_absolute() else cwd / path
    if s.revision is None:
        if not path.is_file():
            raise UserError(f"--build {s.text}: no such file {s.path}")
        text = path.read_text()
        root = repo_root(path.parent)
        commit = repo_path = dirty = None
        if root is not None:
            repo_path = os.path.relpath(path.resolve(), root)
            head = _git(root, "rev-parse", "HEAD")
            commit = head.stdout.decode().strip() if head.returncode == 0 else None
            status = _git(root, "status", "--porcelain", "--", repo_path)
            dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
        return ResolvedBuild(s.name, s.text, arm, source_name, path.resolve(),
                             hashlib.sha256(text.encode()).hexdigest(), defines, None, commit,
                             None if root is None else str(root), repo_path, dirty)
    root = repo_root(cwd)
    if root is None:
        raise UserError(f"--build {s.text}: {cwd} is not in a git repository")
    repo_path = os.path.relpath(path.resolve(), root)
    if repo_path.startswith(".."):
        raise UserError(f"--build {s.text}: {path} is outside the repository {root}; name the file in it (git:REV:PATH)")
    commit = resolve_revision(root, s.revision)
    if commit is None:
        raise UserError(f"--build {s.text}: unknown git revision {s.revision!r} in {root}")
    text = read_at_revision(root, commit, repo_path)
    if text is None:
        raise UserError(f"--build {s.text}: {repo_path} does not exist at {s.revision} ({commit[:12]})")
    headers = headers_at_revision(root, commit, repo_path, text)
    file = _materialize(text, Path(repo_path).name, headers)
    return ResolvedBuild(s.name, s.text, arm, source_name, file, hashlib.sha256(text.encode()).hexdigest(),
                         defines, s.revision, commit, str(root), repo_path, None, tuple(headers))


# ---------------------------------------------------------------------------- host code at a revision

def _host_module_path(arm: str) -> Path | None:
    factory = load_builtin_arms()[arm]
    module = sys.modules.get(factory.__module__)
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if file else None


def _with_host(b: ResolvedBuild) -> ResolvedBuild:
    """Pin the arm's module as it is at the build's revision, when it exists and differs."""
    path = _host_module_path(b.arm)
    if path is None or b.repo is None or b.commit is None:
        return b
    rel = os.path.relpath(path, b.repo)
    if rel.startswith(".."):
        return b  # this moebench is not part of the build's repository
    text = read_at_revision(Path(b.repo), b.commit, Path(rel).as_posix())
    if text is None or text == path.read_text():
        return b
    return replace(b, host=Path(rel).as_posix(), host_sha256=hashlib.sha256(text.encode()).hexdigest())


_HOSTS: dict[str, dict[str, ArmFactory]] = {}  # host sha256 -> the arms its module registers


def load_host_arm(b: ResolvedBuild) -> ArmFactory:
    """The arm factory that the revision's module registers under b.arm: the module's text run
    under a private module name with a private registry, so it touches neither."""
    from moebench.kernels import arm as arm_registry
    if b.host_sha256 not in _HOSTS:
        text = read_at_revision(Path(b.repo), b.commit, b.host)
        module_name = f"moebench.kernels._build_host_{b.host_sha256[:16]}"
        module = types.ModuleType(module_name)
        module.__file__ = f"{b.host}@{b.commit[:12]}"
        sys.modules[module_name] = module  # dataclasses look their module up while the text runs
        saved, arm_registry.ARMS = arm_registry.ARMS, {}
        try:
            exec(compile(text, module.__file__, "exec"), module.__dict__)  # noqa: S102 (the user's own code)
        except Exception as err:  # noqa: BLE001
            del sys.modules[module_name]
            raise UserError(f"--build {b.spec}: {b.host} at {b.revision} does not load with this moebench "
                            f"({type(err).__name__}: {err}); --build-host worktree keeps this tree's") from None
        finally:
            registered, arm_registry.ARMS = arm_registry.ARMS, saved
        _HOSTS[b.host_sha256] = registered
    registered = _HOSTS[b.host_sha256]
    if b.arm not in registered:
        raise UserError(f"--build {b.spec}: {b.host} at {b.revision} registers no arm {b.arm!r}")
    return registered[b.arm]


# ---------------------------------------------------------------------------- the arm

def _forget_module_caches(arm: Arm) -> None:
    """Clear functools caches in the arm's module: a module compiled for another build (or
    for the built-in source) must not be served from there while an override is active."""
    module = sys.modules.get(type(arm).__module__)
    for obj in list(vars(module).values()) if module else ():
        if callable(getattr(obj, "cache_clear", None)) and callable(getattr(obj, "cache_info", None)):
            obj.cache_clear()


class BuildArm(Arm):
    """A registered arm prepared with its source replaced by one build's file."""

    def __init__(self, build: ResolvedBuild, inner: Arm):
        self.build, self.inner = build, inner
        self.name = build.arm_name
        where = f"git {build.revision} ({(build.commit or '')[:12]})" if build.revision else str(build.repo_path or build.path)
        self.description = f"{inner.description} [build {build.name}: {where}]"

    def unavailable_reason(self, device: torch.device) -> str | None:
        return self.inner.unavailable_reason(device)

    def prepare(self, fx: Fixture) -> PreparedCall:
        from moebench.kernels.cuda_build import source_override
        with source_override(self.build.override()) as compiled:
            _forget_module_caches(self.inner)
            try:
                call = self.inner.prepare(fx)
            finally:
                _forget_module_caches(self.inner)
        if not compiled:
            raise RuntimeError(f"{self.name}: {self.inner.name} compiled nothing from {self.build.source_name} "
                               "while the build's source was in place (a module cached outside compile_source?)")
        stale = [b.source_sha256 for b in compiled if b.source_sha256 != self.build.source_sha256]
        inner_build = call.identity.get("build") if isinstance(call.identity, dict) else None
        if isinstance(inner_build, dict) and inner_build.get("source_sha256") not in (None, self.build.source_sha256):
            stale.append(inner_build["source_sha256"])
        if stale:
            raise RuntimeError(f"{self.name}: the arm ran a module from source {stale[0][:12]}, not the build's "
                               f"{self.build.source_sha256[:12]} (did {self.build.path} change during the run?)")
        identity = {**call.identity, "build_spec": self.build.identity(),
                    "compiled": [{k: v for k, v in b.to_dict().items() if k != "resources"} for b in compiled]}
        return replace(call, arm=self.name, identity=identity)


def build_arm_factories(builds: Sequence[ResolvedBuild]) -> dict[str, ArmFactory]:
    """`ARM@NAME` -> a factory taking the family arm's options."""
    import inspect
    registry = load_builtin_arms()
    out: dict[str, ArmFactory] = {}
    for b in builds:
        inner = load_host_arm(b) if b.host else registry[b.arm]

        def factory(__b=b, __inner=inner, **options) -> Arm:
            return BuildArm(__b, __inner(**options))
        factory.__signature__ = inspect.signature(inner)  # make_arms hands it the family's options
        out[b.arm_name] = factory
    return out


# ---------------------------------------------------------------------------- build parity

@dataclass(frozen=True)
class OutputDifference:
    bitwise_equal: bool
    max_abs_diff: float
    mismatched: int  # elements whose bits differ


_SAME_SIZE_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def compare_outputs(out: torch.Tensor, base: torch.Tensor) -> OutputDifference:
    """Two builds' outputs for the same inputs: equal bit for bit, or by how much they differ."""
    if out.shape != base.shape or out.dtype != base.dtype:
        return OutputDifference(False, float("inf"), out.numel())
    bits = _SAME_SIZE_INT[out.element_size()]
    mismatched = int((out.contiguous().view(bits) != base.contiguous().view(bits)).sum())
    diff = (out.float() - base.float()).abs()
    max_abs = float(diff.nan_to_num(nan=float("inf")).max()) if diff.numel() else 0.0
    return OutputDifference(mismatched == 0, max_abs, mismatched)
