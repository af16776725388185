#!/usr/bin/env bash
# Runs on the GPU host after staging (see ../shared/docs/environment.md). Usage:
#   bash scripts/gpu_suite.sh PART        PART: ort | hf | capture | trt | library | never | all
# (never: issue 38's never-wrong checks through the CUDA op, the decode step, verify, and the CPU
# evaluation tests on this host's torch)
# (trt: the TensorRT plugins' enqueue, in 4 processes, each a shard of the models)
# Logs and a JUnit XML go to $OUT (or ./gpu_out). kernel_lens runs from src/; its entry points
# (the target registry) come from a minimal dist-info, so nothing is pip-installed.
set -uo pipefail
cd "$(dirname "$0")/.."
source /tmp/kl-stage/env.sh
out=${OUT:-gpu_out}; mkdir -p "$out"
ep=/tmp/kl-ep/kernel_lens-0.1.0.dist-info
mkdir -p "$ep"
printf 'Metadata-Version: 2.1\nName: kernel_lens\nVersion: 0.1.0\n' > "$ep/METADATA"
printf '[kernel_lens.targets]\nort = kernel_lens.targets.ort:OrtTarget\n' > "$ep/entry_points.txt"
export PYTHONPATH="$PWD/src:/tmp/kl-ep:$PYTHONPATH"
{
  date -u; nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
  python3 -c "import sys, torch, triton, onnxruntime, pydantic, onnxscript; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'onnxruntime', onnxruntime.__version__, 'onnxscript', onnxscript.__version__, 'pydantic', pydantic.VERSION)"
} > "$out/env.txt" 2>&1
case "${1:-all}" in
  ort) tests=(tests/gpu/test_gpu_ort.py) ;;
  hf) tests=(tests/gpu/test_gpu_hf.py tests/gpu/test_gpu_runtime.py) ;;
  never) tests=(tests/gpu/test_gpu_never_wrong.py tests/gpu/test_gpu_decode.py tests/gpu/test_gpu_verify.py
                tests/gpu/test_gpu_runtime.py tests/test_never_wrong.py) ;;
  trt)
    for k in 0 1 2 3; do
      KL_GPU_SHARD=$k/4 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_gpu_trt.py \
        --junitxml="$out/junit-trt-$k.xml" > "$out/pytest-trt-$k.log" 2>&1 &
    done
    rc=0; for k in 0 1 2 3; do wait -n || rc=1; done
    cat "$out"/pytest-trt-?.log > "$out/pytest-trt.log"
    grep -E "max_abs_diff" "$out/pytest-trt.log" > "$out/diffs-trt.txt"
    grep -hE "passed|failed|error" "$out"/pytest-trt-?.log | tail -8
    exit $rc ;;
  library)  # issue 17: third-party libraries through ORT (background) beside the new corpus cases
    python3 scripts/library_conformance.py --device cuda --jobs 10 --timeout 420 \
      --json "$out/library_gpu.json" > "$out/library_gpu.md" 2> "$out/library_gpu.log" &
    lib=$!
    python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_gpu_ort.py -k \
      "constexpr_from_sizes or autotune_features or misaligned" \
      --junitxml="$out/junit-library.xml" > "$out/pytest-library.log" 2>&1
    rc=$?
    python3 -m pytest -q -s -p no:cacheprovider tests/test_launchers.py tests/test_size_functions.py \
      >> "$out/pytest-library.log" 2>&1 || rc=1
    wait $lib || rc=1
    grep -E "max_abs_diff" "$out/pytest-library.log" > "$out/diffs-library.txt"
    tail -6 "$out/pytest-library.log"; tail -3 "$out/library_gpu.log"
    exit $rc ;;
  capture) tests=(tests/gpu/test_gpu_capture.py tests/test_corpus.py tests/test_capture.py tests/test_untrusted_inputs.py tests/test_runtime_cpp.py) ;;
  *) tests=(tests/gpu tests/test_corpus.py tests/test_capture.py tests/test_untrusted_inputs.py) ;;
esac
python3 -m pytest -q -s -p no:cacheprovider "${tests[@]}" --junitxml="$out/junit-${1:-all}.xml" > "$out/pytest-${1:-all}.log" 2>&1
rc=$?
grep -E "max_abs_diff" "$out/pytest-${1:-all}.log" | awk '{split($NF,a,"=");} {print}' > "$out/diffs-${1:-all}.txt"
tail -25 "$out/pytest-${1:-all}.log"
exit $rc
