"""The C library through ctypes: where libmoe.so is found, the mirrors of the public structs of
include/moe.h, include/moe_mlp.h and include/moe_fp8.h, and every prototype this package calls, declared in one
table.

Nothing here knows about torch; the callers pass plain integers (addresses, a cudaStream_t as an int)."""
import ctypes
import ctypes.util
import os
import subprocess

# ------------------------------------------------------------------------------------------------------
# Finding the library
# ------------------------------------------------------------------------------------------------------
_LIB_NAMES = ("libmoe.so", "libmoe.so.0", "libmoe.dylib")
_HERE = os.path.dirname(os.path.abspath(__file__))


def _in_dir(directory):
    for name in _LIB_NAMES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return None


def _installed_libdir():
    """The libdir `make install` wrote next to the package (absent in the source tree and in a pip install)."""
    try:
        from . import _installed  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    return _installed.LIBDIR


def _pkg_config_libdir():
    try:
        done = subprocess.run(["pkg-config", "--variable=libdir", "moe"], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def library_candidates():
    """Where the library is looked for, in order, as (how, path or directory) pairs:
    LIBMOE_PATH (the library file, or a directory holding it); next to this package; the libdir that
    `make install` recorded; the build tree this package sits in (python/libmoe/ -> .libs/); pkg-config's
    libdir of `moe`; the system loader's search (ldconfig)."""
    env = os.environ.get("LIBMOE_PATH")
    if env:
        yield "LIBMOE_PATH", env
    yield "next to the package", _HERE
    installed = _installed_libdir()
    if installed:
        yield "make install's libdir", installed
    build_tree = os.path.normpath(os.path.join(_HERE, "..", ".."))
    yield "the build tree", os.path.join(build_tree, ".libs")
    libdir = _pkg_config_libdir()
    if libdir:
        yield "pkg-config moe", libdir
    found = ctypes.util.find_library("moe")
    if found:
        yield "the system loader", found


def _locate():
    tried = []
    for how, where in library_candidates():
        if how == "LIBMOE_PATH":
            path = where if os.path.isfile(where) else _in_dir(where) if os.path.isdir(where) else None
            if path is None:
                raise OSError("libmoe: LIBMOE_PATH=%s is neither the library nor a directory holding %s"
                              % (where, " or ".join(_LIB_NAMES)))
            return path
        if how == "the system loader":
            return where
        path = _in_dir(where)
        if path:
            return path
        tried.append("%s (%s)" % (where, how))
    raise OSError("libmoe: the C library was not found; looked in " + ", ".join(tried) +
                  ". Install libmoe, or set LIBMOE_PATH to libmoe.so or its directory.")


# ------------------------------------------------------------------------------------------------------
# Enums and structs (include/moe.h, include/moe_mlp.h, include/moe_fp8.h): field for field, in the header's order
# ------------------------------------------------------------------------------------------------------
MOE_OK = 0
MOE_F32, MOE_F16, MOE_BF16, MOE_E4M3, MOE_E5M2 = 0, 1, 2, 3, 4
MOE_FP8_SCALE_F32, MOE_FP8_SCALE_UE8M0 = 0, 1
MOE_FP8_TILE = 128
MOE_FP8_ROWS_EXPERT, MOE_FP8_ROWS_SLOT, MOE_FP8_ROWS_TOKEN = 0, 1, 2
MOE_BACKEND_REF, MOE_BACKEND_CUDA = 0, 1
MOE_MLP_DROPLESS, MOE_MLP_DROPPING = 0, 1
MOE_MLP_PAD_SKIP, MOE_MLP_PAD_ROW = 0, 1
MOE_AFFINITY_ON_H, MOE_AFFINITY_ON_I = 0, 1
ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "swish": 3}   # moe_mlp_activation

_i64p = ctypes.POINTER(ctypes.c_int64)
_enum = ctypes.c_int   # every enum of the API has int's size and alignment on the supported ABIs


class Routing(ctypes.Structure):  # moe_routing
    _fields_ = [("num_tokens", ctypes.c_int64), ("topk", ctypes.c_int64), ("num_experts", ctypes.c_int64),
                ("m_sizes", ctypes.c_void_p), ("gather_indices", ctypes.c_void_p)]


