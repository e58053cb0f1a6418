"""The compile cache under concurrent processes and damaged entries: one build per key, no
torn entry ever read, a corrupt entry rebuilt and replaced, an unwritable cache one line."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from moebench.errors import UserError
from moebench.kernels.cuda import cache as cuda_cache
from moebench.kernels.cuda.cache import CudaBuild

ROOT = Path(__file__).resolve().parents[2]


def _entry(key: str, payload: bytes) -> cuda_cache.Entry:
    """An entry for `key` whose record vouches for `payload` (no NVRTC needed)."""
    digest = hashlib.sha256(payload).hexdigest()
    record = CudaBuild(name="fake.cu", build_hash=key, source_sha256=digest, binary_sha256=digest, flags=(),
                       defines=(), arch="sm_90a", nvrtc_version="0.0", headers=())
    return record, payload, {}, ""


def _workers(script: str, args: list[list[str]], tmp_path: Path, timeout: float = 240) -> list[dict]:
    """Start one process per argument list, let them go at once, return what each printed."""
    go = tmp_path / "go"
    code = textwrap.dedent(script)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(go), *a], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for a in args]
    time.sleep(0.5)
    go.write_text("")
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


WAIT = """
import json, os, sys, time
go = sys.argv[1]
while not os.path.exists(go):
    time.sleep(0.01)
"""


def test_four_processes_build_each_key_once_and_read_only_whole_entries(tmp_path):
    script = WAIT + """
import hashlib
from pathlib import Path
from moebench.kernels.cuda import cache as cuda_cache
root, key, log = Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
def build():
    with open(log, "a") as f:
        f.write(key + "\\n")
    time.sleep(0.3)  # a slow compile: the others must wait, not build too
    payload = (key * 5000).encode()
    digest = hashlib.sha256(payload).hexdigest()
    return (cuda_cache.CudaBuild(name="fake.cu", build_hash=key, source_sha256=digest, binary_sha256=digest,
                                 flags=(), defines=(), arch="sm_90a", nvrtc_version="0.0", headers=()),
            payload, {}, "")
(record, cubin, mapping, _log), found = cuda_cache.get_or_build(root, key, build)
print(json.dumps({"key": key, "found": found, "ok": cubin == (key * 5000).encode() and record.build_hash == key}))
"""
    root, log = tmp_path / "cache", tmp_path / "builds.log"
    keys = ["same", "same", "same", "other"]
    outs = _workers(script, [[str(root), k, str(log)] for k in keys], tmp_path)
    assert all(o["ok"] for o in outs)
    assert sorted(log.read_text().split()) == ["other", "same"]  # one build per key
    assert sorted(o["found"] for o in outs if o["key"] == "same") == [False, True, True]
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]


TINY = r'''extern "C" __global__ void tiny(float* out) { out[threadIdx.x] = SCALE * threadIdx.x; }'''


def test_four_processes_compiling_the_same_and_different_sources_agree(tmp_path):
    pytest.importorskip("cuda.core")
    script = WAIT + f"""
os.environ["MOEBENCH_CACHE"] = sys.argv[2]
from moebench.kernels.cuda.nvrtc import compile_source
m = compile_source({TINY!r}, defines={{"SCALE": sys.argv[3]}})
print(json.dumps({{"scale": sys.argv[3], "hit": m.cache_hit, "key": m.build.build_hash,
                  "binary": m.build.binary_sha256, "regs": m.build.resources["tiny"].registers}}))
"""
    scales = ["2.0f", "2.0f", "3.0f", "4.0f"]
    outs = _workers(script, [[str(tmp_path / "cache"), s] for s in scales], tmp_path)
    same = [o for o in outs if o["scale"] == "2.0f"]
    assert sorted(o["hit"] for o in same) == [False, True] and same[0]["binary"] == same[1]["binary"]
    assert len({o["key"] for o in outs}) == 3 and all(o["regs"] > 0 for o in outs)
    cuda = tmp_path / "cache" / "cuda"
    assert len(list(cuda.glob("*.json"))) == 3 and not list(cuda.glob("*.tmp"))


def _damage(kind: str, root: Path, key: str) -> None:
    cubin, meta = root / f"{key}.cubin", root / f"{key}.json"
    if kind == "truncated cubin":
        cubin.write_bytes(cubin.read_bytes()[:10])
    elif kind == "garbage cubin":
        cubin.write_bytes(bytes(255 - b for b in cubin.read_bytes()))
    elif kind == "empty cubin":
        cubin.write_bytes(b"")
    elif kind == "no cubin":
        cubin.unlink()
    elif kind == "truncated metadata":
        meta.write_bytes(meta.read_bytes()[: len(meta.read_bytes()) // 2])
    elif kind == "binary metadata":
        meta.write_bytes(b"\xff\xfe\x00garbage")
    elif kind == "foreign format":
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "format": "other"}))
    elif kind == "build not a record":
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "build": ["x"]}))
    elif kind == "build missing fields":
        data = json.loads(meta.read_text())
        data["build"] = {"binary_sha256": data["build"]["binary_sha256"]}
        meta.write_text(json.dumps(data))
    elif kind == "another key's entry":
        data = json.loads(meta.read_text())
        data["build"]["build_hash"] = "0" * 64
        meta.write_text(json.dumps(data))
    elif kind == "bad symbol mapping":
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "symbol_mapping": [1, 2]}))


DAMAGE = ["truncated cubin", "garbage cubin", "empty cubin", "no cubin", "truncated metadata", "binary metadata",
          "foreign format", "build not a record", "build missing fields", "another key's entry",
          "bad symbol mapping"]


@pytest.mark.parametrize("kind", DAMAGE)
def test_a_corrupt_entry_is_rebuilt_and_replaced(tmp_path, monkeypatch, kind):
    pytest.importorskip("cuda.core")
    from moebench.kernels.cuda import nvrtc as cuda_build
    monkeypatch.setenv("MOEBENCH_CACHE", str(tmp_path))
    cuda_build.clear_memo()
    try:
        good = cuda_build.compile_source(TINY, defines={"SCALE": "2.0f"})
        _damage(kind, tmp_path / "cuda", good.build.build_hash)
        cuda_build.clear_memo()
        rebuilt = cuda_build.compile_source(TINY, defines={"SCALE": "2.0f"})
        assert not rebuilt.cache_hit and rebuilt.cubin == good.cubin and rebuilt.build == good.build
        cuda_build.clear_memo()
        again = cuda_build.compile_source(TINY, defines={"SCALE": "2.0f"})
        assert again.cache_hit and again.build == good.build  # the entry on disk was replaced whole
    finally:
        cuda_build.clear_memo()


def test_a_reader_never_takes_a_cubin_its_metadata_does_not_vouch_for(tmp_path):
    cuda_cache.publish(tmp_path, "k", *_entry("k", b"old cubin"))
    (tmp_path / "k.cubin").write_bytes(b"new cubin")  # a publish caught between its two renames
    assert cuda_cache.read_entry(tmp_path, "k") is None
    cuda_cache.publish(tmp_path, "k", *_entry("k", b"new cubin"))
    assert cuda_cache.read_entry(tmp_path, "k")[1] == b"new cubin"
    assert cuda_cache.read_entry(tmp_path, "other") is None


def test_an_unwritable_cache_is_one_line_saying_what_to_set(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(UserError) as err:
        cuda_cache.get_or_build(blocked / "cuda", "k", lambda: _entry("k", b"x"))
    text = str(err.value)
    assert "cannot be written" in text and "MOEBENCH_CACHE" in text and "\n" not in text
