/*
 * cli/call.c: one library call on the backend --backend names: the device copies of its arrays with
 * --backend cuda (device.h), and a refused call reported as an error.
 */
#include "cli.h"
#ifdef MOE_CLI_CUDA
#include "device.h"
#endif

#include <string.h>

#ifdef MOE_CLI_CUDA
/* Dies unless a CUDA device is usable, with "<prefix>no CUDA device available (<why>)<suffix>". */
void require_cuda_device(const char *prefix, const char *suffix)
{
    char why[512];
    if (device_available(why, sizeof why) != 0)
        die("%sno CUDA device available (%s)%s", prefix, why, suffix);
    if (!moe_backend_available(MOE_BACKEND_CUDA))
        die("%sno CUDA device available (moe_backend_available says no)%s", prefix, suffix);
}
#endif

/* The backend --backend names; dies when it is cuda and this build or this machine cannot run it. */
moe_backend get_backend(const args *a)
{
    const char *b = get(a, "--backend");
    if (b == NULL || strcmp(b, "ref") == 0)
        return MOE_BACKEND_REF;
    if (strcmp(b, "cuda") != 0)
        die("--backend %s: expected ref or cuda", b);
#ifndef MOE_CLI_CUDA
    die("--backend cuda: this build has no CUDA backend (configure --with-cuda where the CUDA toolkit is "
        "installed); use --backend ref");
#else
    require_cuda_device("--backend cuda: ", "; use --backend ref");
    return MOE_BACKEND_CUDA;
#endif
}

void library_failed(const char *call, moe_status status)
{
    die("%s refused the call: %s (%s)", call, moe_last_error(), moe_strerror(status));
}

void *to_device(const lib_call *c, const void *host, size_t bytes, const char *name)
{
#ifdef MOE_CLI_CUDA
    char err[512];
    void *dev;
    if (device_upload(&dev, host, bytes, name, err, sizeof err) != 0)
        die("%s: %s", c->name, err);
    return dev;
#else
    (void)host, (void)bytes, (void)name;
    die("%s: internal error: no CUDA backend in this build", c->name);
#endif
}

/* The pointer to pass for input `name` (host[0 .. bytes)); NULL stays NULL. */
const void *call_in(const lib_call *c, const char *name, const void *host, size_t bytes)
{
    if (host == NULL || c->backend == MOE_BACKEND_REF)
        return host;
    return to_device(c, host, bytes, name);
}

/* The pointer to pass for output `name`, which call_end leaves in host[0 .. bytes); NULL stays NULL. */
void *call_out(lib_call *c, const char *name, void *host, size_t bytes)
{
    if (host == NULL || c->backend == MOE_BACKEND_REF)
        return host;
    if (c->num_out == MAX_CALL_OUTPUTS)
        die("%s: internal error: more than %d outputs", c->name, MAX_CALL_OUTPUTS);
    void *dev = to_device(c, NULL, bytes, name);
    c->out[c->num_out++] = (call_output){name, host, dev, bytes};
    return dev;
}

/* The routing to pass: its m_sizes and gather_indices through call_in. */
moe_routing call_routing(const lib_call *c, const moe_routing *r)
{
    moe_routing on = *r;
    on.m_sizes = call_in(c, "m_sizes", r->m_sizes, elements(r->num_experts, 1, 1) * sizeof(int64_t));
    on.gather_indices = call_in(c, "gather_indices", r->gather_indices,
                                elements(r->num_tokens, r->topk, 1) * sizeof(int64_t));
    return on;
}

void call_end(lib_call *c, moe_status status)
{
    if (status != MOE_OK)
        library_failed(c->name, status);
    if (c->backend == MOE_BACKEND_REF)
        return;
#ifdef MOE_CLI_CUDA
    status = moe_backend_synchronize(MOE_BACKEND_CUDA, NULL);
    if (status != MOE_OK)
        die("%s (CUDA) refused the call: %s (%s)", c->name, moe_last_error(), moe_strerror(status));
    char err[512];
    for (int i = 0; i < c->num_out; i++)
        if (device_download(c->out[i].host, c->out[i].dev, c->out[i].bytes, c->out[i].name, err, sizeof err) != 0)
            die("%s: %s", c->name, err);
    device_free_all();
    c->num_out = 0;
#endif
}

