"""Torch tensors to the C API: dtypes, the backend and stream of a device, addresses, and the checks every
entry point runs on its tensors before anything is allocated or called (a bad argument raises and changes
nothing)."""
import torch

from . import _capi

DTYPES = {torch.float32: _capi.MOE_F32, torch.float16: _capi.MOE_F16, torch.bfloat16: _capi.MOE_BF16}


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
    return torch.cuda.current_stream(device).cuda_stream


class DeviceScope:
    """Makes a CUDA tensor's device the current one for the duration of a call (no-op on the CPU)."""

    def __init__(self, device):
        self.scope = torch.cuda.device(device) if device.type == "cuda" else None

    def __enter__(self):
        if self.scope is not None:
            self.scope.__enter__()
        return self

    def __exit__(self, *exc):
        if self.scope is not None:
            self.scope.__exit__(*exc)
        return False


def ptr(t):
    """The address of a tensor's data, or None for an absent (None) one."""
    return None if t is None else t.data_ptr()


def _shape_matches(have, want):
    if len(have) != len(want):
        return False
    for extent, wanted in zip(have, want):
        if wanted is not None and extent != wanted:
            return False
    return True


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
    if shape is not None and not _shape_matches(t.shape, shape):
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise ValueError("%s: %s has shape %s, expected %s" % (fn, name, tuple(t.shape), want))
    if not t.is_contiguous():
        raise ValueError("%s: %s is not contiguous (call .contiguous() first)" % (fn, name))
    return t


def check_float(fn, name, t, shape, device, dtype=None, optional=False):
    """check() for a floating tensor: of `dtype` when given, else of one libmoe dtype."""
    return check(fn, name, t, shape, (dtype,) if dtype is not None else tuple(DTYPES), device, optional)


def check_index(fn, name, t, shape, device, optional=False):
    return check(fn, name, t, shape, (torch.int64,), device, optional)


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
    device = None
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError("%s: %s must be a torch.Tensor, got %s" % (fn, name, type(t).__name__))
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError("%s: %s is on %s: only cpu and cuda tensors are supported" % (fn, name, t.device))
        if device is None:
            device, first = t.device, name
        elif t.device != device:
            raise ValueError("%s: %s is on %s, expected %s (the device of %s; every tensor of one call on one device)"
                             % (fn, name, t.device, device, first))
