"""`moebench fixtures` output and the one-line errors for bad input."""

import json

import pytest

from moebench.cli import main


def run_cli(capsys, *argv):
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def test_fixtures_json(capsys):
    code, out, _ = run_cli(capsys, "fixtures", "--shape", "T8", "--shape", "T3", "--json")
    assert code == 0
    t8, t3 = json.loads(out)
    assert (t8["name"], t8["M"], t8["K"], t8["E"], t8["top_k"], t8["N"]) == ("T8", 8, 256, 8, 2, 256)
    assert t3["M"] == 3 and len(t8["fingerprint"]) == 64
    assert t8["floors"]["hbm_bytes"] > t8["floors"]["weight_bytes"] > 0
    assert t8["tokens_per_expert"]["max"] >= t8["tokens_per_expert"]["median"] >= t8["tokens_per_expert"]["min"] >= 1


def test_fixtures_table(capsys):
    code, out, _ = run_cli(capsys, "fixtures", "--shape", "T8")
    assert code == 0 and "fingerprint" in out and "T8" in out


BAD_FAMILIES = {
    "k": "[families.X]\nK = 100\nE = 8\ntop_k = 2\nN = 256\n",
    "topk": "[families.X]\nK = 256\nE = 4\ntop_k = 5\nN = 256\n",
    "missing": "[families.X]\nK = 256\nE = 4\n",
    "syntax": "[families.X\nK = 256\n",
    "type": "[families.X]\nK = \"256\"\nE = 4\ntop_k = 2\nN = 256\n",
    "empty": "title = 'nothing'\n",
}


@pytest.mark.parametrize("argv, needle", [
    (["fixtures", "--shape", "X8"], "unknown shape family"),
    (["fixtures", "--shape", "A0"], "m must be"),
    (["fixtures", "--shape", "A-3"], "m must be"),
    (["fixtures", "--shape", "8A"], "bad shape name"),
    (["fixtures", "--shape", "T8", "--balancedness", "2"], "balancedness"),
    (["fixtures", "--nope"], "no such option"),
])
def test_bad_input_one_line_exit_2(capsys, argv, needle):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and needle in err.lower() and err.startswith("moebench: error:")


@pytest.mark.parametrize("kind, needle", [
    ("k", "not a multiple of 128"), ("topk", "larger than e"), ("missing", "missing"),
    ("syntax", "not valid toml"), ("type", "wrong type"), ("empty", "no [families"),
])
def test_bad_shapes_file_one_line_exit_2(capsys, tmp_path, kind, needle):
    path = tmp_path / "shapes.toml"
    path.write_text(BAD_FAMILIES[kind])
    code, _, err = run_cli(capsys, "fixtures", "--shapes-file", str(path), "--shape", "X8")
    assert code == 2 and err.count("\n") == 1 and needle in err.lower()


def test_missing_shapes_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "fixtures", "--shapes-file", str(tmp_path / "nope.toml"))
    assert code == 2 and "does not exist" in err


def test_shapes_file_family(capsys, tmp_path):
    path = tmp_path / "shapes.toml"
    path.write_text('[families.X]\ndescription = "mine"\nK = 256\nE = 6\ntop_k = 3\nN = 512\nshared_expert = true\n')
    code, out, _ = run_cli(capsys, "fixtures", "--shapes-file", str(path), "--shape", "X4", "--json")
    (x4,) = json.loads(out)
    assert code == 0 and (x4["K"], x4["E"], x4["top_k"], x4["N"], x4["shared_expert"]) == (256, 6, 3, 512, True)
