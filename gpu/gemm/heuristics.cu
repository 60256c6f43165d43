// The GEMM's shape rules and environment overrides, each with the measurements behind it: the sm90 grid, dynamic
// tiles, tiles of one length, tile rows, pairing, the dW kernels, and the rows ping-pong kernels' fusion rules.
#include <stdlib.h>
#include <string.h>

#include "common/launch.cuh"
#include "gemm/args.cuh"
#include "gemm/heuristics.cuh"

namespace moe_gpu {

// An on/off override from the environment: 1 or 0 when the variable `name` is exactly "1" or "0", else -1 (unset
// or anything else: the caller's rule decides).
int env_switch(const char *name)
{
    const char *value = getenv(name);
    return value != NULL && (strcmp(value, "0") == 0 || strcmp(value, "1") == 0) ? value[0] - '0' : -1;
}

// GemmArgs::sm90_skip of every call, the grouped GEMM's and the MLP's rows GEMMs': MOE_SM90_SKIP, else 0.
int sm90_skip_from_env()
{
    const char *skip = getenv("MOE_SM90_SKIP");
    return skip != NULL ? atoi(skip) : 0;
}

moe_status kernel_override(const char *op, KernelOverride *kernel)
{
    static const struct {
        const char *name;
        KernelOverride value;
    } names[] = {{"auto", KERNEL_AUTO}, {"sm90", KERNEL_SM90}, {"sm80", KERNEL_SM80}, {"simt", KERNEL_SIMT}};
    const char *value = getenv("MOE_CUDA_KERNEL");
    *kernel = KERNEL_AUTO;
    if (value == NULL || value[0] == '\0')
        return MOE_OK;
    for (const auto &n : names)
        if (strcmp(value, n.name) == 0) {
            *kernel = n.value;
            return MOE_OK;
        }
    return moe_fail(MOE_ERR_INVALID_OPTION, "%s: MOE_CUDA_KERNEL=\"%.40s\" is not one of auto, sm90, sm80, simt", op,
                    value);
}

// The sm_90a kernels exist only when the build targets 90a and the device is compute capability 9.0.
bool sm90_path_available()
{
#ifdef MOE_BUILD_SM90A
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
        return false;
    return major == 9 && minor == 0;
#else
    return false;
#endif
}

// Whether the tensor-core path can take the problem's shape: 16-byte vectors along every contiguous
// dimension (loads and the vectorised epilogue).  plan_gemm adds the dtype rules: f32 only with allow_tf32
// (the TF32 kernel: every op), dW with fused topk weights for bf16 (on sm90 not the wide or ping-pong
// kernels) and f16 (the sm80 kernel only).
bool tensor_core_ok(const moe_gemm_problem *p, const void *a, const void *b, const void *out)
{
    if (p->N % 8 != 0 || p->K % 8 != 0 || !aligned16(a) || !aligned16(b) || !aligned16(out))
        return false;
    return true;
}

// The CTAs of sm90_gemm_kernel for fwd and dX in the static tile order (tile t on CTA t mod gridDim.x): a
// multiple of H_GRID_ALIGN, 128 of an H100's 132 SMs.  Tiles next to each other in the order share operands
// (an expert's row tiles one W block, its column tiles the rows), and the L2 -> SM traffic, which bounds these
// kernels (ncu: L2 throughput a large share of its peak at Qwen3-30B-A3B), depends on where and when they run:
// CTA b starting at tile 67 b mod 132 instead of b ran Qwen3 gate_up fwd much slower, with more L2 bytes
// (bench/RESULTS.md, "the grouped GEMMs are bound by L2 -> SM traffic").  Where: the L2 is two partitions, each
// holding what the SMs on its side read, and an H100 put CTAs 8j .. 8j + 7 of a launch on four SM pairs of one
// side (e.g. SMs 0, 1, 16, 17, 32, 33, 48, 49 for CTAs 8 .. 15; the sides as measured on two machines:
// bench/RESULTS.md, "Which SMs share an L2 partition").  When: tiles that share operands start together and
// walk their k-steps side by side, and the SMs then send fewer sectors to the L2 than the tiles load
// (bench/RESULTS.md, "the L2's two sides").  With 132 CTAs a wave's tiles shift by 4 against those groups of 8
// from one wave to the next; with 128 they do not, and Qwen3 T = 4096 ran gate_up and down fwd / dX a little
// faster with fewer L2 bytes; 120 CTAs lost.  Not for dynamic tiles (a CTA takes whichever tile comes next;
// Mixtral lost with 128) nor dW (slower with 128); bench/RESULTS.md, "A grid of a multiple of 8 CTAs".
// MOE_SM90_GRID=N caps the CTAs of every sm90 launch (A/B runs).
int64_t sm90_grid_cap(int64_t ctas)
{
    const char *env = getenv("MOE_SM90_GRID");
    const int64_t cap = env != NULL ? atoi(env) : 0;
    return cap > 0 && ctas > cap ? cap : ctas;
}

// Dynamic tiles (gemm/sm90.cu, h_run_scheduler: a CTA takes its next tile when its ring reaches it, not
// every gridDim.x-th) in sm90_gemm_kernel without clusters, where every operand comes by TMA, for fwd and dX
// with a reduction of at least H_DYNAMIC_REDUCTION.  There tiles are long and few per CTA, and an expert's last
// row tile, often short, unbalances the static order; where the reduction is short they cost time.  Measured
// on H100s (bench/RESULTS.md, the section ending "device tool): dynamic tiles"): DeepSeek-V3 dX and
// Mixtral-8x7B down dX (N = 4096) gain, DeepSeek-V3 T = 8192 fwd / dX most, with the pairing rule of
// sm90_cluster_size; Qwen3-30B-A3B (K = 2048, N = 1536 / 2048) loses in fwd and dX in every call, though its
// kernels read fewer bytes (ncu).  Why (see sm90_grid_cap): a dynamic tile goes to whichever CTA asks when it
// asks, so the tiles sharing a W block or rows run on both sides of the L2 (more sectors cross between its
// partitions) and at different moments (the SMs send every sector their tiles load, more than in the static
// order).  Claims kept on the claiming CTA's side of the L2 (the sides measured at run time) brought the
// crossings back to the static order's and two thirds of the Qwen3 loss with them, but no shape gained enough
// over this rule to keep them (bench/RESULTS.md, "Dynamic tiles by side").
// MOE_SM90_DYNAMIC=0|1 forces them off or on (where the kernel can take them).
constexpr int64_t H_DYNAMIC_REDUCTION = 4096;
bool sm90_dynamic_tiles(const moe_gemm_problem *p, int op)
{
    const int forced = env_switch("MOE_SM90_DYNAMIC");
    if (forced >= 0)
        return forced == 1;
    return (op == OP_FWD && p->K >= H_DYNAMIC_REDUCTION) || (op == OP_DX && p->N >= H_DYNAMIC_REDUCTION);
}

// Tiles of one length (GemmArgs::full_blocks; sm90_gemm_kernel without clusters, fwd and dX).  An m64 block
// whose rows all lie past the expert's end skips its MMAs, so an expert's short last row tile takes about half
// as long as a full one, and the CTA that ran it starts its next tile out of phase with the tiles that share
// its operands.  Tiles that share a W block or rows and start together walk their k-steps side by side, and
// their loads cost the L2 and DRAM less (the static order's SMs send fewer sectors to the L2 than their tiles
// load; bench/RESULTS.md, "the L2's two sides").  With long experts (H_FULL_BLOCK_ROWS rows or more on
// average) such blocks issue their MMAs anyway, at most 64 E extra rows of MMAs against the M rows (6%).  On
// H100s that ran Mixtral-8x7B T = 4096 gate_up fwd, gate_up dX (with fewer DRAM reads) and down dX faster, and
// Qwen3-30B-A3B T = 16384 gate_up; the MLP within its spread.  With shorter experts the extra MMAs cost more
// than the phase saves (Qwen3 T = 4096, DeepSeek-V3 T = 8192); bench/RESULTS.md, "Tiles of one length".
// MOE_SM90_FULL_BLOCKS=0|1 forces it off or on.
constexpr int64_t H_FULL_BLOCK_ROWS = 1024;
bool sm90_full_blocks(const moe_gemm_problem *p)
{
    const int forced = env_switch("MOE_SM90_FULL_BLOCKS");
    if (forced >= 0)
        return forced == 1;
    return p->num_experts > 0 && p->rows >= H_FULL_BLOCK_ROWS * p->num_experts;
}

// Tile rows of the sm90 kernel: the rule takes 128 for every shape.
// MOE_SM90_TILE_ROWS=128|256 overrides it for fwd and dX (tuning runs); a tuned choice (autotune table or the
// autotune driver's candidate; NULL: none) comes after the override.
int sm90_tile_rows(int op, const moe_tune_choice *tuned)
{
    if (op == OP_DW)
        return 128;
    const char *forced = getenv("MOE_SM90_TILE_ROWS");
    if (forced != NULL && (atoi(forced) == 128 || atoi(forced) == 256))
        return atoi(forced);
    if (tuned != NULL && tuned->kernel == MOE_TUNE_SM90 && (tuned->tile_rows == 128 || tuned->tile_rows == 256))
        return tuned->tile_rows;
    return 128;
}

// The paired kernel (clusters of two CTAs sharing W by multicast) for 128-row forward tiles when the
// reduction K has at least H_PAIRED_REDUCTION elements and the experts at least H_PAIRED_ROWS rows on average.
// Before dynamic tiles (sm90_dynamic_tiles) it took every K >= H_PAIRED_REDUCTION, where it won or tied on an
// H100 (MOE_SM90_CLUSTER=1 vs 2; bench/RESULTS.md, "fwd pairing for every K >= 4096").  With dynamic tiles the
// unpaired kernel wins where the experts are short and pairs still win on long experts (Mixtral T = 16384, 4096
// rows per expert; bench/RESULTS.md, the section ending "device tool): dynamic tiles").  Where K is short pairs
// lose (Qwen3 gate_up, K = 2048), and for dX on every shape (same sections), which keeps the
// kernel for autotune and MOE_SM90_CLUSTER=2.  MOE_SM90_CLUSTER=1|2 forces it off or on (tests, tuning runs).
constexpr int64_t H_PAIRED_ROWS = 2048;
int sm90_cluster_size(const moe_gemm_problem *p, int op, int bm, const moe_tune_choice *tuned)
{
    if (op == OP_DW || bm != 128)
        return 1;
    const char *forced = getenv("MOE_SM90_CLUSTER");
    if (forced != NULL && (atoi(forced) == 1 || atoi(forced) == 2))
        return atoi(forced);
    if (tuned != NULL && tuned->kernel == MOE_TUNE_SM90)
        return tuned->cluster == 2 ? 2 : 1;
    return op == OP_FWD && p->K >= H_PAIRED_REDUCTION && p->num_experts > 0 && p->rows / p->num_experts >= H_PAIRED_ROWS
               ? 2
               : 1;
}

// dW with every operand and the (16-bit) output by TMA takes the ping-pong kernel (gemm/sm90_dw_pingpong.cu) when the
// experts are short (at most H_DW_PINGPONG_ROWS rows on average): there the epilogue is a large part of a
// tile's time and the other warpgroup's MMAs hide it.  With longer experts sm90_gemm_kernel's 128 x 256 tiles
// (m64n256 MMAs, a third less L2 -> SM traffic) with the wide epilogue win: measured on an H100, ping-pong ahead
// at 128 rows per expert (Qwen3-30B-A3B T = 2048, DeepSeek-V3 T = 4096), behind from 256 (Mixtral T = 1024 and
// up, Qwen3 T = 4096 and up, DeepSeek-V3 T = 8192); at 64 rows (Qwen3 T = 1024) slightly behind, at 32
// (DeepSeek-V3 T = 1024) even (bench/RESULTS.md, "stmatrix for the 8 KiB boxes, and the ping-pong rule re-measured").
// MOE_SM90_DW_PINGPONG=0|1 forces it off or on; a tuned sm90 choice (autotune table or the autotune driver's
// candidate; NULL: none) with dw_pingpong 0 or 1 comes after the override, the rule (from p's rows and
// experts) last.  plan_gemm asks only where the ping-pong kernel applies.
constexpr int64_t H_DW_PINGPONG_ROWS = 128;
bool sm90_dw_pingpong(const moe_gemm_problem *p, const moe_tune_choice *tuned)
{
    const int forced = env_switch("MOE_SM90_DW_PINGPONG");
    if (forced >= 0)
        return forced == 1;
    if (tuned != nullptr && tuned->kernel == MOE_TUNE_SM90 && tuned->dw_pingpong >= 0)
        return tuned->dw_pingpong == 1;
    return p->rows <= H_DW_PINGPONG_ROWS * p->num_experts;
}

// The other dW launches with every operand and the 16-bit output by TMA take sm90_gemm_kernel's wide
// epilogue (8 KiB output boxes, h_store_wg_wide) unless MOE_SM90_DW_WIDE=0.
bool sm90_dw_wide(void)
{
    const char *forced = getenv("MOE_SM90_DW_WIDE");
    return forced == NULL || strcmp(forced, "0") != 0;
}

// Why the fused MLP kernel (moe_cuda_rows_gate_gemm) does not take a call (NULL: it does).  form_ok: r is the
// GEMM the kernel fuses; H, I: the MLP's (positive multiples of 8 required); outs: the epilogue's outputs (NULL
// entries skipped); required: MOE_MLP_FUSE_GATE=1 (no size rule).  The f32 rows kernel on the same schedule
// (rows_f32_pingpong) takes its calls under these rules too.
const char *gate_fusion_refusal(const MoeRowsGemm *r, bool form_ok, int64_t H, int64_t I, bool required,
                                std::initializer_list<const void *> outs)
{
    const char *fuse = getenv("MOE_MLP_FUSE_GATE");
    if (fuse != NULL && strcmp(fuse, "0") == 0)
        return "MOE_MLP_FUSE_GATE=0";
    KernelOverride forced; // the MLP's entry points refused an unknown value before
    if (kernel_override("MLP", &forced) != MOE_OK || forced == KERNEL_SM80 || forced == KERNEL_SIMT)
        return "MOE_CUDA_KERNEL forces another kernel family";
    if (!form_ok || r->accumulate)
        return "not the GEMM the kernel fuses"; // a caller's mistake: the MLP never passes one
    if (r->dtype == MOE_F32)
        return "f32 (the kernel is for f16 and bf16)";
    if (r->E <= 0 || r->rows <= 0 || H <= 0 || I <= 0)
        return "no rows";
    if (H % 8 != 0 || I % 8 != 0)
        return "H or I not a multiple of 8";
    bool aligned = aligned16(r->a) && aligned16(r->b);
    for (const void *out : outs)
        aligned = aligned && (out == nullptr || aligned16(out));
    if (!aligned)
        return "an operand not 16-byte aligned";
    if (!sm90_path_available())
        return "no sm_90a device";
    if (!required && r->rows < G_FUSE_MIN_ROWS * r->E)
        return "short experts (the unfused kernels are faster)";
    return NULL;
}

bool gate_fusion_required()
{
    const char *fuse = getenv("MOE_MLP_FUSE_GATE");
    return fuse != NULL && strcmp(fuse, "1") == 0;
}

// The Hopper FP8 kernel's scales (gemm/fp8_sm90.cu, STAGED): staged in shared memory by the producers, one step
// ahead, for fwd; read by each consumer thread from global memory (three loads, their address arithmetic and the
// UE8M0 decoding per step) for dX, whose producers also transpose every W box.  Measured on an H200, the two
// alternated: fwd 5-13% faster staged, dX 5-10% slower (bench/RESULTS.md, "The Hopper FP8 kernel's scales staged
// in shared memory"); with TMA stores, on an H100, dX staged 7-13% slower (bench/RESULTS.md, "The Hopper FP8
// kernel's epilogue by TMA stores").  dX from W^T (w_kn: no transposition) staged, on an H100: 1.07-1.17x unstaged
// (bench/RESULTS.md, "dX from W^T").  MOE_FP8_SM90_STAGED_SCALES=0|1 forces it off or on.
bool fp8_sm90_staged_scales(int op, bool w_kn)
{
    const int forced = env_switch("MOE_FP8_SM90_STAGED_SCALES");
    return forced >= 0 ? forced == 1 : op == OP_FWD || (op == OP_DX && w_kn);
}

// The Hopper FP8 kernel's epilogue (gemm/fp8_sm90.cu) through gemm/tma_store.cuh's boxes and TMA stores, where the
// output's rows are in tile order and overwritten (fp8_sm90_plan), instead of each thread's pair stores straight
// from its registers (27% of the forward's consumer stall samples, 65% of their sectors excessive).  On an H100,
// fwd 1.09-1.53x and dX 1.06-1.13x (bench/RESULTS.md, "The Hopper FP8 kernel's epilogue by TMA stores").
// MOE_FP8_SM90_TMA_STORE=0|1 forces it off or on.
bool fp8_sm90_tma_store(int op)
{
    const int forced = env_switch("MOE_FP8_SM90_TMA_STORE");
    return forced >= 0 ? forced == 1 : op == OP_FWD || op == OP_DX;
}

// The Hopper FP8 kernel with tiles of 128 x 256 (gemm/fp8_sm90.cu, WIDE) instead of 128 x 128, where it reads W's
// boxes as they are (fwd, dX from W^T) with staged scales and A by TMA: each k-step's 48 KiB of codes feed twice the
// multiply-adds of the 32 KiB of a 128 x 128 tile, with 4 stages instead of 6.  Taken where the experts average
// at least two row tiles (M >= 256 E).  On an H100: Qwen3-30B-A3B (256 rows an expert) fwd 1.15-1.20x, dX from W^T
// 1.08-1.13x; DeepSeek-V3 (128 rows an expert, K = 7168) fwd 0.87x, dX from W^T 0.96-0.98x (bench/RESULTS.md, "Wide
// FP8 tiles, measured").  MOE_FP8_SM90_WIDE_TILES=0|1 forces it off or on.
bool fp8_sm90_wide_tiles(int op, int64_t M, int64_t E)
{
    const int forced = env_switch("MOE_FP8_SM90_WIDE_TILES");
    if (op != OP_FWD && op != OP_DX)
        return false;
    return forced >= 0 ? forced == 1 : M >= 2 * 128 * E;
}

// The Hopper FP8 dW kernel (gemm/fp8_dw_sm90.cu) on transposed codes, where fp8_dw_sm90_plan takes the call; else
// they are copied back into expert-row order for the portable kernel.  Off until it has run on a device: its first
// form stopped with an illegal instruction on an H100 (TMA loads at unaligned rows), and this form has been
// compiled, not run (bench/RESULTS.md, "The Hopper FP8 dW kernel's illegal instruction").  MOE_FP8_DW_SM90=1
// turns it on.
bool fp8_dw_sm90_enabled()
{
    return env_switch("MOE_FP8_DW_SM90") == 1;
}

} // namespace moe_gpu
