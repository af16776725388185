#!/usr/bin/env bash
source /tmp/kl-stage/env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/kl-site .whl/*.whl
out=$OUT
ep=/tmp/kl-ep/kernel_lens-0.1.0.dist-info; mkdir -p "$ep"
printf 'Metadata-Version: 2.1\nName: kernel_lens\nVersion: 0.1.0\n' > "$ep/METADATA"
printf '[kernel_lens.targets]\nort = kernel_lens.targets.ort:OrtTarget\n' > "$ep/entry_points.txt"
export PYTHONPATH="$PWD/src:/tmp/kl-ep:$PYTHONPATH"
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader; } > $out/env.txt 2>&1
( timeout 480 python3 scripts/library_conformance.py --device cuda --jobs 6 --timeout 400 --phases compile \
    --json $out/library_repeat.json gemlite_a16w1_hqq gemlite_a16w2_hqq gemlite_a16w4_hqq gemlite_a8w4_hqq_dynamic \
    composite_attention_block flag_gems_layer_norm > /dev/null 2> $out/library.log ) &
( timeout 480 python3 -m pytest -v -s -p no:cacheprovider tests/gpu/test_gpu_verify.py \
    "tests/test_loading_folders.py::test_launch_settings_cuda_would_refuse_are_refused_at_load" > $out/verify.log 2>&1 ) &
( timeout 500 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_runtime.py tests/gpu/test_gpu_capture.py \
    tests/gpu/test_gpu_binaries.py tests/gpu/test_gpu_hf.py tests/gpu/test_gpu_serving.py > $out/suites.log 2>&1 ) &
wait
for f in $out/*.log; do echo "== $f"; tail -4 $f; done
grep -E "PASSED|FAILED" $out/verify.log | cut -c1-160