class GemmOptions(ctypes.Structure):  # moe_gemm_options
    _fields_ = [("dtype", _enum), ("dw_fp32", ctypes.c_int), ("permute_x", ctypes.c_int),
                ("permute_y", ctypes.c_int), ("reduce_topk", ctypes.c_int), ("accumulate", ctypes.c_int),
                ("allow_tf32", ctypes.c_int), ("dx_only", ctypes.c_int), ("dw_only", ctypes.c_int),
                ("stream", ctypes.c_void_p), ("ref_scratch_bytes", ctypes.c_int64)]


class MlpOptions(ctypes.Structure):  # moe_mlp_options
    _fields_ = [("dtype", _enum), ("block_size", ctypes.c_int64), ("activation", _enum), ("affinity", _enum),
                ("padding", _enum), ("bias", ctypes.c_int),
                ("has_linear_clamp_lower_limit", ctypes.c_int), ("has_linear_clamp_upper_limit", ctypes.c_int),
                ("has_non_linear_clamp_lower_limit", ctypes.c_int),
                ("has_non_linear_clamp_upper_limit", ctypes.c_int),
                ("linear_clamp_lower_limit", ctypes.c_float), ("linear_clamp_upper_limit", ctypes.c_float),
                ("non_linear_clamp_lower_limit", ctypes.c_float),
                ("non_linear_clamp_upper_limit", ctypes.c_float),
                ("tensor_update_overwrite", ctypes.c_int), ("accumulate", ctypes.c_int),
                ("grad_fp32", ctypes.c_int), ("float32_intermediates", ctypes.c_int),
                ("stream", ctypes.c_void_p)]


class MlpLayout(ctypes.Structure):  # moe_mlp_layout
    _fields_ = [("num_tokens", ctypes.c_int64), ("num_experts", ctypes.c_int64), ("num_blocks", ctypes.c_int64),
                ("block_to_expert", ctypes.c_void_p), ("token_position_to_id", ctypes.c_void_p)]


class Fp8Tensor(ctypes.Structure):  # moe_fp8_tensor
    _fields_ = [("data", ctypes.c_void_p), ("scales", ctypes.c_void_p), ("dtype", _enum)]


class Fp8Options(ctypes.Structure):  # moe_fp8_options
    _fields_ = [("out_dtype", _enum), ("scale_format", _enum), ("permute_x", ctypes.c_int),
                ("permute_y", ctypes.c_int), ("reduce_topk", ctypes.c_int), ("accumulate", ctypes.c_int),
                ("stream", ctypes.c_void_p), ("w_transposed", ctypes.c_int),
                ("codes_transposed", ctypes.c_int)]


# The mirrored structs by their C names (tests/python_abi prints the C side's sizeof and offsetof).
STRUCTS = {"moe_routing": Routing, "moe_gemm_options": GemmOptions, "moe_mlp_options": MlpOptions,
           "moe_mlp_layout": MlpLayout, "moe_fp8_tensor": Fp8Tensor, "moe_fp8_options": Fp8Options}

