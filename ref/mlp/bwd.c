/*
 * ref/mlp/bwd.c: the backward of the blockwise MoE MLP reference from the forward's checkpoints: per expert
 * (one thread each), the gather of its slots' rows, the down stage (m, d recomputed without a down
 * checkpoint, the affinity gradients, d_w_d and db_d, dM) and the gate/up stage (the clamp masks, d_w_gu and
 * db_gu, the per-slot input gradients); then per token the sum of its slots' input gradients and its
 * affinity gradients.  The per-expert and per-token loops are proved; the allocating shell
 * (moe_ref_mlp_bwd, the entry point of mlp_ref.h) is not (allocation).
 */
#include "mlp_internal.h"
#include "activations.h"

/* sum_{i ascending} a[i] * b[i]   a [n], b [n] */
/*@ requires count: n >= 0;
    requires a: \valid_read(a + (0 .. n - 1));
    requires b: \valid_read(b + (0 .. n - 1));
    terminates \true;
    assigns \nothing; */
static float dot_seq(const float *a, const float *b, int64_t n)
{
    float acc = 0.0f;
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, acc;
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++)
        acc = acc + a[i] * b[i];
    return acc;
}

/* Writes count float32 values to a gradient (old + value with accumulate), one rounding each.  v is
 * scratch and is overwritten.   dst: tensor of p->grad_dtype (elements first .. first + count - 1);  v [count] */
/*@ requires problem: \valid_read(p) && dtype_ok(p->grad_dtype);
    requires count: 0 <= first && 0 <= count && first + count <= INT64_MAX;
    requires dst: elements_writable((char *)dst, first, count, p->grad_dtype);
    requires v: \valid(v + (0 .. count - 1));
    requires separated: \separated(v + (0 .. count - 1),
      (char *)dst + (byte_offset(first, p->grad_dtype) .. byte_offset(first + count, p->grad_dtype) - 1));
    terminates \true;
    assigns v[0 .. count - 1],
      ((char *)dst)[byte_offset(first, p->grad_dtype) .. byte_offset(first + count, p->grad_dtype) - 1]; */
static void store_grad(const moe_mlp_problem *p, void *dst, int64_t first, float *v, int64_t count)
{
    if (p->accumulate)
        /*@ loop invariant bounds: 0 <= i <= count;
            loop assigns i, v[0 .. count - 1];
            loop variant count - i; */
        for (int64_t i = 0; i < count; i++)
            v[i] = moe_ref_load(p->grad_dtype, dst, first + i) + v[i];
    mlp_store_row(p->grad_dtype, dst, first, v, count);
}

/* The backward's gather of one slot i at position pos (block blk = pos / B, row b = pos % B): its affinity
 * a[i] = affinities[t][e] (t = its token), its gate/up row gu [2I] from the checkpoint gate_up_ckpt_T [N][2I][B]
 * and, when the down checkpoint is given (!recompute_d), its row d [H] of down_ckpt [N*B][H]. */
/*@ requires dims: 0 <= t < T && 0 <= e < E && T * E <= INT64_MAX && 0 <= H && 0 <= I && 2 * I <= INT64_MAX &&
      1 <= B && 0 <= pos < N * B && N * B <= INT64_MAX && N * (2 * I) <= INT64_MAX && N * (2 * I) * B <= INT64_MAX &&
      N * B * H <= INT64_MAX && 0 <= i;
    requires dtype: dtype_ok(dt);
    requires inputs: tensor_readable((char *)affinities, T * E, dt) &&
      tensor_readable((char *)gate_up_ckpt_T, N * (2 * I) * B, dt) &&
      (recompute_d == 0 ==> tensor_readable((char *)down_ckpt, N * B * H, dt));
    requires rows: \valid(a + i) && \valid(gu + (0 .. 2 * I - 1)) && \valid(d + (0 .. H - 1)) &&
      \separated(a + i, gu + (0 .. 2 * I - 1), d + (0 .. H - 1)) &&
      (recompute_d == 0 ==> \separated(d + (0 .. H - 1), (char *)down_ckpt + (0 .. byte_offset(N * B * H, dt) - 1)));
    terminates \true;
    assigns a[i], gu[0 .. 2 * I - 1], d[0 .. H - 1]; */
static void bwd_gather_slot(moe_dtype dt, int64_t E, int64_t B, int64_t H, int64_t I, int64_t e, int64_t t,
                            int64_t pos, const void *affinities, const void *gate_up_ckpt_T, const void *down_ckpt,
                            int recompute_d, float *a, int64_t i, float *gu, float *d)
    /*@ ghost (int64_t T, int64_t N) */
{
    const int64_t I2 = 2 * I, blk = pos / B, b = pos % B;
    /*@ ghost lemma_div_below(pos, N, B); */
    /*@ ghost lemma_row_fits(t, T, E); */
    /*@ ghost lemma_row_fits(blk, N, I2); */
    /*@ ghost lemma_row_fits(pos, N * B, H); */
    /*@ ghost const int64_t NI2 = N * I2; */
    a[i] = moe_ref_load(dt, affinities, t * E + e);
    const int64_t row0 = blk * I2; /* the checkpoint's rows (blk, j) start here */
    /*@ loop invariant bounds: 0 <= j <= I2;
        loop assigns j, gu[0 .. I2 - 1];
        loop variant I2 - j; */
    for (int64_t j = 0; j < I2; j++) {
        const int64_t r = row0 + j;
        /*@ ghost lemma_row_fits(r, NI2, B); */
        gu[j] = moe_ref_load(dt, gate_up_ckpt_T, r * B + b);
    }
    if (!recompute_d)
        mlp_load_f32(dt, down_ckpt, pos * H, H, d);
}

/* The per-slot input gradients of one expert: dx_slot row slots[i] [H] = column i of Tout [H][n]. */
/*@ requires dims: 0 <= n && 0 <= H && H * n <= INT64_MAX && 0 <= V && V * H <= INT64_MAX;
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires Tout: \valid_read(Tout + (0 .. H * n - 1));
    requires dx_slot: \valid(dx_slot + (0 .. V * H - 1)) &&
      \separated(dx_slot + (0 .. V * H - 1), Tout + (0 .. H * n - 1));
    terminates \true;
    assigns dx_slot[0 .. V * H - 1]; */
static void bwd_dx_scatter(int64_t n, int64_t H, const int64_t *slots, const float *Tout, float *dx_slot)
    /*@ ghost (int64_t V) */
{
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, dx_slot[0 .. V * H - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(slots[i], V, H); */
        float *dst = dx_slot + slots[i] * H;
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, dx_slot[0 .. V * H - 1];
            loop variant H - h; */
        for (int64_t h = 0; h < H; h++) {
            /*@ ghost lemma_row_fits(h, H, n); */
            dst[h] = Tout[h * n + i];
        }
    }
}

/* Token t's d_hidden row: the sum of its slots' input gradients (dx_slot rows token_slots[first .. last - 1])
 * in ascending slot order, from +0 (the first copied), rounded once.   acc [H] */
/*@ requires dims: 0 <= H && 0 <= t < rows && rows * H <= INT64_MAX && 0 <= V && V * H <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires slots: 0 <= first <= last && \valid_read(token_slots + (first .. last - 1)) &&
      (\forall integer q; first <= q < last ==> 0 <= token_slots[q] < V);
    requires dx_slot: \valid_read(dx_slot + (0 .. V * H - 1));
    requires acc: \valid(acc + (0 .. H - 1)) && \separated(acc + (0 .. H - 1), dx_slot + (0 .. V * H - 1));
    requires out: tensor_writable((char *)d_hidden, rows * H, dt) &&
      \separated((char *)d_hidden + (0 .. byte_offset(rows * H, dt) - 1), acc + (0 .. H - 1));
    terminates \true;
    assigns acc[0 .. H - 1], ((char *)d_hidden)[byte_offset(t * H, dt) .. byte_offset(t * H + H, dt) - 1]; */
static void bwd_token_row(moe_dtype dt, int64_t H, const float *dx_slot, const int64_t *token_slots, int64_t first,
                          int64_t last, float *acc, void *d_hidden, int64_t t) /*@ ghost (int64_t V, int64_t rows) */
{
    /*@ ghost lemma_row_fits(t, rows, H); */
    /*@ loop invariant bounds: 0 <= h <= H;
        loop assigns h, acc[0 .. H - 1];
        loop variant H - h; */
    for (int64_t h = 0; h < H; h++)
        acc[h] = 0.0f;
    /*@ loop invariant bounds: first <= q <= last;
        loop assigns q, acc[0 .. H - 1];
        loop variant last - q; */
    for (int64_t q = first; q < last; q++) {
        /*@ ghost lemma_row_fits(token_slots[q], V, H); */
        const float *c = dx_slot + token_slots[q] * H;
        if (q == first) {
            copy_floats(acc, c, H);
            continue;
        }
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, acc[0 .. H - 1];
            loop variant H - h; */
        MLP_SIMD
        for (int64_t h = 0; h < H; h++)
            acc[h] = acc[h] + c[h];
    }
    mlp_store_row(dt, d_hidden, t * H, acc, H);
}

