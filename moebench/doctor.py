"""What this machine has for moebench: one check per dependency, each OK or missing, and
the built-in arms that can run here. `moebench doctor` and `moebench arms` print these."""

from __future__ import annotations

from dataclasses import dataclass


def _check(label: str, fn) -> tuple[bool, str]:
    try:
        return True, f"{label}: {fn()}"
    except Exception as err:  # each check reports, never stops the others
        return False, f"{label}: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}".rstrip()


def _torch():
    import torch
    return f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})"


def _gpu():
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device visible")
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return (f"{p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
            f"L2 {getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MiB, {p.total_memory / 2**30:.0f} GiB")


def _driver():
    import pynvml
    pynvml.nvmlInit()
    v = pynvml.nvmlSystemGetDriverVersion()
    return f"{v.decode() if isinstance(v, bytes) else v} (NVML)"


def _cupti():
    from importlib.metadata import version

    from cupti import cupti
    cupti.get_timestamp()  # loads libcupti
    return f"cupti-python {version('cupti-python')}, libcupti loads"


def _nvrtc():
    from cuda.bindings import nvrtc
    err, major, minor = nvrtc.nvrtcVersion()
    return f"NVRTC {major}.{minor}"


def _stock_tables():
    """Which built-in families the stock arm has the engine's tuned tables for on this GPU."""
    import torch
    import triton

    from moebench.fixtures import ShapeRegistry
    from moebench.kernels.engine_config import TableKey, base_version, load_engine_tables
    tables = load_engine_tables()
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    found = []
    for family in ("A", "Q"):
        spec = ShapeRegistry().resolve(f"{family}8")
        for down in (False, True):
            key = TableKey(name.replace(" ", "_"), spec.E, spec.N // 2, down)
            table, version = tables.find(key, base_version(triton.__version__))
            if table is not None:
                found.append(f"{family} {'down' if down else 'up'} (Triton {version})")
    where = ", ".join(found) or "none: the engines' default config"
    return f"{tables.engine} {tables.version} tables for {name}: {where}"


def _referee():
    from moebench.kernels.sglang_arm import load_engine
    engine = load_engine()
    how = "whole engine" if not engine.stand_ins else f"{len(engine.stand_ins)} engine modules stood in for"
    return f"sglang {engine.version} ({how})"


def _version(dist):
    def get():
        from importlib.metadata import version
        return version(dist)
    return get


OPTIONAL = (("stock tables", _stock_tables), ("referee", _referee))  # reported, never a failure
CHECKS = (
    ("torch", _torch), ("GPU", _gpu), ("driver", _driver), ("CUPTI", _cupti), ("NVRTC", _nvrtc),
    ("cuda-core", _version("cuda-core")), ("triton", _version("triton")), ("nvtx", _version("nvtx")),
    ("nvidia-ml-py", _version("nvidia-ml-py")), ("rich", _version("rich")),
)


@dataclass(frozen=True)
class Check:
    status: str  # OK | MISSING | OPTIONAL
    line: str


def machine_checks() -> tuple[list[Check], int]:
    """Every check in order, and how many required ones are missing."""
    from moebench import __version__
    out = [Check("OK", f"moebench: {__version__}")]
    missing = 0
    for label, fn in CHECKS:
        ok, line = _check(label, fn)
        missing += not ok
        out.append(Check("OK" if ok else "MISSING", line))
    for label, fn in OPTIONAL:
        ok, line = _check(label, fn)
        out.append(Check("OK" if ok else "OPTIONAL", line))
    return out, missing


def arm_availability() -> tuple[str, list[tuple[str, str, str | None]]]:
    """The device looked at, and each registered arm: name, description, why it cannot run here
    (None: it can)."""
    import torch

    from moebench.kernels.registry import load_builtin_arms
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for name, factory in sorted(load_builtin_arms().items()):
        arm = factory()
        rows.append((name, getattr(arm, "description", ""), arm.unavailable_reason(device)))
    return str(device), rows
