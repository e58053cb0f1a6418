"""Parity: does a prepared arm compute the oracle's function? Checked before any timing.

The output is poisoned with NaN before the call, so an element the arm never wrote shows
up as non-finite. An arm that accumulates into its output zeroes it in `reset()` (untimed),
which overwrites the poison (an external arm may; the built-in ones write their outputs in
the timed call).

An arm is judged against the oracle with the roundings it declares (`PreparedCall.oracle`, an
error model of moebench.fixtures.error_model): its output's residual energy against the variance
that model gives a correct kernel, element by element, summed over (token, 128 columns) blocks,
tokens and the whole output (within_model; the design record's "Parity" section). Its relative
L2 from the oracle and from the exact oracle are reported beside it. A fixed relative-L2 limit
judges instead only where the user asks for one (`verify --threshold`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

# A fixed relative-L2 limit, used only where a user asks for one (--threshold); defined where --help reads it.
from moebench.choices import REL_L2_THRESHOLD  # noqa: E402,F401
from moebench.errors import UserError
from moebench.fixtures import Fixture, fixture_reference, rel_l2_error
from moebench.fixtures.error_model import ErrorTerms, error_model, error_terms
from moebench.kernels.api.arm import PreparedCall
from moebench.record.schema import ParityInfo

# The error model's check (moebench.fixtures.error_model): the residual energy over each scale
# against TAU times the variance the model allows there. The variances are bounds (half an ulp at
# its largest, flips at FLIP_MARGIN times their probability): a correct kernel sits near half of
# them. A small scale fluctuates more (128 elements) and catches local faults (a scale block, a
# tile); the whole output catches faint dense ones.
TAU = (("block", 6.0), ("token", 3.0), ("all", 2.0))
BLOCK_COLS = 128


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


@dataclass(frozen=True)
class ModelCheck:
    excess: float  # max over scales of residual energy / (TAU x modelled variance): <= 1 passes
    where: str  # the scale and place of the largest
    expected_rel_l2: float  # what the model expects of a correct kernel: sqrt(sum variance) / ||value||

    @property
    def passed(self) -> bool:
        return self.excess <= 1.0


def within_model(out: torch.Tensor, terms: ErrorTerms) -> ModelCheck:
    """Residual energy against the model's variance over (token, 128 columns) blocks, tokens, all."""
    r2 = (out.float() - terms.value) ** 2
    var = terms.variance + 1e-30  # an element the model pins exactly (zero) still has a floor
    M, K = r2.shape
    blocks = (r2.reshape(M, -1, BLOCK_COLS).sum(-1), var.reshape(M, -1, BLOCK_COLS).sum(-1))
    sums = {"block": blocks, "token": (r2.sum(-1), var.sum(-1)), "all": (r2.sum()[None], var.sum()[None])}
    worst, where = 0.0, "nowhere"
    for scale, tau in TAU:
        got, allowed = sums[scale]
        ratio = got / (tau * allowed)
        i = int(ratio.argmax())
        if float(ratio.reshape(-1)[i]) > worst or where == "nowhere":
            worst = float(ratio.reshape(-1)[i])
            where = {"block": lambda: f"token {i // (K // BLOCK_COLS)}, columns {i % (K // BLOCK_COLS) * BLOCK_COLS}+",
                     "token": lambda: f"token {i}", "all": lambda: "the whole output"}[scale]()
    expected = float(terms.variance.sum().sqrt() / terms.value.norm().clamp_min(1e-30))
    return ModelCheck(worst, where, expected)


class References:
    """The oracle's outputs and error terms for one fixture, computed once per rounding on first use."""

    def __init__(self, fx: Fixture):
        self.fx = fx
        self._by_rounding: dict[str, torch.Tensor] = {}
        self._terms: dict[str, ErrorTerms] = {}

    def get(self, rounding: str = "exact") -> torch.Tensor:
        """The BF16 oracle output of an oracle name (a model's value: its intermediates' rounding)."""
        rounding = "bf16-intermediates" if error_model(rounding).bf16_intermediates else "exact"
        if rounding not in self._by_rounding:
            self._by_rounding[rounding] = fixture_reference(self.fx, rounding)
        return self._by_rounding[rounding]

    def terms(self, model: str) -> ErrorTerms:
        if model not in self._terms:
            fx = self.fx
            self._terms[model] = error_terms(fx.x_fp8, fx.x_scale, fx.w1, fx.w1_scale, fx.w2, fx.w2_scale,
                                             fx.topk_ids, fx.topk_weights, model)
        return self._terms[model]


def run_poisoned(call: PreparedCall) -> torch.Tensor:
    """The call once into a NaN-poisoned output (after its reset), finished: its output."""
    poison(call.output)
    if call.reset is not None:
        call.reset()
    call.run()
    if call.output.is_cuda:
        torch.cuda.synchronize(call.output.device)
    return call.output


def check_parity(call: PreparedCall, refs: References, shape: str, threshold: float | None = None) -> Parity:
    """Poison, reset, run once; judged by the error model the arm declares (`call.oracle`), or,
    where the user gives `threshold`, by that fixed relative-L2 limit against the same oracle."""
    try:
        error_model(call.oracle)
    except ValueError as err:
        raise UserError(f"arm {call.arm!r}: {err}") from None
    run_poisoned(call)
    result = compare(call.arm, shape, call.output, refs.get(call.oracle),
                     REL_L2_THRESHOLD if threshold is None else threshold)
    exact = None
    if call.oracle != "exact" and not result.nonfinite:
        exact = rel_l2_error(call.output, refs.get("exact"))
    result = replace(result, oracle=call.oracle, rel_l2_exact=exact)
    if threshold is not None or result.nonfinite:
        return result
    check = within_model(call.output, refs.terms(call.oracle))
    # the relative L2 the model allows over the whole output, for tables beside rel_l2
    allowed = check.expected_rel_l2 * dict(TAU)["all"] ** 0.5
    return replace(result, threshold=allowed, passed=check.passed, model_excess=check.excess,
                   model_where=check.where, expected_rel_l2=check.expected_rel_l2)
