#!/usr/bin/env bash
# One command on a GPU machine reached over a copy of this tree: install the carried wheels, then run the named
# stages in order. Each stage's log goes under logs/, results under results/ of a work
# folder, bundled into $OUT/bundle.tgz after every stage (few files come back from such a machine, and
# a stage cut off by the time limit still leaves the earlier ones).
#   usage: bash scripts/h200.sh STAGE [STAGE ...]
# The proofs the open issues ask for, in order of priority: truth read-floor (the default
# protocol, the read floor), house old-build (the stage folders: all arms before and after,
# a --build from before the move), fp32 registry (the FP32 sums, every registry model),
# peers tune (the cublas peer, the tuned stock path).
# Carry .whl (../shared/fetch-wheels) and, for the `builds` stage, .gitcopy: make it here
# with `git clone -q --bare . .gitcopy` and add `/.gitcopy/` to .git/info/exclude.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MOEBENCH_CACHE=/tmp/moebench-cache
# A copied tree may carry no .git: a bare copy carried as .gitcopy serves `--build NAME=git:REV`.
[ -d .gitcopy ] && export GIT_DIR=$PWD/.gitcopy GIT_WORK_TREE=$PWD
W=/tmp/h200-work
mkdir -p "$W/logs" "$W/results"
R="$W/results"

stage() {  # stage NAME CMD...: run, log, print the status and the log's tail
  local name=$1; shift
  local t0=$SECONDS
  timeout "${STAGE_TIMEOUT:-400}" "$@" > "$W/logs/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc $((SECONDS - t0))s"
  tail -n "${TAIL:-8}" "$W/logs/$name.log" | cut -c1-220
  tar czf "$OUT/bundle.tgz" -C "$W" logs results
}

# ncu-offset: each waiting or streaming kernel timed by ncu (untimed launches under it) and by
# moebench, one row each of $R/ncu-offset.md (moebench probe --table-row).
ncu_offset() {
  local table=$R/ncu-offset.md
  printf '%s\n' '| workload | moebench µs | ncu µs | ncu − moebench ns | moebench/ncu |' '|---|--:|--:|--:|--:|' > "$table"
  for w in 'empty' 'spin --us 2' 'spin --us 20' 'spin --us 200' 'add --mib 24' 'add --mib 256'; do
    set -- $w; local op=$1; shift
    local pat='spin_kernel'; [ "$op" = add ] && pat='Functor\w*_add'
    local csv="$W/logs/ncu-offset-$op${2:-}.csv"
    ncu --cache-control all --clock-control none --kernel-name-base demangled -k "regex:$pat" \
      --launch-skip 10 --launch-count 100 --metrics gpu__time_duration.sum --csv \
      python3 -m moebench probe --op "$op" "$@" --samples 110 --warmup 0 --timer none --flush none > "$csv" || return 1
    python3 -m moebench probe --op "$op" "$@" --samples 200 --flush read --ncu-csv "$csv" --table-row "$table" || return 1
  done
  cat "$table"
}
export -f ncu_offset
export W R

