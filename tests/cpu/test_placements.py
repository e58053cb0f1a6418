"""`--placements P`: every arm prepared P times, round r timing copy (r - 1) mod P, on the CPU
(fake arms whose copies differ in speed, fake CUPTI)."""

from dataclasses import replace

import pytest
import torch
from rich.console import Console
from test_run_cli import backend, cli_error
from timing_fakes import FakeGpu, FakeTracer, fake_kernels

from moebench.kernels.api.arm import Arm, KernelDecl, PreparedCall
from moebench.kernels.registry import ARMS, add_arm
from moebench.views.markdown import render_markdown
from moebench.analysis.load import load
from moebench.views.tables import print_tables
from moebench.run.runner import RunFailed, RunRequest, run
from moebench.analysis.stats import placement_summaries
from moebench.timing.engine import EngineConfig, Unit, run_rounds
from moebench.timing.graphs import graph_units
from moebench.timing.timers import KernelRecordTimer

COPY_NS = (2000, 2600, 2200)  # what the first, second and third copy of `placed-slow` take
PREPARED: dict[str, int] = {}  # arm -> times prepare() ran


class _PlacedArm(Arm):
    """Each prepare() a copy of its own whose kernel takes COPY_NS[copy] (a fixed 3000 for the
    ref); `fail_copy` makes that copy's output wrong."""

    description = "oracle output copied by a fake kernel, slower or faster by copy"
    fixed_ns: int | None = None
    fail_copy: int | None = None

    def prepare(self, fx):
        from test_run_cli import GPU

        from moebench.fixtures import fixture_reference
        copy = PREPARED.get(self.name, 0)
        PREPARED[self.name] = copy + 1
        ref = fixture_reference(fx)
        out = torch.empty_like(ref)
        ns = self.fixed_ns or COPY_NS[copy % len(COPY_NS)]
        wrong = copy == self.fail_copy

        def run_():
            out.copy_(ref * 3 if wrong else ref)
            GPU.launch("placed_kernel", ns)
        return PreparedCall(self.name, run_, out, (KernelDecl("placed_kernel", "placed_kernel"),))


for _name, _fields in (("placed-ref", {"fixed_ns": 3000}), ("placed-slow", {}), ("placed-bad", {"fail_copy": 1})):
    if _name not in ARMS:
        add_arm(_name, type(_name, (_PlacedArm,), {"name": _name, **_fields}))


def test_the_engine_runs_copy_r_minus_1_mod_p_in_round_r_warmups_included():
    gpu = FakeGpu()
    copies = [fake_kernels(gpu, [(f"copy{k}", 1000)]) for k in range(3)]
    unit = Unit("A8", "arm", copies[0], kernels=None, others=tuple((c, None) for c in copies[1:]))
    assert unit.placements == 3
    out = run_rounds([unit], EngineConfig(rounds=5, samples=2, warmup=1), FakeTracer(gpu),
                     KernelRecordTimer(open_recorder=None))
    by_round = {s.round: {k.name for k in s.kernels} for s in out.samples}
    assert by_round == {1: {"copy0"}, 2: {"copy1"}, 3: {"copy2"}, 4: {"copy0"}, 5: {"copy1"}}
    assert gpu.launch_log == [f"copy{(r - 1) % 3}" for r in range(1, 6) for _ in range(1 + 2)]
    resumed = run_rounds([unit], EngineConfig(rounds=5, samples=1, warmup=0, first_round=5), FakeTracer(gpu),
                         KernelRecordTimer(open_recorder=None))  # a resumed run: round 5 is still copy 1
    assert [(s.round, s.kernels[0].name) for s in resumed.samples] == [(5, "copy1")]


def test_each_placement_gets_a_graph_of_its_own():
    gpu = FakeGpu()
    copies = [fake_kernels(gpu, [(f"copy{k}", 1000)]) for k in range(2)]
    unit = Unit("A8", "arm", copies[0], others=((copies[1], None),))

    class Backend:
        flush = staticmethod(lambda: gpu.launch("flush", 10))
        capture = staticmethod(gpu.capture)
    (graphed,) = graph_units([unit], Backend())
    assert graphed.placements == 2
    gpu.launch_log.clear()
    graphed.call(2)[0]()
    graphed.call(1)[0]()
    assert gpu.launch_log == ["flush", "copy1", "flush", "copy0"]


