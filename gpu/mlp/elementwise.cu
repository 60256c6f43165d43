// The MLP's elementwise kernels: the token lists and per-token sums (out, d_hidden), the affinity gradient's dot
// products, the bias gradients, the checkpoints' padding and the rows path's down checkpoint; and their launches.
#include "common/cuda_check.cuh"
#include "common/launch.cuh"
#include "mlp/steps.cuh"
#include "mlp/vec.cuh"

namespace moe_gpu {
namespace {

// tile path) in ascending expert order, one warp per token with ballots over pair_pos.
__global__ void token_lists_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    const int lane = threadIdx.x % 32;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t t = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; t < g.T; t += warps) {
        int64_t next = 0;
        for (int64_t e0 = 0; e0 < g.E; e0 += 32) {
            const long long pos = e0 + lane < g.E ? g.pair_pos[t * g.E + e0 + lane] : NONE;
            const unsigned bits = __ballot_sync(0xffffffffu, pos != NONE);
            if (pos != NONE) {
                const int64_t j = t * g.E + next + __popc(bits & ((1u << lane) - 1u));
                g.tok_list[j] = g.pos_row != nullptr ? g.pos_row[pos] : (int64_t)pos;
                g.tok_expert[j] = e0 + lane;
            }
            next += __popc(bits);
        }
        if (lane == 0)
            g.tok_count[t] = next;
    }
}

// The token sums' walk: for every token t < token_rows and V-wide chunk h of H (grid-stride),
// dst[t][h ..] = the sum over j = 0 .. tok_count[t] - 1 (ascending expert order) of what
// contribution(t, j, h, c) leaves in c[V] (its first term taken as is: no +0 added); +0 for tokens in no
// block and for the pad row.
template <int V, class Contribution>
__device__ __forceinline__ void token_sums(const MlpArgs &g, void *dst, Contribution contribution)
{
    const int64_t H = g.H, chunks = H / V;
    GRID_STRIDE(idx, g.token_rows * chunks)
    {
        const int64_t t = idx / chunks, h = idx % chunks * V;
        float acc[V];
        for (int u = 0; u < V; u++)
            acc[u] = 0.0f;
        if (t < g.T) {
            const int64_t count = g.tok_count[t];
            for (int64_t j = 0; j < count; j++) {
                float c[V];
                contribution(t, j, h, c);
                for (int u = 0; u < V; u++)
                    acc[u] = j == 0 ? c[u] : acc[u] + c[u];
            }
        }
        store_v<V>(g.dt, dst, t * H + h, acc);
    }
}

// dst[t][h] = sum over the token's positions in ascending expert order of rows[row][h].  (out in the
// forward, d_hidden in the backward.)  V-wide chunks of h (V = 8: 16-byte stores of 16-bit
// dst; token_rows picks it when H % 8 == 0 and both tensors are 16-byte aligned; faster than one element per
// thread under ncu: bench/RESULTS.md, "the backward's gate_bwd and token sums").
template <int V>
__global__ void token_rows_kernel(MlpArgs g, const float *rows, void *dst)
{
    if (*g.status != ERR_NONE)
        return;
    token_sums<V>(g, dst, [&](int64_t t, int64_t j, int64_t h, float *c) {
        load_row_v<V>(g, rows, g.tok_list[t * g.E + j], g.split ? g.tok_expert[t * g.E + j] : 0, g.H, h, c);
    });
}

// Rows path forward: out[t][h] = sum over the token's positions (ascending expert order) of its
// contribution from the down GEMM's row D: ON_H a*(D + b_d), ON_I D + a*b_d.  V-wide chunks of h.
// With write_ckpt (ON_H with a down checkpoint) it also writes the checkpoint rnd(D + b_d) of each
// position it reads, so D is read once (down_ckpt_kernel does this for ON_I, from Dre).
template <int V>
__global__ void token_out_kernel(MlpArgs g, int write_ckpt)
{
    if (*g.status != ERR_NONE)
        return;
    const int64_t H = g.H;
    token_sums<V>(g, g.out, [&](int64_t t, int64_t j, int64_t h, float *c) {
        const int64_t row = g.tok_list[t * g.E + j], e = g.tok_expert[t * g.E + j];
        const float a = load_as_float(g.dt, g.aff, t * g.E + e);
        float bd[V];
        load_row_v<V>(g, g.Dr, row, e, H, h, c);
        if (write_ckpt) { // ON_H
            if (g.bias) {
                load_v<V>(g.dt, g.b_d, e * H + h, bd);
                for (int u = 0; u < V; u++)
                    c[u] = c[u] + bd[u];
            }
            store_v<V>(g.dt, g.ckpt_d, g.row_pos[row] * H + h, c);
            for (int u = 0; u < V; u++)
                c[u] = a * c[u];
        } else if (g.bias) {
            load_v<V>(g.dt, g.b_d, e * H + h, bd);
            for (int u = 0; u < V; u++)
                c[u] = g.on_i ? c[u] + a * bd[u] : a * (c[u] + bd[u]);
        } else if (!g.on_i) {
            for (int u = 0; u < V; u++)
                c[u] = a * c[u];
        }
    });
}