for s in "$@"; do case $s in
  env) stage env bash -c 'nvidia-smi; python3 -m moebench doctor; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)"' ;;
  golden) stage golden python3 -m pytest -q tests/cpu/test_fixture_golden.py ;;
  gpu-tests) stage gpu-tests python3 -m pytest -q -m gpu -x --durations=10 ;;
  gpu-tests-all) stage gpu-tests-all python3 -m pytest -q -m gpu --durations=10 ;;
  build) stage build python3 -m moebench build ;;
  stock) stage stock python3 -m moebench run --shape A8,A128,Q8,Q128 --arms triton,triton-swapab --out "$R" ;;
  stock-again) stage stock-again bash -c "time python3 -m moebench run --shape A8,A128,Q8,Q128 --arms triton,triton-swapab --out $R" ;;
  all) stage all python3 -m moebench run --shape A8,A128,Q8,Q128 \
         --arms triton,triton-swapab,cuda-gemm,cuda-swapab,cuda-fused --ref triton --out "$R" ;;
  wall) stage wall bash -c "time python3 -m moebench run --shape A8,A128,Q8,Q128 --arms triton,triton-swapab --samples 60 --out $R/wall" ;;
  ncu) stage ncu bash -c "python3 -m moebench probe --op add --mib 256 --samples 200 --flush read &&
         ncu --cache-control all --clock-control none --kernel-name-base demangled -k 'regex:Functor\w*_add' \
           --launch-skip 10 --launch-count 100 --metrics gpu__time_duration.sum --csv \
           python3 -m moebench probe --op add --mib 256 --samples 110 --warmup 0 --timer none --flush none > $W/logs/ncu_add.csv &&
         python3 -m moebench probe --op add --mib 256 --samples 200 --flush read --ncu-csv $W/logs/ncu_add.csv" ;;
  truth-tests) stage truth-tests python3 -m pytest -q -m gpu tests/gpu/test_graphs_gpu.py tests/gpu/test_timing_gpu.py ;;
  ncu-offset) stage ncu-offset bash -c ncu_offset ;;
  noise) stage noise python3 -m moebench run --shape A8,A128,Q8,Q128 --aa cuda-fused --out "$R/noise" ;;
  aa-proof) stage aa-proof python3 scripts/aa_proof.py --out "$R/aa" ;;  # AA_SLOWDOWN, AA_ARM: scripts/aa_arms.py
  graph-eager) stage graph-eager bash -c "for g in '' --graph; do python3 -m moebench run --shape A8,A128,Q8,Q128 \
         --arms triton,triton-swapab,cuda-gemm,cuda-swapab,cuda-fused --ref triton \$g --out $R/graph-eager || exit 1; done;
         python3 -m moebench compare \$(ls $R/graph-eager/*.json | grep -v _graph.json | tail -1) \$(ls $R/graph-eager/*_graph.json | tail -1)" ;;
  flush) stage flush bash -c "for f in read write none; do python3 -m moebench probe --op add --mib 16 --samples 200 --flush \$f; done;
         for f in read write none; do python3 -m moebench run --shape A8,A128,Q8,Q128 --arms triton,cuda-fused --flush \$f --out $R/flush; done" ;;
  sweep-a) stage sweep-a python3 -m moebench sweep --family A --m 1,2,4,8,16,32,64,128,256 --arms cuda-gemm,cuda-swapab,triton --out "$R" ;;
  sweep-q) stage sweep-q python3 -m moebench sweep --family Q --m 1,2,4,8,16,32,64,128,256 --arms cuda-gemm,cuda-swapab,triton --out "$R" ;;
  builds) stage builds python3 -m moebench run --shape A8,A128,Q8,Q128 \
         --build wt=moebench/kernels/cuda/sm90_fused_moe.cu --build v1=git:bd15e63 --ref v1 --out "$R" ;;
  cuda-tests) stage cuda-tests python3 -m pytest -q tests/gpu/test_cuda_arms_gpu.py ;;
  fused-vs-rev) stage fused-vs-rev python3 -m moebench run --shape A8,A128,Q8,Q128 \
         --build wt=moebench/kernels/cuda/sm90_fused_moe.cu --build base=git:"${BASE_REV:?set BASE_REV}" --ref base --out "$R" ;;
  fused-variants) stage fused-variants python3 -m moebench run --shape A8,A128,Q8,Q128 \
         --variant bm8=cuda-fused:block_m=8 --variant bm16=cuda-fused:block_m=16 --out "$R/variants" ;;
  fused-stages) stage fused-stages python3 -m moebench run --shape A8,A128,Q8,Q128 \
         --variant s4=cuda-fused:block_m=8,stages=4 --variant s3=cuda-fused:block_m=8,stages=3 \
         --variant s2=cuda-fused:block_m=8,stages=2 --out "$R/stages" ;;
  ncu-fused) stage ncu-fused bash -c "for p in 'A128 cuda-fused moebench_fused_moe 2 1' 'Q8 cuda-fused moebench_fused_moe 2 1' 'A128 cuda-swapab moe_grouped_gemm 4 2'; do
         set -- \$p; f=$W/logs/ncu-\$1-\$2;
         ncu --set full --clock-control none -k regex:\$3 --launch-skip \$4 --launch-count \$5 -f -o \$f python3 -m moebench profile \$1 \$2 --calls 4;
         ncu --import \$f.ncu-rep --page details > \$f-details.txt;
         ncu --import \$f.ncu-rep --page source --csv --print-source sass > \$f-sass.csv; gzip -f \$f-sass.csv; rm -f \$f.ncu-rep; done" ;;
  ncu-fused-c4) stage ncu-fused-c4 bash -c "for p in 'A128 cuda-fused moebench_fused_moe 2 1' 'Q8 cuda-fused moebench_fused_moe 2 1'; do
         set -- \$p; f=$W/logs/ncu-c4-\$1-\$2;
         ncu --set full --clock-control none -k regex:\$3 --launch-skip \$4 --launch-count \$5 -f -o \$f python3 -m moebench profile \$1 \$2 --calls 4;
         ncu --import \$f.ncu-rep --page details > \$f-details.txt;
         ncu --import \$f.ncu-rep --page source --csv --print-source sass > \$f-sass.csv; gzip -f \$f-sass.csv; rm -f \$f.ncu-rep; done" ;;
  gemm2-steps) stage gemm2-steps python3 -m moebench run --shape Q128,A128,Q8,A8 \
         --variant steps8=cuda-swapab:target_steps=8 --variant steps4=cuda-swapab:target_steps=4 \
         --variant steps16=cuda-swapab:target_steps=16 --variant steps32=cuda-swapab:target_steps=32 --out "$R/gemm2" ;;
  fused-tests) stage fused-tests python3 -m pytest -q tests/gpu/test_fused_gpu.py ;;
  fused-clusters) stage fused-clusters python3 -m moebench run --shape A8,A128,Q8,Q128 \
         --variant c8=cuda-fused:cluster=8 --variant c4p2=cuda-fused:cluster=4,per_sm=2 \
         --variant c4p3=cuda-fused:cluster=4,per_sm=3 --out "$R/clusters" ;;
  fused-clusters-s) stage fused-clusters-s python3 -m moebench run --shape A8,A128,Q8,Q128 \
         --variant c8=cuda-fused:cluster=8 --variant c4=cuda-fused:cluster=4 \
         --variant c4p3s2=cuda-fused:cluster=4,per_sm=3,stages=2 --variant c4p2s4=cuda-fused:cluster=4,per_sm=2,stages=4 \
         --out "$R/clusters-s" ;;
  racecheck) stage racecheck bash -c "for a in '--stages 6' '' '--max-clusters 1'; do echo \"== racecheck --K 1024 ${SAN_ARGS:-} \$a\";
         timeout \${CONFIG_TIMEOUT:-90} compute-sanitizer --tool racecheck python3 scripts/sanitize_fused.py --K 1024 ${SAN_ARGS:-} \$a 2>&1 | grep -E 'Race reported|Write access|Read access|SUMMARY|rel_l2|rror'; done" ;;  # SAN_ARGS: e.g. --cluster 1
  racecheck-diag) stage racecheck-diag bash -c "for a in '--stages 6' '--max-clusters 1' ''; do echo \"== racecheck \$a\";
         compute-sanitizer --tool racecheck python3 scripts/sanitize_fused.py \$a 2>&1 | grep -E 'Race reported|Write access|Read access|SUMMARY|rel_l2'; done" ;;
  fused-alone) stage fused-alone python3 -m moebench run ${ALONE_SHAPES:---shape Q8,A8} \
         --variant c4=cuda-fused:cluster=4 --variant c1=cuda-fused:cluster=1 --out "$R/alone" ;;
  run-args) stage run-args bash -c "python3 -m moebench run --out $R $RUN_ARGS" ;;  # RUN_ARGS: builds, shapes, --ref
  prefill-chunk) stage prefill-chunk python3 -m moebench run --shape A1024,A2048,A4096,A8192,A16384,Q1024,Q4096,Q16384 \
      --arms cuda-fused --variant c1=cuda-fused:chunk=1 --variant c2=cuda-fused:chunk=2 --variant c4=cuda-fused:chunk=4 \
      --ref cuda-fused --out "$R/prefill-chunk" ;;
  reduce-probe) stage reduce-probe bash -c "for m in 4 16 32 48 128 512; do python3 -m moebench probe --op reduce --mib \$m --samples 30; done" ;;
  memcheck) stage memcheck bash -c "compute-sanitizer --tool memcheck --report-api-errors no python3 scripts/sanitize_fused.py ${SAN_ARGS:-}" ;;
  sanitize) stage sanitize bash -c "compute-sanitizer --tool memcheck --report-api-errors no python3 scripts/sanitize_fused.py &&
         compute-sanitizer --tool racecheck python3 scripts/sanitize_fused.py" ;;
  truth) stage truth bash scripts/truth.sh "$R/truth" aaa slow ;;
  read-floor) stage read-floor bash -c "python3 -m moebench probe --op read && python3 -m moebench doctor --calibrate" ;;
  house) stage house bash -c "d=\$(mktemp -d) && git archive ${MOVE_BASE:-95475b3~1} moebench | tar -x -C \$d &&
         (cd \$d && PYTHONPATH=/tmp/site:\$d python3 -m moebench run --shape A8,Q8,A128,Q128 --out $R/house) &&
         python3 -m moebench run --shape A8,Q8,A128,Q128 --out $R/house &&
         python3 -m moebench compare \$(ls -tr $R/house/*.json | head -1) \$(ls -t $R/house/*.json | head -1)" ;;  # all arms before/after the stage folders
  old-build) stage old-build bash -c "python3 -m moebench run --shape A8,Q8 --arms cuda-fused --ref cuda-fused \
         --build old=git:${MOVE_BASE:-95475b3~1}:moebench/kernels/cuda/sm90_fused_moe.cu --build now=moebench/kernels/cuda/sm90_fused_moe.cu \
         --build-host worktree --out $R/old-build" ;;
  fp32) stage fp32 bash -c "mkdir -p $R/fp32 $R/peers && python3 -m pytest -q tests/gpu/test_fused_fp32_gpu.py tests/gpu/test_fused_gpu.py &&
         python3 -m moebench verify --shapes-file tests/data/whole-expert-shapes.toml --shape D1,D8,W1,W8 \
           --arms cuda-swapab,cuda-fused --edge-cases --out $R/fp32/verify-whole-experts.json &&
         python3 -m moebench run --shapes-file tests/data/whole-expert-shapes.toml --shape A8,Q8,A128,Q128,D1,D8,W1,W8 \
           --variant f32=cuda-fused:sums=fp32 --variant b16=cuda-fused:sums=bf16 --ref b16 --out $R/fp32" ;;
  registry) stage registry python3 -m moebench verify --edge-cases --arms triton,cuda-swapab,cuda-fused --out $R/verify-registry.json --shape \
         deepseek-v3/ep8/M8,deepseek-v3/tp8/M8,kimi-k2/ep8/M8,kimi-k2/tp8/M8,glm-4.5/ep8/M8,glm-4.5/tp4/M8,qwen3-235b-a22b/ep8/M8,qwen3-235b-a22b/tp4/M8,qwen3-30b-a3b/tp1/M8,qwen3-30b-a3b/ep8/M8,qwen3-next-80b-a3b/tp4/M8,qwen3-next-80b-a3b/ep8/M8 ;;
  peers) stage peers bash -c "python3 -m pytest -q tests/gpu/test_cublas_gpu.py &&
         python3 -m moebench verify --shape A8,A128,A4096,Q8,Q128,Q4096 --arms cublas --out $R/peers/verify-cublas.json &&
         python3 -m moebench run --shape A8,Q8,A128,Q128 --arms cuda-fused,cublas,triton --ref triton --out $R/peers" ;;
  tune) stage tune bash -c "for f in A Q deepseek-v3/ep8; do python3 -m moebench tune --shape \$f --ms 1,8,128,4096 --out $R/tuned ||
           python3 -m moebench tune --shape \$f --ms 1,8,128,4096 --out $R/tuned || exit 1; done &&
         python3 -m moebench run --shape A1,A8,A128,A4096,Q1,Q8,Q128,Q4096 --arms triton,triton-tuned --tuned $R/tuned --ref triton --out $R/tuned" ;;
  *) echo "unknown stage $s" ;;
esac; done
