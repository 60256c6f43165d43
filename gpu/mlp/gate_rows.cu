// The rows path's gate kernels, compiled per dtype and activation: gate_act_kernel (the unfused forward's
// elementwise step after the gate/up GEMM) and gate_bwd_kernel (the backward's, from the checkpoint and dM).
#include <type_traits>

#include "common/act.cuh"
#include "common/cp_async.cuh"
#include "common/cuda_check.cuh"
#include "common/launch.cuh"
#include "mlp/steps.cuh"
#include "mlp/vec.cuh"

namespace moe_gpu {
namespace {

// What the elementwise kernels need of a row, computed once per row (64-bit divisions are costly).
struct RowInfo {
    int64_t pos, e, tok;
    int64_t ckpt; // gate_up_ckpt_T index of (half 0, i = 0) for this position: n*2*I*B + b
    float a;      // A[tok][e]
};

// With `expert_affinity` false, e, tok and a are left zero (two dependent loads fewer).
__device__ __forceinline__ RowInfo row_info(const MlpArgs &g, int64_t r, bool expert_affinity)
{
    RowInfo ri = {};
    ri.pos = g.row_pos[r];
    const int64_t n = ri.pos / g.B, b = ri.pos - n * g.B;
    ri.ckpt = n * 2 * g.I * g.B + b;
    if (expert_affinity) {
        ri.e = g.b2e[n];
        ri.tok = g.ids[ri.pos];
        ri.a = load_as_float(g.dt, g.aff, ri.tok * g.E + ri.e);
    }
    return ri;
}

// Tiles of 32 rows x GATE_SPAN intermediate columns, walked 32 columns at a time; CTA (32, 8).  The
// checkpoint [N][2][I][B] is read or written with lanes along the slot, everything else with lanes
// along i, through shared memory.
constexpr int RT = 32, GATE_SPAN = 256;

// A chunk's elements with lanes along i, V consecutive i per thread (V = 4 needs 4 | I): RT / V threads
// per row of the chunk, 8 V rows per pass, LANE_PASSES<V> passes; element(pass, row, col, r, i) for each row
// inside R and i < I (row, col: the first of the V in the tile; r, i: in R x I).
template <int V> constexpr int LANE_PASSES = RT / (8 * V);
template <int V, class Element>
__device__ __forceinline__ void chunk_lanes_along_i(int64_t R, int64_t I, int64_t r0, int64_t i0, Element element)
{
    constexpr int PER_ROW = RT / V;
    static_assert(LANE_PASSES<V> * 8 * V == RT, "V divides RT / 8");
    const int t = threadIdx.y * RT + threadIdx.x, col = t % PER_ROW * V;
#pragma unroll
    for (int pass = 0; pass < LANE_PASSES<V>; pass++) {
        const int rr = t / PER_ROW + pass * 8 * V;
        const int64_t r = r0 + rr, i = i0 + col;
        if (r >= R || i >= I)
            continue;
        element(pass, rr, col, r, i);
    }
}

// The gate kernels are compiled per dtype (DT, a moe_dtype) and activation (ACT, a moe_mlp_activation),
// which must equal g.dt and g.act (launch_gate_kernel): with both switched at run time per element they
// issued about twice the instructions the memory traffic needs (ncu; bench/RESULTS.md,
// "MLP elementwise profile, gate kernels per dtype and activation").  The gate kernels are speed-critical: time any
// change to them per kernel (ncu gpu__time_duration; bench/RESULTS.md has the history).
//
// Forward epilogue of the gate/up GEMM: bias, clamps, the checkpoint, Mr = rnd(act(g)*u [*a]) and
// (ON_I with a down checkpoint) M0r = rnd(act(g)*u).  Grid-stride over the tiles (RT rows from r0,
// GATE_SPAN columns from i_first), each walked RT columns (a chunk from i0) at a time.  Warp ty = 0 loads
// the RowInfo of a tile's rows into info when the tile starts.  In a chunk, thread (tx, ty) has column
// i0 + tx of rows r0 + ty, r0 + ty + 8, ... (lanes along i), whose gate and up values go through gs / us to
// the checkpoint stores with lanes along the slot (row r0 + tx, columns ty, ty + 8, ...).
//
// Measured (ncu, H200; bench/RESULTS.md, "gate_act's loads first"):
// - The chunk's fp32 loads are all issued before its first store, which the compiler may not move them past
//   (Mr may alias GU for all it knows): faster at Qwen3-30B-A3B T = 16384 unfused and gpt-oss-120b T = 4096.
//   Loading the next chunk's values during this one's work gained less (at 64 registers); the GENERAL split
//   of gate_bwd with unrolled checkpoint stores lost.
// - What bounds it is issue, not load latency: at gpt-oss, SM throughput well above DRAM throughput, many
//   cycles per issued instruction at 34 warps per SM (5 CTAs).
// - 4 consecutive i per thread and slot-pair words (as gate_bwd_kernel): slower, with both and with the words
//   alone (bench/RESULTS.md, "4 consecutive i per thread, checkpoint slot pairs").
template <int DT, int ACT>
__global__ void __launch_bounds__(RT * 8) gate_act_kernel(MlpArgs g)
{
    constexpr moe_dtype dt = static_cast<moe_dtype>(DT);
    constexpr int P = RT / 8; // rows per thread in a chunk
    if (*g.status != ERR_NONE)
        return;
    __shared__ float gs[RT][RT + 1], us[RT][RT + 1];
    __shared__ RowInfo info[RT];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t R = rows_total(g), I = g.I, spans = (I + GATE_SPAN - 1) / GATE_SPAN;
    for (int64_t tile = blockIdx.x; tile < (R + RT - 1) / RT * spans; tile += gridDim.x) {
        const int64_t r0 = tile / spans * RT, i_first = tile % spans * GATE_SPAN;
        const int64_t i_end = i_first + GATE_SPAN < I ? i_first + GATE_SPAN : I;
        __syncthreads(); // the previous chunk's checkpoint stores have read info
        if (ty == 0 && r0 + tx < R)
            info[tx] = row_info(g, r0 + tx, g.bias || g.on_i || g.split);
        for (int64_t i0 = i_first; i0 < i_end; i0 += RT) {
            float gv[P], uv[P]; // 0 outside R x I
#pragma unroll
            for (int p = 0; p < P; p++) {
                const int64_t r = r0 + ty + 8 * p, i = i0 + tx;
                const bool inside = r < R && i < I;
                gv[p] = inside ? g.GU[r * 2 * I + i] : 0.0f;
                uv[p] = inside ? g.GU[r * 2 * I + I + i] : 0.0f;
            }
            __syncthreads(); // info is written; the previous chunk's checkpoint stores have read gs and us
#pragma unroll
            for (int p = 0; p < P; p++) {
                const int row = ty + 8 * p;
                const int64_t r = r0 + row, i = i0 + tx;
                if (r >= R || i >= I)
                    continue;
                const int64_t e = info[row].e;
                float gp = gv[p], up = uv[p];
                if (g.bias) {
                    gp = gp + load_as_float(dt, g.b_gu, e * 2 * I + i);
                    up = up + load_as_float(dt, g.b_gu, e * 2 * I + I + i);
                }
                gp = clamp_value(gp, g.has_nl_lo, g.nl_lo, g.has_nl_hi, g.nl_hi);
                up = clamp_value(up, g.has_lin_lo, g.lin_lo, g.has_lin_hi, g.lin_hi);
                const float m = act_value(ACT, gp) * up, mr = g.on_i ? m * info[row].a : m;
                store_operand_v<1>(g, dt, g.Mr, r, info[row].e, I, i, &mr);
                if (g.M0r != nullptr)
                    store_operand_v<1>(g, dt, g.M0r, r, info[row].e, I, i, &m);
                gs[row][tx] = gp, us[row][tx] = up;
            }
            __syncthreads();
            if (g.ckpt_gu != nullptr && r0 + tx < R) {
                for (int col = ty; col < RT && i0 + col < I; col += 8) {
                    const int64_t i = i0 + col;
                    store_from_float(dt, g.ckpt_gu, info[tx].ckpt + i * g.B, gs[tx][col]);
                    store_from_float(dt, g.ckpt_gu, info[tx].ckpt + (I + i) * g.B, us[tx][col]);
                }
            }
        }
    }
}

// A checkpoint value from the 32-bit word of shared memory that holds it: the word itself (f32), or its half
// at bit `shift` (0 or 16; f16 and bf16).
template <int DT>
__device__ __forceinline__ float ckpt_word_value(uint32_t word, int shift)
{
    if constexpr (DT == MOE_F32)
        return __uint_as_float(word);
    else if constexpr (DT == MOE_F16)
        return __half2float(__ushort_as_half((unsigned short)(word >> shift)));
    else
        return __uint_as_float((word >> shift) << 16);
}

// Backward: from the checkpoint and dMr, Mr = rnd(m [*a]) (d_w_d's operand), M0r = rnd(m) (when d is
// recomputed), dGUr = (rnd(dg), rnd(du)) with the strict clamp masks on the checkpointed values.  Compiled
// per dtype and activation as gate_act_kernel; V = 4 (4 | I) moves 4 consecutive i per thread.
//   The loads are asynchronous and one chunk ahead: chunk c + 1's dMr values and checkpoint columns are copied
// into shared memory (cp.async) while chunk c is computed from the other of two stages.  Loaded synchronously,
// chunk by chunk, the kernel was bound by latency (ncu on an H200: DRAM well below its peak, few eligible warps
// per scheduler; bench/RESULTS.md, "the backward's gate_bwd and token sums" and
// "gate_bwd's loads one chunk ahead by cp.async").
//   The checkpoint is read with lanes along the slot, one 4-byte copy per (row, i, gate or up): of a 16-bit
// dtype, the aligned 32-bit word that holds the row's element (`words`, ckpt_words: a 4-byte aligned
// checkpoint and B even; the word's other half is the neighbouring slot's and goes unused), from which
// compute() takes the half at bit 16 * (slot & 1).  (It read two rows' elements as one word where they were
// consecutive slots at an even index, and the others by 2-byte loads: those waited in the issuing thread and
// made a large share of the kernel's stall samples; the words ran faster under ncu on an H200: bench/RESULTS.md,
// "gate_bwd's checkpoint reads all asynchronous".)  Without `words` (a checkpoint aligned to 2 bytes only, or
// B odd) the 16-bit elements are loaded
// synchronously into the low halves.  It is instantiated for f16 and bf16 only (launch_gate_kernel: the rows
// path takes no f32); its ES == 4 branches keep the template whole for f32.
//   Instructions are kept few, for the kernel was bound in part by issuing them (ncu source counters of the words
// form: stalls "not selected" and "selected" a large share of the samples): a whole chunk's checkpoint copies are
// one unrolled run (RT / 8 per thread, far fewer instructions than as a loop); the chunks of a call without
// clamps, the affinity on m (a_in_m: ON_I, split operands) or M0r (GENERAL false) skip those steps' tests; a
// tile's start reads the affinity's chain (ids, b2e, affinities) only with a_in_m.  That cut the executed
// instructions by about a third and ran faster (ncu, H200; bench/RESULTS.md,
// "gate_bwd issues fewer instructions").
// Issuing the next tile's first chunk before the current tile's last is computed (no idle tile start) measured
// slower each time, through the instructions it added (bench/RESULTS.md,
// "the next tile's first chunk issued early" and "lean against lean with the tile-ahead stream").
// Staging: dm_s [stage][row][col] float32; ck_s [stage][gate, up][col][row] the 32-bit words (RT + 1 per
// column: the copies' lanes along row and compute's (8 column groups x 4 rows) both free of bank conflicts).
// MOE_GATE_BWD_MIN_CTAS, a compile-time knob for experiments: the CTAs per SM asked of ptxas.  Unset, ptxas
// picks 57 registers for the bf16 SiLU V = 4 instance (4 CTAs per SM); 5 forces 48 without spills there and
// was slower (bench/RESULTS.md, "lean, at its own 57 registers and forced to 48").
#ifdef MOE_GATE_BWD_MIN_CTAS
#define MOE_GATE_BWD_BOUNDS __launch_bounds__(RT * 8, MOE_GATE_BWD_MIN_CTAS)
#else
#define MOE_GATE_BWD_BOUNDS __launch_bounds__(RT * 8)
#endif
template <int DT, int ACT, int V>
__global__ void MOE_GATE_BWD_BOUNDS gate_bwd_kernel(MlpArgs g, bool words)
{
    constexpr moe_dtype dt = static_cast<moe_dtype>(DT);
    constexpr int ES = dt == MOE_F32 ? 4 : 2;
    if (*g.status != ERR_NONE)
        return;
    __shared__ __align__(16) float dm_s[2][RT][RT];
    __shared__ uint32_t ck_s[2][2][RT][RT + 1];
    __shared__ RowInfo info[RT];
    const int64_t R = rows_total(g), I = g.I, B = g.B, spans = (I + GATE_SPAN - 1) / GATE_SPAN;
    const int64_t i_stride = B * ES, half_stride = I * B * ES; // bytes from (i) to (i + 1), from gate to up
    const int tx = threadIdx.x, ty = threadIdx.y;
    const unsigned char *ck_row = nullptr; // this thread's checkpoint row (tile row tx) at i = 0, gate half
    // chunk (r0, i0) into stage `stage`: the elements compute() below reads, and no others
    auto issue = [&](int stage, int64_t r0, int64_t i0) {
        chunk_lanes_along_i<V>(R, I, r0, i0, [&](int, int row, int col, int64_t r, int64_t i) {
            if constexpr (V == 4)
                cp_async16(&dm_s[stage][row][col], g.dMr + r * I + i, true);
            else
                cp_async4(&dm_s[stage][row][col], g.dMr + r * I + i);
        });
        if (ck_row == nullptr) { // this thread's row lies past R: no checkpoint to copy
        } else if ((ES == 4 || words) && i0 + RT <= I) { // a whole chunk: RT / 8 columns, unrolled
            const unsigned char *gate = ck_row + (i0 + ty) * i_stride;
            const int64_t step = 8 * i_stride;
#pragma unroll
            for (int j = 0; j < RT / 8; j++) {
                cp_async4(&ck_s[stage][0][ty + 8 * j][tx], gate + j * step);
                cp_async4(&ck_s[stage][1][ty + 8 * j][tx], gate + j * step + half_stride);
            }
        } else {
            for (int ii = ty; ii < RT && i0 + ii < I; ii += 8) {
                const unsigned char *gate = ck_row + (i0 + ii) * i_stride, *up = gate + half_stride;
                if (ES == 4 || words) {
                    cp_async4(&ck_s[stage][0][ii][tx], gate);
                    cp_async4(&ck_s[stage][1][ii][tx], up);
                } else {
                    ck_s[stage][0][ii][tx] = *reinterpret_cast<const uint16_t *>(gate);
                    ck_s[stage][1][ii][tx] = *reinterpret_cast<const uint16_t *>(up);
                }
            }
        }
        cp_async_commit();
    };
    // GENERAL (a std::bool_constant): false for a call without clamps, the affinity on m or M0r, whose chunks
    // then run without those steps' tests and arithmetic
    auto compute_as = [&](auto GENERAL, int stage, int64_t r0, int64_t i0) {
        constexpr bool general = decltype(GENERAL)::value;
        chunk_lanes_along_i<V>(R, I, r0, i0, [&](int, int row, int col, int64_t r, int64_t i) {
            const float a = general && g.a_in_m ? info[row].a : 1.0f;
            const int shift = ES == 2 && words ? 16 * (int)(info[row].ckpt & 1) : 0;
            float m[V], dg[V], du[V];
#pragma unroll
            for (int v = 0; v < V; v++) {
                const float gv = ckpt_word_value<DT>(ck_s[stage][0][col + v][row], shift);
                const float uv = ckpt_word_value<DT>(ck_s[stage][1][col + v][row], shift);
                const float act = act_value(ACT, gv);
                m[v] = act * uv;
                const float dm = general && g.a_in_m ? a * dm_s[stage][row][col + v] : dm_s[stage][row][col + v];
                const bool pass_u = !general || ((!g.has_lin_lo || g.lin_lo < uv) && (!g.has_lin_hi || uv < g.lin_hi));
                const bool pass_g = !general || ((!g.has_nl_lo || g.nl_lo < gv) && (!g.has_nl_hi || gv < g.nl_hi));
                du[v] = pass_u ? dm * act : 0.0f;
                dg[v] = pass_g ? dm * uv * act_derivative(ACT, gv) : 0.0f;
            }
            const int64_t e = info[row].e; // loaded where the split path needs it (a_in_m)
            if (general && g.M0r != nullptr)
                store_operand_v<V>(g, dt, g.M0r, r, e, I, i, m);
            if (general && g.a_in_m)
#pragma unroll
                for (int v = 0; v < V; v++)
                    m[v] = a * m[v];
            store_operand_v<V>(g, dt, g.Mr, r, e, I, i, m);
            store_operand_v<V>(g, dt, g.dGUr, r, e, 2 * I, i, dg);
            store_operand_v<V>(g, dt, g.dGUr, r, e, 2 * I, I + i, du);
        });
    };
    const bool general = g.a_in_m || g.M0r != nullptr || g.has_lin_lo || g.has_lin_hi || g.has_nl_lo || g.has_nl_hi;
    auto compute = [&](int stage, int64_t r0, int64_t i0) {
        if (general)
            compute_as(std::true_type{}, stage, r0, i0);
        else
            compute_as(std::false_type{}, stage, r0, i0);
    };
    const unsigned char *ckpt = static_cast<const unsigned char *>(g.ckpt_gu_in);
    for (int64_t tile = blockIdx.x; tile < (R + RT - 1) / RT * spans; tile += gridDim.x) {
        const int64_t r0 = tile / spans * RT, i_first = tile % spans * GATE_SPAN;
        const int64_t i_end = i_first + GATE_SPAN < I ? i_first + GATE_SPAN : I;
        // the previous tile's last chunk ended with a barrier: info and both stages are free
        if (ty == 0 && r0 + tx < R) // the affinity (two more dependent loads) only where it is used
            info[tx] = row_info(g, r0 + tx, g.a_in_m);
        __syncthreads();
        ck_row = nullptr;
        if (r0 + tx < R) {
            const int64_t c = info[tx].ckpt; // its aligned word's at c & ~1 (every element of the row: B even)
            ck_row = ckpt + (ES == 2 && words ? c & ~(int64_t)1 : c) * ES;
        }
        issue(0, r0, i_first);
        int stage = 0;
        for (int64_t i0 = i_first; i0 < i_end; i0 += RT, stage ^= 1) {
            if (i0 + RT < i_end) { // the next chunk into the other stage (last read by the chunk before this one)
                issue(stage ^ 1, r0, i0 + RT);
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads(); // every thread's copies of this chunk have landed
            compute(stage, r0, i0);
            __syncthreads(); // this stage is read before the next chunk but one refills it
        }
    }
}

// Whether gate_bwd_kernel may read each 16-bit checkpoint element through the aligned 32-bit word that holds
// it, taking the half of the element's slot parity: a 16-bit dtype, a 4-byte aligned checkpoint (so that every
// such word lies inside it: a (block, half, i) run of B elements starts at an even index), and B even, so that
// the element of slot b at (half, i), index n*2*I*B + (half*I + i)*B + b, has b's parity for every half and i.
bool ckpt_words(const MlpArgs &g, moe_dtype dt, const void *ckpt)
{
    return dt != MOE_F32 && aligned_to(ckpt, 4) && g.B % 2 == 0;
}

template <class Kernel>
unsigned gate_tiles_grid(const MlpArgs &g, Kernel kernel)
{
    return resident_grid(kernel, RT * 8, cdiv(g.positions, RT) * cdiv(g.I, GATE_SPAN));
}

// Calls launch(dt, act) with std::integral_constant values of the call's dtype and activation, so that
// it can name the gate kernel compiled for them (gate_act_kernel / gate_bwd_kernel<DT, ACT>).  Instantiated
// for f16 and bf16 only: the rows path, the only caller, takes no f32 (mlp_api.c clears round_intermediates
// for it), and the f32 instances cost compile time for kernels never launched.  Another dtype or an unknown
// activation launches nothing and fails (neither can come through the front end's checks).
template <class Launch>
moe_status launch_gate_kernel(const MlpArgs &g, const char *op, Launch launch)
{
    auto with_act = [&](auto dt) -> moe_status {
        switch ((moe_mlp_activation)g.act) { // a case per row of the activation table
#define GATE_KERNEL_CASE(value, name, forward, derivative) \
    case value: launch(dt, std::integral_constant<int, value>{}); return MOE_OK;
            MOE_MLP_ACTIVATIONS(GATE_KERNEL_CASE)
#undef GATE_KERNEL_CASE
        }
        return moe_fail(MOE_ERR_INVALID_OPTION, "%s: activation %d has no gate kernel", op, (int)g.act);
    };
    switch (g.dt) {
    case MOE_F16: return with_act(std::integral_constant<int, MOE_F16>{});
    case MOE_BF16: return with_act(std::integral_constant<int, MOE_BF16>{});
    default:
        return moe_fail(MOE_ERR_UNSUPPORTED, "%s: the rows path's gate kernels take f16 and bf16, not %s", op,
                        moe_dtype_name(g.dt));
    }
}

} // namespace

// gate_act_kernel for the call's dtype and activation (the unfused forward; u.GU holds the gate/up rows).
moe_status launch_gate_act(const MlpArgs &u, cudaStream_t stream)
{
    return launch_gate_kernel(u, "moe_mlp_fwd", [&](auto dt, auto act) {
        const auto kernel = gate_act_kernel<decltype(dt)::value, decltype(act)::value>;
        kernel<<<gate_tiles_grid(u, kernel), dim3(RT, 8), 0, stream>>>(u);
    });
}

// gate_bwd_kernel for the call's dtype and activation (V = 4 when 4 divides I).
moe_status launch_gate_bwd(const MlpArgs &a, cudaStream_t stream)
{
    const int64_t I = a.I;
    return launch_gate_kernel(a, "moe_mlp_bwd", [&](auto dt, auto act) {
        const bool words = ckpt_words(a, static_cast<moe_dtype>(decltype(dt)::value), a.ckpt_gu_in);
        const auto kernel = I % 4 == 0 ? gate_bwd_kernel<decltype(dt)::value, decltype(act)::value, 4>
                                       : gate_bwd_kernel<decltype(dt)::value, decltype(act)::value, 1>;
        kernel<<<gate_tiles_grid(a, kernel), dim3(RT, 8), 0, stream>>>(a, words);
    });
}

} // namespace moe_gpu