/* Token t's d_affinities row (t < T): +0 but for the experts of its slots (token_slots[first .. last - 1]), each
 * the slot's affinity gradient da_slot[s]; the expert of slot s is block_to_expert[pos[s] / B].   row_e [E] */
/*@ requires dims: 0 <= t < T && T * E <= INT64_MAX && 1 <= E && 1 <= B && 0 <= N && N * B <= INT64_MAX && 0 <= V;
    requires dtype: dtype_ok(dt);
    requires slots: 0 <= first <= last && \valid_read(token_slots + (first .. last - 1)) &&
      (\forall integer q; first <= q < last ==> 0 <= token_slots[q] < V);
    requires index: \valid_read(pos + (0 .. V - 1)) && in_range(pos, V, 0, N * B) &&
      \valid_read(b2e + (0 .. N - 1)) && in_range(b2e, N, 0, E);
    requires da_slot: \valid_read(da_slot + (0 .. V - 1));
    requires row_e: \valid(row_e + (0 .. E - 1)) && \separated(row_e + (0 .. E - 1), da_slot + (0 .. V - 1));
    requires out: tensor_writable((char *)d_affinities, T * E, dt) &&
      \separated((char *)d_affinities + (0 .. byte_offset(T * E, dt) - 1), row_e + (0 .. E - 1));
    terminates \true;
    assigns row_e[0 .. E - 1], ((char *)d_affinities)[byte_offset(t * E, dt) .. byte_offset(t * E + E, dt) - 1]; */
static void bwd_token_affinities(moe_dtype dt, int64_t E, int64_t B, const int64_t *b2e, const int64_t *pos,
                                 const int64_t *token_slots, int64_t first, int64_t last, const float *da_slot,
                                 float *row_e, void *d_affinities, int64_t t)
    /*@ ghost (int64_t T, int64_t N, int64_t V) */
{
    /*@ ghost lemma_row_fits(t, T, E); */
    /*@ loop invariant bounds: 0 <= e <= E;
        loop assigns e, row_e[0 .. E - 1];
        loop variant E - e; */
    for (int64_t e = 0; e < E; e++)
        row_e[e] = 0.0f;
    /*@ loop invariant bounds: first <= q <= last;
        loop assigns q, row_e[0 .. E - 1];
        loop variant last - q; */
    for (int64_t q = first; q < last; q++) {
        const int64_t s = token_slots[q];
        /*@ ghost lemma_div_below(pos[s], N, B); */
        row_e[b2e[pos[s] / B]] = da_slot[s];
    }
    /*@ loop invariant bounds: 0 <= e <= E;
        loop assigns e, ((char *)d_affinities)[byte_offset(t * E, dt) .. byte_offset(t * E + E, dt) - 1];
        loop variant E - e; */
    for (int64_t e = 0; e < E; e++)
        moe_ref_store(dt, d_affinities, t * E + e, row_e[e]);
}

/* One thread's share of the backward's token rows: the orphaned `omp for` (static) of moe_ref_mlp_bwd's
 * parallel region; for each row t < rows its d_hidden row (bwd_token_row) and, for t < T, its d_affinities
 * row (bwd_token_affinities).  Frama-C parses it without OpenMP: the proof is of the loop run by one thread.
 *   token_start [T + 1], token_slots [V], pos [V]: the slot index;  b2e: the layout's block_to_expert [N];
 *   dx_slot [V][H], da_slot [V]: the per-slot gradients;  acc [H], row_e [E]: the thread's scratch */
/*@ requires dims: 0 <= H && 0 <= T <= rows && rows * H <= INT64_MAX && T * E <= INT64_MAX && 1 <= E && 1 <= B &&
      0 <= N && N * B <= INT64_MAX && 0 <= V && V * H <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires index: \valid_read(token_start + (0 .. T)) && token_start[0] == 0 && token_start[T] == V &&
      sorted_offsets(token_start, T) && \valid_read(token_slots + (0 .. V - 1)) && in_range(token_slots, V, 0, V) &&
      \valid_read(pos + (0 .. V - 1)) && in_range(pos, V, 0, N * B) &&
      \valid_read(b2e + (0 .. N - 1)) && in_range(b2e, N, 0, E);
    requires slot_grads: \valid_read(dx_slot + (0 .. V * H - 1)) && \valid_read(da_slot + (0 .. V - 1));
    requires scratch: \valid(acc + (0 .. H - 1)) && \valid(row_e + (0 .. E - 1)) &&
      \separated(acc + (0 .. H - 1), row_e + (0 .. E - 1), dx_slot + (0 .. V * H - 1), da_slot + (0 .. V - 1));
    requires d_hidden: tensor_writable((char *)d_hidden, rows * H, dt) &&
      \separated((char *)d_hidden + (0 .. byte_offset(rows * H, dt) - 1), acc + (0 .. H - 1)) &&
      \separated((char *)d_hidden + (0 .. byte_offset(rows * H, dt) - 1), token_start + (0 .. T)) &&
      \separated((char *)d_hidden + (0 .. byte_offset(rows * H, dt) - 1), token_slots + (0 .. V - 1)) &&
      \separated((char *)d_hidden + (0 .. byte_offset(rows * H, dt) - 1), pos + (0 .. V - 1)) &&
      \separated((char *)d_hidden + (0 .. byte_offset(rows * H, dt) - 1), b2e + (0 .. N - 1));
    requires d_affinities: tensor_writable((char *)d_affinities, T * E, dt) &&
      \separated((char *)d_affinities + (0 .. byte_offset(T * E, dt) - 1), row_e + (0 .. E - 1)) &&
      \separated((char *)d_affinities + (0 .. byte_offset(T * E, dt) - 1), token_start + (0 .. T)) &&
      \separated((char *)d_affinities + (0 .. byte_offset(T * E, dt) - 1), token_slots + (0 .. V - 1)) &&
      \separated((char *)d_affinities + (0 .. byte_offset(T * E, dt) - 1), pos + (0 .. V - 1)) &&
      \separated((char *)d_affinities + (0 .. byte_offset(T * E, dt) - 1), b2e + (0 .. N - 1));
    terminates \true;
    assigns acc[0 .. H - 1], row_e[0 .. E - 1], ((char *)d_hidden)[0 .. byte_offset(rows * H, dt) - 1],
      ((char *)d_affinities)[0 .. byte_offset(T * E, dt) - 1]; */
static void bwd_tokens(moe_dtype dt, int64_t T, int64_t E, int64_t B, int64_t H, int64_t rows,
                       const int64_t *token_start, const int64_t *token_slots, const int64_t *pos, const int64_t *b2e,
                       const float *dx_slot, const float *da_slot, float *acc, float *row_e, void *d_hidden,
                       void *d_affinities) /*@ ghost (int64_t N, int64_t V) */
{
    /*@ loop invariant bounds: 0 <= t <= rows;
        loop assigns t, acc[0 .. H - 1], row_e[0 .. E - 1], ((char *)d_hidden)[0 .. byte_offset(rows * H, dt) - 1],
          ((char *)d_affinities)[0 .. byte_offset(T * E, dt) - 1];
        loop variant rows - t; */
    MLP_OMP(for schedule(static))
    for (int64_t t = 0; t < rows; t++) {
        const int64_t first = t < T ? token_start[t] : 0, last = t < T ? token_start[t + 1] : 0;
        /*@ assert range: 0 <= first <= last <= V; */
        bwd_token_row(dt, H, dx_slot, token_slots, first, last, acc, d_hidden, t) /*@ ghost (V, rows) */;
        if (t >= T)
            continue;
        bwd_token_affinities(dt, E, B, b2e, pos, token_slots, first, last, da_slot, row_e, d_affinities, t)
            /*@ ghost (T, N, V) */;
    }
}

