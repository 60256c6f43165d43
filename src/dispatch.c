/* The backend table: starts with the reference; gpu/ overrides it per op when built in. */
#include "moe_backend.h"

#include <stddef.h>

const moe_dispatch *moe_dispatch_for(moe_backend backend)
{
    switch (backend) {
    case MOE_BACKEND_REF: return &moe_ref_dispatch;
    case MOE_BACKEND_CUDA:
#ifdef MOE_HAVE_CUDA
        return &moe_cuda_dispatch;
#else
        return NULL;
#endif
    }
    return NULL;
}

int moe_backend_available(moe_backend backend)
{
    const moe_dispatch *table = moe_dispatch_for(backend);
    return table != NULL && table->available();
}

const char *moe_backend_name(moe_backend backend)
{
    switch (backend) {
    case MOE_BACKEND_REF: return "ref";
    case MOE_BACKEND_CUDA: return "cuda";
    }
    return "?";
}

moe_status moe_backend_synchronize(moe_backend backend, void *stream)
{
    moe_clear_error();
    const moe_dispatch *table = moe_dispatch_for(backend);
    if (table == NULL || !table->available())
        return moe_fail(MOE_ERR_NO_BACKEND, "moe_backend_synchronize: backend %s is not available",
                        moe_backend_name(backend));
    return table->synchronize != NULL ? table->synchronize(stream) : MOE_OK;
}
