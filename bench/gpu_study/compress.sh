#!/bin/bash
# GPU call 2 of issue 43's item 1 (carry .gpu-b): `bsi compress` of the default and demo presets in bf16 and fp32,
# timed stage by stage (bench/gpu_compress.py, $OUT/compress.json), then, with the time left, the engine's first
# rounds in bf16 against fp32 on the same weights (bench/bf16_rounds.py, $OUT/bf16.json). BUDGET bounds both.
# A CPU dry run of the same chain: DEVICE=cpu RUNS=smoke:bfloat16,smoke:float32 ROUNDS_PRESET=smoke.
# PROFILE=default:bfloat16 also profiles one more run of it (compress-profile.txt), when a stage misses its target.
set -u
source "$(dirname "$0")/model.sh"
budget=${BUDGET:-510}; start=$(date +%s)
python bench/gpu_compress.py --device ${DEVICE:-cuda} ${RUNS:+--runs $RUNS} ${PROFILE:+--profile $PROFILE} --budget $((budget - 90)) --runs-dir /tmp/bsi-runs --json $OUT/compress.json \
    > $OUT/compress.log 2>&1; echo "gpu_compress exit $? after $(( $(date +%s) - start )) s"
left=$((budget - $(date +%s) + start))
if [ $left -gt 60 ]; then
  timeout -s INT $left python bench/bf16_rounds.py --device ${DEVICE:-cuda} --preset ${ROUNDS_PRESET:-default} --rounds 2 --json $OUT/bf16.json >> $OUT/compress.log 2>&1
  echo "bf16_rounds exit $? after $(( $(date +%s) - start )) s"
fi
grep -v "it/s\]\|s/it\]" $OUT/compress.log | tail -c 5000
