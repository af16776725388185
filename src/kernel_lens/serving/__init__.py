"""Export compiled models to NVIDIA Triton Inference Server model repositories, and run a
``tritonserver`` on them without a container.

- :func:`export_triton` (``kernel_lens export-triton``): one model of a repository, for Triton's
  onnxruntime backend or its python backend (:mod:`.backends`, one class per kind);
- :mod:`.tritonserver`: start the ``tritonserver`` of PyPI's nvidia-pytriton wheel (fetched by
  ``scripts/fetch_tritonserver.py``, :mod:`.fetch`) on a repository;
- ``triton_python_model.py``: the python backend's ``model.py``, copied as is.

See docs/serving.md.
"""


def __getattr__(name: str):
    # Lazy: scripts/fetch_tritonserver.py imports .fetch with the standard library only.
    if name in ("export_triton", "TritonExport"):
        from . import export  # lazy: facade; onnx, pydantic, jinja2 only for an export
        return getattr(export, name)
    if name in ("BACKENDS", "get_backend"):
        from . import backends  # lazy: facade (scripts import .fetch alone)
        return getattr(backends, name)
    raise AttributeError(f"module 'kernel_lens.serving' has no attribute {name!r}")


__all__ = ["BACKENDS", "TritonExport", "export_triton", "get_backend"]
