"""Where today's files were before the stage folders (moebench/record, analysis, run, kernels/cuda,
...): a `--build NAME=git:REV` of a revision before the move reads the kernel, its headers and the
arm's host module by their paths at that revision, and the host module's imports are read by
today's module names. A file found under neither path at the revision is an error, never today's
file in its place."""

from __future__ import annotations

import re

# today's path -> its path before the move (paths inside the repository)
BEFORE_THE_MOVE: dict[str, str] = {
    "moebench/analysis/compare.py": "moebench/results/compare.py",
    "moebench/analysis/ratio_verdicts.py": "moebench/results/ratio_verdicts.py",
    "moebench/analysis/roofline.py": "moebench/results/roofline.py",
    "moebench/analysis/significance.py": "moebench/significance.py",
    "moebench/analysis/stats.py": "moebench/stats.py",
    "moebench/analysis/throttle.py": "moebench/results/throttle.py",
    "moebench/analysis/validate.py": "moebench/results/validate.py",
    "moebench/analysis/validate_fields.py": "moebench/results/validate_fields.py",
    "moebench/analysis/verdicts.py": "moebench/results/verdicts.py",
    "moebench/determinism/checks.py": "moebench/determinism.py",
    "moebench/determinism/child.py": "moebench/determinism_child.py",
    "moebench/determinism/result.py": "moebench/determinism_result.py",
    "moebench/kernels/api/arm.py": "moebench/kernels/arm.py",
    "moebench/kernels/api/external.py": "moebench/kernels/external.py",
    "moebench/kernels/api/parity.py": "moebench/kernels/parity.py",
    "moebench/kernels/build_specs.py": "moebench/kernels/cuda/build_specs.py",
    "moebench/kernels/builds.py": "moebench/kernels/cuda/builds.py",
    "moebench/kernels/cuda/arms.py": "moebench/kernels/cuda_arms.py",
    "moebench/kernels/cuda/cache.py": "moebench/kernels/cuda_cache.py",
    "moebench/kernels/cuda/fused_arm.py": "moebench/kernels/fused_arm.py",
    "moebench/kernels/cuda/fused_checks.py": "moebench/kernels/fused_checks.py",
    "moebench/kernels/cuda/fused_layout.py": "moebench/kernels/fused_layout.py",
    "moebench/kernels/cuda/fused_policy.py": "moebench/kernels/fused_policy.py",
    "moebench/kernels/cuda/fused_prefill.py": "moebench/kernels/fused_prefill.py",
    "moebench/kernels/cuda/launch.py": "moebench/kernels/cuda_launch.py",
    "moebench/kernels/cuda/nvrtc.py": "moebench/kernels/cuda_build.py",
    "moebench/kernels/cuda/sm90_common.cuh": "moebench/kernels/sm90_common.cuh",
    "moebench/kernels/cuda/sm90_fused_moe.cu": "moebench/kernels/sm90_fused_moe.cu",
    "moebench/kernels/cuda/sm90_fused_prefill.cu": "moebench/kernels/sm90_fused_prefill.cu",
    "moebench/kernels/cuda/sm90_grouped_gemm.cu": "moebench/kernels/sm90_grouped_gemm.cu",
    "moebench/kernels/cuda/sm90_read_probe.cu": "moebench/kernels/sm90_read_probe.cu",
    "moebench/kernels/cuda/sm90_reduce_probe.cu": "moebench/kernels/sm90_reduce_probe.cu",
    "moebench/kernels/cuda/sm90_sync.cuh": "moebench/kernels/sm90_sync.cuh",
    "moebench/kernels/cuda/sm90_wgmma_probe.cu": "moebench/kernels/sm90_wgmma_probe.cu",
    "moebench/kernels/cuda/source.py": "moebench/kernels/kernel_source.py",
    "moebench/kernels/stock/arms.py": "moebench/kernels/triton_arms.py",
    "moebench/kernels/stock/engine_config.py": "moebench/kernels/engine_config.py",
    "moebench/kernels/stock/engine_logs.py": "moebench/kernels/engine_logs.py",
    "moebench/kernels/stock/engine_tables/sglang-0.5.23.json": "moebench/kernels/engine_tables/sglang-0.5.23.json",
    "moebench/kernels/stock/moe.py": "moebench/kernels/triton_moe.py",
    "moebench/kernels/stock/moe_gemm.py": "moebench/kernels/triton_moe_gemm.py",
    "moebench/kernels/stock/rounding.py": "moebench/kernels/triton_rounding.py",
    "moebench/kernels/stock/sglang_arm.py": "moebench/kernels/sglang_arm.py",
    "moebench/record/atomic.py": "moebench/atomic_write.py",
    "moebench/record/determinism.py": "moebench/results/determinism_records.py",
    "moebench/record/device_peaks.py": "moebench/results/device_peaks.py",
    "moebench/record/index.py": "moebench/results/index.py",
    "moebench/record/metrics.py": "moebench/timing/metrics.py",
    "moebench/record/plain.py": "moebench/results/plain.py",
    "moebench/record/provenance.py": "moebench/results/provenance.py",
    "moebench/record/schema.py": "moebench/results/schema.py",
    "moebench/record/store.py": "moebench/results/store.py",
    "moebench/run/assemble.py": "moebench/assemble.py",
    "moebench/run/bench.py": "moebench/bench.py",
    "moebench/run/determinism.py": "moebench/run_determinism.py",
    "moebench/run/distributed.py": "moebench/distributed.py",
    "moebench/run/noise.py": "moebench/noise.py",
    "moebench/run/partial.py": "moebench/partial.py",
    "moebench/run/plan.py": "moebench/plan.py",
    "moebench/run/prepare.py": "moebench/prepare.py",
    "moebench/run/resume.py": "moebench/resume.py",
    "moebench/run/runner.py": "moebench/runner.py",
    "moebench/run/sweep_cells.py": "moebench/sweep_cells.py",
    "moebench/run/variants.py": "moebench/variants.py",
    "moebench/tasks/build.py": "moebench/compile.py",
    "moebench/tasks/calibrate.py": "moebench/calibrate.py",
    "moebench/tasks/doctor.py": "moebench/doctor.py",
    "moebench/tasks/probe.py": "moebench/fidelity.py",
    "moebench/tasks/profile.py": "moebench/profile.py",
    "moebench/tasks/verify.py": "moebench/parity_run.py",
    "moebench/timing/measure.py": "moebench/measure.py",
    "moebench/timing/read_floor.py": "moebench/read_floor.py",
    "moebench/views/compare_view.py": "moebench/results/compare_view.py",
    "moebench/views/csv_view.py": "moebench/results/csv_view.py",
    "moebench/views/determinism_view.py": "moebench/results/determinism_view.py",
    "moebench/views/formats.py": "moebench/results/formats.py",
    "moebench/views/markdown.py": "moebench/results/markdown.py",
    "moebench/views/plots.py": "moebench/results/plots.py",
    "moebench/views/pr_view.py": "moebench/results/pr_view.py",
    "moebench/views/report.py": "moebench/results/report.py",
    "moebench/views/roofline_view.py": "moebench/results/roofline_view.py",
    "moebench/views/tables.py": "moebench/results/tables.py",
}


