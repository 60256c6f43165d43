"""Torch tensors to the C API: dtypes, the backend and stream of a device, addresses, and the checks every
entry point runs on its tensors before anything is allocated or called (a bad argument raises and changes
nothing).  These run on every call: each does the least work that reaches its answer (bench/RESULTS.md has
the host time per call)."""
import contextlib

import torch

from . import _capi

DTYPES = {torch.float32: _capi.MOE_F32, torch.float16: _capi.MOE_F16, torch.bfloat16: _capi.MOE_BF16}
_FLOAT_DTYPES = tuple(DTYPES)
_INDEX_DTYPES = (torch.int64,)
_DEVICE_TYPES = ("cpu", "cuda")
_NO_SCOPE = contextlib.nullcontext()
# the cudaStream_t of a device's current stream without making a torch.cuda.Stream (absent on older torch)
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # pylint: disable=protected-access


def moe_dtype(dtype):
    return DTYPES[dtype]


def backend_of(device):
    """MOE_BACKEND_REF for CPU tensors, MOE_BACKEND_CUDA for CUDA tensors; anything else raises."""
    if device.type == "cpu":
        return _capi.MOE_BACKEND_REF
    if device.type == "cuda":
        if not _capi.cuda_available():
            raise _capi.MoeError("moe_backend_available", 8,
                                 "tensors on %s, but this libmoe (%s) has no usable CUDA backend"
                                 % (device, _capi.library_path()))
        return _capi.MOE_BACKEND_CUDA
    raise ValueError("libmoe: tensors on %s: only cpu and cuda tensors are supported" % device)


def stream_of(device):
    """The cudaStream_t (an int) of torch's current stream on a CUDA device; None on the CPU."""
    if device.type != "cuda":
        return None
    if _current_raw_stream is not None:
        return _current_raw_stream(device.index if device.index is not None else torch.cuda.current_device())
    return torch.cuda.current_stream(device).cuda_stream


def device_scope(device):
    """A context that makes a CUDA tensor's device the current one for the duration of a call (nothing to do on
    the CPU, or where it is the current one already)."""
    if device.type != "cuda" or device.index is None or device.index == torch.cuda.current_device():
        return _NO_SCOPE
    return torch.cuda.device(device)


def ptr(t):
    """The address of a tensor's data, or None for an absent (None) one."""
    return None if t is None else t.data_ptr()


def check(fn, name, t, shape=None, dtypes=None, device=None, optional=False):
    """Checks argument `name` of `fn`: a torch.Tensor (or None when optional), contiguous, on `device`,
    of one of `dtypes`, of `shape` (a tuple; None entries match any extent).  Raises TypeError or
    ValueError naming the function and the argument.  Returns the tensor."""
    if t is None:
        if optional:
            return None
        raise TypeError("%s: %s is required (got None)" % (fn, name))
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s: %s must be a torch.Tensor, got %s" % (fn, name, type(t).__name__))
    if device is not None and t.device != device:
        raise ValueError("%s: %s is on %s, expected %s (every tensor of one call on one device)"
                         % (fn, name, t.device, device))
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError("%s: %s has dtype %s, expected %s" % (fn, name, t.dtype, " or ".join(str(d) for d in dtypes)))
    if shape is not None:
        have = t.shape
        matches = len(have) == len(shape)
        if matches:
            for extent, wanted in zip(have, shape):
                if wanted is not None and extent != wanted:
                    matches = False
                    break
        if not matches:
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            raise ValueError("%s: %s has shape %s, expected %s" % (fn, name, tuple(have), want))
    if not t.is_contiguous():
        raise ValueError("%s: %s is not contiguous (call .contiguous() first)" % (fn, name))
    return t


def check_float(fn, name, t, shape, device, dtype=None, optional=False):
    """check() for a floating tensor: of `dtype` when given, else of one libmoe dtype."""
    return check(fn, name, t, shape, (dtype,) if dtype is not None else _FLOAT_DTYPES, device, optional)


def check_index(fn, name, t, shape, device, optional=False):
    return check(fn, name, t, shape, _INDEX_DTYPES, device, optional)


def check_flag(fn, name, value):
    if not isinstance(value, bool):
        raise TypeError("%s: %s must be a bool, got %r" % (fn, name, value))
    return value


def check_int(fn, name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError("%s: %s must be an int >= %d, got %r" % (fn, name, minimum, value))
    return value


def check_devices(fn, **tensors):
    """Every tensor argument given (None: absent) a torch.Tensor, on one cpu or cuda device: checked before an op is entered,
    so that a meta or mixed-device call is refused rather than shape-inferred by torch's dispatcher."""
    device = first = None
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s: %s must be a torch.Tensor, got %s" % (fn, name, type(t).__name__))
        where = t.device
        if where == device:   # the first tensor's device, whose type was checked
            continue
        if where.type not in _DEVICE_TYPES:
            raise ValueError("%s: %s is on %s: only cpu and cuda tensors are supported" % (fn, name, where))
        if device is not None:
            raise ValueError("%s: %s is on %s, expected %s (the device of %s; every tensor of one call on one device)"
                             % (fn, name, where, device, first))
        device, first = where, name
