"""A torch CUDA graph of ONNX Runtime's ``Run``, and the checks that make replaying it exact.

ORT's own CUDA-graph mode replays through ``Run``, which costs host time on every call (the
session's bookkeeping, and a stream synchronization unless it is turned off). Capturing ``Run``
in a torch CUDA graph on the session's own compute stream leaves a replay that is one
``cudaGraphLaunch``. It is exact only if everything the captured work reads is device memory
that outlives the graph and is not reused meanwhile:

* ORT's arena: warm runs before the capture make the arena as large as a run needs, so the
  capture allocates nothing; the session is used for nothing but this graph afterwards (and a
  session's graphs replay on one stream at a time), so the intermediate buffers the graph
  recorded are not handed out to anyone else;
* cuBLAS / cuDNN workspaces: allocated by the warm runs, kept by the session;
* host memory: a node copying from host memory (ORT stages small parameter arrays through pinned
  buffers it frees after ``Run``) or a host callback (ORT's deferred release of such buffers)
  would read or free memory that is gone at replay. :func:`host_dependencies` lists such nodes of
  the captured graph through the CUDA driver, and the runtime refuses the graph when there are
  any.

Finally the first replay is compared bit for bit with a plain run of the same session on the same
inputs; a difference is an error naming the output.
"""

from __future__ import annotations

import ctypes
import functools
from collections import Counter
from typing import Iterator

from ..errors import KernelLensError

# CUgraphNodeType and CUmemorytype values of the CUDA driver API (cuda.h).
_NODE_MEMCPY, _NODE_HOST, _NODE_GRAPH = 1, 3, 4
_MEMORY_HOST = 1
_POINTER_ATTRIBUTE_MEMORY_TYPE = 2


class _Memcpy3D(ctypes.Structure):  # CUDA_MEMCPY3D
    _fields_ = [
        ("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t), ("srcZ", ctypes.c_size_t),
        ("srcLOD", ctypes.c_size_t), ("srcMemoryType", ctypes.c_int), ("srcHost", ctypes.c_void_p),
        ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p), ("reserved0", ctypes.c_void_p),
        ("srcPitch", ctypes.c_size_t), ("srcHeight", ctypes.c_size_t),
        ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t), ("dstZ", ctypes.c_size_t),
        ("dstLOD", ctypes.c_size_t), ("dstMemoryType", ctypes.c_int), ("dstHost", ctypes.c_void_p),
        ("dstDevice", ctypes.c_uint64), ("dstArray", ctypes.c_void_p), ("reserved1", ctypes.c_void_p),
        ("dstPitch", ctypes.c_size_t), ("dstHeight", ctypes.c_size_t),
        ("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t), ("Depth", ctypes.c_size_t),
    ]


@functools.lru_cache(maxsize=1)
def _driver() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise KernelLensError(f"cannot load the CUDA driver (libcuda.so.1) to check a captured "
                              f"graph: {exc}") from None


def _check(status: int, call: str) -> None:
    if status != 0:
        raise KernelLensError(f"CUDA driver call {call} failed with CUresult {status} while "
                              f"checking a captured graph")


def _nodes(graph: int) -> list[int]:
    cuda = _driver()
    count = ctypes.c_size_t(0)
    _check(cuda.cuGraphGetNodes(ctypes.c_void_p(graph), None, ctypes.byref(count)), "cuGraphGetNodes")
    nodes = (ctypes.c_void_p * max(count.value, 1))()
    _check(cuda.cuGraphGetNodes(ctypes.c_void_p(graph), nodes, ctypes.byref(count)), "cuGraphGetNodes")
    return [nodes[i] for i in range(count.value)]


def _is_host_memory(params: _Memcpy3D) -> bool:
    if params.srcMemoryType == _MEMORY_HOST:
        return True
    if params.srcDevice == 0:
        return False
    kind = ctypes.c_uint(0)
    status = _driver().cuPointerGetAttribute(ctypes.byref(kind), _POINTER_ATTRIBUTE_MEMORY_TYPE,
                                             ctypes.c_uint64(params.srcDevice))
    return status == 0 and kind.value == _MEMORY_HOST


def _walk(graph: int) -> Iterator[tuple[int, int]]:
    """Every node of ``graph`` with its CUgraphNodeType, the nodes of child graphs included."""
    cuda = _driver()
    for node in _nodes(graph):
        kind = ctypes.c_int(-1)
        _check(cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)), "cuGraphNodeGetType")
        yield node, kind.value
        if kind.value == _NODE_GRAPH:
            child = ctypes.c_void_p(0)
            _check(cuda.cuGraphChildGraphNodeGetGraph(ctypes.c_void_p(node), ctypes.byref(child)),
                   "cuGraphChildGraphNodeGetGraph")
            yield from _walk(child.value)


def host_dependencies(graph: int) -> list[str]:
    """What the captured graph ``graph`` (a ``CUgraph`` handle) reads from or does on the host:
    copies from host memory and host callbacks, described one per entry (child graphs too)."""
    found = []
    for node, kind in _walk(graph):
        if kind == _NODE_HOST:
            found.append("a host callback")
        elif kind == _NODE_MEMCPY:
            params = _Memcpy3D()
            _check(_driver().cuGraphMemcpyNodeGetParams(ctypes.c_void_p(node), ctypes.byref(params)),
                   "cuGraphMemcpyNodeGetParams")
            if _is_host_memory(params):
                found.append(f"a copy of {params.WidthInBytes} bytes from host memory")
    return found


_KINDS = ["kernel", "memcpy", "memset", "host", "graph", "empty", "wait_event", "event_record",
          "ext_semas_signal", "ext_semas_wait", "mem_alloc", "mem_free", "batch_mem_op", "conditional"]


def node_kinds(graph: int) -> dict[str, int]:
    """How many nodes of each kind (CUgraphNodeType, by name) the graph ``graph`` holds, child
    graphs included (and counted as ``graph`` nodes themselves): what a replay launches, for
    diagnostics."""
    return dict(Counter(_KINDS[k] if 0 <= k < len(_KINDS) else f"type_{k}" for _, k in _walk(graph)))
