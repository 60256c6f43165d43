// The sticky device-error record: the first invalid input a family of check kernels found, kept on the device
// until the host takes it (moe_backend_synchronize).  One type and one pair of functions; each family (the GEMM's
// routing check, the MLP's layout check, the device builders) defines its own instance beside its kernels.
#ifndef LIBMOE_GPU_COMMON_DEVICE_ERROR_CUH
#define LIBMOE_GPU_COMMON_DEVICE_ERROR_CUH

#include "common/cuda_check.cuh"

namespace moe_gpu {

struct DeviceErrorRecord {
    int kind;            // 0: none; else the family's error kind (-1 while a kernel fills the record)
    int op;              // the entry point whose call found it, in the family's numbering
    long long detail[8]; // the facts of the family's message (the family's enum names the slots)
};

// The words of every message built from a record.
constexpr char DEVICE_ERROR_WHERE[] = "(CUDA, detected on the device; the call wrote nothing)";

// Device: makes *record hold an error of `kind` (nonzero) unless it holds one already.  The first caller claims
// the record (kind -1), fill(record) writes op and the details, and kind is published after a fence, so that a
// record whose kind is set is complete.
template <class Fill>
__device__ __forceinline__ void publish_device_error(DeviceErrorRecord *record, int kind, Fill fill)
{
    if (atomicCAS(&record->kind, 0, -1) == 0) { // claim the record, then publish it
        fill(record);
        __threadfence();
        atomicExch(&record->kind, kind);
    }
}

// Host, after the stream has been synchronised: *taken = the record `symbol` (a __device__ DeviceErrorRecord of
// the calling compile unit), which is then cleared when it held an error (taken->kind != 0).
inline moe_status take_device_error(const DeviceErrorRecord &symbol, DeviceErrorRecord *taken)
{
    MOE_CUDA_CHECK(cudaMemcpyFromSymbol(taken, symbol, sizeof *taken));
    if (taken->kind == 0)
        return MOE_OK;
    const DeviceErrorRecord cleared = {};
    MOE_CUDA_CHECK(cudaMemcpyToSymbol(symbol, &cleared, sizeof cleared));
    return MOE_OK;
}

} // namespace moe_gpu

#endif