/* m = act(g) * u for one expert's n slots, unscaled and unrounded.  GU [n][2I] (g, then u); M [n][I] (overwritten). */
/*@ requires dims: 0 <= n && 0 <= I && 2 * I <= INT64_MAX && n * I <= INT64_MAX && n * (2 * I) <= INT64_MAX;
    requires GU: \valid_read(GU + (0 .. n * (2 * I) - 1));
    requires M: \valid(M + (0 .. n * I - 1)) && \separated(M + (0 .. n * I - 1), GU + (0 .. n * (2 * I) - 1));
    terminates \true;
    assigns M[0 .. n * I - 1], errno; */
static void bwd_m_rows(moe_mlp_activation act, int64_t n, int64_t I, const float *GU, float *M)
{
    const int64_t I2 = 2 * I;
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, M[0 .. n * I - 1], errno;
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(i, n, I2); */
        /*@ ghost lemma_row_fits(i, n, I); */
        /*@ loop invariant bounds: 0 <= j <= I;
            loop assigns j, M[0 .. n * I - 1], errno;
            loop variant I - j; */
        for (int64_t j = 0; j < I; j++)
            M[i * I + j] = act_of(act, GU[i * I2 + j]) * GU[i * I2 + I + j];
    }
}

/* The affinity gradient and the a-scaled rows of one expert's n slots: da_slot[slots[i]] = <G row i, D row i>
 * (D: the slot's down-projection output, bias included), dD row i = a[i] * G row i, and with ON_I (on_i)
 * M row i scaled by a[i] in place.  G, D, dD [n][H]; a [n]; M [n][I]; da_slot [V]. */
/*@ requires dims: 0 <= n && 0 <= H && 0 <= I && n * H <= INT64_MAX && n * I <= INT64_MAX && 0 <= V;
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires inputs: \valid_read(G + (0 .. n * H - 1)) && \valid_read(D + (0 .. n * H - 1)) &&
      \valid_read(a + (0 .. n - 1));
    requires outputs: \valid(da_slot + (0 .. V - 1)) && \valid(dD + (0 .. n * H - 1)) && \valid(M + (0 .. n * I - 1));
    requires apart: \separated(da_slot + (0 .. V - 1), dD + (0 .. n * H - 1), M + (0 .. n * I - 1),
                                G + (0 .. n * H - 1), D + (0 .. n * H - 1), a + (0 .. n - 1));
    terminates \true;
    assigns da_slot[0 .. V - 1], dD[0 .. n * H - 1], M[0 .. n * I - 1]; */
static void bwd_affinity_rows(int64_t n, int64_t H, int64_t I, int on_i, const int64_t *slots, const float *G,
                              const float *D, const float *a, float *da_slot, float *dD, float *M)
    /*@ ghost (int64_t V) */
{
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, da_slot[0 .. V - 1], dD[0 .. n * H - 1], M[0 .. n * I - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(i, n, H); */
        /*@ ghost lemma_row_fits(i, n, I); */
        da_slot[slots[i]] = dot_seq(G + i * H, D + i * H, H);
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, dD[0 .. n * H - 1];
            loop variant H - h; */
        for (int64_t h = 0; h < H; h++)
            dD[i * H + h] = a[i] * G[i * H + h];
        if (on_i) {
            /*@ loop invariant bounds: 0 <= j <= I;
                loop assigns j, M[0 .. n * I - 1];
                loop variant I - j; */
            for (int64_t j = 0; j < I; j++)
                M[i * I + j] = M[i * I + j] * a[i];
        }
    }
}

/* The gate/up gradients of one expert's n slots from the checkpointed g, u and the gradient dm of m:
 * dg = (dm' u) act'(g), du = dm' act(g), each 0 where its value fails the strict limits (nl for g, lin for u;
 * a limit applies when p's flag is set); dm' = a dm with ON_I (on_i), dm otherwise.
 * GU [n][2I] (g, then u); dM [n][I]; a [n]; dGU [n][2I] (dg, then du; overwritten). */
/*@ requires dims: 0 <= n && 0 <= I && 2 * I <= INT64_MAX && n * I <= INT64_MAX && n * (2 * I) <= INT64_MAX;
    requires problem: \valid_read(p);
    requires inputs: \valid_read(GU + (0 .. n * (2 * I) - 1)) && \valid_read(dM + (0 .. n * I - 1)) &&
      \valid_read(a + (0 .. n - 1));
    requires out: \valid(dGU + (0 .. n * (2 * I) - 1)) &&
      \separated(dGU + (0 .. n * (2 * I) - 1), GU + (0 .. n * (2 * I) - 1), dM + (0 .. n * I - 1), a + (0 .. n - 1), p);
    terminates \true;
    assigns dGU[0 .. n * (2 * I) - 1], errno; */
static void bwd_gate_grads(const moe_mlp_problem *p, int64_t n, int64_t I, int on_i, float nl_lo, float nl_hi,
                           float lin_lo, float lin_hi, const float *GU, const float *dM, const float *a, float *dGU)
{
    const int64_t I2 = 2 * I;
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, dGU[0 .. n * (2 * I) - 1], errno;
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(i, n, I2); */
        /*@ ghost lemma_row_fits(i, n, I); */
        const float *g = GU + i * I2, *u = g + I;
        float *dg = dGU + i * I2, *du = dg + I;
        const float *dm = dM + i * I;
        /*@ loop invariant bounds: 0 <= j <= I;
            loop assigns j, dGU[0 .. n * (2 * I) - 1], errno;
            loop variant I - j; */
        for (int64_t j = 0; j < I; j++) {
            const float dmj = on_i ? a[i] * dm[j] : dm[j];
            const int g_free = (!p->has_nl_lo || nl_lo < g[j]) && (!p->has_nl_hi || g[j] < nl_hi);
            const int u_free = (!p->has_lin_lo || lin_lo < u[j]) && (!p->has_lin_hi || u[j] < lin_hi);
            dg[j] = g_free ? (dmj * u[j]) * act_derivative_of(p->activation, g[j]) : 0.0f;
            du[j] = u_free ? dmj * act_of(p->activation, g[j]) : 0.0f;
        }
    }
}

/* C[c] = the sum of column c of src [n][W] over its n rows, in ascending row order from +0 (the bias gradients'
 * sums).  C [W] (overwritten). */
/*@ requires dims: 0 <= n && 0 <= W && n * W <= INT64_MAX;
    requires src: \valid_read(src + (0 .. n * W - 1));
    requires C: \valid(C + (0 .. W - 1)) && \separated(C + (0 .. W - 1), src + (0 .. n * W - 1));
    terminates \true;
    assigns C[0 .. W - 1]; */
static void sum_rows(int64_t n, int64_t W, const float *src, float *C)
{
    /*@ loop invariant bounds: 0 <= c <= W;
        loop assigns c, C[0 .. W - 1];
        loop variant W - c; */
    for (int64_t c = 0; c < W; c++)
        C[c] = 0.0f;
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, C[0 .. W - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(i, n, W); */
        /*@ loop invariant bounds: 0 <= c <= W;
            loop assigns c, C[0 .. W - 1];
            loop variant W - c; */
        for (int64_t c = 0; c < W; c++)
            C[c] = C[c] + src[i * W + c];
    }
}

/* d recomputed (ON_I without a down checkpoint), as the forward's down checkpoint: D [n][H] = rnd(M) . W_d[e]
 * (+ b_d[e]), rnd only with round_intermediates (M itself stays unrounded: d_w_d rounds a*m, not m; Mr [n][I]
 * holds the rounded copy).  M [n][I]; w_d [E][I][H], b_d [E][H] (read with bias) of dtype dt;  bd [H], bbuf
 * [PC*NC] scratch */
/*@ requires problem: \valid_read(p);
    requires dims: 0 <= e < E && 1 <= n && 0 <= H <= INT64_MAX - NC && 0 <= I <= INT64_MAX - PC &&
      n * I <= INT64_MAX && n * H <= INT64_MAX && E * H <= INT64_MAX && E * I <= INT64_MAX && E * I * H <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires weights: tensor_readable((char *)w_d, E * I * H, dt) &&
      (p->bias != 0 ==> tensor_readable((char *)b_d, E * H, dt) &&
                        \separated(bd + (0 .. H - 1), (char *)b_d + (0 .. byte_offset(E * H, dt) - 1)));
    requires scratch: \valid_read(M + (0 .. n * I - 1)) && \valid(Mr + (0 .. n * I - 1)) &&
      \valid(D + (0 .. n * H - 1)) && \valid(bd + (0 .. H - 1)) && \valid(bbuf + (0 .. PC * NC - 1)) &&
      \separated(M + (0 .. n * I - 1), Mr + (0 .. n * I - 1), D + (0 .. n * H - 1), bd + (0 .. H - 1),
                 bbuf + (0 .. PC * NC - 1), p);
    terminates \true;
    assigns Mr[0 .. n * I - 1], D[0 .. n * H - 1], bd[0 .. H - 1], bbuf[0 .. PC * NC - 1]; */
