"""`--build` specs: parsed, checked and pinned to a KernelSource (file or git revision).

A build spec is `NAME=PATH` (a file) or `NAME=git:REV[:PATH]` (the file as it is at a
revision of the git repository you are in; PATH defaults to the other builds' file). The
file's name says which arm family it builds (the arm whose `source_file` it is:
`sm90_fused_moe.cu` -> `cuda-fused`); a source that several arms compile, or a file named
otherwise, needs `--build-arm`. `--define NAME:KEY=VALUE` adds a preprocessor define to build
NAME only. Each user mistake is one UserError line.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import re
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from moebench.errors import UserError
from moebench.kernels.cuda.cache import sources_dir
from moebench.kernels.cuda.source import KERNELS_DIR, KernelSource, folder_lookup, include_closure, materialize
from moebench.kernels.moved import candidate_paths, with_todays_imports
from moebench.kernels.registry import load_builtin_arms

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


def read_moved_at_revision(root: Path, commit: str, repo_path: str) -> tuple[str, str] | None:
    """(the path, its text) of today's `repo_path` at `commit`: under its own path, or where it
    was before the stage folders (moebench.kernels.moved); None when under neither."""
    for path in candidate_paths(repo_path):
        text = read_at_revision(root, commit, path)
        if text is not None:
            return path, text
    return None


def headers_at_revision(root: Path, commit: str, repo_path: str, text: str) -> dict[str, str]:
    """Local headers the source includes, as they are at `commit` (next to the source);
    a header absent there is not among them."""
    base = Path(repo_path).parent
    return include_closure(text, lambda name: read_at_revision(root, commit, (base / name).as_posix()))


# ---------------------------------------------------------------------------- resolved builds

@dataclass(frozen=True)
class ResolvedBuild:
    """A build checked and pinned: the source it compiles, and where it came from."""

    name: str
    spec: str  # as given
    arm: str  # the arm family it builds, e.g. cuda-fused
    source_name: str  # the built-in source it stands in for
    path: Path  # the file the source was read from (a revision's text is written to the cache first)
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
    # what the build's arm compiles (text, headers, the build's defines), and its host module's text
    source: KernelSource | None = field(default=None, repr=False)
    host_text: str | None = field(default=None, repr=False)

    @property
    def arm_name(self) -> str:
        return f"{self.arm}@{self.name}"

    def identity(self) -> dict:
        return {"name": self.name, "spec": self.spec, "origin": "git" if self.revision else "file",
                "path": self.repo_path or str(self.path), "revision": self.revision, "commit": self.commit,
                "repo": self.repo, "dirty": self.dirty, "source_sha256": self.source_sha256,
                "defines": dict(self.defines), "headers_from_revision": list(self.headers),
                "host_module": self.host or "working tree", "host_sha256": self.host_sha256}


def source_arms() -> dict[str, tuple[str, ...]]:
    """Arm name -> the .cu sources it compiles (its `source_file` first, then its
    `build_sources`), for the registered arms."""
    out = {}
    for name, factory in load_builtin_arms().items():
        src = getattr(factory, "source_file", None)
        if isinstance(src, str) and src.endswith(".cu"):
            out[name] = (src, *getattr(factory, "build_sources", {}))
    return out


def build_keyword(arm_factory, source_name: str) -> str:
    """The keyword of `arm_factory` that takes a build of `source_name`."""
    if source_name == getattr(arm_factory, "source_file", None):
        return "source"
    return getattr(arm_factory, "build_sources", {})[source_name][0]


def _most_general(arms: list[str]) -> list[str]:
    """Those of `arms` whose class derives from no other's: a build of sm90_fused_moe.cu is
    cuda-fused's, not also cuda-fused-det's (a cuda-fused with another reduction order)."""
    cls = load_builtin_arms()
    return [a for a in arms if not any(b != a and isinstance(cls[a], type) and isinstance(cls[b], type)
                                       and issubclass(cls[a], cls[b]) for b in arms)]


def _family(specs: Sequence[BuildSpec], build_arm: str | None, sources: dict[str, tuple[str, ...]]) -> tuple[str, str]:
    """(the arm family the builds are of, the source they stand in for)."""
    if build_arm is not None and build_arm not in sources:
        raise UserError(f"--build-arm {build_arm!r}: not an arm built from a CUDA source "
                        f"(those are: {', '.join(sorted(sources))})")
    families = set()
    for s in specs:
        if s.path is None:
            continue
        base = Path(s.path).name
        if build_arm is not None:  # the file's name picks among the arm's sources, else its first
            families.add((build_arm, base if base in sources[build_arm] else sources[build_arm][0]))
            continue
        arms = _most_general(sorted(a for a, srcs in sources.items() if base in srcs))
        if not arms:
            known = sorted({src for srcs in sources.values() for src in srcs})
            raise UserError(f"--build {s.text}: {base} is not the source of an arm (known: "
                            f"{', '.join(known)}); say which arm it builds with --build-arm")
        if len(arms) > 1:
            raise UserError(f"--build {s.text}: {base} builds {' and '.join(arms)}; choose one with --build-arm")
        families.add((arms[0], base))
    if build_arm is not None and not families:
        return build_arm, sources[build_arm][0]
    if len({arm for arm, _ in families}) > 1:
        raise UserError(f"--build: the builds are sources of different arms "
                        f"({', '.join(sorted({arm for arm, _ in families}))}); builds compare one arm family")
    if len(families) > 1:
        raise UserError(f"--build: the builds are different sources of {next(iter(families))[0]} "
                        f"({', '.join(sorted(src for _, src in families))}); builds compare one source")
    if not families:
        raise UserError("--build: no build names a file; give one a PATH or pass --build-arm")
    return families.pop()


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
    arm, source_name = _family(specs, build_arm, source_arms())
    default_path = next((s.path for s in specs if s.path is not None), None)
    if default_path is None:  # only git builds without a path: the arm's own source in this repository
        default_path = str(KERNELS_DIR / source_name)
    builds = [_resolve(s, arm, source_name, default_path, tuple(sorted(defines[s.name].items())), cwd)
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
        source = KernelSource.from_file(path).with_defines(dict(defines))
        return ResolvedBuild(s.name, s.text, arm, source_name, path.resolve(), source.sha256, defines, None, commit,
                             None if root is None else str(root), repo_path, dirty, source=source)
    root = repo_root(cwd)
    if root is None:
        raise UserError(f"--build {s.text}: {cwd} is not in a git repository")
    repo_path = os.path.relpath(path.resolve(), root)
    if repo_path.startswith(".."):
        raise UserError(f"--build {s.text}: {path} is outside the repository {root}; name the file in it (git:REV:PATH)")
    commit = resolve_revision(root, s.revision)
    if commit is None:
        raise UserError(f"--build {s.text}: unknown git revision {s.revision!r} in {root}")
    found_at = read_moved_at_revision(root, commit, repo_path)
    if found_at is None:
        raise UserError(f"--build {s.text}: {repo_path} does not exist at {s.revision} ({commit[:12]})")
    repo_path, text = found_at
    headers = headers_at_revision(root, commit, repo_path, text)
    # a header the revision lacks is this tree's (moebench/kernels), pinned now like the rest
    found = include_closure(text, lambda name: headers.get(name) or folder_lookup(KERNELS_DIR)(name))
    source = KernelSource.from_text(text, Path(repo_path).name, headers=found,
                                    origin=f"{repo_path}@{commit[:12]}").with_defines(dict(defines))
    file = materialize(source, sources_dir())
    return ResolvedBuild(s.name, s.text, arm, source_name, file, source.sha256, defines, s.revision, commit,
                         str(root), repo_path, None, tuple(headers), source=source)



# ---------------------------------------------------------------------------- host code at a revision

def _host_module_path(arm: str) -> Path | None:
    try:
        file = inspect.getsourcefile(load_builtin_arms()[arm])
    except TypeError:  # defined in no file
        return None
    return Path(file).resolve() if file else None


def _differs_at_revision(b: ResolvedBuild, module: str) -> str | None:
    """The file of `module` (this tree's, inside the build's repository) when its text at the
    build's revision exists and differs from this tree's, else None."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or b.repo is None or b.commit is None:
        return None
    rel = os.path.relpath(spec.origin, b.repo)
    if rel.startswith(".."):
        return None
    found = read_moved_at_revision(Path(b.repo), b.commit, Path(rel).as_posix())
    if found is None:  # not at the revision: its host module there does not import it
        return None
    text = with_todays_imports(found[1])
    return Path(rel).as_posix() if text != Path(spec.origin).read_text() else None


