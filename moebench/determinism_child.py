"""The fresh process of the across-processes check (moebench.determinism.cross_process_check).

Reads a ChildRequest as JSON on stdin, rebuilds the fixture from its spec (the fingerprint must
match), prepares each arm, runs it once and prints the outputs' SHA-256s, tagged, on stdout.
"""

from __future__ import annotations

import json
import sys


def child_hash(request: dict) -> dict:
    import torch

    from moebench.determinism import output_hash, run_once
    from moebench.fixtures import Family, ShapeSpec, build_fixture
    from moebench.errors import UserError
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
    return {"arms": out}


def main() -> int:
    from moebench.determinism import CHILD_RESULT_TAG
    from moebench.errors import UserError
    request = json.loads(sys.stdin.read())
    try:
        result = child_hash(request)
    except UserError as err:
        result = {"error": str(err)}
    print(CHILD_RESULT_TAG + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
