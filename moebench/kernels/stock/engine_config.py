"""Which Triton configs the serving engines launch their fused-MoE GEMMs with, on this GPU.

The stock arm is only worth what it is faithful to, so this module states the engines' rules
as data and functions (read from SGLang 0.5.23's `fused_moe_triton_config.py`, whose tables
ship in `engine_tables/`; vLLM's lookup is the same up to the down table):

* A table is looked up by the device name (spaces as underscores), the expert count E and the
  intermediate size N (the down projection's input width, I = N_gate_up / 2), for FP8 W8A8 with
  128x128 blocks, in the folder of the running Triton version; when that version has none, the
  other versions' folders are tried newest first. No table: the engine's default config.
* The entry for a batch of M tokens is the key nearest to M, the first in file order on a tie.
* The down GEMM has a table of its own (`..._down.json`). When no version has one, the up table
  is used for it too; with no table at all, GEMM2 runs the up GEMM's config. The down entry's
  BLOCK_SIZE_M is forced to the up entry's: both GEMMs walk one route plan.
* `USE_TMA` in an entry turns on tensor descriptors for that GEMM's weights (the down GEMM's
  activations too, in the sorted layout) where Triton has them.
* Swap-AB: FP8 W8A8 on SM90 with BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64, decided per GEMM.
* PDL (programmatic dependent launch) for both GEMMs on compute capability 9 and newer; the
  kernel releases its dependents at entry when its A operand has at most 512 rows.

Route-plan sizing and the intermediate buffers follow `moe_align_block_size` and the engine's
fused path: see `moebench.fixtures.routing.engine_plan_capacity` and `sorted_rows` below.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

from moebench.errors import UserError

QUANT_GROUP = 128
TABLES_DIR = Path(__file__).with_name("engine_tables")
DEFAULT_TABLES = "sglang-0.5.23.json"
PDL_EARLY_MAX_ROWS = 512  # GDC_EARLY: A.shape[0] <= 512
SWAP_AB_RULE = "FP8 W8A8 on SM90, BLOCK_SIZE_M < 64 and BLOCK_SIZE_N >= 64 (per GEMM)"


@dataclass(frozen=True)
class TritonMoeConfig:
    """One entry of an engine config table: tile shape, launch shape, and the TMA switch."""

    BLOCK_SIZE_M: int = 64
    BLOCK_SIZE_N: int = 128
    BLOCK_SIZE_K: int = 128
    GROUP_SIZE_M: int = 32
    num_warps: int = 4
    num_stages: int = 3
    USE_TMA: bool = False

    def validate(self, where: str) -> None:
        def pow2(v: int) -> bool:
            return v > 0 and v & (v - 1) == 0
        for name in ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"):
            v = getattr(self, name)
            if not pow2(v) or v < 16:
                raise UserError(f"{where}: {name}={v} must be a power of two >= 16 (tl.dot needs 16)")
        if QUANT_GROUP % self.BLOCK_SIZE_K:
            raise UserError(f"{where}: BLOCK_SIZE_K={self.BLOCK_SIZE_K} must divide the scale group {QUANT_GROUP}")
        if self.GROUP_SIZE_M < 1:
            raise UserError(f"{where}: GROUP_SIZE_M must be >= 1")
        if not pow2(self.num_warps) or self.num_warps > 16:
            raise UserError(f"{where}: num_warps={self.num_warps} must be a power of two <= 16")
        if self.num_stages < 1:
            raise UserError(f"{where}: num_stages must be >= 1")

    def as_dict(self) -> dict:
        """The entry as the engines write it (USE_TMA only when on)."""
        d = asdict(self)
        if not d["USE_TMA"]:
            del d["USE_TMA"]
        return d


# The engines' default for FP8 block-scale weights (get_default_config, block_shape [128, 128]).
DEFAULT_CONFIG = TritonMoeConfig()

_CONFIG_KEYS = set(TritonMoeConfig.__dataclass_fields__)
_REQUIRED_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")


def parse_entry(entry, where: str) -> TritonMoeConfig:
    """One table entry; every mistake is a UserError naming where it is."""
    if not isinstance(entry, dict):
        raise UserError(f"{where}: expected an object")
    extra = dict(entry)
    if extra.pop("SPLIT_K", 1) != 1:  # vLLM's tuner writes SPLIT_K=1; nothing else is supported
        raise UserError(f"{where}: SPLIT_K other than 1 is not supported")
    unknown = sorted(set(extra) - _CONFIG_KEYS)
    if unknown:
        raise UserError(f"{where}: unknown key(s) {', '.join(unknown)}")
    missing = [k for k in _REQUIRED_KEYS if k not in extra]
    if missing:
        raise UserError(f"{where}: missing {', '.join(missing)}")
    use_tma = extra.pop("USE_TMA", False)
    if not isinstance(use_tma, bool):
        raise UserError(f"{where}: USE_TMA must be true or false")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in extra.values()):
        raise UserError(f"{where}: values must be integers")
    config = TritonMoeConfig(**extra, USE_TMA=use_tma)
    config.validate(where)
    return config


@dataclass(frozen=True)
class ConfigTable:
    """Per-M entries, keyed by the token count M, in file order."""

    source: str  # where the entries come from: an engine's file, or a user's path
    entries: tuple[tuple[int, TritonMoeConfig], ...]
    sha256: str = ""

    def select(self, M: int) -> tuple[int, TritonMoeConfig]:
        """The entry whose key is nearest to M; the first in file order on a tie."""
        return min(self.entries, key=lambda kv: abs(kv[0] - M))


def parse_table(data, where: str, source: str, sha256: str = "") -> ConfigTable:
    if not isinstance(data, dict) or not data:
        raise UserError(f'{where}: expected an object of per-M configs, like {{"1": {{"BLOCK_SIZE_M": 16, ...}}}}')
    entries = []
    for key, entry in data.items():
        here = f"{where}, entry {key!r}"
        if not (isinstance(key, str) and key.strip().isdigit() and int(key) > 0):
            raise UserError(f"{here}: a key is a positive token count M")
        entries.append((int(key), parse_entry(entry, here)))
    return ConfigTable(source, tuple(entries), sha256)


def load_config_file(path: str | Path) -> ConfigTable:
    """A user's per-M configs in the engines' JSON format (`--triton-config FILE`)."""
    where = f"Triton config {str(path)!r}"
    try:
        raw_bytes = Path(path).read_bytes()
    except OSError as err:
        raise UserError(f"cannot read {where}: {err.strerror or err}") from None
    try:
        data = json.loads(raw_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{where} is not valid JSON: {err}") from None
    return parse_table(data, where, str(path), hashlib.sha256(raw_bytes).hexdigest())


# ----------------------------------------------------------------------------------------------
# The engine's shipped tables, and the lookup across Triton versions.
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableKey:
    device_name: str  # torch.cuda.get_device_name() with spaces as underscores
    E: int
    N: int  # intermediate size: the down GEMM's K
    down: bool


@dataclass(frozen=True)
class EngineTables:
    engine: str  # "sglang"
    version: str  # "0.5.23"
    sha256: str  # of the data file
    tables: dict[tuple[TableKey, str], ConfigTable]  # (key, Triton version) -> table

    def find(self, key: TableKey, triton_version: str) -> tuple[ConfigTable | None, str | None]:
        """The table for `key` under `triton_version`, else under the newest other version that
        has one (the engines' fallback). Returns (table, the version it was found under)."""
        if (key, triton_version) in self.tables:
            return self.tables[(key, triton_version)], triton_version
        others = sorted({v for (k, v) in self.tables if k == key and v != triton_version},
                        key=_version_tuple, reverse=True)
        if others:
            return self.tables[(key, others[0])], others[0]
        return None, None


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for p in version.split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def base_version(version: str) -> str:
    """`3.6.0+git1234` -> `3.6.0`: the engines key their folders by the release."""
    return version.split("+")[0]


@lru_cache(maxsize=None)
def load_engine_tables(name: str = DEFAULT_TABLES) -> EngineTables:
    path = TABLES_DIR / name
    raw = path.read_bytes()
    data = json.loads(raw)
    tables = {}
    for t in data["tables"]:
        key = TableKey(t["device_name"], int(t["E"]), int(t["N"]), bool(t["down"]))
        source = f"{data['engine']} {data['engine_version']}: {t['file']}"
        tables[(key, t["triton"])] = parse_table(t["configs"], f"{name}: {t['file']}", source)
    return EngineTables(data["engine"], data["engine_version"], hashlib.sha256(raw).hexdigest(), tables)


# ----------------------------------------------------------------------------------------------
# Resolution: what one call of the engine's fused MoE launches at M tokens.
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmLaunch:
    """How one GEMM is launched."""

    config: TritonMoeConfig  # USE_TMA here is the table's request
    tma: bool  # tensor descriptors used (requested and available)
    swap_ab: bool
    pdl: bool
    pdl_early: bool  # dependents released at entry (GDC_EARLY)


@dataclass(frozen=True)
class StockPlan:
    up: GemmLaunch
    down: GemmLaunch
    identity: dict  # which tables and entries were used, or why the default applies

    @property
    def block_m(self) -> int:
        return self.up.config.BLOCK_SIZE_M

    @property
    def sorted_down(self) -> bool:
        """GEMM1 writes, and GEMM2 reads, the intermediate in route-plan order (the TMA down path)."""
        return self.down.tma


@dataclass(frozen=True)
class Device:
    """What the rules read off the GPU (or the interpreter's stand-in)."""

    name: str  # as torch.cuda.get_device_name() says it
    capability: tuple[int, int]  # (0, 0) off the GPU
    triton_version: str
    tensor_descriptors: bool  # triton.tools.tensor_descriptor is there

    @property
    def sm90(self) -> bool:
        return self.capability[0] == 9

    @property
    def pdl(self) -> bool:
        return self.capability[0] >= 9


def swap_ab_rule(config: TritonMoeConfig, on_sm90: bool) -> bool:
    """The engines' swap-AB test for FP8 W8A8 (should_enable_swap_ab)."""
    return on_sm90 and config.BLOCK_SIZE_M < 64 and config.BLOCK_SIZE_N >= 64


def sorted_rows(num_slots: int, E: int, block_m: int, sorted_down: bool) -> int:
    """Rows of the intermediate buffers: one per slot, plus the worst-case padding of the
    sorted layout, min(slots, E + 1) * (block_m - 1), when the down GEMM reads it by TMA."""
    return num_slots + (min(num_slots, E + 1) * (block_m - 1) if sorted_down else 0)


def resolve(device: Device, *, E: int, N: int, M: int, K: int, top_k: int,
            tables: EngineTables | None = None, override: ConfigTable | None = None,
            force_default: bool = False, swap_on_any_device: bool = False, pdl: bool = True,
            default: TritonMoeConfig = DEFAULT_CONFIG) -> StockPlan:
    """The configs, swap-AB, TMA and PDL of the engine's fused MoE at M tokens.

    `override` (a user's table) replaces the engine's lookup, as the engines' own override
    does: one entry for both GEMMs, the down GEMM without TMA. `force_default` takes `default`
    (the engines' untuned config) for both, as on a GPU without tables. `swap_on_any_device`
    drops the SM90 condition of the swap rule (the interpreter, non-SM90 GPUs). `pdl=False`
    turns PDL off."""
    identity: dict = {"triton_version": device.triton_version, "device_name": device.name}
    if force_default:
        up = down = default
        identity.update(config_source="default", config_note="the engines' untuned default, forced")
    elif override is not None:
        key, up = override.select(M)
        down = replace(up, USE_TMA=False)  # the engines' override: one entry, the down GEMM without TMA
        identity.update(config_source="file", config_file=override.source, config_sha256=override.sha256,
                        config_key=key)
    else:
        tables = tables or load_engine_tables()
        identity.update(engine=f"{tables.engine} {tables.version}", engine_tables_sha256=tables.sha256)
        dev = device.name.replace(" ", "_")
        version = base_version(device.triton_version)
        up_table, up_version = tables.find(TableKey(dev, E, N, False), version)
        down_table, down_version = tables.find(TableKey(dev, E, N, True), version)
        if up_table is None:
            up = default
            identity.update(config_source="default",
                            config_note=f"no tuned table for E={E},N={N},device_name={dev}: the engine's default")
        else:
            up_key, up = up_table.select(M)
            identity.update(config_source="engine table", up_table=up_table.source, up_key=up_key,
                            up_table_triton=up_version)
        if down_table is None and up_table is not None:
            down_table, down_version = up_table, up_version  # the up table serves the down GEMM
            identity["down_note"] = "no down table: the up table's entry"
        if down_table is None:
            down = up
        else:
            down_key, down = down_table.select(M)
            identity.update(down_table=down_table.source, down_key=down_key, down_table_triton=down_version)
            if down.BLOCK_SIZE_M != up.BLOCK_SIZE_M:
                identity["down_block_m_forced"] = f"{down.BLOCK_SIZE_M} -> {up.BLOCK_SIZE_M}"
                down = replace(down, BLOCK_SIZE_M=up.BLOCK_SIZE_M)
    return stock_plan(device, up, down, M=M, E=E, top_k=top_k, identity=identity,
                      swap_on_any_device=swap_on_any_device, pdl=pdl)


def stock_plan(device: Device, up: TritonMoeConfig, down: TritonMoeConfig, *, M: int, E: int, top_k: int,
               identity: dict, swap_on_any_device: bool = False, pdl: bool = True) -> StockPlan:
    """How the engine launches an up and a down config it has chosen at M tokens: TMA where
    the entry asks and Triton has it, swap-AB by the rule, PDL on SM90. The down entry's
    BLOCK_SIZE_M must already be the up entry's (one route plan)."""
    if down.BLOCK_SIZE_M != up.BLOCK_SIZE_M:
        raise ValueError(f"down BLOCK_SIZE_M {down.BLOCK_SIZE_M} != up {up.BLOCK_SIZE_M}: one route plan serves both")
    sm90 = device.sm90 or swap_on_any_device
    use_pdl = pdl and device.pdl
    up_tma = up.USE_TMA and device.tensor_descriptors
    down_tma = down.USE_TMA and device.tensor_descriptors
    down_rows = sorted_rows(M * top_k, E, up.BLOCK_SIZE_M, down_tma)
    return StockPlan(
        up=GemmLaunch(up, up_tma, swap_ab_rule(up, sm90), use_pdl, use_pdl and M <= PDL_EARLY_MAX_ROWS),
        down=GemmLaunch(down, down_tma, swap_ab_rule(down, sm90), use_pdl,
                        use_pdl and down_rows <= PDL_EARLY_MAX_ROWS),
        identity=identity)