static void bwd_recompute_d(const moe_mlp_problem *p, moe_dtype dt, int64_t H, int64_t I, int64_t e, int64_t n,
                            const float *M, float *Mr, const void *w_d, const void *b_d, float *D, float *bd,
                            float *bbuf) /*@ ghost (int64_t E) */
{
    const float *Md = M;
    if (p->round_intermediates) {
        copy_floats(Mr, M, n * I);
        mlp_round_row(dt, Mr, n * I);
        Md = Mr;
    }
    /*@ ghost lemma_row_fits(e, E, I); */
    /*@ ghost lemma_mul_monotone(e * I + I, E * I, H); */
    /*@ ghost lemma_row_fits(n - 1, n, I); */
    mlp_mm_nn(n, H, I, Md, I, 1, dt, w_d, e * I * H, H, D, H, bbuf);
    if (!p->bias)
        return;
    /*@ ghost lemma_row_fits(e, E, H); */
    mlp_load_f32(dt, b_d, e * H, H, bd);
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, D[0 .. n * H - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(i, n, H); */
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, D[0 .. n * H - 1];
            loop variant H - h; */
        for (int64_t h = 0; h < H; h++)
            D[i * H + h] = D[i * H + h] + bd[h];
    }
}

/* One expert's weight gradient and, with bias, its bias gradient, each through store_grad (p->grad_dtype, one
 * rounding, old + value with accumulate): dw[e][r][c] = sum_{i = 0 .. n-1 ascending} A[i][r] * S[i][c] (mlp_mm_nn_f32
 * of A^T in chunks of RC rows r, C holding one chunk), db[e][c] = sum_i bsrc[i][c] (sum_rows).  d_w_d: A = M,
 * S = dD (ON_H) or G (ON_I), bsrc = dD; d_w_gu: A = X, S = bsrc = dGU.
 *   A [n][R], S [n][W], bsrc [n][W];  C [RC*cw] scratch (ghost cw >= W: its row capacity);  dw [E][R][W], db [E][W] (written with bias) */
/*@ requires problem: \valid_read(p) && dtype_ok(p->grad_dtype);
    requires dims: 0 <= e < E && 0 <= n <= INT64_MAX - PC && 0 <= R <= INT64_MAX - RC && 0 <= W <= INT64_MAX - NC &&
      n * R <= INT64_MAX && n * W <= INT64_MAX && E * R <= INT64_MAX && E * R * W <= INT64_MAX &&
      E * W <= INT64_MAX && W <= cw && RC * cw <= INT64_MAX;
    requires inputs: \valid_read(A + (0 .. n * R - 1)) && \valid_read(S + (0 .. n * W - 1)) &&
      \valid_read(bsrc + (0 .. n * W - 1));
    requires C: \valid(C + (0 .. RC * cw - 1)) && \separated(C + (0 .. RC * cw - 1), p);
    requires C_A: \separated(C + (0 .. RC * cw - 1), A + (0 .. n * R - 1));
    requires C_S: \separated(C + (0 .. RC * cw - 1), S + (0 .. n * W - 1));
    requires C_bsrc: \separated(C + (0 .. RC * cw - 1), bsrc + (0 .. n * W - 1));
    requires dw: tensor_writable((char *)dw, E * R * W, p->grad_dtype) &&
      \separated((char *)dw + (0 .. byte_offset(E * R * W, p->grad_dtype) - 1), C + (0 .. RC * cw - 1), p);
    requires db: p->bias != 0 ==> tensor_writable((char *)db, E * W, p->grad_dtype) &&
      \separated((char *)db + (0 .. byte_offset(E * W, p->grad_dtype) - 1), C + (0 .. RC * cw - 1), p);
    terminates \true;
    assigns C[0 .. RC * cw - 1], ((char *)dw)[0 .. byte_offset(E * R * W, p->grad_dtype) - 1],
      ((char *)db)[0 .. byte_offset(p->bias != 0 ? E * W : 0, p->grad_dtype) - 1]; */
static void bwd_weight_grad(const moe_mlp_problem *p, int64_t e, int64_t n, int64_t R, int64_t W, const float *A,
                            const float *S, const float *bsrc, float *C, void *dw, void *db)
    /*@ ghost (int64_t E, int64_t cw) */
{
    /*@ ghost lemma_mul_monotone(W, cw, RC); */
    /*@ ghost lemma_row_fits(e, E, R); */
    /*@ ghost if (n >= 1) lemma_row_fits(n - 1, n, R); */
    /*@ loop invariant chunks: 0 <= r0 < R + RC;
        loop assigns r0, C[0 .. RC * cw - 1], ((char *)dw)[0 .. byte_offset(E * R * W, p->grad_dtype) - 1];
        loop variant R - r0; */
    for (int64_t r0 = 0; r0 < R; r0 += RC) {
        const int64_t rc = R - r0 < RC ? R - r0 : RC;
        /*@ ghost lemma_mul_monotone(rc, RC, W); */
        /*@ ghost lemma_mul_monotone(e * R + r0 + rc, E * R, W); */
        /*@ ghost lemma_mul_monotone(e * R + r0, e * R + r0 + rc, W); */
        mlp_mm_nn_f32(rc, W, n, A + r0, 1, R, S, W, C, W);
        store_grad(p, dw, (e * R + r0) * W, C, rc * W);
    }
    if (p->bias) {
        /*@ ghost lemma_row_fits(e, E, W); */
        sum_rows(n, W, bsrc, C);
        store_grad(p, db, e * W, C, W);
    }
}

/* Tout [R][n] = W[e] . src^T: Tout[r][i] = sum_{c = 0 .. K-1 ascending} W[e][r][c] * src[i][c] (W[e]: elements
 * woff + r*K + c of a dtype tensor), through Tin = src^T and mlp_mm_wn (the weight row converted once, the inner loop
 * across the n slots).  The backward's dM (W = W_d[e], K = H, R = I) and per-slot dX (W = W_gu[e], K = 2I, R = H).
 *   src [n][K];  Tin [K*n], Tout [R*n], wrow [K] scratch */
/*@ requires dims: 1 <= n <= INT64_MAX - NC && 0 <= K <= INT64_MAX - 32 && 0 <= R && n <= INT64_MAX - 32 &&
      n * K <= INT64_MAX && R * n <= INT64_MAX && 0 <= woff && woff + R * K <= INT64_MAX;
    requires dtype: dtype_ok(wdt);
    requires weight: elements_readable((char *)w, woff, R * K, wdt);
    requires src: \valid_read(src + (0 .. n * K - 1));
    requires scratch: \valid(Tin + (0 .. n * K - 1)) && \valid(Tout + (0 .. R * n - 1)) &&
      \valid(wrow + (0 .. K - 1)) &&
      \separated(Tin + (0 .. n * K - 1), Tout + (0 .. R * n - 1), wrow + (0 .. K - 1), src + (0 .. n * K - 1));
    terminates \true;
    assigns Tin[0 .. n * K - 1], Tout[0 .. R * n - 1], wrow[0 .. K - 1]; */
static void bwd_weight_rows(int64_t n, int64_t K, int64_t R, moe_dtype wdt, const void *w, int64_t woff,
                            const float *src, float *Tin, float *Tout, float *wrow)
{
    mlp_transpose(n, K, src, K, Tin);
    mlp_mm_wn(R, n, K, wdt, w, woff, K, Tin, n, Tout, n, wrow);
}
/* bwd_expert's gather: X, G [n][H] the hidden and output-gradient rows of its slots' tokens, and per slot
 * (bwd_gather_slot) its affinity a[i], its gate/up checkpoint row GU [2I] and, with the down checkpoint, its
 * row Dk [H]. */
