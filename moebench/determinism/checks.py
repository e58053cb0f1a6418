"""Determinism and batch invariance of an arm: is its output the same bits every time?

Three checks per arm and fixture, each bitwise (BF16 bit patterns, so -0 and NaN count):

  run-to-run      one prepared call run `runs` times on the same inputs: how many runs differ
                  from the first, the most elements any of them differs in, the largest |diff|;
  batch           the output rows of the fixture's first m tokens (m = 1, 8 and M) computed
                  alone and inside larger batches holding the same rows and routes (the
                  fixture itself, and the fixture followed by M more tokens): a batch-invariant
                  arm gives those rows the same bits whatever else is in the batch;
  across processes  the SHA-256 of the first run's output in a fresh Python process
                  (moebench.determinism.child) equals this one's.

Untimed: nothing here measures speed. `moebench verify --determinism` prepares the arms for the
checks (check_arms); `moebench run --determinism` runs them on the calls it times
(check_prepared, from moebench.run.determinism). Verdicts are the frozen records of
moebench.record.determinism, stored in a RunResult's `determinism` field and drawn by
moebench.views.determinism_view.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace

import torch

from moebench.errors import UserError
from moebench.fixtures import Fixture, derive
from moebench.fixtures.tokens import append_tokens, take_tokens
from moebench.kernels.api.arm import Arm, PreparedCall
from moebench.kernels.api.parity import run_poisoned
from moebench.kernels.registry import load_builtin_arms, make_arms
from moebench.record.determinism import BatchRows, CrossProcess, DeterminismVerdict, RunToRun

DEFAULT_RUNS = 20
PROOF_RUNS = 100  # what the H200 record of cuda-fused-det runs
BATCH_ROWS = (1, 8)  # and M

# What the engines define for batch invariance, beside the arms that follow them (read from their
# sources; moebench times the stock settings, not these modes).
ENGINE_NOTES = {
    "triton": "config follows M (tuned table); vLLM VLLM_BATCH_INVARIANT=1 defaults to one config for every M",
    "triton-swapab": "config follows M (tuned table); vLLM VLLM_BATCH_INVARIANT=1 defaults to one config for every M",
    "triton-default": "one config at every M (vLLM's batch-invariant default is one too: BM64 BN64 BK32)",
    "vllm": "vLLM: VLLM_BATCH_INVARIANT=1 defaults to one fused-MoE config for every M",
    "sglang": "SGLang: --enable-deterministic-inference (batch-invariant matmul, attention, sampling)",
    "cuda-fused": "BF16 reduce-adds into the output in the order the hardware takes them",
    "cuda-fused-det": "DETERMINISTIC build: per-slot rows summed in a fixed order",
}


@dataclass(frozen=True)
class Difference:
    """How two outputs of the same shape differ, bit for bit."""

    elements: int  # elements whose bits differ
    max_abs: float  # largest |a - b| over them where both are finite; -1.0 if none is (0.0: none differ)

    @property
    def bitwise(self) -> bool:
        return self.elements == 0


# ------------------------------------------------------------------------------ outputs


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(view)


def difference(a: torch.Tensor, b: torch.Tensor) -> Difference:
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"outputs differ in shape or dtype: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
    differ = _bits(a) != _bits(b)
    n = int(differ.sum())
    if n == 0:
        return Difference(0, 0.0)
    a32, b32 = a.float()[differ], b.float()[differ]
    both = torch.isfinite(a32) & torch.isfinite(b32)
    max_abs = float((a32[both] - b32[both]).abs().max()) if bool(both.any()) else -1.0
    return Difference(n, max_abs)


def output_hash(t: torch.Tensor) -> str:
    """SHA-256 over the output's dtype, shape and bytes."""
    t = t.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype}:{tuple(t.shape)}".encode())
    h.update(_bits(t).reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


def run_once(call: PreparedCall) -> torch.Tensor:
    """Poison, reset, run, and a host copy of the output."""
    return run_poisoned(call).detach().to("cpu", copy=True)


# ------------------------------------------------------------------------------ across processes

CHILD_RESULT_TAG = "moebench-determinism-child "
# The fresh process holds a second copy of the fixture and the arms' buffers beside this one's; on
# a card other processes share, it can find no memory left (eight test workers on one 80 GB H100
# left 93 MiB: results/h100/fidelity/gpu-tests-c566cfb-parallel.log). It is tried again after
# these pauses before the check is recorded as not run, with the reason.
MEMORY_RETRY_PAUSES_S = (5.0, 20.0)


@dataclass(frozen=True)
class ChildRequest:
    """What the fresh process needs to make the same calls: the fixture's spec and fingerprint
    (it rebuilds the fixture, bitwise the same on every machine), the arms and their options, the
    device. One fresh process a fixture serves every arm checked on it."""

    family: dict  # Family fields
    spec: dict  # name, M, seed, balancedness
    fingerprint: str
    arms: dict  # arm name -> its options
    external: tuple[str, ...]  # `NAME=module:factory` arms
    device: str
    interpret: bool  # TRITON_INTERPRET in this process

    @classmethod
    def for_fixture(cls, fx: Fixture, arms: dict, external: tuple[str, ...] = ()) -> ChildRequest:
        from moebench.kernels.stock.arms import interpreter_requested
        s = fx.spec
        return cls(asdict(s.family), {"name": s.name, "M": s.M, "seed": s.seed, "balancedness": s.balancedness},
                   fx.fingerprint, {a: {k: v for k, v in o.items() if v is not None} for a, o in arms.items()},
                   tuple(external), str(fx.device), interpreter_requested())


def cross_process_check(request: ChildRequest, hashes_here: dict[str, str],
                        timeout_s: float = 900.0) -> dict[str, CrossProcess]:
    """Run `python -m moebench.determinism.child` on the request; each arm's hash there against
    `hashes_here[arm]`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # this process's imports (a test's arms too)
    if request.interpret:
        env["TRITON_INTERPRET"] = "1"

    def every(why: str) -> dict[str, CrossProcess]:
        return {arm: CrossProcess(h, None, why) for arm, h in hashes_here.items()}
    for attempt, pause_s in enumerate((*MEMORY_RETRY_PAUSES_S, None)):
        try:
            proc = subprocess.run([sys.executable, "-m", "moebench.determinism.child"],
                                  input=json.dumps(asdict(request)), capture_output=True, text=True,
                                  timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            return every(f"the fresh process took more than {timeout_s:g} s")
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(CHILD_RESULT_TAG)]
        if not lines:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return every(f"the fresh process failed (exit {proc.returncode}): {tail}")
        got = json.loads(lines[-1][len(CHILD_RESULT_TAG):])
        if not got.get("out_of_memory") or pause_s is None:
            break
        time.sleep(pause_s)  # another process holds the card's memory: it may let go
    if "error" in got and "arms" not in got:
        tries = f" ({attempt + 1} tries)" if got.get("out_of_memory") else ""
        return every(got["error"] + tries)
    there = got.get("arms", {})
    return {arm: CrossProcess(h, there.get(arm, {}).get("hash"),
                              there.get(arm, {}).get("error", None if arm in there else "no answer for this arm"))
            for arm, h in hashes_here.items()}


# ------------------------------------------------------------------------------ the checks


def check_run_to_run(call: PreparedCall, runs: int = DEFAULT_RUNS) -> tuple[RunToRun, torch.Tensor]:
    """The first run's output and how the other runs differ from it."""
    if runs < 2:
        raise UserError(f"--runs must be at least 2, got {runs}")
    first = run_once(call)
    differing, most, max_abs = 0, 0, -1.0
    for _ in range(runs - 1):
        d = difference(first, run_once(call))
        if not d.bitwise:
            differing += 1
            most, max_abs = max(most, d.elements), max(max_abs, d.max_abs)
    max_abs = 0.0 if differing == 0 else max_abs
    return RunToRun(runs, differing, most, max_abs), first


def batch_sizes(M: int, rows: tuple[int, ...] = BATCH_ROWS) -> list[int]:
    return sorted({m for m in rows if 1 <= m <= M} | {M})


def check_batch(arm: Arm, fx: Fixture, full_output: torch.Tensor, *, rows: tuple[int, ...] = BATCH_ROWS,
                seed: int | None = None) -> tuple[BatchRows, ...]:
    """Rows of the first m tokens alone against the same rows in fx (`full_output`, already run)
    and in fx followed by M more tokens (drawn from `seed`, with their own routes)."""
    seed = fx.spec.seed + 7 if seed is None else seed
    grown = append_tokens(fx, derive(fx, seed, M=fx.M))
    inside = {fx.M: full_output, grown.M: run_once(arm.prepare(grown))}
    out = []
    for m in batch_sizes(fx.M, rows):
        alone = full_output if m == fx.M else run_once(arm.prepare(take_tokens(fx, m)))
        for batch in sorted(b for b in inside if b > m):
            d = difference(alone, inside[batch][:m])
            out.append(BatchRows(m, batch, d.elements, d.max_abs))
    return tuple(out)


def check_arm(arm: Arm, fx: Fixture, *, runs: int = DEFAULT_RUNS, rows: tuple[int, ...] = BATCH_ROWS,
              seed: int | None = None) -> tuple[DeterminismVerdict, str]:
    """The run-to-run and batch checks for one arm, and its first output's hash (for the
    across-processes check, which check_arms runs once for every arm of a fixture)."""
    call = arm.prepare(fx)
    repeat, first = check_run_to_run(call, runs)
    identity = dict(call.identity)
    del call  # its buffers are not needed while the batches are prepared
    return _verdict(arm, fx, repeat, first, identity, rows, seed)


def check_prepared(arm: Arm, fx: Fixture, call: PreparedCall, *, runs: int = DEFAULT_RUNS,
                   rows: tuple[int, ...] = BATCH_ROWS, seed: int | None = None) -> tuple[DeterminismVerdict, str]:
    """check_arm on a call `arm` already prepared on fx (a timed run's own): the run-to-run
    check runs that call; the batch check prepares the arm on the other batches."""
    repeat, first = check_run_to_run(call, runs)
    return _verdict(arm, fx, repeat, first, dict(call.identity), rows, seed)


def _verdict(arm: Arm, fx: Fixture, repeat: RunToRun, first: torch.Tensor, identity: dict,
             rows: tuple[int, ...], seed: int | None) -> tuple[DeterminismVerdict, str]:
    batch = check_batch(arm, fx, first, rows=rows, seed=seed)
    verdict = DeterminismVerdict(arm.name, fx.spec.name, fx.M, repeat, batch, None, ENGINE_NOTES.get(arm.name),
                                 identity)
    return verdict, output_hash(first)


def check_arms(fx: Fixture, names: list[str], *, options: dict | None = None, external: tuple[str, ...] = (),
               runs: int = DEFAULT_RUNS, rows: tuple[int, ...] = BATCH_ROWS, cross_process: bool = True,
               seed: int | None = None, timeout_s: float = 900.0) -> list[DeterminismVerdict]:
    """One verdict per arm on fx. `external`: `NAME=module:factory` arms (as `--arm`), also
    made in the fresh process. Raises UserError if an arm cannot run on fx's device."""
    from moebench.kernels.registry import external_arm_factories
    arms = make_arms(names, options, extra=external_arm_factories(external))
    for arm in arms:
        reason = arm.unavailable_reason(fx.device)
        if reason:
            raise UserError(f"arm {arm.name!r} cannot run here: {reason}")
    checked = [check_arm(arm, fx, runs=runs, rows=rows, seed=seed) for arm in arms]
    if not cross_process:
        return [v for v, _ in checked]
    return across_processes(fx, checked, options=options, external=external, timeout_s=timeout_s)


NOT_REMADE = "an arm of this run only (a build, variant or copy): not made again in a fresh process"


def across_processes(fx: Fixture, checked: list[tuple[DeterminismVerdict, str]], *, options: dict | None = None,
                     external: tuple[str, ...] = (), timeout_s: float = 900.0) -> list[DeterminismVerdict]:
    """The verdicts of check_arm or check_prepared with the across-processes check filled in:
    one fresh process for every arm it can make again (the built-in arms and `external`); the
    others' check records why it did not run."""
    from moebench.kernels.registry import external_arm_factories
    factories = {**load_builtin_arms(), **external_arm_factories(external)}
    mine = {}
    for v, _ in checked:
        if v.arm in factories:
            accepts = inspect.signature(factories[v.arm]).parameters
            mine[v.arm] = {k: val for k, val in (options or {}).items() if k in accepts}
    there = cross_process_check(ChildRequest.for_fixture(fx, mine, tuple(external)),
                                {v.arm: h for v, h in checked if v.arm in mine}, timeout_s=timeout_s) if mine else {}
    return [replace(v, cross_process=there.get(v.arm) or CrossProcess(h, None, NOT_REMADE)) for v, h in checked]
