"""`moebench doctor`: what this machine has for moebench, one line each, OK or missing."""

from __future__ import annotations

import click

from moebench.cli import cli


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


def _version(dist):
    def get():
        from importlib.metadata import version
        return version(dist)
    return get


CHECKS = (
    ("torch", _torch), ("GPU", _gpu), ("driver", _driver), ("CUPTI", _cupti), ("NVRTC", _nvrtc),
    ("cuda-core", _version("cuda-core")), ("triton", _version("triton")), ("nvtx", _version("nvtx")),
    ("nvidia-ml-py", _version("nvidia-ml-py")), ("rich", _version("rich")),
)


@cli.command()
def doctor():
    """Check GPU, driver, CUPTI, NVRTC, Triton and library versions."""
    from moebench import __version__
    click.echo(f"OK       moebench: {__version__}")
    missing = 0
    for label, fn in CHECKS:
        ok, line = _check(label, fn)
        missing += not ok
        click.echo(f"{'OK' if ok else 'MISSING':8} {line}")
    if missing:
        raise click.exceptions.Exit(1)
