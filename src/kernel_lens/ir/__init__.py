"""The kernel_lens IR: pydantic models, JSON round-trip exact, schema published."""

from .graph import (SCHEMA_VERSION, ConstantData, ConstArg, Dispatch, GraphIR, Launch, LaunchArg,
                    ListArg, RuntimeCheck, RuntimeSymbol, SizeBox, SizePiece, SymArg, TensorValue, TorchOp, ValueArg, ValueBranch, json_schema)
from .kernel import (AbiParam, CompileOptions, ConstexprValue, DTypeValue, JitValue, KernelBinary,
                     KernelIR, KernelParam, ParamKind, Role, SourceInfo, Specialization, TmaMeta,
                     TupleValue)
from .symbolic import SymbolInfo, SymExpr, evaluate, format_expr, inexact_reason, parse, symbol
from .types import DType

__all__ = [
    "SCHEMA_VERSION", "AbiParam", "Dispatch", "CompileOptions", "ConstantData", "ConstArg",
    "ConstexprValue", "DType", "DTypeValue", "GraphIR", "JitValue", "TmaMeta", "TupleValue",
    "KernelBinary", "KernelIR", "KernelParam", "Launch", "LaunchArg", "ListArg", "ParamKind",
    "Role", "RuntimeCheck", "RuntimeSymbol", "SizeBox", "SizePiece", "SourceInfo", "Specialization", "SymArg", "SymbolInfo", "SymExpr", "TensorValue", "ValueBranch",
    "TorchOp", "ValueArg", "evaluate", "format_expr", "inexact_reason", "json_schema", "parse",
    "symbol",
]
