#!/usr/bin/env bash
# GPU check for DALI (issue 8), for a bare GPU machine with no network: run from the repository root.
#
# Installs DALI from wheels carried in $WHEELS (default .whl/; fetch them where pip works with
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#       -d .whl nvidia-dali-cuda130          # nvidia-dali-cuda120 for CUDA 12 drivers
# ), uses the machine's own torch, OpenCV, Pillow and numpy, builds an encoded pack (from $CORPUS, or
# synthetic photos), runs the mixed nvJPEG pipeline and the CPU paths (OpenCV, Pillow, DALI CPU) on it,
# checks the mixed pipeline's pixels against OpenCV's decode of the same bytes (mean absolute difference
# <= 2, labels equal) and prints images per second for each. Exit 0 only when they agree.
set -euo pipefail
PY=${PY:-python3}
WHEELS=${WHEELS:-.whl}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! "$PY" -c "import nvidia.dali" 2>/dev/null; then
  if ! ls "$WHEELS"/nvidia_dali_cuda*.whl >/dev/null 2>&1; then
    echo "DALI is not installed and no nvidia_dali_cuda*.whl is in $WHEELS (see the comment at the top)" >&2
    exit 2
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/dali-site "$WHEELS"/*.whl
  export PYTHONPATH="/tmp/dali-site:$PYTHONPATH"
fi
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible to torch'; print(torch.cuda.get_device_name(0))"
"$PY" -c "from nvidia.dali import backend; print('DALI sees', backend.GetCUDADeviceCount(), 'GPU(s)')"
"$PY" benchmarks/bench_dali.py --gpu --images "${IMAGES:-2048}" ${CORPUS:+--corpus "$CORPUS"} "$@"