def _module(path: str) -> str | None:
    return path[:-3].replace("/", ".") if path.endswith(".py") else None


# a module's name before the move -> today's
MODULE_RENAMES: dict[str, str] = {
    old: new for new, old in ((_module(n), _module(o)) for n, o in BEFORE_THE_MOVE.items()) if old and new
}
_OLD_NAME = re.compile(r"(?<![\w.])(" + "|".join(re.escape(m) for m in sorted(MODULE_RENAMES, key=len, reverse=True))
                       + r")(?![\w])")
_FROM_PACKAGE = re.compile(r"^([ \t]*)from (moebench(?:\.\w+)*) import (\w+)(?: as (\w+))?[ \t]*$", re.M)


def candidate_paths(repo_path: str) -> tuple[str, ...]:
    """The paths a file of today's tree may have at a revision: its own, then its path before the move."""
    before = BEFORE_THE_MOVE.get(repo_path)
    return (repo_path,) if before is None else (repo_path, before)


def with_todays_imports(text: str) -> str:
    """A module's text from before the move with its imports of moebench's modules renamed to
    today's, so that it loads beside today's modules (`from moebench.kernels import cuda_build`
    becomes `from moebench.kernels.cuda import nvrtc as cuda_build`)."""
    def from_package(m: re.Match) -> str:
        indent, package, name, alias = m.groups()
        new = MODULE_RENAMES.get(f"{package}.{name}")
        if new is None:
            return m.group(0)
        parent, _, leaf = new.rpartition(".")
        local = alias or name
        return f"{indent}from {parent} import {leaf}" + (f" as {local}" if local != leaf else "")
    return _OLD_NAME.sub(lambda m: MODULE_RENAMES[m.group(1)], _FROM_PACKAGE.sub(from_package, text))
