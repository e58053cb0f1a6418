"""`report --plot` killed at any moment leaves no partial image: each PNG and SVG is rendered in
memory and renamed into place whole, so the folder holds whole images or none (a killed
writer's hidden temporary, `.NAME.XXXX.tmp`, is no image and is named as such)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

from result_factory import make_result

from moebench.record import store

PNG_END = b"IEND\xaeB`\x82"  # a PNG's last chunk, whole


def _whole(path) -> bool:
    data = path.read_bytes()
    if path.suffix == ".png":
        return data.startswith(b"\x89PNG\r\n\x1a\n") and data.endswith(PNG_END)
    return data.lstrip().startswith(b"<?xml") and data.rstrip().endswith(b"</svg>")


def test_killing_report_plot_at_random_points_leaves_no_partial_image(tmp_path):
    result = store.save(make_result(shapes=("A8",), rounds=3, samples=4), tmp_path / "r.json")
    argv = [sys.executable, "-m", "moebench", "report", str(result), "--format", "summary"]
    start = time.monotonic()
    subprocess.run([*argv, "--plot", str(tmp_path / "full")], check=True, capture_output=True, timeout=300)
    whole_run = time.monotonic() - start
    full = sorted(p.name for p in (tmp_path / "full").iterdir())
    assert len(full) >= 6 and all(_whole(tmp_path / "full" / n) for n in full)
    rng = random.Random(53)
    # Most kills land while the images are written (the last part of the run), some earlier.
    for i, at in enumerate(sorted(rng.uniform(0.4, 1.0) * whole_run for _ in range(4))):
        folder = tmp_path / f"k{i}"
        proc = subprocess.Popen([*argv, "--plot", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(at)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        for path in folder.iterdir() if folder.exists() else ():
            if path.name.startswith(".") and path.name.endswith(".tmp"):
                continue  # the temporary of the image being written when the kill came
            assert path.name in full and _whole(path), f"partial {path.name} after a kill at {at:.2f} s"
