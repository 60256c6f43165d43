"""libmoe for PyTorch: the C library's MoE kernels on torch tensors, with autograd.

CPU tensors run the CPU reference, CUDA tensors the CUDA kernels on torch.cuda.current_stream() without
host synchronisation.  The library is found at import by LIBMOE_PATH, next to this package, make install's
libdir, the build tree, pkg-config or the system loader (libmoe._capi.library_candidates).

    routing_from_topk   m_sizes, gather and scatter indices of a router's topk ids
    grouped_gemm        the grouped GEMM, every mode, differentiable
    mlp_layout, moe_mlp the blockwise MoE MLP, every option, differentiable
    MoEExperts          an nn.Module expert layer on moe_mlp
    quantize_fp8_rows, quantize_fp8_blocks, dequantize_fp8, grouped_gemm_fp8, grouped_gemm_fp8_dx
                        FP8 (DeepSeek-V3's tile and block scales): the quantizers and the GEMM on codes
    quantize_fp8_columns, grouped_gemm_fp8_dw, column_scale_rows
                        FP8 dW (128 x 1 tiles along each expert's rows)
    grouped_gemm_fp8_train
                        the grouped GEMM on FP8 codes with autograd (DeepSeek-V3's recipe, the quantization
                        inside)
    compat              Unsloth's grouped_gemm and torch._grouped_mm call forms
    synchronize         reports an error the CUDA backend found on the device
"""
import torch

from . import _capi, _ops, compat
from ._capi import MoeError
from ._raw import routing_from_topk
from .fp8 import (column_scale_rows, dequantize_fp8, grouped_gemm_fp8, grouped_gemm_fp8_dw, grouped_gemm_fp8_dx,
                  quantize_fp8_blocks, quantize_fp8_columns, quantize_fp8_rows)
from .fp8_train import grouped_gemm_fp8_train
from .gemm import grouped_gemm
from .layer import MoEExperts
from .mlp import MlpLayout, mlp_layout, moe_mlp, to_nki_layout

__all__ = ["MoeError", "routing_from_topk", "grouped_gemm", "mlp_layout", "MlpLayout", "moe_mlp", "to_nki_layout",
           "MoEExperts", "compat", "synchronize", "library_path", "HAS_CUSTOM_OP", "cuda_available",
           "quantize_fp8_rows", "quantize_fp8_blocks", "dequantize_fp8", "grouped_gemm_fp8", "grouped_gemm_fp8_dx",
           "quantize_fp8_columns", "grouped_gemm_fp8_dw", "column_scale_rows", "grouped_gemm_fp8_train"]
__version__ = "0.1.0"

HAS_CUSTOM_OP = _ops.HAS_CUSTOM_OP


def library_path():
    """The libmoe shared library this package loaded."""
    return _capi.library_path()


def cuda_available():
    """True when the loaded libmoe has a CUDA backend and a device."""
    return _capi.cuda_available()


def synchronize(device=None):
    """Waits for torch's current stream on a CUDA device and raises MoeError for the first error the CUDA
    backend detected on the device since the last call (a routing or layout whose contents are invalid, an
    FP8 scale or a value to quantize that is not finite: such a call writes nothing and returns at once).
    No-op for the CPU."""
    device = torch.device(device) if device is not None else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
    if device.type != "cuda":
        return
    with torch.cuda.device(device):
        _capi.synchronize(_capi.MOE_BACKEND_CUDA, torch.cuda.current_stream(device).cuda_stream)
