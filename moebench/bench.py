"""`moebench.bench`: time any callables with moebench's engine and get a RunResult.

    import moebench
    result = moebench.bench({"mine": run_mine, "theirs": run_theirs}, ref="theirs",
                            kernels={"mine": ["my_kernel"], "theirs": None})
    print(result.ratios[0].median)   # theirs-row / mine-row, median over rounds (> 1: mine faster)

The same paired, interleaved rounds, L2 flush, CUPTI kernel records and audit as
`moebench run`, through the runner's own functions (validate, time_units, assemble): the
callables stand in for prepared arms. There is no fixture and no oracle here; check your
outputs yourself before timing.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path
from typing import Callable, Mapping, Sequence

from moebench.errors import UserError
from moebench.results import schema as S

INFERRED = "inferred: the kernels most samples launched; the audit flags samples that differ"


def bench(callables: Mapping[str, Callable[[], None]], *,
          kernels: Mapping[str, Sequence | None] | None = None,
          reset: Mapping[str, Callable[[], None]] | None = None,
          ref: str | None = None, rounds: int = 5, samples: int = 30, warmup: int = 5,
          flush: str = "read", timer: str = "cupti", label: str = "bench", hbm_bytes: int = 0,
          measure_bandwidth: bool = False, out_dir: str | None = None, backend=None) -> S.RunResult:
    """Time each callable (`name -> fn()` launching its work on torch's current stream) in
    paired rounds and return the RunResult (saved to `out_dir` when given).

    kernels: per name, what one call must launch — KernelDecls, regexes or (label, pattern,
        count) tuples — or None (or a missing name, or `kernels=None` for all) to accept the
        kernels most of its samples launched; every sample is audited against that.
    reset: per name, an untimed call before every sample (e.g. zero an accumulating output).
    ref: the name ratios are taken against (default: the first). label: the "shape" column.
    hbm_bytes: bytes one call must move, for the bandwidth columns (0: not known).
    backend: a runner.TimingBackend (tests pass a fake one); default the current CUDA device.
    """
    from moebench.kernels.arm import as_kernel_decls
    from moebench.results.provenance import utc_now
    from moebench.runner import Prepared, RunRequest, assemble, cuda_backend, time_units, validate
    from moebench.timing.engine import Unit
    names = tuple(callables)
    for name, fn in callables.items():
        if not isinstance(name, str) or not name or not callable(fn):
            raise UserError(f"bench: {name!r} must be a non-empty name mapped to a callable")
    unknown = sorted(set(kernels or {}) - set(names)) + sorted(set(reset or {}) - set(names))
    if unknown:
        raise UserError(f"bench: kernels/reset name callables not given: {', '.join(unknown)}")
    if not label or not re.fullmatch(r"[\w.@+-]+", label):
        raise UserError(f"bench: label {label!r} must be a word (letters, digits, _ . @ + -)")
    req = RunRequest(shapes=(label,), arms=names, ref=ref, rounds=rounds, samples=samples, warmup=warmup,
                     flush=flush, timer=timer, out_dir=out_dir or "", command=("python", *sys.argv),
                     measure_bandwidth=measure_bandwidth)
    validate(req)
    declared = {name: as_kernel_decls(k, f"bench: kernels of {name!r}")
                for name, k in (kernels or {}).items() if k is not None}
    started_at = utc_now()
    backend = backend if backend is not None else cuda_backend(req)
    units = [Unit(label, name, callables[name], (reset or {}).get(name)) for name in names]
    prep = Prepared(fixtures=[], arms=[], parity=[], units=units, declared={}, hbm_bytes={label: hbm_bytes})
    out, bandwidth, options = time_units(req, backend, units)
    for name in names:
        decl = declared.get(name) or inferred_kernels([s for s in out.samples if s.arm == name])
        kept = tuple(decl)
        prep.declared[(label, name)] = kept
        identity = {"callable": getattr(callables[name], "__qualname__", repr(callables[name]))}
        if name not in declared:
            identity["kernels"] = INFERRED
        prep.arms.append(S.ArmInfo(name, "callable timed by moebench.bench", label, kept, identity))
    result = assemble(req, backend, prep, out, bandwidth, options, started_at)
    if out_dir:
        from moebench.results.store import save
        from moebench.runner import result_filename
        save(result, Path(out_dir) / result_filename(result))
    return result


def inferred_kernels(samples: Sequence[S.Sample]) -> tuple:
    """The kernel set most samples hold, as exact-name declarations. A callable that launched
    nothing gets a declaration no sample meets, so the audit says so instead of passing."""
    from moebench.kernels.arm import KernelDecl
    sets = Counter(tuple(sorted(k.name for k in s.kernels)) for s in samples)
    common = sets.most_common(1)[0][0] if sets else ()
    if not common:
        return (KernelDecl("a kernel", r".", 1),)
    return tuple(KernelDecl(name, f"^{re.escape(name)}$", n) for name, n in sorted(Counter(common).items()))