/*@ requires dims: 0 <= e < E && 0 <= n <= n_max && 0 <= H && 0 <= I && 2 * I <= INT64_MAX && 0 <= T <= rows &&
      rows * H <= INT64_MAX && T * E <= INT64_MAX && 1 <= B && 0 <= N && N * B <= INT64_MAX &&
      N * (2 * I) <= INT64_MAX && N * (2 * I) * B <= INT64_MAX && N * B * H <= INT64_MAX && 0 <= V &&
      n_max * H <= INT64_MAX && n_max * (2 * I) <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires index: \valid_read(pos + (0 .. V - 1)) && in_range(pos, V, 0, N * B) &&
      \valid_read(token + (0 .. V - 1)) && in_range(token, V, 0, T);
    requires inputs: tensor_readable((char *)hidden, rows * H, dt) && tensor_readable((char *)out_grad, rows * H, dt) &&
      tensor_readable((char *)affinities, T * E, dt) && tensor_readable((char *)gate_up_ckpt_T, N * (2 * I) * B, dt) &&
      (recompute_d == 0 ==> tensor_readable((char *)down_ckpt, N * B * H, dt));
    requires scratch: \valid(X + (0 .. n_max * H - 1)) && \valid(G + (0 .. n_max * H - 1)) &&
      \valid(a + (0 .. n_max - 1)) && \valid(GU + (0 .. n_max * (2 * I) - 1)) && \valid(Dk + (0 .. n_max * H - 1)) &&
      \separated(X + (0 .. n_max * H - 1), G + (0 .. n_max * H - 1), a + (0 .. n_max - 1),
                 GU + (0 .. n_max * (2 * I) - 1), Dk + (0 .. n_max * H - 1));
    requires apart: \separated(X + (0 .. n_max * H - 1), (char *)hidden + (0 .. byte_offset(rows * H, dt) - 1)) &&
      \separated(G + (0 .. n_max * H - 1), (char *)out_grad + (0 .. byte_offset(rows * H, dt) - 1)) &&
      (recompute_d == 0 ==>
         \separated(Dk + (0 .. n_max * H - 1), (char *)down_ckpt + (0 .. byte_offset(N * B * H, dt) - 1)));
    terminates \true;
    assigns X[0 .. n_max * H - 1], G[0 .. n_max * H - 1], a[0 .. n_max - 1], GU[0 .. n_max * (2 * I) - 1],
      Dk[0 .. n_max * H - 1]; */
static void bwd_gather(moe_dtype dt, int64_t E, int64_t B, int64_t H, int64_t I, int64_t e, const int64_t *slots,
                       int64_t n, const int64_t *pos, const int64_t *token, const void *hidden, const void *out_grad,
                       const void *affinities, const void *gate_up_ckpt_T, const void *down_ckpt, int recompute_d,
                       float *X, float *G, float *a, float *GU, float *Dk)
    /*@ ghost (int64_t T, int64_t N, int64_t V, int64_t rows, int64_t n_max) */
{
    const int64_t I2 = 2 * I;
    /*@ ghost lemma_mul_monotone(n, n_max, H); */
    mlp_gather_rows(dt, hidden, slots, token, n, H, X) /*@ ghost (V, rows) */;
    mlp_gather_rows(dt, out_grad, slots, token, n, H, G) /*@ ghost (V, rows) */;
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, a[0 .. n_max - 1], GU[0 .. n_max * I2 - 1], Dk[0 .. n_max * H - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(i, n_max, I2); */
        /*@ ghost lemma_row_fits(i, n_max, H); */
        bwd_gather_slot(dt, E, B, H, I, e, token[slots[i]], pos[slots[i]], affinities, gate_up_ckpt_T, down_ckpt,
                        recompute_d, a, i, GU + i * I2, Dk + i * H) /*@ ghost (T, N) */;
    }
}

/* bwd_expert's down stage: M = act(g) u (bwd_m_rows), d recomputed when recompute_d (bwd_recompute_d), the
 * affinity gradients da_slot and dD = a G, with ON_I M scaled by a (bwd_affinity_rows), with round_intermediates
 * M and dD rounded, then d_w_d[e] and db_d[e] (bwd_weight_grad of M against dD with ON_H, G with ON_I) and
 * dM = (W_d[e] . dDsrc^T)^T (bwd_weight_rows, mlp_transpose).
 *   G, Dk, dD [n][H]; GU [n][2I]; M, dM [n][I]; a [n]; Tin, Tout [n][wide]; C [RC][wide]; brow [wide]; bd [H];
 *   bbuf [PC*NC]; da_slot [V]; d_w_d [E][I][H], d_b_d [E][H] (with bias) of p->grad_dtype */
/*@ requires problem: \valid_read(p) && dtype_ok(p->grad_dtype);
    requires dims: 0 <= e < E && 0 <= n <= n_max && 0 <= H <= wide && 0 <= I && 2 * I <= wide &&
      1 <= wide <= INT64_MAX - NC && n_max <= INT64_MAX - NC && n_max * wide <= INT64_MAX && RC * wide <= INT64_MAX &&
      n_max * H <= INT64_MAX && n_max * I <= INT64_MAX && n_max * (2 * I) <= INT64_MAX && E * H <= INT64_MAX &&
      E * I <= INT64_MAX && E * I * H <= INT64_MAX && 0 <= V;
    requires dtype: dtype_ok(dt);
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires weights: tensor_readable((char *)w_d, E * I * H, dt) &&
      (recompute_d != 0 && p->bias != 0 ==> tensor_readable((char *)b_d, E * H, dt) &&
         \separated(bd + (0 .. H - 1), (char *)b_d + (0 .. byte_offset(E * H, dt) - 1)));
    requires scratch: \valid_read(G + (0 .. n_max * H - 1)) && \valid(Dk + (0 .. n_max * H - 1)) &&
      \valid(dD + (0 .. n_max * H - 1)) && \valid_read(GU + (0 .. n_max * (2 * I) - 1)) &&
      \valid(M + (0 .. n_max * I - 1)) && \valid(dM + (0 .. n_max * I - 1)) && \valid_read(a + (0 .. n_max - 1)) &&
      \valid(Tin + (0 .. n_max * wide - 1)) && \valid(Tout + (0 .. n_max * wide - 1)) &&
      \valid(C + (0 .. RC * wide - 1)) && \valid(brow + (0 .. wide - 1)) && \valid(bd + (0 .. H - 1)) &&
      \valid(bbuf + (0 .. PC * NC - 1)) && \valid(da_slot + (0 .. V - 1)) &&
      \separated(G + (0 .. n_max * H - 1), Dk + (0 .. n_max * H - 1), dD + (0 .. n_max * H - 1),
                 GU + (0 .. n_max * (2 * I) - 1), M + (0 .. n_max * I - 1), dM + (0 .. n_max * I - 1),
                 a + (0 .. n_max - 1), Tin + (0 .. n_max * wide - 1), Tout + (0 .. n_max * wide - 1),
                 C + (0 .. RC * wide - 1), brow + (0 .. wide - 1), bd + (0 .. H - 1), bbuf + (0 .. PC * NC - 1),
                 da_slot + (0 .. V - 1), p);
    requires d_w_d: tensor_writable((char *)d_w_d, E * I * H, p->grad_dtype) &&
      \separated((char *)d_w_d + (0 .. byte_offset(E * I * H, p->grad_dtype) - 1), C + (0 .. RC * wide - 1), p);
    requires d_b_d: p->bias != 0 ==> tensor_writable((char *)d_b_d, E * H, p->grad_dtype) &&
      \separated((char *)d_b_d + (0 .. byte_offset(E * H, p->grad_dtype) - 1), C + (0 .. RC * wide - 1), p);
    terminates \true;
    assigns Dk[0 .. n_max * H - 1], dD[0 .. n_max * H - 1], M[0 .. n_max * I - 1], dM[0 .. n_max * I - 1],
      Tin[0 .. n_max * wide - 1], Tout[0 .. n_max * wide - 1], C[0 .. RC * wide - 1], brow[0 .. wide - 1],
      bd[0 .. H - 1], bbuf[0 .. PC * NC - 1], da_slot[0 .. V - 1], errno,
      ((char *)d_w_d)[0 .. byte_offset(E * I * H, p->grad_dtype) - 1],
      ((char *)d_b_d)[0 .. byte_offset(p->bias != 0 ? E * H : 0, p->grad_dtype) - 1]; */
