#!/bin/bash
# GPU calls 1-3 (carry .gpu-a, .gpu-a2, then .gpu-a3; see README.md): keep the first three parts of the embedded model's wheel (and the sweep
# folder to extend, if prepare.sh was given one) in /tmp, install the pure-Python packages the GPU image lacks,
# and check that bsi imports there.
set -u
M=/tmp/bsi-model; P=/tmp/bsi-py
mkdir -p $M $P && for d in .gpu-a .gpu-a2 .gpu-a3; do [ ! -d $d ] || cp -r $d/. $M/ || exit 3; done
if [ -f $M/study.tgz ]; then rm -rf $M/study && mkdir -p $M/study && tar xzf $M/study.tgz -C $M/study || exit 3; fi
for pkg in gguf narwhals plotly; do
  ls $M/$pkg-*.whl >/dev/null 2>&1 || continue  # its wheel comes with the other call
  python -c "import $pkg" 2>/dev/null && echo "$pkg: on the image" && continue
  pip install -q --no-deps --no-index --target $P $M/$pkg-*.whl 2>&1 | grep -v "is ignored" | tail -2
done
export PYTHONPATH=$PWD:$P
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import sys,torch,transformers,accelerate;print(sys.version.split()[0],torch.__version__,transformers.__version__,accelerate.__version__,torch.cuda.is_available())"
python -c "import bsi.pipeline.sweep, gguf; print('bsi imports: ok (plotly comes with .gpu-b)')"
nproc; free -g | head -2; df -h /tmp | tail -1