// da[pos] = <G[tok], d[pos]>, d from the down checkpoint or recomputed in float32 (ON_I without one: the
// tile path keeps it by position with the bias, the rows path by row without it).  One warp per
// position, lanes over V-wide strided chunks of h then a fixed butterfly: deterministic.
template <int V>
__global__ void dot_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    const int lane = threadIdx.x % 32;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32), H = g.H;
    for (int64_t pos = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32; pos < g.positions; pos += warps) {
        const int64_t tok = token_of(g, pos);
        if (tok < 0)
            continue;
        const int64_t d_row = g.pos_row != nullptr ? g.pos_row[pos] : pos, e = g.b2e[pos / g.B];
        float sum = 0.0f;
        for (int64_t h = lane * (int64_t)V; h < H; h += 32 * V) {
            float G[V], d[V];
            load_v<V>(g.dt, g.out_grad, tok * H + h, G);
            if (g.ckpt_d_in != nullptr) {
                load_v<V>(g.dt, g.ckpt_d_in, pos * H + h, d);
            } else {
                load_row_v<V>(g, g.Dre, d_row, e, H, h, d);
                if (g.dre_bias) {
                    float bd[V];
                    load_v<V>(g.dt, g.b_d, e * H + h, bd);
                    for (int u = 0; u < V; u++)
                        d[u] = d[u] + bd[u];
                }
            }
            for (int u = 0; u < V; u++)
                sum = fmaf(G[u], d[u], sum);
        }
        for (int off = 16; off > 0; off /= 2)
            sum += __shfl_xor_sync(0xffffffffu, sum, off);
        if (lane == 0)
            g.da[pos] = sum;
    }
}

// d_affinities[t*E + e] = da of the pair's position, +0 for pairs outside the layout.
__global__ void daff_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    GRID_STRIDE(idx, g.T * g.E)
    {
        const long long pos = g.pair_pos[idx];
        store_from_float(g.dt, g.d_aff, idx, pos == NONE ? 0.0f : g.da[pos]);
    }
}

// db_d[e][h] = sum a*G[tok][h], db_gu[e][j] = sum dGU[pos][j], over the expert's positions ascending.
__global__ void bias_grad_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    const int64_t cols = g.H + 2 * g.I;
    GRID_STRIDE(idx, g.E * cols)
    {
        const int64_t e = idx / cols, c = idx % cols;
        float sum = 0.0f;
        for (int64_t q = g.expert_start[e]; q < g.expert_start[e + 1]; q++) {
            const int64_t n = g.expert_blocks[q];
            for (int64_t b = 0; b < g.B; b++) {
                const int64_t pos = n * g.B + b, tok = token_of(g, pos);
                if (tok < 0)
                    continue;
                sum = sum + (c < g.H ? scaled_grad(g, tok, load_as_float(g.dt, g.aff, tok * g.E + e), c, true)
                                     : g.dGU[pos * 2 * g.I + (c - g.H)]);
            }
        }
        if (c < g.H)
            store_grad(g, g.d_bd, e * g.H + c, sum);
        else
            store_grad(g, g.d_bgu, e * 2 * g.I + (c - g.H), sum);
    }
}

// +0 at the padding positions of the checkpoints, before the epilogues write the real ones.  Work items over
// the whole grid, per block with padding: its gate_up_ckpt_T slab [2][I][B] (contiguous; 16-byte stores when
// vec) in segments of ZERO_SEGMENT elements, then its down_ckpt padding rows (16-byte stores when vec_d) in
// groups of ZERO_ROWS positions.  (It was one CTA per block, which left most of the device idle and ran slower
// under ncu; bench/RESULTS.md, "MLP zero_padding_kernel over the whole grid".)
constexpr int64_t ZERO_SEGMENT = 8192, ZERO_ROWS = 16;
// Work items of one block: its gate_up_ckpt_T segments (zero_gu_items), then its down_ckpt row groups.
__host__ __device__ inline int64_t zero_gu_items(const MlpArgs &g)
{
    return g.ckpt_gu != nullptr ? (2 * g.I * g.B + ZERO_SEGMENT - 1) / ZERO_SEGMENT : 0;
}
__host__ __device__ inline int64_t zero_items_per_block(const MlpArgs &g)
{
    return zero_gu_items(g) + (g.ckpt_d != nullptr ? (g.B + ZERO_ROWS - 1) / ZERO_ROWS : 0);
}