static void bwd_down_stage(const moe_mlp_problem *p, moe_dtype dt, int64_t H, int64_t I, int64_t e, int64_t n,
                           const int64_t *slots, int on_i, int recompute_d, const void *w_d, const void *b_d,
                           const float *G, float *Dk, float *dD, const float *GU, float *M, float *dM, const float *a,
                           float *Tin, float *Tout, float *C, float *brow, float *bd, float *bbuf, float *da_slot,
                           void *d_w_d, void *d_b_d) /*@ ghost (int64_t E, int64_t V, int64_t n_max, int64_t wide) */
{
    /*@ ghost lemma_mul_monotone(n, n_max, H); */
    /*@ ghost lemma_mul_monotone(n, n_max, I); */
    /*@ ghost lemma_mul_monotone(n, n_max, 2 * I); */
    /*@ ghost lemma_mul_monotone(n, n_max, wide); */
    /*@ ghost lemma_mul_monotone(H, wide, RC); */
    /*@ ghost lemma_mul_monotone(H, wide, n); */
    /*@ ghost lemma_mul_monotone(I, wide, n); */
    /*@ ghost lemma_row_fits(e, E, I); */
    /*@ ghost lemma_mul_monotone(e * I + I, E * I, H); */
    /* m = act(g) * u (the unscaled one first: ON_I without a down checkpoint recomputes d) */
    bwd_m_rows(p->activation, n, I, GU, M);
    if (recompute_d && n > 0)
        bwd_recompute_d(p, dt, H, I, e, n, M, dM, w_d, b_d, Dk, bd, bbuf) /*@ ghost (E) */;
    /* affinity gradient and dD */
    bwd_affinity_rows(n, H, I, on_i, slots, G, Dk, a, da_slot, dD, M) /*@ ghost (V) */;
    /* round_intermediates: dW_d's operands rnd(m) (ON_I rnd(a*m)) and rnd(a*G); dD is also what db_d sums and,
     * with ON_H, the dM GEMM's operand */
    if (p->round_intermediates) {
        mlp_round_row(dt, M, n * I);
        mlp_round_row(dt, dD, n * H);
    }
    /* the down-projection input gradient as the forward applied a: ON_H dD = a*G against the unscaled m; ON_I
     * G against the scaled m */
    const float *dDsrc = on_i ? G : dD;
    /* dW_d[e] = M^T . dDsrc;  db_d[e] = sum dD (= sum a*G either way) */
    bwd_weight_grad(p, e, n, I, H, M, dDsrc, dD, C, d_w_d, d_b_d) /*@ ghost (E, wide) */;
    /* dM = dD . W_d[e]^T  (ON_I: a * (G . W_d^T)), computed as (W_d[e] . dD^T)^T */
    if (n > 0) {
        bwd_weight_rows(n, H, I, dt, w_d, e * I * H, dDsrc, Tin, Tout, brow);
        mlp_transpose(I, n, Tout, n, dM);
    }
}

/* bwd_expert's gate/up stage: dGU = (dg, du) with the clamp masks (bwd_gate_grads; limits already rounded to
 * the dtype), rounded with round_intermediates, then d_w_gu[e] and db_gu[e] (bwd_weight_grad of X against dGU)
 * and the per-slot dX rows = (W_gu[e] . dGU^T)^T into dx_slot (bwd_weight_rows, bwd_dx_scatter).
 *   X [n][H]; GU, dGU [n][2I]; dM [n][I]; a [n]; Tin, Tout [n][wide]; C [RC][wide]; brow [wide];
 *   dx_slot [V][H]; d_w_gu [E][H][2I], d_b_gu [E][2I] (with bias) of p->grad_dtype */
/*@ requires problem: \valid_read(p) && dtype_ok(p->grad_dtype);
    requires dims: 0 <= e < E && 0 <= n <= n_max && 0 <= H <= wide && 0 <= I && 2 * I <= wide &&
      1 <= wide <= INT64_MAX - NC && n_max <= INT64_MAX - NC && n_max * wide <= INT64_MAX && RC * wide <= INT64_MAX &&
      n_max * H <= INT64_MAX && n_max * I <= INT64_MAX && n_max * (2 * I) <= INT64_MAX && E * H <= INT64_MAX &&
      E * (2 * I) <= INT64_MAX && E * H * (2 * I) <= INT64_MAX && 0 <= V && V * H <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires w_gu: tensor_readable((char *)w_gu, E * H * (2 * I), dt);
    requires scratch: \valid_read(X + (0 .. n_max * H - 1)) && \valid_read(GU + (0 .. n_max * (2 * I) - 1)) &&
      \valid(dGU + (0 .. n_max * (2 * I) - 1)) && \valid_read(dM + (0 .. n_max * I - 1)) &&
      \valid_read(a + (0 .. n_max - 1)) && \valid(Tin + (0 .. n_max * wide - 1)) &&
      \valid(Tout + (0 .. n_max * wide - 1)) && \valid(C + (0 .. RC * wide - 1)) && \valid(brow + (0 .. wide - 1)) &&
      \valid(dx_slot + (0 .. V * H - 1)) &&
      \separated(X + (0 .. n_max * H - 1), GU + (0 .. n_max * (2 * I) - 1), dGU + (0 .. n_max * (2 * I) - 1),
                 dM + (0 .. n_max * I - 1), a + (0 .. n_max - 1), Tin + (0 .. n_max * wide - 1),
                 Tout + (0 .. n_max * wide - 1), C + (0 .. RC * wide - 1), brow + (0 .. wide - 1),
                 dx_slot + (0 .. V * H - 1), p);
    requires d_w_gu: tensor_writable((char *)d_w_gu, E * H * (2 * I), p->grad_dtype) &&
      \separated((char *)d_w_gu + (0 .. byte_offset(E * H * (2 * I), p->grad_dtype) - 1), C + (0 .. RC * wide - 1), p);
    requires d_b_gu: p->bias != 0 ==> tensor_writable((char *)d_b_gu, E * (2 * I), p->grad_dtype) &&
      \separated((char *)d_b_gu + (0 .. byte_offset(E * (2 * I), p->grad_dtype) - 1), C + (0 .. RC * wide - 1), p);
    terminates \true;
    assigns dGU[0 .. n_max * (2 * I) - 1], Tin[0 .. n_max * wide - 1], Tout[0 .. n_max * wide - 1],
      C[0 .. RC * wide - 1], brow[0 .. wide - 1], dx_slot[0 .. V * H - 1], errno,
      ((char *)d_w_gu)[0 .. byte_offset(E * H * (2 * I), p->grad_dtype) - 1],
      ((char *)d_b_gu)[0 .. byte_offset(p->bias != 0 ? E * (2 * I) : 0, p->grad_dtype) - 1]; */
static void bwd_gate_up_stage(const moe_mlp_problem *p, moe_dtype dt, int64_t H, int64_t I, int64_t e, int64_t n,
                              const int64_t *slots, int on_i, float nl_lo, float nl_hi, float lin_lo, float lin_hi,
                              const void *w_gu, const float *X, const float *GU, float *dGU, const float *dM,
                              const float *a, float *Tin, float *Tout, float *C, float *brow, float *dx_slot,
                              void *d_w_gu, void *d_b_gu) /*@ ghost (int64_t E, int64_t V, int64_t n_max, int64_t wide) */
{
    const int64_t I2 = 2 * I;
    /*@ ghost lemma_mul_monotone(n, n_max, H); */
    /*@ ghost lemma_mul_monotone(n, n_max, I); */
    /*@ ghost lemma_mul_monotone(n, n_max, I2); */
    /*@ ghost lemma_mul_monotone(n, n_max, wide); */
    /*@ ghost lemma_mul_monotone(I2, wide, RC); */
    /*@ ghost lemma_mul_monotone(I2, wide, n); */
    /*@ ghost lemma_mul_monotone(H, wide, n); */
    /*@ ghost lemma_row_fits(e, E, H); */
    /*@ ghost lemma_mul_monotone(e * H + H, E * H, I2); */
    bwd_gate_grads(p, n, I, on_i, nl_lo, nl_hi, lin_lo, lin_hi, GU, dM, a, dGU);
    /* round_intermediates: rnd(dg), rnd(du) for dW_gu, db_gu and d_hidden */
    if (p->round_intermediates)
        mlp_round_row(dt, dGU, n * I2);
    /* dW_gu[e] = X^T . dGU;  db_gu[e] = sum dGU */
    bwd_weight_grad(p, e, n, H, I2, X, dGU, dGU, C, d_w_gu, d_b_gu) /*@ ghost (E, wide) */;
    /* per-slot dX = dGU . W_gu[e]^T, computed as (W_gu[e] . dGU^T)^T */
    if (n > 0) {
        bwd_weight_rows(n, I2, H, dt, w_gu, e * H * I2, dGU, Tin, Tout, brow);
        bwd_dx_scatter(n, H, slots, Tout, dx_slot) /*@ ghost (V) */;
    }
}

/* The backward of expert e over its n slots (slots[0 .. n - 1]): gather (bwd_gather), the down stage (m, d
 * recomputed, dA and dD, d_w_d and db_d, dM: bwd_down_stage), the gate/up stage (dg/du, d_w_gu and db_gu, the
 * per-slot dX: bwd_gate_up_stage).  An expert without slots still writes its weight (and bias) gradients: +0,
 * or the old value through one rounding with accumulate.
 *   pos, token [V]: the slot index;  s: the thread's scratch;  dx_slot [V][H], da_slot [V]: per-slot gradients;
 *   limits nl_lo .. lin_hi rounded to dt */
