#!/usr/bin/env bash
# One call on the H200 (the device tool): install the carried wheels, then run the named
# stages in order. Each stage's log goes under $OUT/logs, results under $OUT/results, and
# everything is bundled into $OUT/bundle.tgz (the tool returns few files).
#   usage: bash scripts/h200.sh STAGE [STAGE ...]
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MOEBENCH_CACHE=/tmp/moebench-cache
mkdir -p "$OUT/logs" "$OUT/results"
R="$OUT/results"

stage() {  # stage NAME CMD...: run, log, print the status and the log's tail
  local name=$1; shift
  local t0=$SECONDS
  timeout "${STAGE_TIMEOUT:-400}" "$@" > "$OUT/logs/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc $((SECONDS - t0))s"
  tail -n "${TAIL:-8}" "$OUT/logs/$name.log" | cut -c1-220
}

for s in "$@"; do case $s in
  env) stage env bash -c 'nvidia-smi; python3 -m moebench doctor; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)"' ;;
  golden) stage golden python3 -m pytest -q tests/test_fixture_golden.py ;;
  gpu-tests) stage gpu-tests python3 -m pytest -q -m gpu -x --durations=10 ;;
  gpu-tests-all) stage gpu-tests-all python3 -m pytest -q -m gpu --durations=10 ;;
  build) stage build python3 -m moebench build ;;
  stock) stage stock python3 -m moebench run --shape A8,A128,Q8,Q128 --arms triton,triton-swapab --out "$R" ;;
  cuda) stage cuda python3 -m moebench run --shape A8,A128,Q8,Q128 --arms triton,cuda-gemm,cuda-swapab,cuda-fused --out "$R" ;;
  *) echo "unknown stage $s" ;;
esac; done
tar czf "$OUT/bundle.tgz" -C "$OUT" logs results
