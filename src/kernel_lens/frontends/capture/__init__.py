"""Capture: the model's forward run once with Triton patched, every kernel launch recorded with
its arguments (``recorder``). On a CPU-only host the kernels run in Triton's interpreter, with
bounds-checked memory (``interpreter_bounds``), torch's rounding for casts
(``interpreter_casts``) and libdevice evaluated on the CPU (``libdevice_cpu``); library launchers
and tensor-like arguments are handled in ``launchers`` and ``tensor_likes``."""
