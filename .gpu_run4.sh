#!/usr/bin/env bash
source /tmp/kl-stage/env.sh
out=$OUT
ep=/tmp/kl-ep/kernel_lens-0.1.0.dist-info; mkdir -p "$ep"
printf 'Metadata-Version: 2.1\nName: kernel_lens\nVersion: 0.1.0\n' > "$ep/METADATA"
printf '[kernel_lens.targets]\nort = kernel_lens.targets.ort:OrtTarget\n' > "$ep/entry_points.txt"
export PYTHONPATH="$PWD/src:/tmp/kl-ep:$PYTHONPATH"
{ date -u; git log -1 --format=%h; } > $out/env.txt 2>&1
( timeout 330 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_hf.py > $out/hf.log 2>&1 ) &
( timeout 330 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_decode.py > $out/decode.log 2>&1 ) &
wait
for f in $out/*.log; do echo "== $f"; tail -4 $f; done
