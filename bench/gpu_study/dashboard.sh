#!/bin/bash
# GPU call 3 of issue 43's item 4 (carry .gpu-c, after setup.sh and a call that carried .gpu-b, or carry .gpu-b
# and .gpu-c together when they fit): `python app.py` on the GPU, a `default` run driven through gradio_client
# from Start to Done (bench/gpu_dashboard.py, $OUT/dashboard.json and the app's log). BUDGET bounds it.
set -u
source "$(dirname "$0")/model.sh"
python -c "import gradio, gradio_client; print('gradio', gradio.__version__)" || exit 5
python bench/gpu_dashboard.py --preset ${PRESET:-default} --budget ${BUDGET:-420} --json $OUT/dashboard.json
echo "gpu_dashboard exit $?"; tail -c 3000 $OUT/dashboard.log
