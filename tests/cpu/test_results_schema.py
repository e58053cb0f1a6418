"""RunResult files: round trip, version check, atomic save; the tables read only fields."""

import json

import pytest
from rich.console import Console
from timing_fakes import make_result

from moebench.errors import UserError
from moebench.record import store
from moebench.analysis import load as loader
from moebench.record.schema import SCHEMA_VERSION
from moebench.views.tables import audit_line, print_tables, ratio_table, summary_table


@pytest.mark.parametrize("timer", ["cupti", "events"])
def test_round_trip_is_exact(tmp_path, timer):
    r = make_result(timer)
    path = store.save(r, tmp_path / "r.json")
    back = loader.load(path)
    assert back == r
    assert back.samples[0].value_ns == r.samples[0].value_ns
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temp file left


def test_gz_paths_are_compressed_and_load_back(tmp_path):
    r = make_result()
    path = store.save(r, tmp_path / "r.json.gz")
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b" and len(raw) < len(store.dumps(r).encode()) / 3
    assert loader.load(path) == r
    renamed = path.rename(tmp_path / "r.json")  # compressed content under a plain name loads too
    assert loader.load(renamed) == r
    (tmp_path / "bad.json.gz").write_bytes(raw[: len(raw) // 2])  # a truncated download
    with pytest.raises(UserError, match="cannot read"):
        loader.load(tmp_path / "bad.json.gz")


def test_version_and_format_are_checked(tmp_path):
    data = json.loads(store.dumps(make_result()))
    assert data["schema_version"] == SCHEMA_VERSION and data["format"] == "moebench.RunResult"
    data["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(UserError, match="schema_version"):
        loader.loads(json.dumps(data))
    data["schema_version"] = SCHEMA_VERSION
    del data["audit"]
    with pytest.raises(UserError, match="missing field 'audit'"):
        loader.loads(json.dumps(data))
    with pytest.raises(UserError, match="not a moebench RunResult"):
        loader.loads("{}")


def test_every_sample_is_kept_with_its_kernels():
    r = make_result()
    data = json.loads(store.dumps(r))
    assert len(data["samples"]) == len(r.samples)
    assert data["samples"][0]["kernels"][0].keys() == {"name", "start_ns", "end_ns"}


def test_tables_format_fields(tmp_path):
    r = make_result()
    console = Console(record=True, width=160)
    print_tables(r, console)
    text = console.export_text()
    assert "100.00" in text and "80.00" in text and "1.250" in text and "2/2" in text
    assert "audit passed: 8/8 samples audited" in text and "CUPTI" in text
    assert summary_table(r).row_count == 2 and ratio_table(r).row_count == 1


def test_tables_label_events_and_findings():
    r = make_result("events", failed=True)
    console = Console(record=True, width=160)
    print_tables(r, console)
    text = console.export_text()
    assert "CUDA EVENTS" in text and "audit FAILED: 7/8" in text
    assert "A8 triton round 1 sample 0: 2 kernels, expected 1" in text
    assert audit_line(r).startswith("audit FAILED")


def test_package_sha256_names_the_source(tmp_path):
    from moebench.record.provenance import package_sha256
    pkg = tmp_path / "pkg"
    (pkg / "kernels").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "kernels" / "k.cu").write_text("// kernel\n")
    (pkg / "notes.txt").write_text("not source")
    first = package_sha256(pkg)
    (pkg / "notes.txt").write_text("still not source")
    assert package_sha256(pkg) == first
    (pkg / "kernels" / "k.cu").write_text("// kernel, changed\n")
    assert package_sha256(pkg) != first
    assert len(first) == 64


def test_atomic_write_replaces_whole_and_leaves_no_temporaries(tmp_path):
    import os

    from moebench.record.atomic import atomic_write
    target = tmp_path / "r.json"
    atomic_write(target, b"old")
    atomic_write(target, b"new contents")
    assert target.read_bytes() == b"new contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_create_whole_never_replaces_and_never_shows_an_empty_file(tmp_path):
    from moebench.record.atomic import create_whole
    target = tmp_path / "r.json"
    assert create_whole(target, b"first") is True
    assert create_whole(target, b"second") is False
    assert target.read_bytes() == b"first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def test_save_new_takes_the_next_free_name_and_writes_it_whole(tmp_path):
    result = make_result()
    first = store.save_new(result, tmp_path / "r.json")
    second = store.save_new(result, tmp_path / "r.json")
    gz = store.save_new(result, tmp_path / "r.json.gz")
    assert (first.name, second.name, gz.name) == ("r.json", "r_2.json", "r.json.gz")
    assert loader.load(second) == loader.load(first) == loader.load(gz) == result
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.json.gz", "r_2.json"]
