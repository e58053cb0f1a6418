"""`moebench.bench`: time any callables with moebench's engine and get a RunResult.

    import moebench
    result = moebench.bench({"mine": run_mine, "theirs": run_theirs}, ref="theirs",
                            kernels={"mine": ["my_kernel"], "theirs": None})
    print(result.ratios[0].median)   # theirs-row / mine-row, median over rounds (> 1: mine faster)

A name may map to a list of callables instead: copies of the same call, each on buffers of its
own, timed in turn by round (copy (r - 1) mod P in round r), as `moebench run --placements P`
does; every name then gives P of them.

The same paired, interleaved rounds, L2 flush, CUPTI kernel records and audit as
`moebench run`: the callables are the units of one measurement (moebench.timing.measure). There
is no fixture and no oracle here; check your outputs yourself before timing.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

from moebench.errors import UserError
from moebench.record import schema as S

INFERRED = "inferred: the kernels most samples launched; the audit flags samples that differ"


def bench(callables: Mapping[str, Callable[[], None] | Sequence[Callable[[], None]]], *,
          kernels: Mapping[str, Sequence | None] | None = None,
          reset: Mapping[str, Callable[[], None] | Sequence[Callable[[], None]]] | None = None,
          ref: str | None = None, rounds: int = 5, samples: int = 30, warmup: int = 5,
          flush: str = "read", timer: str = "cupti", label: str = "bench", hbm_bytes: int = 0,
          measure_bandwidth: bool = False, out_dir: str | None = None, backend=None) -> S.RunResult:
    """Time each callable (`name -> fn()` launching its work on torch's current stream) in
    paired rounds and return the RunResult (saved to `out_dir` when given). `name -> [fn, ...]`:
    P copies of the call, on buffers of their own, timed in turn by round (every name P of them).

    kernels: per name, what one call must launch — KernelDecls, regexes or (label, pattern,
        count) tuples — or None (or a missing name, or `kernels=None` for all) to accept the
        kernels most of its samples launched; every sample is audited against that.
    reset: per name, an untimed call before every sample (e.g. zero an accumulating output); one
        for every copy, or a list with one per copy.
    ref: the name ratios are taken against (default: the first). label: the "shape" column.
    hbm_bytes: bytes one call must move, for the bandwidth columns of the returned result (0: not
        known). The file holds no fixture to derive them from again, so a loaded file shows "—".
    backend: a moebench.timing.measure.TimingBackend (tests pass a fake one); default the current CUDA device.
    """
    from moebench.kernels.api.arm import as_kernel_decls
    from moebench.record.provenance import utc_now
    from moebench.run.assemble import assemble, result_filename
    from moebench.run.prepare import Subjects
    from moebench.timing.engine import Unit
    from moebench.timing.measure import TimingProtocol, check_protocol, cuda_backend, measure
    names = tuple(callables)
    if not names:
        raise UserError("bench: no callables given")
    copies = {name: _copies(name, fn, "a callable or a list of callables") for name, fn in callables.items()}
    placements = len(copies[names[0]])
    if any(len(c) != placements for c in copies.values()):
        raise UserError("bench: every name must give the same number of copies ("
                        + ", ".join(f"{n}: {len(c)}" for n, c in copies.items()) + ")")
    unknown = sorted(set(kernels or {}) - set(names)) + sorted(set(reset or {}) - set(names))
    if unknown:
        raise UserError(f"bench: kernels/reset name callables not given: {', '.join(unknown)}")
    if not label or not re.fullmatch(r"[\w.@+-]+", label):
        raise UserError(f"bench: label {label!r} must be a word (letters, digits, _ . @ + -)")
    if ref is not None and ref not in names:
        raise UserError(f"--ref {ref!r} is not one of the arms ({', '.join(names)})")
    resets = {name: _copies(name, r, "reset: a callable or a list of callables") for name, r in (reset or {}).items()}
    for name, rs in resets.items():
        if len(rs) not in (1, placements):
            raise UserError(f"bench: reset of {name!r} gives {len(rs)} callables for "
                            f"{placements} cop{'y' if placements == 1 else 'ies'}")
    protocol = TimingProtocol(rounds, samples, warmup, flush, timer, measure_bandwidth, placements=placements)
    check_protocol(protocol)
    declared = {name: as_kernel_decls(k, f"bench: kernels of {name!r}")
                for name, k in (kernels or {}).items() if k is not None}
    started_at = utc_now()
    backend = backend if backend is not None else cuda_backend(protocol)
    units = []
    for name in names:
        rs = resets.get(name, [None])
        calls = [(fn, rs[k % len(rs)]) for k, fn in enumerate(copies[name])]
        units.append(Unit.placed(label, name, calls, declared.get(name)))
    m = measure(units, protocol, backend)
    infos = []
    for name in names:
        first = copies[name][0]
        identity = {"callable": getattr(first, "__qualname__", repr(first))}
        if (label, name) in m.inferred:
            identity["kernels"] = INFERRED
        infos.append(S.ArmInfo(name, "callable timed by moebench.bench", label, m.declared[(label, name)], identity))
    subjects = Subjects(shapes=(label,), arms=names, ref=ref or names[0], hbm_bytes={label: hbm_bytes},
                        arm_infos=tuple(infos))
    result = assemble(m, subjects, gpu=backend.gpu, command=("python", *sys.argv), started_at=started_at)
    if out_dir:
        from moebench.record.store import save
        save(result, Path(out_dir) / result_filename(result))
    return result


def _copies(name, given, what: str) -> list:
    """`given` (one callable or a list of them) as a non-empty list, or a UserError naming `name`."""
    fns = list(given) if isinstance(given, (list, tuple)) else [given]
    if not isinstance(name, str) or not name or not fns or not all(callable(f) for f in fns):
        raise UserError(f"bench: {name!r} must be a non-empty name mapped to {what}")
    return fns
