"""`moebench tune`: the stock Triton path's up and down GEMM configs searched per M on this GPU
and Triton version, timed as moebench times everything (a cold L2 before every sample, CUPTI
kernel durations, every sample audited), written as the engines' JSON tables.

Per M, from the engine's shipped pair of configs (always the first candidates): a walk over
the pruned space (moebench.tasks.tune_space), each GEMM timed alone in isolation from the other in
eager launches. Every candidate first runs in the whole path with a partner that passed (the
current config of the other GEMM, at the candidate's BLOCK_SIZE_M) and is checked against the
oracle; a config that does not compile, fails parity or fails the audit is refused with why.
The chosen pair is then timed against the shipped pair, whole path against whole path, in
paired rounds; it is written only where it is faster (median over rounds of the per-round
ratio above 1), else the shipped pair is written for that M and the provenance says so.

The state file (moebench.tasks.tune_state) is saved after every batch: a tune stopped by its
`--budget`, Ctrl-C or a lost machine continues when the same command runs again. The tables
(moebench.kernels.stock.tuned_tables) and their provenance are rewritten after every finished M.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from moebench.choices import TUNE_PASSES
from moebench.errors import UserError
from moebench.fixtures import Fixture, ShapeRegistry, build_fixture
from moebench.kernels.api.parity import References, check_parity
from moebench.kernels.stock.arms import TRITON_KERNELS, _kernel_source_sha256, device_of, stock_call, stock_workspace
from moebench.kernels.stock.engine_config import TritonMoeConfig, resolve, stock_plan
from moebench.kernels.stock.tuned_tables import table_stem, tables_folder
from moebench.tasks.tune_space import (SM90_SMEM_PER_BLOCK, GemmShape, Limits, block_m_moves, config_label, expert_rows,
                                       moves)
from moebench.tasks.tune_state import TuneState
from moebench.timing.engine import Unit
from moebench.timing.measure import TimingBackend, TimingProtocol, check_protocol, measure

GEMM_DECL = {"up": (TRITON_KERNELS[0],), "down": (TRITON_KERNELS[3],)}


@dataclass(frozen=True)
class TuneRequest:
    family: str  # a family letter (A, Q) or MODEL/LAYOUT (deepseek-v3/ep8)
    ms: tuple[int, ...]
    out_dir: str
    budget_s: float | None = None  # wall-clock seconds this invocation may take, None: no limit
    rounds: int = 2  # per candidate: paired rounds, each `samples` audited cold samples
    samples: int = 10
    warmup: int = 2
    check_rounds: int = 6  # the final whole-path check of tuned against shipped
    passes: int = TUNE_PASSES
    flush: str = "read"
    pdl: bool = True
    balancedness: float = 0.8
    shapes_file: str | None = None
    max_fixture_gb: float = 16.0
    command: tuple[str, ...] = ()

    @property
    def protocol(self) -> TimingProtocol:
        return TimingProtocol(rounds=self.rounds, samples=self.samples, warmup=self.warmup, flush=self.flush,
                              measure_bandwidth=False)

    @property
    def check_protocol(self) -> TimingProtocol:
        return replace(self.protocol, rounds=self.check_rounds, samples=2 * self.samples)

    def validate(self) -> None:
        check_protocol(self.protocol)
        if self.check_rounds < 1 or self.passes < 1:
            raise UserError("--check-rounds and --passes must be at least 1")
        if self.budget_s is not None and not 0 < self.budget_s < float("inf"):
            raise UserError(f"--budget must be a positive number of seconds, got {self.budget_s}")


class BudgetSpent(Exception):
    """The tune's --budget ran out: the state is saved, the finished Ms written."""


class Budget:
    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic):
        self.clock, self.start = clock, clock()
        self.deadline = None if seconds is None else self.start + seconds

    def check(self) -> None:
        if self.deadline is not None and self.clock() >= self.deadline:
            raise BudgetSpent()

    @property
    def elapsed(self) -> float:
        return self.clock() - self.start


class MeasureTimer:
    """Units timed by moebench's one measurement core, their audited samples by round.
    `wrap(unit)` lets CPU tests put fake kernel records beside a real interpreted call."""

    def __init__(self, backend: TimingBackend, wrap: Callable[[Unit], Unit] | None = None):
        self.backend, self.wrap = backend, wrap

    def rows(self, units: list[Unit], protocol: TimingProtocol) -> dict[str, dict[int, list[int]]]:
        timed = [self.wrap(u) for u in units] if self.wrap else units
        m = measure(timed, protocol, self.backend)
        out: dict[str, dict[int, list[int]]] = {u.arm: {} for u in units}
        for s in m.audited_samples:
            out[s.arm].setdefault(s.round, []).append(s.value_ns)
        return out


