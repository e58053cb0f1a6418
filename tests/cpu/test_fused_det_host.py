"""CPU tests of cuda-fused-det: the DETERMINISTIC build and its combine compile through NVRTC
for sm_90a without spills at every launch the arm can make, the fused kernel's SASS keeps no
BF16 reduction (plain stores into the workspace) and the combine none either, the build that
would spill is refused at compile time, the default build's defines are unchanged, and the
declared kernels tell the fused kernel from the combine."""

from __future__ import annotations

import re
import subprocess

import pytest

from moebench.kernels.cuda import fused_arm
from moebench.kernels.registry import make_arm
from moebench.kernels.cuda.fused_arm import choose_stages
from moebench.timing.audit import kernel_mismatch
from test_fused_host import _cuobjdump, cache  # noqa: F401 - the compile cache fixture


def _det_builds():
    out = []
    for cluster in fused_arm.CLUSTERS:
        for bm in (8, 16, 32, 48):
            if cluster == 1 and bm > fused_arm.MAX_BLOCK_M_ALONE:
                continue
            for per_sm in fused_arm.deterministic_occupancies(bm, cluster):
                out.append((bm, per_sm, cluster))
    return out


@pytest.mark.parametrize("block_m,per_sm,cluster", _det_builds())
def test_deterministic_builds_compile_without_spills(cache, block_m, per_sm, cluster):
    from moebench.kernels.cuda.nvrtc import compile_source
    stages = choose_stages(block_m, 7168, per_sm, cluster)
    m = compile_source(fused_arm.SOURCE, defines=fused_arm.kernel_defines(block_m, stages, per_sm, cluster, True))
    for name in (fused_arm.KERNEL_NAME, fused_arm.COMBINE_NAME):
        r = m.resources(name)
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0, (name, r)
    assert m.resources(fused_arm.KERNEL_NAME).registers <= 65536 // (fused_arm.THREADS * per_sm)


def test_deterministic_sass_stores_instead_of_reducing(cache, tmp_path):
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump")
    from moebench.kernels.cuda.nvrtc import compile_source
    m = compile_source(fused_arm.SOURCE, defines=fused_arm.kernel_defines(8, 5, 2, 4, True))
    cubin = tmp_path / "det.cubin"
    cubin.write_bytes(m.cubin)
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    functions = re.split(r"\n\s*Function : ", sass)
    fused = next(f for f in functions if f.startswith(fused_arm.KERNEL_NAME + "\n"))
    combine = next(f for f in functions if f.startswith(fused_arm.COMBINE_NAME))
    assert "REDG" not in fused and "STG.E.128" in fused  # each contribution into its own row
    assert "HMMA" in fused and "CALL" not in fused and not re.search(r"\b(LDL|STL)\b", fused)
    assert "REDG" not in combine and "ATOM" not in combine and "LDG.E.128" in combine
    # PDL: the fused kernel lets the combine launch (PREEXIT); the combine loads the output's old
    # value before it waits for the fused grid's end (ACQBULK), and the workspace, through L2
    # (.STRONG.GPU), only after
    assert "PREEXIT" in fused
    assert fused.index("PREEXIT") > fused.rindex("HMMA")  # the trigger once a CTA's items are done
    assert combine.index("LDG") < combine.index("ACQBULK") < combine.index("LDG.E.128.STRONG.GPU")
    assert len(re.findall(r"LDG\.E\.128\.STRONG\.GPU", combine)) == 10  # one batch of rows in flight
    default = compile_source(fused_arm.SOURCE, defines=fused_arm.kernel_defines(8, 5, 2, 4))
    cubin.write_bytes(default.cubin)
    plain = re.split(r"\n\s*Function : ", subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True,
                                                           check=True).stdout)
    fused = next(f for f in plain if f.startswith(fused_arm.KERNEL_NAME + "\n"))
    zero = next(f for f in plain if f.startswith(fused_arm.ZERO_NAME))
    # cuda-fused: the zeroing kernel lets the fused kernel launch at once (PREEXIT first thing);
    # the fused kernel has no dependent and waits for the zeroing's end (ACQBULK) before it
    # first reduces into the output
    assert "PREEXIT" not in fused and "PREEXIT" in zero and zero.index("PREEXIT") < zero.index("STG.E.128")
    assert "ACQBULK" in fused and fused.index("ACQBULK") < fused.index("REDG")


def test_the_spilling_deterministic_build_is_refused(cache):
    from moebench.errors import UserError
    from moebench.kernels.cuda.nvrtc import compile_source
    assert fused_arm.deterministic_occupancies(16) == (2,) and fused_arm.deterministic_occupancies(8) == (2, 3)
    with pytest.raises((UserError, RuntimeError), match="two accumulator chains spill"):
        compile_source(fused_arm.SOURCE, defines=fused_arm.kernel_defines(16, 3, 3, 4, True))
    with pytest.raises(UserError, match="per_sm=3 at block_m=16: at most 2 CTAs an SM"):
        fused_arm.launch_options(16, 7168, 0, 4, per_sm=3, deterministic=True)


def test_default_build_keeps_its_defines():
    assert "DETERMINISTIC" not in fused_arm.kernel_defines(8, 5, 2, 4)
    assert fused_arm.kernel_defines(8, 5, 2, 4, True)["DETERMINISTIC"] == "1"


def test_declared_kernels_tell_the_fused_kernel_from_the_combine():
    det = fused_arm.FUSED_DET_KERNELS
    assert kernel_mismatch([fused_arm.KERNEL_NAME, fused_arm.COMBINE_NAME], det) is None
    assert kernel_mismatch([fused_arm.KERNEL_NAME], det) is not None  # no combine
    assert kernel_mismatch([fused_arm.COMBINE_NAME, fused_arm.COMBINE_NAME], det) is not None
    plain = fused_arm.FUSED_KERNELS  # the zeroing kernel, then the fused kernel
    assert kernel_mismatch([fused_arm.ZERO_NAME, fused_arm.KERNEL_NAME], plain) is None
    assert kernel_mismatch([fused_arm.KERNEL_NAME], plain) is not None  # the output not zeroed
    arm = make_arm("cuda-fused-det")
    assert arm.name == "cuda-fused-det" and arm.deterministic and not make_arm("cuda-fused").deterministic
    assert arm.unavailable_reason("cpu")