# ------------------------------------------------------------------------------------------------------
# Prototypes: name -> (return type, argument types).  Pointers to tensors are c_void_p (passed as ints).
# ------------------------------------------------------------------------------------------------------
_vp, _i64, _int, _st = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int
_gemm_args = [_enum, ctypes.POINTER(Routing), _i64, _i64]
# moe_quantize_fp8_columns and moe_quantize_fp8_columns_transposed
_columns_args = [_enum, ctypes.POINTER(Routing), _enum, _i64, _vp, _enum, _vp, _enum, _enum, _vp, _vp, _vp]
PROTOTYPES = {
    "moe_strerror": (ctypes.c_char_p, [_st]),
    "moe_last_error": (ctypes.c_char_p, []),
    "moe_backend_available": (_int, [_enum]),
    "moe_backend_synchronize": (_st, [_enum, _vp]),
    "moe_routing_build": (_st, [_enum, _i64, _i64, _i64, _vp, _vp, _vp, _vp, _vp]),
    "moe_gemm_fwd": (_st, _gemm_args + [_vp, _vp, _vp, _vp, ctypes.POINTER(GemmOptions)]),
    "moe_gemm_topk_weights_grad": (_st, _gemm_args + [_vp, _vp, _vp, _vp, ctypes.POINTER(GemmOptions)]),
    "moe_gemm_bwd": (_st, _gemm_args + [_vp, _vp, _vp, _vp, _vp, _vp, _vp, ctypes.POINTER(GemmOptions)]),
    "moe_mlp_layout_num_blocks": (_st, [_enum, _i64, _i64, _i64, _vp, ctypes.POINTER(MlpOptions), _i64p]),
    "moe_mlp_layout_max_blocks": (_st, [_enum, _i64, _i64, _i64, ctypes.POINTER(MlpOptions), _i64p]),
    "moe_mlp_layout_build": (_st, [_enum, _i64, _i64, _i64, _vp, _vp, _i64, _vp, _vp, _vp, _vp,
                                   ctypes.POINTER(MlpOptions)]),
    "moe_mlp_layout_build_on": (_st, [_enum, _enum, _i64, _i64, _i64, _vp, _vp, _i64, _vp, _vp, _vp, _vp, _vp,
                                      ctypes.POINTER(MlpOptions)]),
    "moe_mlp_fwd": (_st, [_enum, ctypes.POINTER(MlpLayout), _i64, _i64] + [_vp] * 9 + [ctypes.POINTER(MlpOptions)]),
    "moe_mlp_bwd": (_st, [_enum, ctypes.POINTER(MlpLayout), _i64, _i64] + [_vp] * 14 + [ctypes.POINTER(MlpOptions)]),
    "moe_quantize_fp8_rows": (_st, [_enum, _enum, _i64, _i64, _vp, _enum, _enum, _vp, _vp, _vp]),
    "moe_quantize_fp8_blocks": (_st, [_enum, _enum, _i64, _i64, _i64, _vp, _enum, _enum, _vp, _vp, _vp]),
    "moe_dequantize_fp8": (_st, [_enum, _enum, _enum, _int, _i64, _i64, _i64, _vp, _vp, _enum, _vp, _vp]),
    "moe_gemm_fp8_fwd": (_st, _gemm_args + [ctypes.POINTER(Fp8Tensor), ctypes.POINTER(Fp8Tensor), _vp, _vp,
                                            ctypes.POINTER(Fp8Options)]),
    "moe_gemm_fp8_dx": (_st, _gemm_args + [ctypes.POINTER(Fp8Tensor), ctypes.POINTER(Fp8Tensor), _vp, _vp,
                                           ctypes.POINTER(Fp8Options)]),
    "moe_gemm_fp8_dw": (_st, _gemm_args + [ctypes.POINTER(Fp8Tensor), ctypes.POINTER(Fp8Tensor), _vp,
                                           ctypes.POINTER(Fp8Options)]),
    "moe_fp8_column_scale_rows": (_i64, [_i64, _i64]),
    "moe_quantize_fp8_columns": (_st, _columns_args),
    "moe_quantize_fp8_columns_transposed": (_st, _columns_args),
}


class MoeError(RuntimeError):
    """A libmoe call failed: .status is the moe_status code, .function the C function, and the message is
    moe_strerror's text and moe_last_error()'s."""

    def __init__(self, function, status, detail):
        self.function, self.status, self.detail = function, status, detail
        text = detail if detail else function
        super().__init__("%s (%s)" % (text, _strerror(status)))


_lib = None


def lib():
    """The loaded library, its prototypes declared (loaded on first use)."""
    global _lib  # pylint: disable=global-statement
    if _lib is None:
        loaded = ctypes.CDLL(_locate())
        for name, (restype, argtypes) in PROTOTYPES.items():
            fn = getattr(loaded, name)
            fn.restype, fn.argtypes = restype, argtypes
        _lib = loaded
    return _lib


def library_path():
    """The file the library was loaded from."""
    return lib()._name  # pylint: disable=protected-access


def _strerror(status):
    return lib().moe_strerror(status).decode()


_functions = {}
_cuda = []


def cuda_available():
    """moe_backend_available(MOE_BACKEND_CUDA), asked once per process."""
    if not _cuda:
        _cuda.append(bool(lib().moe_backend_available(MOE_BACKEND_CUDA)))
    return _cuda[0]


def call(name, *args):
    """Calls the C function `name`; a status other than MOE_OK raises MoeError with moe_last_error()."""
    fn = _functions.get(name)
    if fn is None:
        fn = _functions[name] = getattr(lib(), name)
    status = fn(*args)
    if status != MOE_OK:
        raise MoeError(name, status, lib().moe_last_error().decode())


def synchronize(backend, stream):
    """moe_backend_synchronize: waits for `stream` and raises the first error the device detected."""
    call("moe_backend_synchronize", backend, stream)
