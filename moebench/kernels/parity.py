"""Parity: does a prepared arm compute the oracle's function? Checked before any timing.

The output is poisoned with NaN before the call, so an element the arm never wrote shows
up as non-finite. An arm that accumulates into its output zeroes it in `reset()` (untimed),
which overwrites the poison (an external arm may; the built-in ones write their outputs in
the timed call).

An arm is judged against the oracle with the roundings it declares (`PreparedCall.oracle`,
see moebench.fixtures.oracle); its distance from the exact oracle is reported beside it.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from moebench.fixtures import Fixture, fixture_reference, rel_l2_error
from moebench.kernels.arm import PreparedCall
from moebench.results.schema import ParityInfo

REL_L2_THRESHOLD = 1e-2  # FP8 requant boundaries flip a few codes; a correct kernel lands far below


Parity = ParityInfo  # the record a result stores; nonfinite counts unwritten (still NaN) or NaN/Inf


def poison(t: torch.Tensor) -> None:
    t.fill_(float("nan"))


def compare(arm: str, shape: str, out: torch.Tensor, ref: torch.Tensor,
            threshold: float = REL_L2_THRESHOLD) -> Parity:
    out32, ref32 = out.float(), ref.float()
    finite = torch.isfinite(out32)
    nonfinite = int((~finite).sum())
    if nonfinite:
        rel, max_abs = float("inf"), float("inf")
    else:
        rel = rel_l2_error(out32, ref32)
        max_abs = float((out32 - ref32).abs().max()) if out32.numel() else 0.0
    ref_max = float(ref32.abs().max()) if ref32.numel() else 0.0
    return Parity(shape=shape, arm=arm, rel_l2=rel, max_abs=max_abs, nonfinite=nonfinite, threshold=threshold,
                  passed=nonfinite == 0 and rel <= threshold, ref_max_abs=ref_max)


class References:
    """The oracle's outputs for one fixture, computed once per rounding on first use."""

    def __init__(self, fx: Fixture):
        self.fx = fx
        self._by_rounding: dict[str, torch.Tensor] = {}

    def get(self, rounding: str = "exact") -> torch.Tensor:
        if rounding not in self._by_rounding:
            self._by_rounding[rounding] = fixture_reference(self.fx, rounding)
        return self._by_rounding[rounding]


def run_poisoned(call: PreparedCall) -> torch.Tensor:
    """The call once into a NaN-poisoned output (after its reset), finished: its output."""
    poison(call.output)
    if call.reset is not None:
        call.reset()
    call.run()
    if call.output.is_cuda:
        torch.cuda.synchronize(call.output.device)
    return call.output


def check_parity(call: PreparedCall, refs: References, shape: str,
                 threshold: float = REL_L2_THRESHOLD) -> Parity:
    """Poison, reset, run once, compare with the oracle of the arm's roundings."""
    run_poisoned(call)
    result = compare(call.arm, shape, call.output, refs.get(call.oracle), threshold)
    exact = None
    if call.oracle != "exact" and not result.nonfinite:
        exact = rel_l2_error(call.output, refs.get("exact"))
    return replace(result, oracle=call.oracle, rel_l2_exact=exact)
