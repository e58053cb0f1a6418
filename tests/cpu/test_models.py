"""Public models and layouts as shape names (moebench.fixtures.models): the registry's values
against the published configs, the layouts' arithmetic, the syntax, and what a result records."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from moebench.cli import main
from moebench.errors import UserError
from moebench.fixtures import Family, ShapeRegistry, ShapeSpec, build_fixture
from moebench.fixtures.models import MODELS, Layout, find_model, parse_layout, rank_geometry, valid_layouts
from moebench.fixtures.shapes import DEFAULT_SEEDS, derived_seed
from moebench.fixtures.summary import fixture_summary
from moebench.run.plan import sweep_shapes
from moebench.record import schema as S

# Each model's MoE fields as its config.json on the Hugging Face hub states them (docs/models.md
# says how each was checked): hidden_size, n_routed_experts / num_experts, num_experts_per_tok,
# moe_intermediate_size, routed_scaling_factor (1.0: none), n_shared_experts, the shared expert's
# own size where the config gives one, and whether it has a gate of its own.
PUBLISHED = {
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3 config.json", 7168, 256, 8, 2048, 2.5, 1, None, False),
    "deepseek-r1": ("deepseek-ai/DeepSeek-R1 config.json", 7168, 256, 8, 2048, 2.5, 1, None, False),
    "kimi-k2": ("moonshotai/Kimi-K2-Instruct config.json", 7168, 384, 8, 2048, 2.827, 1, None, False),
    "glm-4.5": ("zai-org/GLM-4.5 config.json", 5120, 160, 8, 1536, 2.5, 1, None, False),
    "qwen3-235b-a22b": ("Qwen/Qwen3-235B-A22B config.json", 4096, 128, 8, 1536, 1.0, 0, None, False),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B config.json", 2048, 128, 8, 768, 1.0, 0, None, False),
    "qwen3-next-80b-a3b": ("Qwen/Qwen3-Next-80B-A3B-Instruct config.json", 2048, 512, 10, 512, 1.0, 1, 512, True),
}


@pytest.mark.parametrize("key", sorted(PUBLISHED))
def test_the_registry_holds_the_published_values_and_their_citation(key):
    m = MODELS[key]
    assert (m.config, m.hidden_size, m.routed_experts, m.top_k, m.expert_intermediate, m.routed_scale,
            m.shared_experts, m.shared_intermediate, m.shared_gated) == PUBLISHED[key]
    assert m.config.endswith(" config.json") and "/" in m.config.split()[0]


def test_the_registry_is_the_published_set():
    assert set(MODELS) == set(PUBLISHED)


def test_family_a_is_deepseek_v3_under_tp16_and_q_is_qwen3_next_under_tp4():
    reg = ShapeRegistry()
    for family, name in (("A", "deepseek-v3/tp16/M8"), ("Q", "qwen3-next-80b-a3b/tp4/M8")):
        letter, model = reg.resolve(f"{family}8"), reg.resolve(name)
        dims = ("K", "E", "top_k", "N", "routed_scale", "shared_expert")
        assert [getattr(letter.family, d) for d in dims] == [getattr(model.family, d) for d in dims]
        assert letter.seed == DEFAULT_SEEDS[f"{family}8"] and model.seed != letter.seed  # other names, other draws


@pytest.mark.parametrize("key,layout,dims", [
    # (K, E incl. shared, top_k incl. shared, I)
    ("deepseek-v3", "ep8", (7168, 33, 9, 2048)),  # the whole-expert layer: 32 routed + 1 shared
    ("deepseek-v3", "tp8", (7168, 257, 9, 256)),
    ("deepseek-v3", "tp2ep4", (7168, 65, 9, 1024)),
    ("deepseek-v3", "ep64", (7168, 5, 5, 2048)),  # 4 routed experts a rank: top_k capped at 4, + shared
    ("kimi-k2", "ep8", (7168, 49, 9, 2048)),
    ("glm-4.5", "tp4", (5120, 161, 9, 384)),
    ("glm-4.5", "ep8", (5120, 21, 9, 1536)),
    ("qwen3-235b-a22b", "ep16", (4096, 8, 8, 1536)),
    ("qwen3-30b-a3b", "tp1", (2048, 128, 8, 768)),  # the Qwen3-30B-A3B whole layer
    ("qwen3-next-80b-a3b", "ep8", (2048, 64, 10, 512)),  # the gated shared expert is not in the layer
])
def test_layout_arithmetic(key, layout, dims):
    g = rank_geometry(find_model(key), parse_layout(layout))
    assert (g.K, g.E, g.top_k, g.I) == dims
    assert g.shared_expert == MODELS[key].shared_in_layer


@pytest.mark.parametrize("key,layout,needle", [
    ("glm-4.5", "tp8", r"I = 1536/8 = 192 is not a multiple of 128 .* tp 1, 2, 3, 4, 6, 12 slice it"),
    ("qwen3-30b-a3b", "tp4", "192 is not a multiple of 128"),
    ("deepseek-v3", "tp3", "tensor parallelism 3 does not divide the expert intermediate size 2048"),
    ("deepseek-v3", "ep3", "expert parallelism 3 does not divide the 256 routed experts"),
    ("kimi-k2", "tp32", "64 is not a multiple of 128"),
])
def test_layouts_that_cannot_be_deployed_are_refused_in_one_line(key, layout, needle):
    with pytest.raises(UserError, match=needle):
        rank_geometry(find_model(key), parse_layout(layout))


def test_shared_expert_handling():
    assert MODELS["deepseek-v3"].shared_in_layer and MODELS["glm-4.5"].shared_in_layer
    assert not MODELS["qwen3-30b-a3b"].shared_in_layer  # none
    next80 = MODELS["qwen3-next-80b-a3b"]
    assert not next80.shared_in_layer and "gated" in next80.shared_note
    # a shared expert of another size, or several, is a dense MLP of its own, outside the MoE call
    from dataclasses import replace
    assert not replace(next80, shared_gated=False, shared_intermediate=1024).shared_in_layer
    assert not replace(MODELS["deepseek-v3"], shared_experts=2).shared_in_layer
    assert replace(next80, shared_gated=False).shared_in_layer


def test_valid_layouts_are_those_whose_arithmetic_holds():
    assert valid_layouts(MODELS["glm-4.5"]) == ("tp1", "tp2", "tp4", "ep2", "ep4", "ep8", "ep16", "ep32")
    for m in MODELS.values():
        for name in valid_layouts(m):
            rank_geometry(m, parse_layout(name))


@pytest.mark.parametrize("text,canonical", [
    ("deepseek-v3/ep8/M8", "deepseek-v3/ep8/M8"),
    ("DeepSeek-V3/EP8/m8", "deepseek-v3/ep8/M8"),
    ("deepseek-v3/ep8/8", "deepseek-v3/ep8/M8"),
    ("qwen3-30b-a3b/M4096", "qwen3-30b-a3b/tp1/M4096"),
    ("qwen3-30b-a3b/tp1ep1/M1", "qwen3-30b-a3b/tp1/M1"),
    ("deepseek-v3/ep4tp2/M1", None),  # tp before ep: one spelling
    ("deepseek-v3/tp2ep4/M1", "deepseek-v3/tp2ep4/M1"),
])
def test_shape_names(text, canonical):
    reg = ShapeRegistry()
    if canonical is None:
        with pytest.raises(UserError, match="bad layout"):
            reg.resolve(text)
        return
    spec = reg.resolve(text)
    assert spec.name == canonical and spec.M == int(canonical.rsplit("/M", 1)[1])
    assert spec.seed == derived_seed(canonical)  # from the full canonical name


@pytest.mark.parametrize("text,needle", [
    ("llama/tp1/M8", "unknown model 'llama'"),
    ("deepseek-v3/xp8/M8", "bad layout 'xp8'"),
    ("deepseek-v3/tp0/M8", "at least 1"),
    ("deepseek-v3/ep8/M0", "M must be between 1 and"),
    ("deepseek-v3/ep8/Mx", "M must be between 1 and .* got 'x'"),
    ("deepseek-v3/ep8/M8/1", "expected MODEL/LAYOUT/M"),
    ("deepseek-v3/tp1/M8", r"needs about 22\.6 GB of host memory"),  # the whole layer: 257 experts of 2048
])
def test_bad_model_shapes_are_one_line_user_errors(text, needle):
    with pytest.raises(UserError, match=needle):
        ShapeRegistry().resolve(text)


def test_letter_shapes_are_unchanged():
    reg = ShapeRegistry()
    for name, seed in DEFAULT_SEEDS.items():
        assert reg.resolve(name).seed == seed and reg.resolve(name.lower()).name == name
    assert reg.resolve("A1").seed == derived_seed("A1")
    assert reg.resolve("A8").family.model == ""


def test_registry_fixtures_are_deterministic_and_recorded():
    reg = ShapeRegistry()
    a = build_fixture(reg.resolve("qwen3-30b-a3b/ep64/M3"))
    b = build_fixture(reg.resolve("Qwen3-30B-A3B/ep64/3"))
    assert a.fingerprint == b.fingerprint and a.spec.name == "qwen3-30b-a3b/ep64/M3"
    assert tuple(a.w1.shape) == (2, 1536, 2048) and tuple(a.w2.shape) == (2, 2048, 768)
    summary = fixture_summary(a)
    assert (summary["family"], summary["model"], summary["layout"], summary["config"]) == (
        "qwen3-30b-a3b/ep64", "Qwen3-30B-A3B", "ep64", "Qwen/Qwen3-30B-A3B config.json")
    from moebench.run.prepare import _fixture_info
    info = _fixture_info(summary)
    assert (info.model, info.layout, info.config) == ("Qwen3-30B-A3B", "ep64", "Qwen/Qwen3-30B-A3B config.json")
    assert S.from_plain(S.FixtureInfo, S.to_plain(info)) == info
    old = {k: v for k, v in S.to_plain(info).items() if k not in ("model", "layout", "config")}
    assert S.from_plain(S.FixtureInfo, old).model == ""  # files written before read as letter shapes
    # the fresh process of the determinism checks rebuilds the same fixture from the family's fields
    spec = ShapeSpec(family=Family(**asdict(a.spec.family)), name=a.spec.name, M=a.spec.M, seed=a.spec.seed)
    assert build_fixture(spec).fingerprint == a.fingerprint


def test_sweep_names_a_registry_family():
    assert sweep_shapes("deepseek-v3/ep8", "1,8") == ("deepseek-v3/ep8/M1", "deepseek-v3/ep8/M8")
    assert sweep_shapes("a", "2") == ("A2",)
    with pytest.raises(UserError, match="MODEL/LAYOUT"):
        sweep_shapes("AB", "1")
    reg = ShapeRegistry()
    assert [reg.resolve(n).family.letter for n in sweep_shapes("deepseek-v3/ep8", "1,8")] == ["deepseek-v3/ep8"] * 2


def _cli(capsys, *argv):
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


def test_fixtures_models_lists_the_registry(capsys):
    code, out, _ = _cli(capsys, "fixtures", "--models", "--json")
    assert code == 0
    rows = {r["model"]: r for r in json.loads(out)}
    assert set(rows) == set(PUBLISHED)
    assert rows["glm-4.5"]["config"] == "zai-org/GLM-4.5 config.json" and "tp4" in rows["glm-4.5"]["layouts"]
    code, out, _ = _cli(capsys, "fixtures", "--models")
    assert code == 0 and "deepseek-v3" in out
    code, _, err = _cli(capsys, "fixtures", "--models", "--shape", "A8")
    assert code == 2 and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv", [
    ("fixtures", "--shape", "llama/tp1/M8"),
    ("fixtures", "--shape", "glm-4.5/tp8/M8"),
    ("run", "--shape", "deepseek-v3/ep7/M8", "--arms", "triton"),
    ("verify", "--shape", "qwen3-30b-a3b/tp4/M1", "--arms", "triton"),
])
def test_bad_model_shapes_exit_2_in_one_line(capsys, argv):
    code, _, err = _cli(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_layout_names():
    assert [Layout(1, 1).name, Layout(8, 1).name, Layout(1, 8).name, Layout(2, 4).name] == ["tp1", "tp8", "ep8", "tp2ep4"]


def test_the_docs_tables_are_the_registry():
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    rows = [[c.strip().strip("`") for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("| `")]
    models = {r[0]: r for r in rows if r[0] in MODELS}
    assert set(models) == set(MODELS)
    for key, r in models.items():
        m = MODELS[key]
        assert [int(r[1]), int(r[2]), int(r[3]), int(r[4]), float(r[5])] == [
            m.hidden_size, m.routed_experts, m.top_k, m.expert_intermediate, m.routed_scale]
        assert r[7] == m.config
    ranks = [r for r in rows if "/" in r[0]]
    assert len(ranks) == 2 * len(MODELS)
    for r in ranks:
        key, layout = r[0].split("/")
        g = rank_geometry(MODELS[key], parse_layout(layout))
        assert [int(x) for x in r[1:6]] == [g.K, g.E, g.top_k, g.I, 2 * g.I]
        assert r[6] == ("yes" if g.shared_expert else "no")


def test_a_model_shape_names_one_file_where_a_shape_names_a_file():
    from moebench.run.distributed import cell_filename
    assert cell_filename("deepseek-v3/ep8/M8") == "deepseek-v3_ep8_M8.json" and cell_filename("A8") == "A8.json"


def test_a_shapes_file_letter_can_name_a_model_under_a_layout(tmp_path):
    path = tmp_path / "shapes.toml"
    path.write_text('[families.D]\nmodel = "DeepSeek-V3"\nlayout = "ep8"\n')
    spec = ShapeRegistry().with_shapes_file(path).resolve("D8")
    assert spec.name == "D8" and spec.seed == derived_seed("D8")
    assert (spec.K, spec.E, spec.top_k, spec.I, spec.family.shared_expert) == (7168, 33, 9, 2048, True)
    assert (spec.family.model, spec.family.layout, spec.family.config) == (
        "DeepSeek-V3", "ep8", "deepseek-ai/DeepSeek-V3 config.json")
    for body, needle in (('model = "deepseek-v3"\nK = 7168\n', "takes only"),
                         ('model = "glm-4.5"\nlayout = "tp8"\n', "192 is not a multiple of 128"),
                         ('model = "nope"\n', "unknown model"),
                         ('model = 3\n', "strings")):
        path.write_text("[families.D]\n" + body)
        with pytest.raises(UserError, match=needle):
            ShapeRegistry().with_shapes_file(path)
    path.write_text('[families.A]\nmodel = "deepseek-v3"\nlayout = "ep8"\n')
    with pytest.raises(UserError, match="override = true"):
        ShapeRegistry().with_shapes_file(path)