@dataclass(frozen=True)
class TuneOutcome:
    folder: Path
    tables: tuple[Path, ...]  # up, down, provenance (empty when no M finished)
    finished: tuple[int, ...]
    left: tuple[int, ...]
    stopped: str | None  # "budget" when the budget ran out


def _interrupted(err: BaseException) -> bool:
    """A Ctrl-C that a library wrapped in an error of its own (Triton's compiler and interpreter do)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def _median(values: list[int]) -> float:
    return float(statistics.median(values))


class MTune:
    """The search at one M: candidates prepared, checked and timed through the state's cache."""

    def __init__(self, fx: Fixture, device, limits: Limits, state: TuneState, timer, req: TuneRequest,
                 budget: Budget, log: Callable[[str], None]):
        spec = fx.spec
        self.fx, self.device, self.lim, self.state, self.timer, self.req = fx, device, limits, state, timer, req
        self.budget, self.log, self.M = budget, log, fx.M
        self.g_up, self.g_down = GemmShape("up", spec.N, spec.K), GemmShape("down", spec.K, spec.I)
        self.refs = References(fx)
        self.workspaces: dict[tuple[int, bool], object] = {}

    def plan(self, up: TritonMoeConfig, down: TritonMoeConfig):
        spec = self.fx.spec
        return stock_plan(self.device, up, down, M=self.M, E=spec.E, top_k=spec.top_k, pdl=self.req.pdl,
                          identity={"config_source": "tune candidate"})

    def call(self, up: TritonMoeConfig, down: TritonMoeConfig, fresh: bool = False):
        plan = self.plan(up, down)
        layout = (plan.block_m, plan.sorted_down)
        ws = stock_workspace(self.fx, *layout) if fresh else self.workspaces.get(layout)
        if ws is None:
            ws = self.workspaces[layout] = stock_workspace(self.fx, *layout)
        return stock_call(self.fx, plan, "tune", ws)

    def key(self, gemm: str, cfg: TritonMoeConfig, partner: TritonMoeConfig) -> str:
        # The up GEMM writes in plan order when the down GEMM reads by TMA: part of what is timed.
        layout = ("plan-order" if partner.USE_TMA and self.device.tensor_descriptors else "slots") \
            if gemm == "up" else ""
        return f"{gemm} {config_label(cfg)}" + (f" {layout}" if layout else "")

    def values(self, items: list[tuple[str, TritonMoeConfig, TritonMoeConfig]]) -> dict[str, int | None]:
        """(gemm, candidate, partner) items timed where the state has no value: their ns (None: refused)."""
        todo, units = [], []
        for gemm, cand, partner in items:
            key = self.key(gemm, cand, partner)
            if self.state.get(self.M, key) is not None or key in todo:
                continue
            self.budget.check()
            up, down = (cand, partner) if gemm == "up" else (partner, cand)
            try:
                call, gemm1, gemm2 = self.call(up, down)
                par = check_parity(call, self.refs, self.fx.spec.name)
            except Exception as err:  # noqa: BLE001 (a config Triton cannot compile or launch here)
                if _interrupted(err):
                    raise KeyboardInterrupt from None
                why = f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
                self.state.put(self.M, key, None, why)
                if "CUDA error" in str(err):  # the context is lost: refused, saved, and the tune stops here
                    self.state.save()
                    raise UserError(f"{self.fx.spec.name}: {key}: {why}; it is refused in the state file, and the "
                                    f"same command continues in a fresh process") from None
                continue
            if not par.passed:
                self.state.put(self.M, key, None, f"parity: {par.reason()}")
                continue
            todo.append(key)
            units.append(Unit(self.fx.spec.name, key, gemm1 if gemm == "up" else gemm2, None, GEMM_DECL[gemm]))
        if units:
            self.budget.check()
            rows = self.timer.rows(units, self.req.protocol)
            need = self.req.rounds * self.req.samples
            for key in todo:
                vals = [v for r in rows.get(key, {}).values() for v in r]
                if len(vals) * 2 < need:
                    self.state.put(self.M, key, None, f"audit: {len(vals)} of {need} samples passed")
                else:
                    self.state.put(self.M, key, int(_median(vals)))
            self.state.save()
            timed, refused = self.state.count(self.M)
            self.log(f"{self.fx.spec.name}: {len(units)} timed ({timed} so far, {refused} refused); "
                     f"{self.budget.elapsed:.0f} s")
        return {self.key(g, c, p): self.state.get(self.M, self.key(g, c, p))["ns"] for g, c, p in items}

    def best(self, options, cost) -> tuple:
        """The option of least cost (the first on a tie: the current config is listed first)."""
        scored = [(cost(o), i, o) for i, o in enumerate(options)]
        scored = [s for s in scored if s[0] is not None]
        if not scored:
            return None
        return min(scored, key=lambda s: (s[0], s[1]))

    def search(self, up: TritonMoeConfig, down: TritonMoeConfig) -> tuple[TritonMoeConfig, TritonMoeConfig]:
        name = self.fx.spec.name
        for p in range(1, self.req.passes + 1):
            start = (up, down)
            pairs = [(up, down)] + block_m_moves(up, down, self.g_up, self.g_down, self.lim)
            v = self.values([it for u, d in pairs for it in (("up", u, d), ("down", d, u))])

            def pair_cost(pair):
                a, b = v[self.key("up", pair[0], pair[1])], v[self.key("down", pair[1], pair[0])]
                return None if a is None or b is None else a + b
            found = self.best(pairs, pair_cost)
            if found is None:
                raise UserError(f"{name}: neither the shipped configs nor any other BLOCK_SIZE_M ran here: "
                                f"{self._why(pairs[0])}")
            up, down = found[2]
            for gemm in ("up", "down"):
                cur, partner, g = (up, down, self.g_up) if gemm == "up" else (down, up, self.g_down)
                options = [cur] + moves(cur, g, self.lim)
                v = self.values([(gemm, c, partner) for c in options])
                chosen = self.best(options, lambda c: v[self.key(gemm, c, partner)])
                if chosen is not None:
                    up, down = (chosen[2], down) if gemm == "up" else (up, chosen[2])
            timed, refused = self.state.count(self.M)
            self.log(f"{name}: pass {p}: up {config_label(up)}, down {config_label(down)}; "
                     f"{timed} candidates timed, {refused} refused so far; {self.budget.elapsed:.0f} s")
            if (up, down) == start:
                break
        return up, down

    def _why(self, pair) -> str:
        rows = [self.state.get(self.M, self.key(g, c, p)) for g, c, p in (("up", pair[0], pair[1]),
                                                                          ("down", pair[1], pair[0]))]
        return "; ".join(r["why"] for r in rows if r and r.get("why")) or "no value"

    def check(self, tuned: tuple, shipped: tuple) -> dict:
        """The whole path with the tuned pair against the shipped pair, in paired rounds."""
        if tuned == shipped:
            return {"kept": "shipped", "note": "the search kept the shipped configs"}
        self.budget.check()
        units, labels = [], {}
        for which, (up, down) in (("tuned", tuned), ("shipped", shipped)):
            call, _, _ = self.call(up, down, fresh=True)
            par = check_parity(call, self.refs, self.fx.spec.name)
            if not par.passed:
                raise UserError(f"{self.fx.spec.name}: the {which} pair fails the oracle: {par.reason()}")
            labels[which] = f"{which} up {config_label(up)} down {config_label(down)}"
            units.append(Unit(self.fx.spec.name, labels[which], call.run, None, tuple(call.kernels)))
        rows = self.timer.rows(units, self.req.check_protocol)
        tuned_rows, shipped_rows = rows[labels["tuned"]], rows[labels["shipped"]]
        rounds = sorted(set(tuned_rows) & set(shipped_rows))
        if not rounds:
            raise UserError(f"{self.fx.spec.name}: the final check kept no audited round of both pairs")
        ratios = [_median(shipped_rows[r]) / _median(tuned_rows[r]) for r in rounds]
        ratio = _median(ratios)
        tuned_ns = _median([v for r in rounds for v in tuned_rows[r]])
        shipped_ns = _median([v for r in rounds for v in shipped_rows[r]])
        return {"kept": "tuned" if ratio > 1.0 else "shipped", "ratio_shipped_over_tuned": ratio,
                "rounds": len(rounds), "rounds_won": sum(1 for x in ratios if x > 1.0),
                "tuned_ns": tuned_ns, "shipped_ns": shipped_ns}


