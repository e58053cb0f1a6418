"""The fresh process of the across-processes check (moebench.determinism.checks.cross_process_check).

Reads a ChildRequest as JSON on stdin, rebuilds the fixture from its spec (the fingerprint must
match), prepares each arm, runs it once and prints the outputs' SHA-256s, tagged, on stdout.
Running out of device memory (a card shared with other processes) is answered as such, tagged
`out_of_memory`, so the parent can try again rather than read a traceback's last line.
"""

from __future__ import annotations

import json
import sys


def child_hash(request: dict) -> dict:
    import torch

    from moebench.determinism.checks import output_hash, run_once
    from moebench.errors import UserError
    from moebench.fixtures import Family, ShapeSpec, build_fixture
    from moebench.kernels.registry import external_arm_factories, make_arms
    spec = ShapeSpec(family=Family(**request["family"]), **request["spec"])
    fx = build_fixture(spec)
    if fx.fingerprint != request["fingerprint"]:
        return {"error": "the fixture is not the one its spec builds (a derived fixture): not rebuilt here"}
    fx = fx.to(torch.device(request["device"]))
    extra = external_arm_factories(request["external"])
    out = {}
    for name, options in request["arms"].items():
        try:
            arm = make_arms([name], options, extra=extra)[0]
            out[name] = {"hash": output_hash(run_once(arm.prepare(fx)))}
        except UserError as err:
            out[name] = {"error": str(err)}
        if fx.device.type == "cuda":
            torch.cuda.empty_cache()  # one arm's buffers given back before the next's
    return {"arms": out}


def main() -> int:
    from moebench.determinism.checks import CHILD_RESULT_TAG
    from moebench.errors import UserError
    from moebench.failures import is_out_of_memory
    request = json.loads(sys.stdin.read())
    try:
        result = child_hash(request)
    except UserError as err:
        result = {"error": str(err)}
    except Exception as err:  # noqa: BLE001 - only running out of memory is answered; the rest is a traceback
        if not is_out_of_memory(err):
            raise
        result = {"error": f"out of device memory in the fresh process: {str(err).splitlines()[0][:160]}",
                  "out_of_memory": True}
    print(CHILD_RESULT_TAG + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
