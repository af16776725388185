"""Which ONNX spelling of attention and linear layers ORT's CUDA EP runs fastest, on the fp16
LLaMA block of ``bench_decode.py`` (examples/llama_block.py, hidden 4096, 32 heads, FFN 11008).

    python benchmarks/bench_block_lowering.py --artifacts kl_decode_bench/block_dynamic_seq_fp16 \\
        --json block_lowering.json

``--artifacts`` is a kernel_lens folder of the block (bench_decode.py writes one; without it the
block is compiled here). The ONNX model there is rewritten into variants beside it, each run
with the same plugin library through kernel_lens's ORT runner (no CUDA graph), at every
``--tokens``:

* ``as_compiled``: the artifact (ONNX ``Attention`` on 3-D inputs, ``MatMul`` on pre-transposed
  weights);
* ``attention_4d``: ``Attention`` on 4-D (batch, heads, seq, dim) inputs;
* ``mha_contrib``: ORT's ``com.microsoft.MultiHeadAttention`` (3-D inputs, ``unidirectional``
  for causal);
* ``gemm_transb``: every ``MatMul`` by a 2-D weight as ``Gemm(transB=1)`` on the weight in
  torch's (out, in) layout, between 2-D reshapes.

Reported per variant and token count: median CUDA-event ms of ``--iters`` calls, the max abs
difference from eager, and the GPU kernels of one call (``bench_decode.kernel_profile``); eager
PyTorch is the first row. A variant that fails is recorded with its error.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_decode as B  # noqa: E402  (sys.path: src/, examples/)

import kernel_lens as kl  # noqa: E402
from kernel_lens.runtime.ort import OrtModel  # noqa: E402


def _attention_node(model):
    nodes = [n for n in model.graph.node if n.op_type == "Attention" and n.domain in ("", "ai.onnx")]
    if len(nodes) != 1:
        raise RuntimeError(f"expected one Attention node, found {len(nodes)}")
    node = nodes[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if "q_num_heads" not in attrs:
        raise RuntimeError("the Attention node is not on 3-D inputs")
    return node, attrs


def _const(model, name, values):
    model.graph.node.insert(0, helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name + "_t", onnx.TensorProto.INT64, [len(values)], values)))
    return name


def attention_4d(model, head_dim):
    node, attrs = _attention_node(model)
    n_heads, kv_heads = attrs.pop("q_num_heads"), attrs.pop("kv_num_heads")
    idx = list(model.graph.node).index(node)
    new = []
    split_q = _const(model, "v4_split_q", [0, 0, n_heads, head_dim])
    split_kv = _const(model, "v4_split_kv", [0, 0, kv_heads, head_dim])
    flat = _const(model, "v4_flat", [0, 0, n_heads * head_dim])
    ins = []
    for i, (name, shape) in enumerate(zip(node.input[:3], [split_q, split_kv, split_kv])):
        new.append(helper.make_node("Reshape", [name, shape], [f"v4_r{i}"]))
        new.append(helper.make_node("Transpose", [f"v4_r{i}"], [f"v4_t{i}"], perm=[0, 2, 1, 3]))
        ins.append(f"v4_t{i}")
    new.append(helper.make_node("Attention", ins + list(node.input[3:]), ["v4_y"], **attrs))
    new.append(helper.make_node("Transpose", ["v4_y"], ["v4_yt"], perm=[0, 2, 1, 3]))
    new.append(helper.make_node("Reshape", ["v4_yt", flat], [node.output[0]]))
    idx = list(model.graph.node).index(node)
    model.graph.node.remove(node)
    for k, n in enumerate(new):
        model.graph.node.insert(idx + k, n)
    return model


def mha_contrib(model, head_dim):
    node, attrs = _attention_node(model)
    if len(node.input) > 3 and node.input[3]:
        raise RuntimeError("masked attention: not rewritten")
    if attrs["q_num_heads"] != attrs["kv_num_heads"]:
        raise RuntimeError("grouped-query attention: MultiHeadAttention needs equal head counts")
    mha = helper.make_node("MultiHeadAttention", list(node.input[:3]), [node.output[0]],
                           domain="com.microsoft", num_heads=attrs["q_num_heads"],
                           unidirectional=int(attrs.get("is_causal", 0)))
    if "scale" in attrs:
        mha.attribute.append(helper.make_attribute("scale", attrs["scale"]))
    idx = list(model.graph.node).index(node)
    model.graph.node.remove(node)
    model.graph.node.insert(idx, mha)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def gemm_transb(model, head_dim):
    inits = {i.name: i for i in model.graph.initializer}
    nodes = list(model.graph.node)
    done = 0
    for node in nodes:
        if node.op_type != "MatMul" or node.input[1] not in inits or len(inits[node.input[1]].dims) != 2:
            continue
        w = inits[node.input[1]]
        k, n = w.dims
        wt = numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(w).T), w.name + "_nk")
        model.graph.initializer.append(wt)
        a, y = node.input[0], node.output[0]
        tag = f"g{done}"
        flat = _const(model, f"{tag}_flat", [-1, k])
        start, end = _const(model, f"{tag}_s0", [0]), _const(model, f"{tag}_s1", [-1])
        nn = _const(model, f"{tag}_n", [n])
        new = [helper.make_node("Reshape", [a, flat], [f"{tag}_a2"]),
               helper.make_node("Gemm", [f"{tag}_a2", wt.name], [f"{tag}_y2"], transB=1),
               helper.make_node("Shape", [a], [f"{tag}_shape"]),
               helper.make_node("Slice", [f"{tag}_shape", start, end], [f"{tag}_lead"]),
               helper.make_node("Concat", [f"{tag}_lead", nn], [f"{tag}_out_shape"], axis=0),
               helper.make_node("Reshape", [f"{tag}_y2", f"{tag}_out_shape"], [y])]
        idx = list(model.graph.node).index(node)
        model.graph.node.remove(node)
        for j, m in enumerate(new):
            model.graph.node.insert(idx + j, m)
        done += 1
    if not done:
        raise RuntimeError("no MatMul by a 2-D weight")
    used = {i for nd in model.graph.node for i in nd.input}
    keep = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    return model


VARIANTS = {"attention_4d": attention_4d, "mha_contrib": mha_contrib, "gemm_transb": gemm_transb}


def write_variant(onnx_path: Path, name: str, head_dim: int) -> Path:
    model = onnx.load(str(onnx_path))  # external data (if any) loaded
    model = VARIANTS[name](model, head_dim)
    out = onnx_path.with_name(f"{onnx_path.stem}.{name}.onnx")
    big = model.ByteSize() > 1_800_000_000
    onnx.save(model, str(out), save_as_external_data=big, location=out.name + ".data" if big else None)
    return out


def time_calls(fn, x, iters):
    for _ in range(5):
        fn(x)
    torch.cuda.synchronize()
    return B.time_calls(fn, x, iters)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifacts", default=None)
    parser.add_argument("--json", default="block_lowering.json")
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    import llama_block as LB

    result = {"env": B.environment(argparse.Namespace(tokens=0), torch.float16), "rows": [], "errors": {}}
    result["env"].pop("config", None)
    save = lambda: Path(args.json).write_text(json.dumps(result, indent=1))  # noqa: E731
    with torch.no_grad():
        block = LB.LlamaBlock(**B.BLOCK_CONFIG, seed=0).to("cuda", torch.float16).eval()
        block.inv_freq = block.inv_freq.float()
    if args.artifacts:
        compiled = kl.load(args.artifacts)
    else:
        x = torch.randn(1, 8, B.BLOCK_CONFIG["hidden"]).to("cuda", torch.float16)
        compiled = kl.compile(block, (x,), dynamic_shapes=LB.dynamic_shapes, targets=["ort"],
                              output_dir="kl_block_lowering")
    onnx_path, library = Path(compiled.artifacts["ort.onnx"]), compiled.artifacts["ort.library"]
    head_dim = B.BLOCK_CONFIG["hidden"] // B.BLOCK_CONFIG["n_heads"]
    models = {"as_compiled": OrtModel(compiled.ir, onnx_path, library)}
    for name in args.variants:
        try:
            t0 = time.perf_counter()
            path = write_variant(onnx_path, name, head_dim)
            models[name] = OrtModel(compiled.ir, path, library)
            print(f"variant {name}: written in {time.perf_counter() - t0:.1f} s", flush=True)
        except Exception as exc:  # noqa: BLE001 - recorded
            traceback.print_exc()
            result["errors"][name] = f"{type(exc).__name__}: {exc}"[:1000]
    for tokens in args.tokens:
        g = torch.Generator().manual_seed(tokens)
        x = torch.randn(1, tokens, B.BLOCK_CONFIG["hidden"], generator=g).to("cuda", torch.float16)
        with torch.no_grad():
            want = block(x).float()
            fns = {"eager": block}
            fns.update({name: (lambda xx, m=m: m.run(xx)) for name, m in models.items()})
            for name, fn in fns.items():
                row = {"tokens": tokens, "variant": name}
                try:
                    times = time_calls(fn, x, args.iters)
                    diff = (fn(x).float() - want).abs()
                    row.update(ms=round(statistics.median(times), 4), max_abs_diff=float(diff.max()),
                               profile=B.kernel_profile(lambda: fn(x)))
                except Exception as exc:  # noqa: BLE001
                    traceback.print_exc()
                    row["error"] = f"{type(exc).__name__}: {exc}"[:1000]
                torch.cuda.synchronize()
                print(json.dumps({k: v for k, v in row.items() if k != "profile"}), flush=True)
                result["rows"].append(row)
                save()
    save()


if __name__ == "__main__":
    with torch.cuda.stream(torch.cuda.Stream()):
        main()
