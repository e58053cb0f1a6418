#!/usr/bin/env bash
# The runs behind docs/measurement.md's "Truth at defaults" (results/<gpu>/truth/): identical code
# at default settings, known slowdowns, and what each protocol choice costs. One GPU, ~10 minutes.
#   scripts/truth.sh OUT_DIR [parts...]   parts: placement aaa slow legacy (default: all)
set -euo pipefail
out=${1:?usage: scripts/truth.sh OUT_DIR [placement|aaa|slow|legacy ...]}; shift
parts=${*:-placement aaa slow legacy}
mkdir -p "$out"
F=moebench/kernels/cuda/sm90_fused_moe.cu
mb() { python3 -m moebench "$@"; }
timed() {  # timed NAME CMD...: the command's wall time into $out/wall.tsv, its output into $out/NAME.log
  local name=$1; shift; local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1 || echo "$name: exit $?" >>"$out/failed.txt"
  printf '%s\t%s\n' "$name" $((SECONDS - t0)) >>"$out/wall.tsv"
  tail -n 40 "$out/$name.log"
}
newest() { ls -t "$out"/*.json | head -n 1; }
for part in $parts; do case $part in
placement)  # where buffers land: 8 placements taken by round, so each placement's median stands alone
  timed placement mb run --shape Q8,A8 --arms cuda-fused --build b=$F --build c=$F --ref cuda-fused \
    --placements 8 --placement-mode rounds --rounds 16 --order alternating --aa none --out "$out"
  mv "$(newest)" "$out/placement-by-round.json" ;;
aaa)  # identical code at default settings, twice
  for k in 1 2; do
    timed "aaa-defaults-$k" mb run --shape A8,Q8,A128,Q128 --arms cuda-fused --build b=$F --build c=$F \
      --ref cuda-fused --out "$out"
    mv "$(newest)" "$out/aaa-defaults-$k.json"
  done
  mb compare "$out/aaa-defaults-1.json" "$out/aaa-defaults-2.json" >"$out/aaa-compare.txt" 2>&1 || true
  tail -n 30 "$out/aaa-compare.txt" ;;
slow)  # known slowdowns at Q8 (a spin at the decode kernel's entry): ~2%, ~1%, ~0.5%
  for c in 900 450 225; do python3 scripts/slowed_copy.py "/tmp/slow$c" --cycles $c >/dev/null; done
  timed slowdowns mb run --shape Q8 --arms cuda-fused --build slow900=/tmp/slow900/sm90_fused_moe.cu \
    --build slow450=/tmp/slow450/sm90_fused_moe.cu --build slow225=/tmp/slow225/sm90_fused_moe.cu \
    --build same=$F --ref cuda-fused --out "$out"
  mv "$(newest)" "$out/slowdowns-q8.json" ;;
legacy)  # the protocol before: one placement, alternating order, no floor
  timed legacy mb run --shape A8,Q8,A128,Q128 --arms cuda-fused --build b=$F --build c=$F --ref cuda-fused \
    --placements 1 --order alternating --aa none --out "$out"
  mv "$(newest)" "$out/legacy-protocol.json" ;;
*) echo "unknown part $part" >&2; exit 2 ;;
esac; done
cat "$out/wall.tsv"