def _specs(req: TuneRequest):
    from moebench.run.plan import sweep_shapes
    registry = ShapeRegistry(max_fixture_gb=req.max_fixture_gb)
    if req.shapes_file:
        registry = registry.with_shapes_file(req.shapes_file)
    try:
        names = sweep_shapes(req.family, ",".join(str(m) for m in req.ms))
    except UserError as err:  # the tune's option is --shape (sweep's --family)
        raise UserError(str(err).replace("--family:", "--shape:", 1)) from None
    return [registry.resolve(n, balancedness=req.balancedness) for n in names]


def _smem_per_block(device: torch.device) -> int:
    if device.type != "cuda":
        return SM90_SMEM_PER_BLOCK
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "shared_memory_per_block_optin", 0) or SM90_SMEM_PER_BLOCK)


def tune(req: TuneRequest, device: torch.device, timer=None, log: Callable[[str], None] = lambda m: None,
         clock: Callable[[], float] = time.monotonic) -> TuneOutcome:
    """Tune every M of `req` not finished in the state; write the tables after each M."""
    from moebench.tasks.tune_write import state_key, write_outputs
    req.validate()
    specs = _specs(req)
    spec0 = specs[0]
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("no CUDA device visible: a tune times on a GPU (see `moebench doctor`)")
    if device.type != "cuda" and timer is None:
        raise UserError("a tune times on a GPU: CUPTI records of a CUDA device")
    dev = device_of(device)
    folder = tables_folder(req.out_dir, dev.triton_version)
    stem = table_stem(spec0.E, spec0.I, dev.name)
    state = TuneState.open(folder / f"{stem}.tune-state.json", state_key(req, spec0, dev, _kernel_source_sha256()))
    if state.resumed:
        log(f"continuing from {state.path.name}: {len(state.done)} M(s) finished, "
            f"{sum(len(v) for v in state.measured.values())} candidates known")
    if timer is None:
        from moebench.timing.measure import cuda_backend
        timer = MeasureTimer(cuda_backend(req.protocol))
    gpu = getattr(getattr(timer, "backend", None), "gpu", None)  # with the driver and clocks, when real
    budget = Budget(req.budget_s, clock)
    smem = _smem_per_block(device)
    tma = dev.sm90 and dev.tensor_descriptors
    stopped, written = None, ()
    try:
        for n, spec in enumerate(specs, 1):
            if str(spec.M) in state.done:
                log(f"{spec.name} [{n}/{len(specs)}]: finished before, kept")
                continue
            budget.check()
            fx = build_fixture(spec).to(device)
            shipped_plan = resolve(dev, E=spec.E, N=spec.I, M=spec.M, K=spec.K, top_k=spec.top_k, pdl=req.pdl)
            shipped = (shipped_plan.up.config, shipped_plan.down.config)
            lim = Limits(expert_rows(fx.topk_ids, spec.E), smem, tma)
            log(f"{spec.name} [{n}/{len(specs)}]: shipped up {config_label(shipped[0])}, down "
                f"{config_label(shipped[1])} ({shipped_plan.identity.get('config_source')}); busiest expert "
                f"{lim.max_expert_rows} rows")
            mt = MTune(fx, dev, lim, state, timer, req, budget, log)
            up, down = mt.search(*shipped)
            check = mt.check((up, down), shipped)
            kept = (up, down) if check["kept"] == "tuned" else shipped
            vals = {g: state.get(spec.M, mt.key(g, c, p)) for g, c, p in (("up", up, down), ("down", down, up))}
            timed, refused = state.count(spec.M)
            state.finish(spec.M, {
                "kept": check["kept"], "up": kept[0].as_dict(), "down": kept[1].as_dict(),
                "searched_up": up.as_dict(), "searched_down": down.as_dict(),
                "shipped_up": shipped[0].as_dict(), "shipped_down": shipped[1].as_dict(),
                "shipped_source": {k: v for k, v in shipped_plan.identity.items() if k != "device_name"},
                "up_ns": vals["up"]["ns"], "down_ns": vals["down"]["ns"], "check": check,
                "candidates_timed": timed, "candidates_refused": refused})
            state.save()
            written = write_outputs(req, state, folder, stem, spec0, dev, device, gpu=gpu)
            ratio = check.get("ratio_shipped_over_tuned")
            log(f"{spec.name}: kept {check['kept']}" + (f" (shipped/tuned {ratio:.3f} over {check['rounds']} "
                                                         f"rounds)" if ratio is not None else "")
                + f"; {timed} timed, {refused} refused; {budget.elapsed:.0f} s")
            del mt, fx
    except BudgetSpent:
        stopped = "budget"
    finally:
        state.save()
    if stopped:
        written = write_outputs(req, state, folder, stem, spec0, dev, device, stopped=stopped, gpu=gpu)
    finished = tuple(m for m in req.ms if str(m) in state.done)
    left = tuple(m for m in req.ms if str(m) not in state.done)
    return TuneOutcome(folder, written, finished, left, stopped)

