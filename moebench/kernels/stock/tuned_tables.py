"""Tuned config tables on disk: the engines' file names and layout, written by `moebench tune`,
read by the `triton-tuned` arm.

A tune writes into its folder OUT exactly what SGLang reads from its own package:

    OUT/configs/triton_3_6_0/E=257,N=128,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128].json
    OUT/configs/triton_3_6_0/E=257,N=128,device_name=...,block_shape=[128, 128]_down.json
    OUT/configs/triton_3_6_0/E=257,N=128,device_name=...,block_shape=[128, 128].provenance.json
    OUT/configs/triton_3_6_0/E=257,N=128,device_name=...,block_shape=[128, 128].tune-state.json

so `SGLANG_MOE_CONFIG_DIR=OUT` makes the engine load them (its get_moe_configs looks in
`$SGLANG_MOE_CONFIG_DIR/configs/triton_<version>/<name>`), and vLLM's `VLLM_TUNED_CONFIG_FOLDER`
takes the version folder itself. N in the name is the intermediate size I (the down GEMM's K),
as the engines key their tables. The tables are `{"M": {BLOCK_SIZE_M: ..., ...}}` in ascending
M, indented by 4, with a final newline, as the engines' tuners write them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from moebench.errors import UserError
from moebench.kernels.stock.engine_config import ConfigTable, TritonMoeConfig, base_version, load_config_file
from moebench.record.atomic import atomic_write

DTYPE = "fp8_w8a8"
BLOCK_SHAPE = (128, 128)


def device_file_name(device_name: str) -> str:
    """torch.cuda.get_device_name() as the engines put it in a file name: spaces as underscores."""
    return device_name.replace(" ", "_")


def table_stem(E: int, N: int, device_name: str) -> str:
    """`E=257,N=128,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8,block_shape=[128, 128]`."""
    return (f"E={E},N={N},device_name={device_file_name(device_name)},dtype={DTYPE},"
            f"block_shape=[{BLOCK_SHAPE[0]}, {BLOCK_SHAPE[1]}]")


def table_name(E: int, N: int, device_name: str, down: bool = False) -> str:
    return table_stem(E, N, device_name) + ("_down" if down else "") + ".json"


def version_folder(triton_version: str) -> str:
    """`3.6.0` -> `triton_3_6_0`: SGLang's folder for the running Triton, from its full version
    string as SGLang forms it (a local build's `3.6.0+git12` gets `triton_3_6_0+git12`)."""
    return "triton_" + triton_version.replace(".", "_")


def tables_folder(out_dir: str | Path, triton_version: str) -> Path:
    return Path(out_dir) / "configs" / version_folder(triton_version)


def table_json(entries: dict[int, TritonMoeConfig]) -> bytes:
    """A table's bytes: ascending M, each entry as the engines write it."""
    data = {str(M): entries[M].as_dict() for M in sorted(entries)}
    return (json.dumps(data, indent=4) + "\n").encode()


def write_table(path: Path, entries: dict[int, TritonMoeConfig]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, table_json(entries))


@dataclass(frozen=True)
class TunedTables:
    """A tuned up table, its down table (None: the up table serves both, as in the engines),
    and the provenance written beside them (None when absent)."""

    up: ConfigTable
    down: ConfigTable | None
    provenance: dict | None

    def select(self, M: int) -> tuple[dict, TritonMoeConfig, TritonMoeConfig]:
        """The engines' lookup at M: each table's nearest key, the down entry's BLOCK_SIZE_M
        forced to the up entry's. Returns (identity, up, down)."""
        up_key, up = self.up.select(M)
        identity = {"config_source": "tuned", "tuned_file": self.up.source, "tuned_sha256": self.up.sha256,
                    "up_key": up_key}
        if self.down is None:
            down, identity["down_note"] = up, "no down table: the up table's entry"
            identity["down_key"] = up_key
        else:
            down_key, down = self.down.select(M)
            identity.update(tuned_down_file=self.down.source, tuned_down_sha256=self.down.sha256, down_key=down_key)
        if down.BLOCK_SIZE_M != up.BLOCK_SIZE_M:
            identity["down_block_m_forced"] = f"{down.BLOCK_SIZE_M} -> {up.BLOCK_SIZE_M}"
            down = replace(down, BLOCK_SIZE_M=up.BLOCK_SIZE_M)
        if self.provenance:
            identity["tuned_provenance"] = {k: self.provenance.get(k) for k in
                                            ("gpu", "triton", "moebench", "timing", "finished_at") if k in self.provenance}
        return identity, up, down


def candidate_paths(tuned: str | Path, E: int, N: int, device_name: str, triton_version: str) -> list[Path]:
    """Where the up table for this geometry and GPU may be: a file named directly, or in a tune's
    folder (its configs/triton_<version>/), or in a folder of tables (vLLM's layout)."""
    root = Path(tuned)
    if root.is_file():
        return [root]
    name = table_name(E, N, device_name)
    return [tables_folder(root, triton_version) / name, root / version_folder(triton_version) / name, root / name]


def load_tuned(tuned: str | Path, E: int, N: int, device_name: str, triton_version: str) -> TunedTables:
    """The tuned tables for this geometry on this GPU and Triton version; a missing table is one line."""
    paths = candidate_paths(tuned, E, N, device_name, triton_version)
    if not Path(tuned).exists():
        raise UserError(f"--tuned {str(tuned)!r}: no such file or folder")
    want = table_name(E, N, device_name)
    if Path(tuned).is_file() and Path(tuned).name.startswith("E=") and Path(tuned).name != want:
        raise UserError(f"--tuned {str(tuned)!r} is another geometry's or GPU's table: this shape here needs {want!r}")
    up_path = next((p for p in paths if p.is_file()), None)
    if up_path is None:
        raise UserError(f"--tuned {str(tuned)!r}: no table {paths[0].name!r} for E={E}, I={N} on this GPU under "
                        f"Triton {base_version(triton_version)} (run `moebench tune` for it here)")
    up = load_config_file(up_path)
    down_path = up_path.with_name(up_path.name[:-len(".json")] + "_down.json")
    down = load_config_file(down_path) if down_path.is_file() else None
    prov_path = up_path.with_name(up_path.name[:-len(".json")] + ".provenance.json")
    provenance = None
    if prov_path.is_file():
        try:
            provenance = json.loads(prov_path.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            raise UserError(f"{prov_path}: the provenance beside the table is not readable JSON") from None
        if not isinstance(provenance, dict):
            raise UserError(f"{prov_path}: the provenance beside the table is not a JSON object")
    return TunedTables(up, down, provenance)
