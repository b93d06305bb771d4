#!/usr/bin/env bash
# The GPU measurements of issue 16, as one command on a lent H100 (the `device` tool: `run` with this file).
# Writes to $OUT (default /tmp/lssim-gpu): the GEMM sweep (every GEMM Vidur profiled, at its token counts, and
# qwen2.5-7b / -1.5b over Vidur's dense grid) and whole qwen2.5-7b iterations on both sides of cuBLAS's steps
# (unfused by default, FUSE=' ' for torch.compile'd element-wise work as the shipped profile's best variant;
# aligned and unaligned sizes timed the same way in the same minutes). SKIP_SWEEP=1 / SKIP_STEPS=1 skip a part.
set -uo pipefail
OUT=${OUT:-/tmp/lssim-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/device.txt"
python3 -c "import torch; print('torch', torch.__version__, torch.version.cuda)" | tee -a "$OUT/device.txt"
[ -z "${SKIP_SWEEP:-}" ] && timeout "${SWEEP_S:-220}" python3 -m lssim.cost.gpu_gemm_sweep --vidur --model qwen2.5-7b --model qwen2.5-1.5b \
    --iters 10 --out "$OUT/h100_gemm_sweep.csv" 2>&1 | grep -v USDT > "$OUT/sweep.log"
tail -5 "$OUT/sweep.log"; grep -E "^\[(1|2|3|4|21|33|50)/" "$OUT/sweep.log"
[ -n "${SKIP_STEPS:-}" ] && exit 0
for model in ${STEP_MODELS:-qwen2.5-7b}; do
  timeout "${WHOLE_S:-200}" python3 lssim/benchmarks/roofline_gpu.py --model "$model" ${FUSE:---no-fuse} \
      --batch-sizes 16,24,128,136 --context-lens 512 \
      --prefills 1x512,1x520,1x1024,1x1040,1x2048,1x2080,1x1500,1x3000 --out "$OUT/steps" > "$OUT/steps_$model.log" 2>&1
  grep -E "^  (n=|prefill)|took" "$OUT/steps_$model.log"
done
rm -rf "$OUT/steps"  # the logs hold every point; the per-model files are the profile's format, not needed here
ls -la "$OUT"