def test_a_run_times_every_copy_in_turn_and_reports_each_placement(tmp_path):
    PREPARED.clear()
    req = RunRequest(shapes=("T8",), arms=("placed-ref", "placed-slow"), rounds=6, samples=3, warmup=1,
                     out_dir=str(tmp_path), placements=3, placement_mode="rounds", measure_bandwidth=False)
    result, path = run(req, backend())
    assert PREPARED == {"placed-ref": 3, "placed-slow": 3}  # every copy prepared, each checked by the oracle
    assert result.settings.placements == 3 and load(path) == result
    slow = [s for s in result.samples if s.arm == "placed-slow"]
    assert {s.round: s.value_ns for s in slow} == {r: COPY_NS[(r - 1) % 3] for r in range(1, 7)}
    (ref, arm) = placement_summaries(result)
    assert ref.arm == "placed-ref" and ref.ratios is None and ref.spread == 0
    assert arm.medians_ns == COPY_NS and arm.spread == pytest.approx(2600 / 2000 - 1)
    assert arm.ratios == pytest.approx(tuple(3000 / ns for ns in COPY_NS))
    console = Console(record=True, width=200)
    print_tables(result, console)
    text = console.export_text()
    assert "by placement" in text and "3 placements in turn" in text
    assert "2.00 / 2.60 / 2.20" in text and "30.0%" in text and "1.500 / 1.154 / 1.364" in text
    md = render_markdown(result)
    assert "By placement" in md and "prepared 3 times" in md
    assert "| T8 | `placed-slow` | 2.00 / 2.60 / 2.20 | 30.0% | 1.500 / 1.154 / 1.364 |" in md


def test_one_placement_is_the_plain_run_and_compare_notes_the_difference(tmp_path):
    from moebench.analysis.compare import compare_results
    one, _ = run(RunRequest(shapes=("T8",), arms=("placed-ref",), rounds=3, samples=2, warmup=0,
                            out_dir=str(tmp_path), measure_bandwidth=False, placements=1), backend())
    three, _ = run(RunRequest(shapes=("T8",), arms=("placed-ref",), rounds=3, samples=2, warmup=0,
                              out_dir=str(tmp_path), measure_bandwidth=False, placements=3, placement_mode="rounds"), backend())
    assert one.settings.placements == 1 and placement_summaries(one) == ()
    assert "settings differ: placements 1 vs 3" in compare_results(one, three).notes
    assert not any("placements" in n for n in compare_results(three, three).notes)


def test_a_copy_that_fails_the_oracle_stops_the_run_naming_the_copy(tmp_path):
    PREPARED.clear()
    req = RunRequest(shapes=("T8",), arms=("placed-ref", "placed-bad"), rounds=3, samples=1, warmup=0,
                     out_dir=str(tmp_path), placements=3, placement_mode="rounds")
    with pytest.raises(RunFailed, match="placed-bad at T8: placement 2 of 3: residual .*relative L2"):
        run(req, backend())
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, needle", [
    (["--placements", "0"], "--placements must be 1 to 16, got 0"),
    (["--placements", "17", "--rounds", "20"], "--placements must be 1 to 16, got 17"),
    (["--placements", "4", "--rounds", "3", "--placement-mode", "rounds"], "--placements 4 needs at least as many rounds (--rounds 3)"),
])
def test_placement_mistakes_are_one_line(capsys, argv, needle):
    code, err = cli_error(capsys, "run", "--arms", "placed-ref", "--shape", "T8", *argv)
    assert code == 2 and needle in err


def test_a_resumed_run_keeps_its_placements(tmp_path):
    from dataclasses import replace

    import test_resume
    from test_resume import Crash, only_file

    from moebench.run.runner import resume
    req = replace(test_resume.request(tmp_path, rounds=5), placements=2, order_seed=7)
    with pytest.raises(RuntimeError, match="fell off the bus"):
        run(req, test_resume.backend(Crash(4)))
    path = only_file(tmp_path / "out")
    assert load(path).rounds_done == 3 and load(path).settings.placements == 2
    done, _ = resume(path, test_resume.backend())
    whole, _ = run(replace(req, out_dir=str(tmp_path / "whole")), test_resume.backend())
    assert done.settings == whole.settings and done.settings.placements == 2
    assert done.summaries == whole.summaries and done.ratios == whole.ratios


def test_the_default_protocol_records_its_seed_placements_and_floor(tmp_path):
    from moebench.run.plan import REF_AA
    PREPARED.clear()
    req = RunRequest(shapes=("T8",), arms=("placed-ref", "placed-slow"), rounds=4, samples=4, warmup=0,
                     out_dir=str(tmp_path), placements=2, aa_arm=REF_AA, measure_bandwidth=False)
    result, path = run(req, backend())
    s = result.settings
    assert s.placement_mode == "samples" and s.placements_by_shape == {"T8": 2}
    assert s.order_seed is not None and load(path).settings.order_seed == s.order_seed  # drawn and kept
    assert s.arms == ("placed-ref", "placed-slow", "placed-ref#2") and set(result.noise["T8"]) == {
        "placed-ref", "placed-ref#2"}
    again, _ = run(replace(req, order_seed=s.order_seed, out_dir=str(tmp_path / "again")), backend())
    order = [(x.round, x.arm) for x in result.samples if x.index == 0]
    assert order == [(x.round, x.arm) for x in again.samples if x.index == 0]  # the seed redoes the order
