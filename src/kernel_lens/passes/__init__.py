"""The pass pipeline: Pass, PassManager and the built-in passes."""

from .base import Pass, PassContext, PassManager, PassResult, PassTiming, dump_to_dir
from .grid_canonicalization import GridCanonicalization
from .ptx_clamp import PtxIsaClamp
from .role_inference import RoleInference, infer_roles
from .specialization import SpecializationGuards
from .verify import verify

BUILTIN_PASSES = (RoleInference, GridCanonicalization, SpecializationGuards, PtxIsaClamp)


def default_pipeline() -> PassManager:
    """role inference, grid canonicalization, specialization, PTX ISA clamping; verified."""
    return PassManager([cls() for cls in BUILTIN_PASSES], verify=verify)


__all__ = ["BUILTIN_PASSES", "GridCanonicalization", "Pass", "PassContext", "PassManager",
           "PassResult", "PassTiming", "PtxIsaClamp", "RoleInference", "SpecializationGuards",
           "default_pipeline", "dump_to_dir", "infer_roles", "verify"]
