"""`moebench fixtures`: build fixtures and describe them."""

from __future__ import annotations

import json

import click
from rich.table import Table

from moebench.cli.common import balancedness_option, max_fixture_gb_option, registry, shape_option, shapes_file_option
from moebench.views.tables import make_console

DEFAULT_SHAPES = ("A8", "A128", "Q8", "Q128")


@click.command()
@shape_option
@shapes_file_option
@balancedness_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@click.option("--models", "list_models", is_flag=True,
              help="List the public models shape names can name (MODEL/LAYOUT/M), with their configs.")
@max_fixture_gb_option
def fixtures(shapes, shapes_file, balancedness, as_json, list_models, max_fixture_gb):
    """Build fixtures and print their dims, routing, floors and fingerprint."""
    if list_models:
        return _print_models(as_json, bool(shapes))
    from moebench.fixtures.summary import describe_fixtures  # torch: not for --help
    specs = registry(shapes_file, max_fixture_gb).resolve_many(list(shapes) or list(DEFAULT_SHAPES), balancedness=balancedness)
    summaries = describe_fixtures(specs)
    if as_json:
        click.echo(json.dumps(summaries, indent=2))
        return
    console = make_console()
    for s in summaries:
        console.print(_fixture_table(s))


def _print_models(as_json: bool, shapes_given: bool) -> None:
    from moebench.errors import UserError
    from moebench.fixtures.models import model_rows
    if shapes_given:
        raise UserError("--models lists the registry; give it no --shape")
    rows = model_rows()
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    t = Table(title="public models: shape names MODEL/LAYOUT/M, e.g. deepseek-v3/ep8/M8", title_justify="left")
    for col in ("model", "K", "routed experts", "top_k", "I", "routed scale", "shared expert", "layouts", "config"):
        t.add_column(col, justify="right" if col in ("K", "routed experts", "top_k", "I", "routed scale") else "left")
    for r in rows:
        t.add_row(r["model"], str(r["K"]), str(r["routed_experts"]), str(r["top_k"]), str(r["I"]),
                  f"{r['routed_scale']:g}", r["shared_expert"], " ".join(r["layouts"]), r["config"])
    make_console().print(t)


def _fixture_table(s: dict) -> Table:
    t = Table(title=f"{s['name']} — {s['description']}", show_header=False, title_justify="left")
    t.add_column(style="bold")
    t.add_column()
    tpe = s["tokens_per_expert"]
    fl = s["floors"]
    rows = [
        ("dims", f"M={s['M']} K={s['K']} E={s['E']} top_k={s['top_k']} N={s['N']} (I={s['I']})"
                 + (", shared expert" if s["shared_expert"] else "")),
        *([("model", f"{s['model']} {s['layout']} ({s['config']})")] if s.get("model") else []),
        ("seed", str(s["seed"])),
        ("balancedness", f"{s['balancedness']:g}"),
        ("experts routed", str(s["experts_routed"])),
        ("tokens per expert", f"min {tpe['min']}  median {tpe['median']:g}  max {tpe['max']}"),
        ("HBM bytes", f"{fl['hbm_bytes'] / 1e6:,.2f} MB (weights {fl['weight_bytes'] / 1e6:,.2f} MB)"),
        ("FLOPs", f"{fl['flops'] / 1e9:,.3f} GFLOP"),
        ("fingerprint", s["fingerprint"]),
        ("built in", f"{s['build_seconds']:.2f} s"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t