/*@ requires problem: \valid_read(p) && dtype_ok(p->grad_dtype);
    requires dims: bwd_dims(T, E, N, B, H, I, V, n_max, rows, wide);
    requires dtype: dtype_ok(dt);
    requires expert: 0 <= e < E;
    requires slots: 0 <= n <= n_max && \valid_read(slots + (0 .. n - 1)) &&
      \forall integer r; 0 <= r < n ==> 0 <= slots[r] < V;
    requires index: \valid_read(pos + (0 .. V - 1)) && in_range(pos, V, 0, N * B) &&
      \valid_read(token + (0 .. V - 1)) && in_range(token, V, 0, T);
    requires inputs: bwd_inputs_at((char *)hidden, (char *)affinities, (char *)w_gu, (char *)w_d, (char *)b_d,
      (char *)gate_up_ckpt_T, (char *)down_ckpt, (char *)out_grad, recompute_d, rows, T, E, N, B, H, I, p->bias, dt);
    requires scratch: bwd_scratch_ok(s, dx_slot, da_slot, V, n_max, H, I, wide);
    requires floats_apart: bwd_floats_apart_p(s, dx_slot, da_slot, V, n_max, H, I, wide, p) &&
      bwd_inputs_apart((char *)hidden, (char *)out_grad, (char *)down_ckpt, (char *)b_d, recompute_d, rows, E, N, B,
                       H, p->bias, dt, s, dx_slot, da_slot, V, n_max, I, wide);
    requires d_w_gu: bwd_grad_ok((char *)d_w_gu, E * H * (2 * I), p->grad_dtype, p, s, dx_slot, da_slot, V, n_max, H,
      I, wide);
    requires d_w_d: bwd_grad_ok((char *)d_w_d, E * I * H, p->grad_dtype, p, s, dx_slot, da_slot, V, n_max, H, I, wide);
    requires d_b_gu: p->bias != 0 ==> bwd_grad_ok((char *)d_b_gu, E * (2 * I), p->grad_dtype, p, s, dx_slot, da_slot,
      V, n_max, H, I, wide);
    requires d_b_d: p->bias != 0 ==> bwd_grad_ok((char *)d_b_d, E * H, p->grad_dtype, p, s, dx_slot, da_slot, V,
      n_max, H, I, wide);
    terminates \true;
    assigns s->X[0 .. n_max * H - 1], s->G[0 .. n_max * H - 1], s->Dk[0 .. n_max * H - 1],
      s->dD[0 .. n_max * H - 1], s->Tin[0 .. n_max * wide - 1], s->Tout[0 .. n_max * wide - 1],
      s->GU[0 .. n_max * (2 * I) - 1], s->dGU[0 .. n_max * (2 * I) - 1], s->M[0 .. n_max * I - 1],
      s->dM[0 .. n_max * I - 1], s->a[0 .. n_max - 1], s->C[0 .. RC * wide - 1], s->brow[0 .. wide - 1],
      s->bd[0 .. H - 1], s->bbuf[0 .. PC * NC - 1], dx_slot[0 .. V * H - 1], da_slot[0 .. V - 1], errno,
      ((char *)d_w_gu)[0 .. byte_offset(E * H * (2 * I), p->grad_dtype) - 1],
      ((char *)d_w_d)[0 .. byte_offset(E * I * H, p->grad_dtype) - 1],
      ((char *)d_b_gu)[0 .. byte_offset(p->bias != 0 ? E * (2 * I) : 0, p->grad_dtype) - 1],
      ((char *)d_b_d)[0 .. byte_offset(p->bias != 0 ? E * H : 0, p->grad_dtype) - 1]; */
static void bwd_expert(const moe_mlp_problem *p, moe_dtype dt, int64_t E, int64_t B, int64_t H, int64_t I, int on_i,
                       int recompute_d, float nl_lo, float nl_hi, float lin_lo, float lin_hi, int64_t e,
                       const int64_t *slots, int64_t n, const int64_t *pos, const int64_t *token, const void *hidden,
                       const void *affinities, const void *w_gu, const void *w_d, const void *b_d,
                       const void *gate_up_ckpt_T, const void *down_ckpt, const void *out_grad, void *d_w_gu,
                       void *d_w_d, void *d_b_gu, void *d_b_d, const bwd_scratch *s, float *dx_slot, float *da_slot)
    /*@ ghost (int64_t T, int64_t N, int64_t V, int64_t n_max, int64_t rows, int64_t wide) */
{
    bwd_gather(dt, E, B, H, I, e, slots, n, pos, token, hidden, out_grad, affinities, gate_up_ckpt_T, down_ckpt,
               recompute_d, s->X, s->G, s->a, s->GU, s->Dk) /*@ ghost (T, N, V, rows, n_max) */;
    bwd_down_stage(p, dt, H, I, e, n, slots, on_i, recompute_d, w_d, b_d, s->G, s->Dk, s->dD, s->GU, s->M, s->dM,
                   s->a, s->Tin, s->Tout, s->C, s->brow, s->bd, s->bbuf, da_slot, d_w_d, d_b_d)
        /*@ ghost (E, V, n_max, wide) */;
    bwd_gate_up_stage(p, dt, H, I, e, n, slots, on_i, nl_lo, nl_hi, lin_lo, lin_hi, w_gu, s->X, s->GU, s->dGU, s->dM,
                      s->a, s->Tin, s->Tout, s->C, s->brow, dx_slot, d_w_gu, d_b_gu) /*@ ghost (E, V, n_max, wide) */;
}

/* One thread's share of the experts: the orphaned `omp for` (dynamic, one expert at a time) of moe_ref_mlp_bwd's
 * parallel region, bwd_expert for each expert e < E (its slots expert_slots[expert_start[e] ..]).  Frama-C parses
 * it without OpenMP: the proof is of the loop run by one thread over every expert.
 *   x: the slot index (V = x->count slots, n_max = x->max_slots) */
/*@ requires problem: \valid_read(p) && dtype_ok(p->grad_dtype);
    requires dims: bwd_dims(T, E, N, B, H, I, V, n_max, rows, wide);
    requires dtype: dtype_ok(dt);
    requires index: slot_index_ok(x, ids, T, E, N, B) && x->count == V && x->max_slots == n_max;
    requires inputs: bwd_inputs_at((char *)hidden, (char *)affinities, (char *)w_gu, (char *)w_d, (char *)b_d,
      (char *)gate_up_ckpt_T, (char *)down_ckpt, (char *)out_grad, recompute_d, rows, T, E, N, B, H, I, p->bias, dt);
    requires scratch: bwd_scratch_ok(s, dx_slot, da_slot, V, n_max, H, I, wide);
    requires floats_apart: bwd_floats_apart_p(s, dx_slot, da_slot, V, n_max, H, I, wide, p) &&
      bwd_inputs_apart((char *)hidden, (char *)out_grad, (char *)down_ckpt, (char *)b_d, recompute_d, rows, E, N, B,
                       H, p->bias, dt, s, dx_slot, da_slot, V, n_max, I, wide);
    requires d_w_gu: bwd_grad_x_ok((char *)d_w_gu, E * H * (2 * I), p->grad_dtype, p, x, V, E, s, dx_slot, da_slot,
      n_max, H, I, wide);
    requires d_w_d: bwd_grad_x_ok((char *)d_w_d, E * I * H, p->grad_dtype, p, x, V, E, s, dx_slot, da_slot, n_max, H,
      I, wide);
    requires d_b_gu: p->bias != 0 ==> bwd_grad_x_ok((char *)d_b_gu, E * (2 * I), p->grad_dtype, p, x, V, E, s,
      dx_slot, da_slot, n_max, H, I, wide);
    requires d_b_d: p->bias != 0 ==> bwd_grad_x_ok((char *)d_b_d, E * H, p->grad_dtype, p, x, V, E, s, dx_slot,
      da_slot, n_max, H, I, wide);
    terminates \true;
    assigns s->X[0 .. n_max * H - 1], s->G[0 .. n_max * H - 1], s->Dk[0 .. n_max * H - 1],
      s->dD[0 .. n_max * H - 1], s->Tin[0 .. n_max * wide - 1], s->Tout[0 .. n_max * wide - 1],
      s->GU[0 .. n_max * (2 * I) - 1], s->dGU[0 .. n_max * (2 * I) - 1], s->M[0 .. n_max * I - 1],
      s->dM[0 .. n_max * I - 1], s->a[0 .. n_max - 1], s->C[0 .. RC * wide - 1], s->brow[0 .. wide - 1],
      s->bd[0 .. H - 1], s->bbuf[0 .. PC * NC - 1], dx_slot[0 .. V * H - 1], da_slot[0 .. V - 1], errno,
      ((char *)d_w_gu)[0 .. byte_offset(E * H * (2 * I), p->grad_dtype) - 1],
      ((char *)d_w_d)[0 .. byte_offset(E * I * H, p->grad_dtype) - 1],
      ((char *)d_b_gu)[0 .. byte_offset(p->bias != 0 ? E * (2 * I) : 0, p->grad_dtype) - 1],
      ((char *)d_b_d)[0 .. byte_offset(p->bias != 0 ? E * H : 0, p->grad_dtype) - 1]; */
