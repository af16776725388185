"""What a served model looks like to Triton: its inputs and outputs as ``config.pbtxt`` states
them (name, Triton data type, dims), read from the ONNX graph the server runs.

The ONNX graph is the contract: both backends run exactly that graph, so the config is derived
from its inputs and outputs, never from the model file. The IR contributes only the ranges of
the symbolic dims (to check a requested batch size against them).

Rules (Triton's, see docs/serving.md):
- a dim with a ``dim_param`` (a symbol such as ``seq``, or an expression such as ``2*n``) is
  dynamic: ``-1``; a ``dim_value`` is kept;
- ``max_batch_size: 0`` (the default) states full dims; with ``max_batch_size > 0`` the leading
  dim of every input and output must be one and the same symbol, which becomes Triton's batch
  dim and leaves ``dims``;
- Triton has no rank-0 tensor in a non-batching model: a rank-0 tensor is served as ``[1]``
  (Triton's onnxruntime backend maps the two; the python backend's model.py reshapes); a batched
  tensor that is only its batch dim is ``dims: [1]`` with ``reshape: { shape: [] }``.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from pydantic import BaseModel, ConfigDict

from ..errors import ArtifactError, InputError
from ..ir import GraphIR

log = logging.getLogger(__name__)

# ONNX TensorProto element type -> Triton's model-config DataType. What is not here (float8,
# int4, complex, strings, ...) has no Triton data type a kernel_lens model could use.
TRITON_TYPES = {
    onnx.TensorProto.BOOL: "TYPE_BOOL",
    onnx.TensorProto.UINT8: "TYPE_UINT8",
    onnx.TensorProto.UINT16: "TYPE_UINT16",
    onnx.TensorProto.UINT32: "TYPE_UINT32",
    onnx.TensorProto.UINT64: "TYPE_UINT64",
    onnx.TensorProto.INT8: "TYPE_INT8",
    onnx.TensorProto.INT16: "TYPE_INT16",
    onnx.TensorProto.INT32: "TYPE_INT32",
    onnx.TensorProto.INT64: "TYPE_INT64",
    onnx.TensorProto.FLOAT16: "TYPE_FP16",
    onnx.TensorProto.FLOAT: "TYPE_FP32",
    onnx.TensorProto.DOUBLE: "TYPE_FP64",
    onnx.TensorProto.BFLOAT16: "TYPE_BF16",
}

DYNAMIC = -1
# Tensor and model names end up in URLs, JSON and file names: the same safe alphabet for all.
SAFE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,127}")
# File names an export writes into NAME/1/ and names in config.pbtxt: one plain name, no path
# separator, no quote, no escape, no control character, not hidden (nor '.' / '..').
SAFE_FILE_NAME = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9._\-]{0,254}")


class TensorSpec(BaseModel):
    """One input or output as ``config.pbtxt`` states it."""

    model_config = ConfigDict(frozen=True)

    name: str
    data_type: str          # Triton's DataType name, e.g. TYPE_FP32
    dims: list[int]         # -1 for a dynamic dim; the batch dim left out when batching
    onnx_shape: list[str]   # the ONNX graph's dims (ints and dim_params as text), for messages
    reshape: list[int] | None = None  # [] for a batched tensor that is only its batch dim


class ModelInterface(BaseModel):
    """The served interface of one model: ``max_batch_size``, inputs and outputs in graph order."""

    model_config = ConfigDict(frozen=True)

    max_batch_size: int
    batch_symbol: str | None  # the ONNX dim_param Triton batches over (max_batch_size > 0)
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


def check_name(name: str, what: str, fix: str) -> str:
    """``name`` when it is a safe name (letters, digits, '_', '-'; a letter or '_' first)."""
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name):
        raise InputError(f"{what} {name!r} is not a safe name: use letters, digits, '_' and '-' "
                         f"(starting with a letter or '_', at most 128; no path separators); {fix}")
    return name


def check_file_name(name: str, what: str, fix: str) -> str:
    """``name`` when it is a plain file name from [A-Za-z0-9._-] not starting with '.': what may
    be written into ``NAME/1/`` and named in ``config.pbtxt`` (an ``ArtifactError`` otherwise, as
    such names come from a compiled folder's manifest or graph)."""
    if not isinstance(name, str) or not SAFE_FILE_NAME.fullmatch(name):
        raise ArtifactError(f"{what} {name!r} is not a plain file name: only letters, digits, '.', "
                            f"'_' and '-' (not starting with '.') are exported; {fix}")
    return name


def load_graph(onnx_path: str | Path) -> onnx.ModelProto:
    """The ONNX model at ``onnx_path`` without its external data; one typed line if it cannot be read."""
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except (DecodeError, OSError, ValueError) as exc:
        raise ArtifactError(f"{onnx_path} is not a readable ONNX model ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}); recompile the "
                            f"model into its folder") from None
    if not model.graph.output:
        raise ArtifactError(f"{onnx_path} holds no ONNX graph with outputs (empty or truncated file); "
                            f"recompile the model into its folder")
    return model


def _dims(value: onnx.ValueInfoProto, model: str) -> tuple[list[int], list[str]]:
    if not value.type.HasField("tensor_type"):
        raise InputError(f"{model}: graph input/output {value.name!r} is not a tensor; Triton serves tensors")
    dims, text = [], []
    for d in value.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            if d.dim_value < 1:
                raise InputError(f"{model}: {value.name!r} has a static dim of size {d.dim_value}; "
                                 f"Triton dims must be >= 1 or dynamic (-1)")
            dims.append(d.dim_value)
            text.append(str(d.dim_value))
        else:
            dims.append(DYNAMIC)
            text.append(d.dim_param or "?")
    return dims, text


def _spec(value: onnx.ValueInfoProto, model: str) -> TensorSpec:
    check_name(value.name, f"{model}: tensor name", "rename the model's input (the ONNX graph's names "
               "come from the model's forward arguments)")
    elem = value.type.tensor_type.elem_type
    if elem not in TRITON_TYPES:
        kind = onnx.TensorProto.DataType.Name(elem) if elem in onnx.TensorProto.DataType.values() else elem
        raise InputError(f"{model}: {value.name!r} is of ONNX type {kind}, which Triton Inference Server "
                         f"has no data type for (it has {', '.join(sorted(set(TRITON_TYPES.values())))}); "
                         f"convert it in the model (e.g. take float16 and cast inside forward)")
    dims, text = _dims(value, model)
    return TensorSpec(name=value.name, data_type=TRITON_TYPES[elem], dims=dims or [1], onnx_shape=text)


def _batched(spec: TensorSpec) -> TensorSpec:
    """``spec`` without its leading (batch) dim; a tensor that is only its batch dim is stated as
    dims [1] reshaped to [] (Triton's way of saying "one value per batch entry")."""
    if len(spec.dims) == 1:
        return spec.model_copy(update={"dims": [1], "reshape": []})
    return spec.model_copy(update={"dims": spec.dims[1:]})


def _batch_symbol(specs: list[TensorSpec], model: str, max_batch_size: int, ir: GraphIR) -> str:
    """The one symbol every tensor's leading dim is, checked against its range in the IR."""
    leading = {s.name: (s.onnx_shape[0] if s.onnx_shape else "(rank 0)") for s in specs}
    symbols = set(leading.values())
    if len(symbols) != 1 or next(iter(symbols)) not in ir.symbols:
        listed = ", ".join(f"{n}: {d}" for n, d in leading.items())
        raise InputError(f"{model}: --max-batch-size {max_batch_size} needs every input and output to "
                         f"lead with one and the same dynamic dim (Triton's batch dim); their leading "
                         f"dims are {listed}; export with --max-batch-size 0 (full dims, the default)")
    symbol = next(iter(symbols))
    info = ir.symbols[symbol]
    if info.max is not None and info.max < max_batch_size:
        raise InputError(f"{model}: --max-batch-size {max_batch_size} exceeds the range of the batch "
                         f"dim {symbol!r} ({info.min}..{info.max}) the model was compiled for; pass at "
                         f"most {info.max}, or recompile with a larger range")
    if info.min > 1:
        log.warning("%s: the batch dim %r was compiled for sizes %d..%s: the model refuses requests "
                    "with a batch smaller than %d (recompile with a smaller min to serve them)",
                    model, symbol, info.min, info.max, info.min)
    return symbol


def read_interface(onnx_path: str | Path, ir: GraphIR, max_batch_size: int = 0) -> ModelInterface:
    """The served interface of the ONNX graph at ``onnx_path`` (its weights are not read)."""
    graph = load_graph(onnx_path).graph
    model = ir.name
    inputs = [_spec(v, model) for v in graph.input]
    outputs = [_spec(v, model) for v in graph.output]
    if max_batch_size < 0:
        raise InputError(f"--max-batch-size must be 0 (no batching) or positive, got {max_batch_size}")
    if max_batch_size == 0:
        return ModelInterface(max_batch_size=0, batch_symbol=None, inputs=inputs, outputs=outputs)
    symbol = _batch_symbol(inputs + outputs, model, max_batch_size, ir)
    return ModelInterface(max_batch_size=max_batch_size, batch_symbol=symbol,
                          inputs=[_batched(s) for s in inputs], outputs=[_batched(s) for s in outputs])
