#!/usr/bin/env bash
source /tmp/kl-stage/env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/kl-site .whl/*.whl
out=$OUT
ep=/tmp/kl-ep/kernel_lens-0.1.0.dist-info; mkdir -p "$ep"
printf 'Metadata-Version: 2.1\nName: kernel_lens\nVersion: 0.1.0\n' > "$ep/METADATA"
printf '[kernel_lens.targets]\nort = kernel_lens.targets.ort:OrtTarget\n' > "$ep/entry_points.txt"
export PYTHONPATH="$PWD/src:/tmp/kl-ep:$PYTHONPATH"
{ date -u; nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader; } > $out/env.txt 2>&1
( timeout 560 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_ort.py > $out/ort.log 2>&1 ) &
( timeout 560 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_runtime.py tests/gpu/test_gpu_capture.py \
    tests/gpu/test_gpu_binaries.py tests/gpu/test_gpu_verify.py > $out/suites.log 2>&1;
  timeout 200 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_gpu_trt.py -k "arg_ or size_branches or toy" >> $out/suites.log 2>&1 ) &
( for c in composite_attention_block flag_gems_layer_norm; do
    FLAGGEMS_DB_URL=sqlite:// GEMS_VENDOR=nvidia timeout 270 python3 -m kernel_lens.cli -q verify tests/libraries/$c.py --max-size 64 >> $out/verify_cases.log 2>&1
  done ) &
wait
for f in $out/*.log; do echo "== $f"; tail -4 $f; done
grep -E "launch [0-9]+ \(|launches:|result:|\[(ok|FAIL)\]" $out/verify_cases.log | head -40