static void bwd_experts(const moe_mlp_problem *p, moe_dtype dt, int64_t E, int64_t B, int64_t H, int64_t I, int on_i,
                        int recompute_d, float nl_lo, float nl_hi, float lin_lo, float lin_hi, const slot_index *x,
                        const void *hidden, const void *affinities, const void *w_gu, const void *w_d, const void *b_d,
                        const void *gate_up_ckpt_T, const void *down_ckpt, const void *out_grad, void *d_w_gu,
                        void *d_w_d, void *d_b_gu, void *d_b_d, const bwd_scratch *s, float *dx_slot, float *da_slot)
    /*@ ghost (const int64_t *ids, int64_t T, int64_t N, int64_t V, int64_t n_max, int64_t rows, int64_t wide) */
{
    /*@ loop invariant bounds: 0 <= e <= E;
        loop assigns e, s->X[0 .. n_max * H - 1], s->G[0 .. n_max * H - 1], s->Dk[0 .. n_max * H - 1],
          s->dD[0 .. n_max * H - 1], s->Tin[0 .. n_max * wide - 1], s->Tout[0 .. n_max * wide - 1],
          s->GU[0 .. n_max * (2 * I) - 1], s->dGU[0 .. n_max * (2 * I) - 1], s->M[0 .. n_max * I - 1],
          s->dM[0 .. n_max * I - 1], s->a[0 .. n_max - 1], s->C[0 .. RC * wide - 1], s->brow[0 .. wide - 1],
          s->bd[0 .. H - 1], s->bbuf[0 .. PC * NC - 1], dx_slot[0 .. V * H - 1], da_slot[0 .. V - 1], errno,
          ((char *)d_w_gu)[0 .. byte_offset(E * H * (2 * I), p->grad_dtype) - 1],
          ((char *)d_w_d)[0 .. byte_offset(E * I * H, p->grad_dtype) - 1],
          ((char *)d_b_gu)[0 .. byte_offset(p->bias != 0 ? E * (2 * I) : 0, p->grad_dtype) - 1],
          ((char *)d_b_d)[0 .. byte_offset(p->bias != 0 ? E * H : 0, p->grad_dtype) - 1];
        loop variant E - e; */
    MLP_OMP(for schedule(dynamic, 1))
    for (int64_t e = 0; e < E; e++) {
        const int64_t first = x->expert_start[e], n = x->expert_start[e + 1] - first;
        /*@ assert slots_in: 0 <= first && first + n <= V && 0 <= n <= n_max; */
        /*@ assert slots_kept: \forall integer r; first <= r < first + n ==> 0 <= x->expert_slots[r] < V; */
        bwd_expert(p, dt, E, B, H, I, on_i, recompute_d, nl_lo, nl_hi, lin_lo, lin_hi, e, x->expert_slots + first, n,
                   x->pos, x->token, hidden, affinities, w_gu, w_d, b_d, gate_up_ckpt_T, down_ckpt, out_grad, d_w_gu,
                   d_w_d, d_b_gu, d_b_d, s, dx_slot, da_slot) /*@ ghost (T, N, V, n_max, rows, wide) */;
    }
}

moe_status moe_ref_mlp_bwd(const moe_mlp_problem *p, const void *hidden, const void *affinities,
                           const void *w_gu, const void *w_d, const void *b_d, const void *gate_up_ckpt_T,
                           const void *down_ckpt, const void *out_grad, void *d_hidden, void *d_affinities,
                           void *d_w_gu, void *d_w_d, void *d_b_gu, void *d_b_d)
{
    const int64_t E = p->E, B = p->B, H = p->H, I = p->I, I2 = 2 * p->I, T = p->T;
    const moe_dtype dt = p->dtype;
    const int on_i = p->affinity == MOE_AFFINITY_ON_I;
    const int recompute_d = down_ckpt == NULL; /* only allowed with ON_I */
    slot_index x;
    moe_status status = mlp_build_index(p, &x);
    if (status != MOE_OK)
        return status;
    const int64_t n_max = x.max_slots, wide = mlp_max3(H, I2, 1);
    const int threads = mlp_threads_for(x.count, H, I);
    /* per thread: X, G, Dk, dD [n][H]; GU, dGU [n][2I]; M, dM [n][I]; a [n]; transposed in/out [wide][n];
     * C [RC][wide]; wrow [wide]; bias row [H]; bbuf; per-token expert row [E] */
    const double need = (double)n_max * (double)(4 * H + 2 * I2 + 2 * I + 1 + 2 * wide) +
                        (double)(RC + 1) * (double)wide + (double)E;
    const size_t per_thread = need > 0x1p60 ? SIZE_MAX
                              : (size_t)n_max * (size_t)(4 * H + 2 * I2 + 2 * I + 1 + 2 * wide) +
                                    (size_t)(RC + 1) * wide + (size_t)H + PC * NC + (size_t)E + 16 * 15;
    arena ws;
    float *dx_slot = mlp_alloc_floats(x.count, H);
    float *da_slot = mlp_alloc_floats(x.count, 1);
    if (dx_slot == NULL || da_slot == NULL || !mlp_arena_alloc(&ws, threads, per_thread)) {
        free(dx_slot);
        free(da_slot);
        mlp_free_index(&x);
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for the float32 workspace (%" PRId64
                        " slots, H = %" PRId64 ", I = %" PRId64 ")", p->op, x.count, H, I);
    }
    const float nl_lo = mlp_round_to(dt, p->nl_lo), nl_hi = mlp_round_to(dt, p->nl_hi);
    const float lin_lo = mlp_round_to(dt, p->lin_lo), lin_hi = mlp_round_to(dt, p->lin_hi);

    MLP_OMP(parallel num_threads(threads))
    {
        float *cur = ws.base + (size_t)team_member(threads) * ws.per_thread;
        float *X = mlp_carve(&cur, n_max * H), *G = mlp_carve(&cur, n_max * H), *Dk = mlp_carve(&cur, n_max * H);
        float *dD = mlp_carve(&cur, n_max * H), *Tin = mlp_carve(&cur, n_max * wide);
        float *Tout = mlp_carve(&cur, n_max * wide);
        float *GU = mlp_carve(&cur, n_max * I2), *dGU = mlp_carve(&cur, n_max * I2);
        float *M = mlp_carve(&cur, n_max * I), *dM = mlp_carve(&cur, n_max * I), *a = mlp_carve(&cur, n_max);
        float *C = mlp_carve(&cur, RC * wide), *brow = mlp_carve(&cur, wide), *bd = mlp_carve(&cur, H);
        float *bbuf = mlp_carve(&cur, PC * NC), *row_e = mlp_carve(&cur, E);

        const bwd_scratch s = {X, G, Dk, dD, Tin, Tout, GU, dGU, M, dM, a, C, brow, bd, bbuf};

        bwd_experts(p, dt, E, B, H, I, on_i, recompute_d, nl_lo, nl_hi, lin_lo, lin_hi, &x, hidden, affinities, w_gu,
                    w_d, b_d, gate_up_ckpt_T, down_ckpt, out_grad, d_w_gu, d_w_d, d_b_gu, d_b_d, &s, dx_slot, da_slot)
            /*@ ghost (p->token_position_to_id, T, p->N, x.count, n_max, p->token_rows, wide) */;

        /* token rows of d_hidden and d_affinities (acc = brow: wide >= H) */
        bwd_tokens(dt, T, E, B, H, p->token_rows, x.token_start, x.token_slots, x.pos, p->block_to_expert, dx_slot,
                   da_slot, brow, row_e, d_hidden, d_affinities) /*@ ghost (p->N, x.count) */;
    }

    free(dx_slot);
    free(da_slot);
    free(ws.base);
    mlp_free_index(&x);
    return MOE_OK;
}
