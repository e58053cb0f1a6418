#!/usr/bin/env bash
# Build switches of the fused kernel, traced and timed in one device call (scripts/h200.sh
# stage `variants`):
#   VARIANTS="base ew:EARLY_W=1 both:EARLY_W=1:X_MC=1" [TSHAPES=Q8,A8] bash scripts/variants.sh OUT
# Each variant NAME[:DEFINE=VALUE...] is traced first (scripts/trace_fused.py, which also checks
# parity; OUT/trace-NAME/ and OUT/trace-NAME.log); those that pass are then timed as builds of one
# paired run against the first (OUT/run/, OUT/run.log). The traces are bundled into
# OUT/traces.tgz (the device tool returns few files).
set -u
out=$1
mkdir -p "$out"
ok=()
for v in ${VARIANTS:-base}; do
  name=${v%%:*}; defs=()
  [ "$name" != "$v" ] && for d in $(tr ':' ' ' <<< "${v#*:}"); do defs+=(--define "$d"); done
  timeout "${TRACE_TIMEOUT:-100}" python3 scripts/trace_fused.py "$out/trace-$name" --shape "${TSHAPES:-Q8}" "${defs[@]}" \
    > "$out/trace-$name.log" 2>&1
  rc=$?
  echo "trace $name rc=$rc"; grep -E "^[AQ][0-9]+:|SMs" "$out/trace-$name.log" | cut -c1-160
  [ $rc = 0 ] && ok+=("$v")
done
args=()
for v in "${ok[@]}"; do
  name=${v%%:*}
  args+=(--build "$name=moebench/kernels/sm90_fused_moe.cu")
  [ "$name" != "$v" ] && for d in $(tr ':' ' ' <<< "${v#*:}"); do args+=(--define "$name:$d"); done
done
if [ ${#ok[@]} -ge 2 ]; then
  ref=${ok[0]%%:*}
  timeout "${RUN_TIMEOUT:-330}" python3 -m moebench run --shape "${RUN_SHAPES:-A8,A128,Q8,Q128}" "${args[@]}" \
    --ref "$ref" --out "$out/run" > "$out/run.log" 2>&1
  echo "run rc=$?"; tail -n 20 "$out/run.log" | cut -c1-200
else
  echo "run skipped: fewer than two variants passed parity"
fi
(cd "$out" && tar czf traces.tgz trace-*/ 2>/dev/null && rm -rf trace-*/)
