"""`moebench build`'s work: compile CUDA sources through NVRTC (no GPU needed), an arm's own
configuration or named files, each checked to be a readable .cu/.cuh first."""

from __future__ import annotations

from pathlib import Path

from moebench.errors import UserError


def compiled_modules(arm_names, sources, defines):
    from moebench.kernels.cuda import nvrtc as cuda_build
    from moebench.kernels.registry import make_arm
    if arm_names and (sources or defines):
        raise UserError("--arm builds the arm's own configuration; give --source/--define without it")
    if arm_names:
        for name in arm_names:
            arm = make_arm(name)
            if not hasattr(arm, "build"):
                raise UserError(f"arm {name!r} has no CUDA build")
            yield name, arm.build()
        return
    for src in sources:
        check_source(src, cuda_build.KERNELS_DIR)
    paths = list(sources) or sorted(p.name for p in cuda_build.KERNELS_DIR.glob("*.cu"))
    for src in paths:
        try:
            yield src, cuda_build.compile_source(Path(src), defines=defines)
        except FileNotFoundError as err:
            raise UserError(str(err)) from None
        except cuda_build.CudaBuildError as err:
            raise UserError(err.one_line()) from None


def check_source(src: str, kernels_dir: Path) -> None:
    """A --source is a readable .cu or .cuh text file (or the name of one of moebench's)."""
    path = Path(src)
    if not path.exists() and (kernels_dir / path).is_file():
        path = kernels_dir / path
    if path.is_dir():
        raise UserError(f"--source {src}: a folder, not a CUDA source file")
    if not path.is_file():
        raise UserError(f"--source {src}: no such file")
    if path.suffix not in (".cu", ".cuh"):
        raise UserError(f"--source {src}: expected a .cu or .cuh file")
    try:
        path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as err:
        raise UserError(f"--source {src}: not a readable text file ({type(err).__name__})") from None