__global__ void zero_padding_kernel(MlpArgs g, int vec, int vec_d)
{
    if (*g.status != ERR_NONE)
        return;
    const int64_t slab = 2 * g.I * g.B, per_block = zero_items_per_block(g), gu_items = zero_gu_items(g);
    for (int64_t item = blockIdx.x; item < g.num_blocks * per_block; item += gridDim.x) {
        const int64_t n = item / per_block, part = item % per_block;
        if (g.block_rows[n] == g.B)
            continue;
        if (part < gu_items) { // elements begin .. end - 1 of block n's slab (multiples of 8 when vec)
            const int64_t begin = part * ZERO_SEGMENT, end = begin + ZERO_SEGMENT < slab ? begin + ZERO_SEGMENT : slab;
            const int64_t first = n * slab;
            if (vec) {
                uint4 *p = reinterpret_cast<uint4 *>(static_cast<uint16_t *>(g.ckpt_gu) + first);
                for (int64_t q = begin / 8 + threadIdx.x; q < end / 8; q += blockDim.x)
                    p[q] = make_uint4(0, 0, 0, 0);
            } else {
                for (int64_t q = begin + threadIdx.x; q < end; q += blockDim.x)
                    store_from_float(g.dt, g.ckpt_gu, first + q, 0.0f);
            }
        } else { // positions r0 .. r0 + rows - 1 of block n: rows of H elements, 8 at a time when vec_d
            const int64_t r0 = (part - gu_items) * ZERO_ROWS, rows = g.B - r0 < ZERO_ROWS ? g.B - r0 : ZERO_ROWS;
            const int64_t per_row = vec_d ? g.H / 8 : g.H;
            for (int64_t q = threadIdx.x; q < rows * per_row; q += blockDim.x) {
                const int64_t pos = n * g.B + r0 + q / per_row, c = q % per_row;
                if (g.pos_row[pos] >= 0)
                    continue;
                if (vec_d)
                    reinterpret_cast<uint4 *>(g.ckpt_d)[pos * per_row + c] = make_uint4(0, 0, 0, 0);
                else
                    store_from_float(g.dt, g.ckpt_d, pos * g.H + c, 0.0f);
            }
        }
    }
}

// The down checkpoint from the down GEMM's rows: ON_H rnd(D + b_d), ON_I rnd(Dre + b_d) (Dre = M0r . W_d).
// Launched for ON_I only: token_out_kernel writes ON_H's while it forms the contributions to out.  One
// CTA per row.
template <int V>
__global__ void down_ckpt_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    const int64_t R = rows_total(g), H = g.H;
    const float *D = g.on_i ? g.Dre : g.Dr;
    for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
        const int64_t pos = g.row_pos[r], e = g.b2e[pos / g.B];
        for (int64_t h = threadIdx.x * (int64_t)V; h < H; h += (int64_t)blockDim.x * V) {
            float d[V], bd[V];
            load_row_v<V>(g, D, r, e, H, h, d);
            if (g.bias) {
                load_v<V>(g.dt, g.b_d, e * H + h, bd);
                for (int u = 0; u < V; u++)
                    d[u] = d[u] + bd[u];
            }
            store_v<V>(g.dt, g.ckpt_d, pos * H + h, d);
        }
    }
}

// db_d[e][h] = sum of rnd(a*G) (split: a*G) over the expert's rows, db_gu[e][j] = sum of dGUr (split: of its
// terms' sums), ascending rows.
__global__ void rows_bias_grad_kernel(MlpArgs g)
{
    if (*g.status != ERR_NONE)
        return;
    const int64_t cols = g.H + 2 * g.I;
    GRID_STRIDE(idx, g.E * cols)
    {
        const int64_t e = idx / cols, c = idx % cols;
        float sum = 0.0f;
        for (int64_t r = g.row_offsets[e]; r < g.row_offsets[e + 1]; r++) {
            if (c >= g.H) {
                sum = sum + load_operand(g, g.dGUr, r, e, 2 * g.I, c - g.H);
            } else if (!g.a_in_m) {
                sum = sum + load_as_float(g.dt, g.Sr, r * g.H + c); // already rnd(a*G)
            } else {
                const float aG = row_affinity(g, g.row_pos[r]) * load_as_float(g.dt, g.Sr, r * g.H + c);
                sum = sum + (g.split ? aG : round_to_dtype(g.dt, aG));
            }
        }
        if (c < g.H)
            store_grad(g, g.d_bd, e * g.H + c, sum);
        else
            store_grad(g, g.d_bgu, e * 2 * g.I + (c - g.H), sum);
    }
}

} // namespace