def _launcher_differs(b: ResolvedBuild) -> str | None:
    """For a build of one of the arm's `build_sources`: the module launching it (a file of this
    tree) when its text at the build's revision differs from this tree's, else None."""
    entry = getattr(load_builtin_arms()[b.arm], "build_sources", {}).get(b.source_name)
    return None if entry is None else _differs_at_revision(b, entry[1])


def _with_host(b: ResolvedBuild) -> ResolvedBuild:
    """Pin the arm's module as it is at the build's revision, when it exists and differs. A
    build of another of its sources runs this tree's launcher for it, and every build runs this
    tree's helper modules of the arm (`host_helpers`), so a revision where one of those differs
    is refused."""
    launcher = _launcher_differs(b)
    if launcher is not None:
        raise UserError(f"--build {b.spec}: a build of {b.source_name} runs this tree's {launcher}, which "
                        f"differs at {b.revision}; --build-host worktree times it with this tree's")
    for module in getattr(load_builtin_arms()[b.arm], "host_helpers", ()):
        helper = _differs_at_revision(b, module)
        if helper is not None:
            raise UserError(f"--build {b.spec}: {b.arm}'s launch also runs this tree's {helper}, which differs at "
                            f"{b.revision} (a git build takes only the arm's own module from its revision); "
                            f"--build-host worktree times it with this tree's")
    path = _host_module_path(b.arm)
    if path is None or b.repo is None or b.commit is None:
        return b
    rel = os.path.relpath(path, b.repo)
    if rel.startswith(".."):
        return b  # this moebench is not part of the build's repository
    found = read_moved_at_revision(Path(b.repo), b.commit, Path(rel).as_posix())
    if found is None:  # never this tree's host code in its place
        raise UserError(f"--build {b.spec}: {b.arm}'s host module {Path(rel).as_posix()} does not exist at "
                        f"{b.revision} ({b.commit[:12]}), nor where it was before the stage folders; "
                        f"--build-host worktree times the revision's kernel with this tree's")
    at, text = found[0], with_todays_imports(found[1])
    if text == path.read_text():
        return b
    return replace(b, host=at, host_sha256=hashlib.sha256(text.encode()).hexdigest(), host_text=text)


