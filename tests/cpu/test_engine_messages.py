"""An engine's log lines and warnings are kept in the arm's identity, not printed mid-run.

SGLang logs through `logging` when it falls back to another Triton version's config table. A
stand-in engine (the real one is an optional extra, on a GPU) logs the same way, through a logger
with a handler of its own as an engine may set up, while it loads and while it resolves a config.
"""

from __future__ import annotations

import io
import logging
import warnings

import pytest

from moebench.kernels.stock.engine_logs import ENGINE_MESSAGES, captured_engine_messages, messages_line
from test_referee import CONFIG_SRC, KERNELS_SRC, fake_sglang  # noqa: F401  (the stand-in engine fixture)

FALLBACK = ("Config file not found at E=257,N=128,device_name=NVIDIA_H100_80GB_HBM3.json for triton 3.6.0; "
            "fallback to triton version 3.4.0")


def test_log_records_and_warnings_are_kept_and_printed_nowhere(capsys):
    engine_log = logging.getLogger("sglang.srt.layers.moe.fake_config")
    seen = io.StringIO()
    own = logging.StreamHandler(seen)  # an engine's own handler, as a colourful logger sets up
    engine_log.addHandler(own)
    engine_log.propagate = False
    try:
        with captured_engine_messages() as kept:
            engine_log.warning("%s", FALLBACK)
            engine_log.warning("%s", FALLBACK)  # said twice (two shapes), kept once
            engine_log.info("below the logger's level: never handled, so never kept")
            logging.getLogger("sglang.created.inside").warning("a logger born inside the block")
            warnings.warn("deprecated knob", DeprecationWarning)
        assert kept == [f"warning: {FALLBACK}", "warning: a logger born inside the block",
                        "warning: DeprecationWarning: deprecated knob"]
        assert seen.getvalue() == ""
        out = capsys.readouterr()
        assert out.out == "" and out.err == ""
        engine_log.warning("after the block")  # the engine's own handler is back
        assert seen.getvalue() == "after the block\n" and engine_log.handlers == [own] and not engine_log.propagate
    finally:
        engine_log.removeHandler(own)
        engine_log.propagate = True


LOGGING_CONFIG_SRC = CONFIG_SRC.replace('''def try_get_optimal_moe_config(*args, **kwargs):''', f'''import logging
logger = logging.getLogger(__name__)
logger.addHandler(logging.StreamHandler())
logger.warning("loaded the config module")
def try_get_optimal_moe_config(*args, **kwargs):
    logger.warning({FALLBACK!r})''')


@pytest.fixture
def logging_sglang(fake_sglang, monkeypatch):  # noqa: F811
    import sys
    from pathlib import Path
    root = Path(next(p for p in sys.path if (Path(p) / "sglang").is_dir()))
    (root / "sglang/srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py").write_text(LOGGING_CONFIG_SRC)
    return fake_sglang


def test_the_sglang_arm_keeps_what_its_engine_logs(logging_sglang, capfd):
    engine = logging_sglang.load_engine()
    assert engine.load_messages == ("warning: loaded the config module",)
    up, down, said = engine.lookup_config((257, 256, 7168), (257, 7168, 128), 9, 8)
    assert up == {"BLOCK_SIZE_M": 16} and down is None
    assert said == ["warning: loaded the config module", f"warning: {FALLBACK}"]
    # The engine caches its lookup; a shape of the same geometry still carries what it said.
    engine.configs.try_get_optimal_moe_config = lambda *a, **k: ({"BLOCK_SIZE_M": 64}, (None, None))
    assert engine.lookup_config((257, 256, 7168), (257, 7168, 128), 9, 128)[2] == said
    assert engine.lookup_config((512, 256, 2048), (512, 2048, 128), 10, 8)[2] == ["warning: loaded the config module"]
    out = capfd.readouterr()
    assert FALLBACK not in out.out + out.err and "loaded the config module" not in out.out + out.err


def test_one_terminal_line_per_arm_says_where_they_are():
    line = messages_line("sglang", {"A8": [f"warning: {FALLBACK}"], "A128": [f"warning: {FALLBACK}"],
                                    "Q8": ["warning: other"]})
    assert "\n" not in line and line.startswith("sglang: 2 engine message(s) at A8, A128, Q8")
    assert ENGINE_MESSAGES in line and "Config file not found" in line and len(line) <= 160


def test_prepare_logs_the_line_once_per_arm():
    from moebench.run.prepare import _engine_messages
    from moebench.record.schema import ArmInfo
    infos = [ArmInfo("sglang", "", shape, (), {ENGINE_MESSAGES: [f"warning: {FALLBACK}"]}) for shape in ("A8", "Q8")]
    infos.append(ArmInfo("triton", "", "A8", (), {}))
    assert _engine_messages(infos) == {"sglang": {"A8": [f"warning: {FALLBACK}"], "Q8": [f"warning: {FALLBACK}"]}}