// dot_kernel with 16-byte vectors when every operand allows them.
moe_status launch_dot(const MlpArgs &g, cudaStream_t stream)
{
    if (g.positions == 0)
        return MOE_OK;
    const int64_t wanted = cdiv(g.positions * 32, 256);
    const bool vec = g.H % 8 == 0 && aligned16(g.out_grad) &&
                     (g.ckpt_d_in != nullptr ? aligned16(g.ckpt_d_in) : !g.dre_bias || aligned16(g.b_d));
    if (vec)
        dot_kernel<8><<<resident_grid(dot_kernel<8>, 256, wanted), 256, 0, stream>>>(g);
    else
        dot_kernel<1><<<resident_grid(dot_kernel<1>, 256, wanted), 256, 0, stream>>>(g);
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

// tok_count, tok_list, tok_expert (token_lists_kernel) for the kernels that walk tokens.
void launch_token_lists(const MlpArgs &g, cudaStream_t stream)
{
    if (g.T > 0)
        token_lists_kernel<<<resident_grid(token_lists_kernel, 256, cdiv(g.T * 32, 256)), 256, 0, stream>>>(g);
}

// Needs the token lists (launch_token_lists).
moe_status token_rows(const MlpArgs &g, const float *rows, void *dst, cudaStream_t stream)
{
    if (g.token_rows * g.H == 0)
        return MOE_OK;
    if (g.H % 8 == 0 && aligned16(rows) && aligned16(dst))
        token_rows_kernel<8><<<resident_grid(token_rows_kernel<8>, 256, cdiv(g.token_rows * g.H / 8, 256)), 256, 0,
                               stream>>>(g, rows, dst);
    else
        token_rows_kernel<1><<<resident_grid(token_rows_kernel<1>, 256, cdiv(g.token_rows * g.H, 256)), 256, 0,
                               stream>>>(g, rows, dst);
    MOE_CUDA_CHECK(cudaGetLastError());
    return MOE_OK;
}

// zero_padding_kernel for a forward that writes a checkpoint (rows path).
void launch_zero_padding(const MlpArgs &a, cudaStream_t stream)
{
    const int64_t NB = a.positions, H = a.H, I = a.I;
    if ((a.ckpt_gu != nullptr || a.ckpt_d != nullptr) && NB > 0)
        zero_padding_kernel<<<grid_for(a.num_blocks * zero_items_per_block(a), 1, (int64_t)sm_count() * 8), 256, 0,
                              stream>>>(a, (I * a.B) % 4 == 0 && aligned16(a.ckpt_gu),
                                        H % 8 == 0 && aligned16(a.ckpt_d));
}

// down_ckpt_kernel (vec: H % 8 == 0 and an aligned bias or none).
void launch_down_ckpt(const MlpArgs &a, bool vec, cudaStream_t stream)
{
    const int64_t NB = a.positions;
    if (vec && aligned16(a.ckpt_d))
        down_ckpt_kernel<8><<<resident_grid(down_ckpt_kernel<8>, 256, NB), 256, 0, stream>>>(a);
    else
        down_ckpt_kernel<1><<<resident_grid(down_ckpt_kernel<1>, 256, NB), 256, 0, stream>>>(a);
}

// token_out_kernel (vec: as launch_down_ckpt's; ckpt_in_token_out: it writes ON_H's down checkpoint).
void launch_token_out(const MlpArgs &a, bool vec, int ckpt_in_token_out, cudaStream_t stream)
{
    const int64_t wanted = cdiv(a.token_rows * a.H, 256);
    if (vec && aligned16(a.out) && (!ckpt_in_token_out || aligned16(a.ckpt_d)))
        token_out_kernel<8><<<resident_grid(token_out_kernel<8>, 256, wanted), 256, 0, stream>>>(a, ckpt_in_token_out);
    else
        token_out_kernel<1><<<resident_grid(token_out_kernel<1>, 256, wanted), 256, 0, stream>>>(a, ckpt_in_token_out);
}

// daff_kernel over the T * E pairs (cap: the grid's limit).
void launch_daff(const MlpArgs &a, int64_t cap, cudaStream_t stream)
{
    if (a.T * a.E > 0)
        daff_kernel<<<grid_for(a.T * a.E, 256, cap), 256, 0, stream>>>(a);
}

// bias_grad_kernel (the tile path's bias gradients; cap: the grid's limit).
void launch_bias_grad(const MlpArgs &a, int64_t cap, cudaStream_t stream)
{
    bias_grad_kernel<<<grid_for(a.E * (a.H + 2 * a.I), 256, cap), 256, 0, stream>>>(a);
}

// rows_bias_grad_kernel (the rows path's bias gradients; cap: the grid's limit).
void launch_rows_bias_grad(const MlpArgs &a, int64_t cap, cudaStream_t stream)
{
    rows_bias_grad_kernel<<<grid_for(a.E * (a.H + 2 * a.I), 256, cap), 256, 0, stream>>>(a);
}

} // namespace moe_gpu
