#!/bin/sh
# Stand-in for `python` in the examples' PyTorch image on the local cluster, which has no GPU
# and no registry (tests/cluster/test_examples.py imports it under the image's exact name).
# It prints what a CUDA program in the pod would be given and behaves like the example's
# script over time: train.py runs a while and exits 0, serve.py answers /healthz on :8000.
echo "stand-in for the PyTorch image (no GPU here): CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}" \
  "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE:-}" \
  "CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-}"
[ -f "$1" ] || { echo "no script $1" >&2; exit 3; }
case "$1" in
  */train.py) sleep "${STAND_IN_TRAIN_SECONDS:-40}"; echo "training done"; exit 0 ;;
  */serve.py) mkdir -p /tmp/www && echo ok > /tmp/www/healthz && exec httpd -f -p 8000 -h /tmp/www ;;
  *) echo "the stand-in knows train.py and serve.py, not $1" >&2; exit 2 ;;
esac
