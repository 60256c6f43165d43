/*
 * ref/mlp/fwd.c: the forward of the blockwise MoE MLP reference with its checkpoints: per expert (one
 * thread each), the padding positions' checkpoints +0, the gather of its slots' rows, the gate/up GEMM with
 * bias, clamps, checkpoint and activation, the down GEMM with bias, checkpoint and the affinity; then per
 * token the sum of its slots' contributions in ascending slot order.  The per-expert and per-token loops are
 * proved; the allocating shell (moe_ref_mlp_fwd, the entry point of mlp_ref.h) is not (allocation).
 */
#include "mlp_internal.h"
#include "activations.h"

/* Whether id is a token (in [0, T)): a layout's other entries mark padding positions. */
/*@ requires p: \valid_read(p);
    terminates \true;
    assigns \nothing;
    ensures token: \result != 0 <==> 0 <= id < p->T; */
static int is_token(const moe_mlp_problem *p, int64_t id) { return id >= 0 && id < p->T; }

/* One padding position (block blk, row b): its gate/up checkpoint column and its down checkpoint row +0.
 *   gate_up_ckpt_T [N][2I][B], down_ckpt [N*B][H] of dtype dt, each NULL when not requested */
/*@ requires dims: 0 <= N && 1 <= B && 0 <= H && 0 <= I2 && N * B <= INT64_MAX && N * I2 <= INT64_MAX &&
      N * B * H <= INT64_MAX && N * I2 * B <= INT64_MAX;
    requires position: 0 <= blk < N && 0 <= b < B;
    requires dtype: dtype_ok(dt);
    requires gate_up: gate_up_ckpt_T != \null ==> tensor_writable((char *)gate_up_ckpt_T, N * I2 * B, dt);
    requires down: down_ckpt != \null ==> tensor_writable((char *)down_ckpt, N * B * H, dt);
    terminates \true;
    assigns ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * I2 * B, dt)) - 1],
      ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(N * B * H, dt)) - 1]; */
static void fwd_pad_position(moe_dtype dt, int64_t B, int64_t H, int64_t I2, int64_t blk, int64_t b,
                             void *gate_up_ckpt_T, void *down_ckpt) /*@ ghost (int64_t N) */
{
    if (gate_up_ckpt_T != NULL) {
        /*@ ghost lemma_row_fits(blk, N, I2); */
        /*@ loop invariant bounds: 0 <= i <= I2;
            loop assigns i, ((char *)gate_up_ckpt_T)[0 .. byte_offset(N * I2 * B, dt) - 1];
            loop variant I2 - i; */
        for (int64_t i = 0; i < I2; i++) {
            /*@ ghost lemma_row_fits(blk * I2 + i, N * I2, B); */
            moe_ref_store(dt, gate_up_ckpt_T, (blk * I2 + i) * B + b, 0.0f);
        }
    }
    if (down_ckpt != NULL) {
        /*@ ghost lemma_row_fits(blk, N, B); */
        /*@ ghost lemma_row_fits(blk * B + b, N * B, H); */
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, ((char *)down_ckpt)[0 .. byte_offset(N * B * H, dt) - 1];
            loop variant H - h; */
        for (int64_t h = 0; h < H; h++)
            moe_ref_store(dt, down_ckpt, (blk * B + b) * H + h, 0.0f);
    }
}

/* The padding positions of one expert's blocks (blocks[q0 .. q1 - 1], each in [0, N)): checkpoints +0.
 *   ids: the layout's token_position_to_id [N*B] (p->T: the tokens) */
/*@ requires problem: \valid_read(p);
    requires dims: 0 <= N && 1 <= B && 0 <= H && 0 <= I2 && N * B <= INT64_MAX && N * I2 <= INT64_MAX &&
      N * B * H <= INT64_MAX && N * I2 * B <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires blocks: 0 <= q0 <= q1 && \valid_read(blocks + (q0 .. q1 - 1)) &&
      \forall integer q; q0 <= q < q1 ==> 0 <= blocks[q] < N;
    requires ids: \valid_read(ids + (0 .. N * B - 1));
    requires gate_up: gate_up_ckpt_T != \null ==> tensor_writable((char *)gate_up_ckpt_T, N * I2 * B, dt) &&
      \separated((char *)gate_up_ckpt_T + (0 .. byte_offset(N * I2 * B, dt) - 1), p) &&
      \separated((char *)gate_up_ckpt_T + (0 .. byte_offset(N * I2 * B, dt) - 1), blocks + (q0 .. q1 - 1)) &&
      \separated((char *)gate_up_ckpt_T + (0 .. byte_offset(N * I2 * B, dt) - 1), ids + (0 .. N * B - 1));
    requires down: down_ckpt != \null ==> tensor_writable((char *)down_ckpt, N * B * H, dt) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(N * B * H, dt) - 1), p) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(N * B * H, dt) - 1), blocks + (q0 .. q1 - 1)) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(N * B * H, dt) - 1), ids + (0 .. N * B - 1));
    terminates \true;
    assigns ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * I2 * B, dt)) - 1],
      ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(N * B * H, dt)) - 1]; */
static void fwd_pad(const moe_mlp_problem *p, moe_dtype dt, int64_t B, int64_t H, int64_t I2, const int64_t *ids,
                    const int64_t *blocks, int64_t q0, int64_t q1, void *gate_up_ckpt_T, void *down_ckpt)
    /*@ ghost (int64_t N) */
{
    /*@ loop invariant bounds: q0 <= q <= \max(q0, q1);
        loop assigns q, ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * I2 * B, dt)) - 1],
          ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(N * B * H, dt)) - 1];
        loop variant q1 - q; */
    for (int64_t q = q0; q < q1; q++) {
        const int64_t blk = blocks[q];
        /*@ ghost lemma_row_fits(blk, N, B); */
        /*@ loop invariant bounds: 0 <= b <= B;
            loop assigns b, ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * I2 * B, dt)) - 1],
              ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(N * B * H, dt)) - 1];
            loop variant B - b; */
        for (int64_t b = 0; b < B; b++) {
            if (is_token(p, ids[blk * B + b]))
                continue;
            fwd_pad_position(dt, B, H, I2, blk, b, gate_up_ckpt_T, down_ckpt) /*@ ghost (N) */;
        }
    }
}

/* One slot's gate/up row gu [2I] after the GEMM: + bgu (with bias), clamped (gate j < I: the non-linear
 * limits; up: the linear ones), stored back and, when requested, checkpointed at position (blk, b) of
 * gate_up_ckpt_T [N][2I][B]. */
/*@ requires problem: \valid_read(p);
    requires dims: 0 <= N && 1 <= B && 0 <= I && 2 * I <= INT64_MAX && N * (2 * I) <= INT64_MAX &&
      N * (2 * I) * B <= INT64_MAX;
    requires position: 0 <= blk < N && 0 <= b < B;
    requires dtype: dtype_ok(dt);
    requires gu: \valid(gu + (0 .. 2 * I - 1)) && \separated(gu + (0 .. 2 * I - 1), p);
    requires bgu: \valid_read(bgu + (0 .. 2 * I - 1));
    requires gate_up: gate_up_ckpt_T != \null ==> tensor_writable((char *)gate_up_ckpt_T, N * (2 * I) * B, dt) &&
      \separated((char *)gate_up_ckpt_T + (0 .. byte_offset(N * (2 * I) * B, dt) - 1), p);
    terminates \true;
    assigns gu[0 .. 2 * I - 1],
      ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * (2 * I) * B, dt)) - 1]; */
static void fwd_gate_up_row(const moe_mlp_problem *p, moe_dtype dt, int64_t B, int64_t I, float *gu,
                            const float *bgu, void *gate_up_ckpt_T, int64_t blk, int64_t b) /*@ ghost (int64_t N) */
{
    const int64_t I2 = 2 * I;
    /*@ ghost lemma_row_fits(blk, N, I2); */
    /*@ ghost const int64_t NI2 = N * I2; */
    const int64_t row0 = blk * I2; /* the checkpoint's rows (blk, j) start here */
    /*@ loop invariant bounds: 0 <= j <= I2;
        loop assigns j, gu[0 .. I2 - 1],
          ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * I2 * B, dt)) - 1];
        loop variant I2 - j; */
    for (int64_t j = 0; j < I2; j++) {
        const int64_t r = row0 + j;
        /*@ ghost lemma_row_fits(r, NI2, B); */
        /* the checkpoint element (blk * 2I + j) * B + b, computed before the float operations (with their facts
         * in the context, and the index as one expression, the provers failed on its overflow goals) */
        const int64_t k = r * B + b;
        float v = p->bias ? gu[j] + bgu[j] : gu[j];
        v = j < I ? clamp_(v, p->has_nl_lo, p->nl_lo, p->has_nl_hi, p->nl_hi)
                  : clamp_(v, p->has_lin_lo, p->lin_lo, p->has_lin_hi, p->lin_hi);
        gu[j] = v;
        if (gate_up_ckpt_T != NULL)
            moe_ref_store(dt, gate_up_ckpt_T, k, v);
    }
}

/* One slot's activation row: m [I] = act(g) * u from its clamped gate/up row gu [2I]; with ON_I the
 * unscaled m is copied to m0 [I] (write_d0: for the down checkpoint; rounded with round_intermediates) and
 * m scaled by the slot's affinity a[i]; m rounded with round_intermediates. */
/*@ requires problem: \valid_read(p);
    requires dims: 0 <= I && 2 * I <= INT64_MAX && 0 <= i;
    requires dtype: dtype_ok(dt);
    requires rows: \valid_read(gu + (0 .. 2 * I - 1)) && \valid(m + (0 .. I - 1)) && \valid_read(a + i);
    requires m0: write_d0 != 0 ==> \valid(m0 + (0 .. I - 1)) &&
      \separated(m0 + (0 .. I - 1), m + (0 .. I - 1), p);
    requires apart: \separated(m + (0 .. I - 1), gu + (0 .. 2 * I - 1), a + i, p);
    terminates \true;
    assigns m[0 .. I - 1], m0[0 .. (write_d0 != 0 ? I : 0) - 1], errno; */
static void fwd_act_row(const moe_mlp_problem *p, moe_dtype dt, int64_t I, const float *gu, float *m, float *m0,
                        const float *a, int64_t i, int on_i, int write_d0)
{
    /*@ loop invariant bounds: 0 <= j <= I;
        loop assigns j, m[0 .. I - 1], errno;
        loop variant I - j; */
    for (int64_t j = 0; j < I; j++)
        m[j] = act_of(p->activation, gu[j]) * gu[I + j];
    if (on_i) {
        if (write_d0) {
            copy_floats(m0, m, I);
            if (p->round_intermediates)
                mlp_round_row(dt, m0, I);
        }
        /*@ loop invariant bounds: 0 <= j <= I;
            loop assigns j, m[0 .. I - 1];
            loop variant I - j; */
        for (int64_t j = 0; j < I; j++)
            m[j] = m[j] * a[i];
    }
    /* the down projection's operand: rnd(m) (ON_I: rnd(act(g)*u*a), from the unrounded product) */
    if (p->round_intermediates)
        mlp_round_row(dt, m, I);
}

/* One slot's down row d [H] after the GEMM (d0 [H]: the unscaled one, write_d0 only): ON_H d + bd (with
 * bias), checkpointed at position pos of down_ckpt [N*B][H], contribution c [H] = a[i] * d; ON_I c = d +
 * a[i] * bd (with bias, else d), and the checkpoint from d0 (+ bd). */
/*@ requires problem: \valid_read(p);
    requires dims: 0 <= H && 0 <= pos < NB && NB * H <= INT64_MAX && 0 <= i;
    requires dtype: dtype_ok(dt);
    requires mode: write_d0 != 0 ==> on_i != 0 && down_ckpt != \null;
    requires rows: \valid(d + (0 .. H - 1)) && \valid_read(bd + (0 .. H - 1)) && \valid_read(a + i) &&
      \valid(c + (0 .. H - 1));
    requires d0: write_d0 != 0 ==> \valid(d0 + (0 .. H - 1)) &&
      \separated(d0 + (0 .. H - 1), c + (0 .. H - 1), bd + (0 .. H - 1), a + i, p);
    requires apart: \separated(c + (0 .. H - 1), d + (0 .. H - 1), bd + (0 .. H - 1), a + i, p) &&
      \separated(d + (0 .. H - 1), bd + (0 .. H - 1), a + i, p);
    requires down: down_ckpt != \null ==> tensor_writable((char *)down_ckpt, NB * H, dt) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), p, d + (0 .. H - 1),
                 c + (0 .. H - 1), bd + (0 .. H - 1), a + i) &&
      (write_d0 != 0 ==> \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), d0 + (0 .. H - 1)));
    terminates \true;
    assigns d[0 .. H - 1], d0[0 .. (write_d0 != 0 ? H : 0) - 1], c[0 .. H - 1],
      ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(NB * H, dt)) - 1]; */
static void fwd_down_row(const moe_mlp_problem *p, moe_dtype dt, int64_t H, float *d, float *d0, const float *bd,
                         const float *a, int64_t i, float *c, void *down_ckpt, int64_t pos, int on_i, int write_d0)
    /*@ ghost (int64_t NB) */
{
    /*@ ghost lemma_row_fits(pos, NB, H); */
    if (!on_i) {
        if (p->bias)
            /*@ loop invariant bounds: 0 <= h <= H;
                loop assigns h, d[0 .. H - 1];
                loop variant H - h; */
            for (int64_t h = 0; h < H; h++)
                d[h] = d[h] + bd[h];
        if (down_ckpt != NULL)
            mlp_store_row(dt, down_ckpt, pos * H, d, H);
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, c[0 .. H - 1];
            loop variant H - h; */
        for (int64_t h = 0; h < H; h++)
            c[h] = a[i] * d[h];
    } else {
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, c[0 .. H - 1];
            loop variant H - h; */
        for (int64_t h = 0; h < H; h++)
            c[h] = p->bias ? d[h] + a[i] * bd[h] : d[h];
        if (write_d0) {
            if (p->bias)
                /*@ loop invariant bounds: 0 <= h <= H;
                    loop assigns h, d0[0 .. H - 1];
                    loop variant H - h; */
                for (int64_t h = 0; h < H; h++)
                    d0[h] = d0[h] + bd[h];
            mlp_store_row(dt, down_ckpt, pos * H, d0, H);
        }
    }
}

/* fwd_expert's gather: the rows X [n][H] of its slots' tokens (hidden), their affinities a [n] for expert e
 * (affinities [T][E]) and, with bias, its bias rows bgu [2I], bd [H] (b_gu [E][2I], b_d [E][H]). */
/*@ requires problem: \valid_read(p);
    requires dims: 0 <= T <= rows && 0 <= e < E && 0 <= H && 0 <= I && 1 <= n <= n_max && 0 <= V &&
      rows * H <= INT64_MAX && n_max * H <= INT64_MAX && T * E <= INT64_MAX && E * H <= INT64_MAX &&
      E * (2 * I) <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires token: \valid_read(token + (0 .. V - 1)) && in_range(token, V, 0, T);
    requires inputs: tensor_readable((char *)hidden, rows * H, dt) && tensor_readable((char *)affinities, T * E, dt) &&
      (p->bias != 0 ==> tensor_readable((char *)b_gu, E * (2 * I), dt) && tensor_readable((char *)b_d, E * H, dt));
    requires scratch: \valid(X + (0 .. n_max * H - 1)) && \valid(a + (0 .. n_max - 1)) &&
      \valid(bgu + (0 .. 2 * I - 1)) && \valid(bd + (0 .. H - 1)) &&
      \separated(X + (0 .. n_max * H - 1), a + (0 .. n_max - 1), bgu + (0 .. 2 * I - 1), bd + (0 .. H - 1));
    requires apart: \separated(X + (0 .. n_max * H - 1), (char *)hidden + (0 .. byte_offset(rows * H, dt) - 1)) &&
      (p->bias != 0 ==> \separated(bgu + (0 .. 2 * I - 1), (char *)b_gu + (0 .. byte_offset(E * (2 * I), dt) - 1)) &&
                        \separated(bd + (0 .. H - 1), (char *)b_d + (0 .. byte_offset(E * H, dt) - 1)));
    terminates \true;
    assigns X[0 .. n_max * H - 1], a[0 .. n_max - 1], bgu[0 .. 2 * I - 1], bd[0 .. H - 1]; */
static void fwd_gather(const moe_mlp_problem *p, moe_dtype dt, int64_t E, int64_t H, int64_t I, int64_t e,
                       const int64_t *slots, int64_t n, const int64_t *token, const void *hidden,
                       const void *affinities, const void *b_gu, const void *b_d, float *X, float *a, float *bgu,
                       float *bd) /*@ ghost (int64_t T, int64_t V, int64_t rows, int64_t n_max) */
{
    const int64_t I2 = 2 * I;
    /*@ ghost lemma_mul_monotone(n, n_max, H); */
    mlp_gather_rows(dt, hidden, slots, token, n, H, X) /*@ ghost (V, rows) */;
    /*@ loop invariant bounds: 0 <= i <= n;
        loop assigns i, a[0 .. n_max - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        /*@ ghost lemma_row_fits(token[slots[i]], T, E); */
        a[i] = moe_ref_load(dt, affinities, token[slots[i]] * E + e);
    }
    if (p->bias) {
        /*@ ghost lemma_row_fits(e, E, I2); */
        /*@ ghost lemma_row_fits(e, E, H); */
        mlp_load_f32(dt, b_gu, e * I2, I2, bgu);
        mlp_load_f32(dt, b_d, e * H, H, bd);
    }
}

/* fwd_expert's gate/up stage: GU [n][2I] = X . W_gu[e] (w_gu [E][H][2I]), then per slot fwd_gate_up_row (bias,
 * clamp, checkpoint at its position pos[slots[i]] of gate_up_ckpt_T [N][2I][B]) and fwd_act_row (M [n][I],
 * with write_d0 M0 [n][I]). */
/*@ requires problem: \valid_read(p);
    requires dims: 0 <= e < E && 0 <= H && 0 <= I && 1 <= n <= n_max && 0 <= V && 0 <= N && 1 <= B &&
      H <= SIZE_MAX / 64 && 2 * I <= SIZE_MAX / 64 && E * H <= INT64_MAX && E * H * (2 * I) <= INT64_MAX &&
      N * B <= INT64_MAX && N * (2 * I) <= INT64_MAX && N * (2 * I) * B <= INT64_MAX &&
      n_max * H <= INT64_MAX && n_max * (2 * I) <= INT64_MAX && n_max * I <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires mode: write_d0 != 0 ==> on_i != 0;
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires pos: \valid_read(pos + (0 .. V - 1)) && in_range(pos, V, 0, N * B);
    requires w_gu: tensor_readable((char *)w_gu, E * H * (2 * I), dt);
    requires scratch: \valid_read(X + (0 .. n_max * H - 1)) && \valid(GU + (0 .. n_max * (2 * I) - 1)) &&
      \valid(M + (0 .. n_max * I - 1)) && \valid(M0 + (0 .. (write_d0 != 0 ? n_max * I : 0) - 1)) &&
      \valid_read(a + (0 .. n_max - 1)) && \valid_read(bgu + (0 .. 2 * I - 1)) && \valid(bbuf + (0 .. PC * NC - 1)) &&
      \separated(GU + (0 .. n_max * (2 * I) - 1), M + (0 .. n_max * I - 1),
                 M0 + (0 .. (write_d0 != 0 ? n_max * I : 0) - 1), a + (0 .. n_max - 1), bgu + (0 .. 2 * I - 1),
                 bbuf + (0 .. PC * NC - 1), p) &&
      \separated(X + (0 .. n_max * H - 1), GU + (0 .. n_max * (2 * I) - 1), M + (0 .. n_max * I - 1),
                 M0 + (0 .. (write_d0 != 0 ? n_max * I : 0) - 1), bbuf + (0 .. PC * NC - 1));
    requires gate_up: gate_up_ckpt_T != \null ==> tensor_writable((char *)gate_up_ckpt_T, N * (2 * I) * B, dt) &&
      \separated((char *)gate_up_ckpt_T + (0 .. byte_offset(N * (2 * I) * B, dt) - 1), p) &&
      \separated((char *)gate_up_ckpt_T + (0 .. byte_offset(N * (2 * I) * B, dt) - 1), slots + (0 .. n - 1)) &&
      \separated((char *)gate_up_ckpt_T + (0 .. byte_offset(N * (2 * I) * B, dt) - 1), pos + (0 .. V - 1));
    terminates \true;
    assigns GU[0 .. n_max * (2 * I) - 1], M[0 .. n_max * I - 1], M0[0 .. (write_d0 != 0 ? n_max * I : 0) - 1],
      bbuf[0 .. PC * NC - 1], errno,
      ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * (2 * I) * B, dt)) - 1]; */
static void fwd_gate_up(const moe_mlp_problem *p, moe_dtype dt, int64_t B, int64_t H, int64_t I, int64_t e,
                        const int64_t *slots, int64_t n, const int64_t *pos, const void *w_gu, const float *X,
                        float *GU, float *M, float *M0, const float *a, const float *bgu, float *bbuf,
                        void *gate_up_ckpt_T, int on_i, int write_d0)
    /*@ ghost (int64_t E, int64_t N, int64_t V, int64_t n_max) */
{
    const int64_t I2 = 2 * I;
    /*@ ghost lemma_row_fits(e, E, H); */
    /*@ ghost lemma_mul_monotone(e * H + H, E * H, I2); */
    /*@ ghost lemma_row_fits(n - 1, n_max, H); */
    /*@ ghost lemma_mul_monotone(n, n_max, I2); */
    mlp_mm_nn(n, I2, H, X, H, 1, dt, w_gu, e * H * I2, I2, GU, I2, bbuf);
    /*@ loop invariant bounds: 0 <= i <= n;
        loop invariant slots: in_range(slots, n, 0, V);
        loop invariant pos: in_range(pos, V, 0, N * B);
        loop assigns i, errno, GU[0 .. n_max * I2 - 1], M[0 .. n_max * I - 1],
          M0[0 .. (write_d0 != 0 ? n_max * I : 0) - 1],
          ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * I2 * B, dt)) - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        const int64_t pos_i = pos[slots[i]], blk = pos_i / B, b = pos_i % B;
        /*@ ghost lemma_div_below(pos_i, N, B); */
        /*@ ghost lemma_row_fits(i, n_max, I2); */
        /*@ ghost lemma_row_fits(i, n_max, I); */
        fwd_gate_up_row(p, dt, B, I, GU + i * I2, bgu, gate_up_ckpt_T, blk, b) /*@ ghost (N) */;
        fwd_act_row(p, dt, I, GU + i * I2, M + i * I, write_d0 ? M0 + i * I : NULL, a, i, on_i, write_d0);
    }
}

/* fwd_expert's down stage: D [n][H] = M . W_d[e] (w_d [E][I][H]; with write_d0 also D0 = M0 . W_d[e]), then
 * per slot fwd_down_row into its contribution row contrib[slots[i]] and the down checkpoint at its position. */
/*@ requires problem: \valid_read(p);
    requires dims: 0 <= e < E && 0 <= H && 0 <= I && 1 <= n <= n_max && 0 <= V && 0 <= NB &&
      H <= SIZE_MAX / 64 && 2 * I <= SIZE_MAX / 64 && E * I <= INT64_MAX && E * I * H <= INT64_MAX && NB * H <= INT64_MAX &&
      V * H <= INT64_MAX && n_max * H <= INT64_MAX && n_max * I <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires mode: write_d0 != 0 ==> on_i != 0 && down_ckpt != \null;
    requires slots: \valid_read(slots + (0 .. n - 1)) && in_range(slots, n, 0, V);
    requires pos: \valid_read(pos + (0 .. V - 1)) && in_range(pos, V, 0, NB);
    requires w_d: tensor_readable((char *)w_d, E * I * H, dt);
    requires scratch: \valid_read(M + (0 .. n_max * I - 1)) && \valid_read(M0 + (0 .. (write_d0 != 0 ? n_max * I : 0) - 1)) &&
      \valid(D + (0 .. n_max * H - 1)) && \valid(D0 + (0 .. (write_d0 != 0 ? n_max * H : 0) - 1)) &&
      \valid_read(a + (0 .. n_max - 1)) && \valid_read(bd + (0 .. H - 1)) && \valid(bbuf + (0 .. PC * NC - 1)) &&
      \valid(contrib + (0 .. V * H - 1)) &&
      \separated(D + (0 .. n_max * H - 1), D0 + (0 .. (write_d0 != 0 ? n_max * H : 0) - 1), contrib + (0 .. V * H - 1),
                 a + (0 .. n_max - 1), bd + (0 .. H - 1), bbuf + (0 .. PC * NC - 1), p) &&
      \separated(M + (0 .. n_max * I - 1), M0 + (0 .. (write_d0 != 0 ? n_max * I : 0) - 1), D + (0 .. n_max * H - 1),
                 D0 + (0 .. (write_d0 != 0 ? n_max * H : 0) - 1), bbuf + (0 .. PC * NC - 1));
    requires down: down_ckpt != \null ==> tensor_writable((char *)down_ckpt, NB * H, dt) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), p) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), slots + (0 .. n - 1)) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), pos + (0 .. V - 1)) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), D + (0 .. n_max * H - 1)) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), D0 + (0 .. (write_d0 != 0 ? n_max * H : 0) - 1)) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), contrib + (0 .. V * H - 1)) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), bd + (0 .. H - 1)) &&
      \separated((char *)down_ckpt + (0 .. byte_offset(NB * H, dt) - 1), a + (0 .. n_max - 1));
    terminates \true;
    assigns D[0 .. n_max * H - 1], D0[0 .. (write_d0 != 0 ? n_max * H : 0) - 1], bbuf[0 .. PC * NC - 1],
      contrib[0 .. V * H - 1], ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(NB * H, dt)) - 1]; */
static void fwd_down(const moe_mlp_problem *p, moe_dtype dt, int64_t H, int64_t I, int64_t e, const int64_t *slots,
                     int64_t n, const int64_t *pos, const void *w_d, const float *M, const float *M0, float *D,
                     float *D0, const float *a, const float *bd, float *bbuf, float *contrib, void *down_ckpt, int on_i,
                     int write_d0) /*@ ghost (int64_t E, int64_t NB, int64_t V, int64_t n_max) */
{
    /*@ ghost lemma_row_fits(e, E, I); */
    /*@ ghost lemma_mul_monotone(e * I + I, E * I, H); */
    /*@ ghost lemma_row_fits(n - 1, n_max, I); */
    /*@ ghost lemma_mul_monotone(n, n_max, H); */
    mlp_mm_nn(n, H, I, M, I, 1, dt, w_d, e * I * H, H, D, H, bbuf);
    if (write_d0)
        mlp_mm_nn(n, H, I, M0, I, 1, dt, w_d, e * I * H, H, D0, H, bbuf);
    /*@ loop invariant bounds: 0 <= i <= n;
        loop invariant slots: in_range(slots, n, 0, V);
        loop invariant pos: in_range(pos, V, 0, NB);
        loop assigns i, D[0 .. n_max * H - 1], D0[0 .. (write_d0 != 0 ? n_max * H : 0) - 1], contrib[0 .. V * H - 1],
          ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(NB * H, dt)) - 1];
        loop variant n - i; */
    for (int64_t i = 0; i < n; i++) {
        const int64_t sl = slots[i], pos_i = pos[sl];
        /*@ ghost lemma_row_fits(i, n_max, H); */
        /*@ ghost lemma_row_fits(sl, V, H); */
        fwd_down_row(p, dt, H, D + i * H, write_d0 ? D0 + i * H : NULL, bd, a, i, contrib + sl * H, down_ckpt,
                     pos_i, on_i, write_d0) /*@ ghost (NB) */;
    }
}

/* The forward of expert e: its padding positions (blocks[q0 .. q1 - 1]) checkpointed +0, then its n slots
 * (slots[0 .. n - 1]): gather (X, a, the bias rows), gate/up GEMM, per slot fwd_gate_up_row and fwd_act_row,
 * down GEMM (and, write_d0, the unscaled one into D0), per slot fwd_down_row into contrib [V][H].
 *   pos, token [V]: the slot index;  ids: the layout's token_position_to_id [N*B];  s: the thread's scratch */
/*@ requires problem: \valid_read(p);
    requires dims: fwd_dims(T, E, N, B, H, I, V, n_max, rows);
    requires dtype: dtype_ok(dt);
    requires expert: 0 <= e < E;
    requires mode: write_d0 != 0 ==> on_i != 0 && down_ckpt != \null;
    requires slots: 0 <= n <= n_max && \valid_read(slots + (0 .. n - 1)) &&
      \forall integer r; 0 <= r < n ==> 0 <= slots[r] < V;
    requires index: \valid_read(pos + (0 .. V - 1)) && in_range(pos, V, 0, N * B) &&
      \valid_read(token + (0 .. V - 1)) && in_range(token, V, 0, T);
    requires blocks: 0 <= q0 <= q1 && \valid_read(blocks + (q0 .. q1 - 1)) &&
      (\forall integer q; q0 <= q < q1 ==> 0 <= blocks[q] < N);
    requires ids: \valid_read(ids + (0 .. N * B - 1));
    requires inputs: fwd_inputs_at((char *)hidden, (char *)affinities, (char *)w_gu, (char *)w_d, (char *)b_gu,
      (char *)b_d, rows, T, E, H, I, p->bias, dt);
    requires scratch: fwd_scratch_ok(s, contrib, V, n_max, H, I, on_i);
    requires floats_apart: fwd_floats_apart_p(s, contrib, V, n_max, H, I, on_i, p) &&
      fwd_inputs_apart((char *)hidden, (char *)b_gu, (char *)b_d, rows, E, H, I, p->bias, dt, s, contrib, V,
                       n_max, on_i);
    requires gate_up: fwd_ckpt_ok((char *)gate_up_ckpt_T, N * (2 * I) * B, dt, p, slots, n, pos, token, V, blocks,
      q0, q1, ids, N * B, s, contrib, n_max, H, I, on_i);
    requires down: fwd_ckpt_ok((char *)down_ckpt, N * B * H, dt, p, slots, n, pos, token, V, blocks, q0, q1, ids,
      N * B, s, contrib, n_max, H, I, on_i);
    terminates \true;
    assigns s->X[0 .. n_max * H - 1], s->D[0 .. n_max * H - 1], s->GU[0 .. n_max * (2 * I) - 1],
      s->M[0 .. n_max * I - 1], s->M0[0 .. (on_i != 0 ? n_max * I : 0) - 1],
      s->D0[0 .. (on_i != 0 ? n_max * H : 0) - 1], s->a[0 .. n_max - 1], s->bgu[0 .. 2 * I - 1],
      s->bd[0 .. H - 1], s->bbuf[0 .. PC * NC - 1], contrib[0 .. V * H - 1], errno,
      ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * (2 * I) * B, dt)) - 1],
      ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(N * B * H, dt)) - 1]; */
static void fwd_expert(const moe_mlp_problem *p, moe_dtype dt, int64_t E, int64_t B, int64_t H,
                       int64_t I, int on_i, int write_d0, int64_t e, const int64_t *slots, int64_t n,
                       const int64_t *pos, const int64_t *token, const int64_t *ids, const int64_t *blocks,
                       int64_t q0, int64_t q1, const void *hidden, const void *affinities, const void *w_gu,
                       const void *w_d, const void *b_gu, const void *b_d, void *gate_up_ckpt_T, void *down_ckpt,
                       float *contrib, const fwd_scratch *s)
    /*@ ghost (int64_t T, int64_t N, int64_t V, int64_t n_max, int64_t rows) */
{
    const int64_t I2 = 2 * I;
    float *X = s->X, *D = s->D, *GU = s->GU, *M = s->M, *M0 = s->M0, *D0 = s->D0, *a = s->a, *bgu = s->bgu,
          *bd = s->bd, *bbuf = s->bbuf;

    /* padding positions of this expert's blocks: checkpoints +0 */
    fwd_pad(p, dt, B, H, I2, ids, blocks, q0, q1, gate_up_ckpt_T, down_ckpt) /*@ ghost (N) */;
    if (n == 0)
        return;
    fwd_gather(p, dt, E, H, I, e, slots, n, token, hidden, affinities, b_gu, b_d, X, a, bgu, bd)
        /*@ ghost (T, V, rows, n_max) */;
    /* gate/up projection, bias, clamp, checkpoint, activation */
    fwd_gate_up(p, dt, B, H, I, e, slots, n, pos, w_gu, X, GU, M, M0, a, bgu, bbuf, gate_up_ckpt_T, on_i, write_d0)
        /*@ ghost (E, N, V, n_max) */;
    /* down projection, bias, checkpoint, contributions */
    fwd_down(p, dt, H, I, e, slots, n, pos, w_d, M, M0, D, D0, a, bd, bbuf, contrib, down_ckpt, on_i, write_d0)
        /*@ ghost (E, N * B, V, n_max) */;
}

/* Token t's output row: the sum of its slots' contributions (contrib rows token_slots[first .. last - 1]) in
 * ascending slot order, rounded once; +0 when it has none.   acc [H] (read only when the token has slots) */
/*@ requires dims: 0 <= H && 0 <= t < rows && rows * H <= INT64_MAX && 0 <= V && V * H <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires slots: 0 <= first <= last && \valid_read(token_slots + (first .. last - 1)) &&
      (\forall integer q; first <= q < last ==> 0 <= token_slots[q] < V);
    requires contrib: \valid_read(contrib + (0 .. V * H - 1));
    requires acc: first < last ==> \valid(acc + (0 .. H - 1)) &&
      \separated(acc + (0 .. H - 1), contrib + (0 .. V * H - 1));
    requires out: tensor_writable((char *)out, rows * H, dt) &&
      \separated((char *)out + (0 .. byte_offset(rows * H, dt) - 1), token_slots + (first .. last - 1)) &&
      (first < last ==> \separated((char *)out + (0 .. byte_offset(rows * H, dt) - 1), acc + (0 .. H - 1)));
    terminates \true;
    assigns acc[0 .. (first < last ? H : 0) - 1],
      ((char *)out)[byte_offset(t * H, dt) .. byte_offset(t * H + H, dt) - 1]; */
static void fwd_token_row(moe_dtype dt, int64_t H, const float *contrib, const int64_t *token_slots, int64_t first,
                          int64_t last, float *acc, void *out, int64_t t) /*@ ghost (int64_t V, int64_t rows) */
{
    /*@ ghost lemma_row_fits(t, rows, H); */
    if (first == last) {
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, ((char *)out)[byte_offset(t * H, dt) .. byte_offset(t * H + H, dt) - 1];
            loop variant H - h; */
        for (int64_t h = 0; h < H; h++)
            moe_ref_store(dt, out, t * H + h, 0.0f);
        return;
    }
    /*@ ghost lemma_row_fits(token_slots[first], V, H); */
    const float *c0 = contrib + token_slots[first] * H;
    copy_floats(acc, c0, H);
    /*@ loop invariant bounds: first + 1 <= q <= last;
        loop assigns q, acc[0 .. H - 1];
        loop variant last - q; */
    for (int64_t q = first + 1; q < last; q++) {
        /*@ ghost lemma_row_fits(token_slots[q], V, H); */
        const float *c = contrib + token_slots[q] * H;
        /*@ loop invariant bounds: 0 <= h <= H;
            loop assigns h, acc[0 .. H - 1];
            loop variant H - h; */
        MLP_SIMD
        for (int64_t h = 0; h < H; h++)
            acc[h] = acc[h] + c[h];
    }
    mlp_store_row(dt, out, t * H, acc, H);
}

/* One thread's share of the experts: the orphaned `omp for` (dynamic, one expert at a time) of
 * moe_ref_mlp_fwd's parallel region, fwd_expert for each expert e < E (its slots expert_slots[expert_start[e]
 * ..], its blocks expert_blocks[block_start[e] ..]).  Frama-C parses it without OpenMP: the proof is of the
 * loop run by one thread over every expert.
 *   x: the slot index (V = x->count slots, n_max = x->max_slots);  ids: the layout's token_position_to_id */
/*@ requires problem: \valid_read(p);
    requires dims: fwd_dims(T, E, N, B, H, I, V, n_max, rows);
    requires dtype: dtype_ok(dt);
    requires mode: write_d0 != 0 ==> on_i != 0 && down_ckpt != \null;
    requires index: slot_index_ok(x, ids, T, E, N, B) && x->count == V && x->max_slots == n_max;
    requires ids: \valid_read(ids + (0 .. N * B - 1));
    requires inputs: fwd_inputs_at((char *)hidden, (char *)affinities, (char *)w_gu, (char *)w_d, (char *)b_gu,
      (char *)b_d, rows, T, E, H, I, p->bias, dt);
    requires scratch: fwd_scratch_ok(s, contrib, V, n_max, H, I, on_i);
    requires floats_apart: fwd_floats_apart_p(s, contrib, V, n_max, H, I, on_i, p) &&
      fwd_inputs_apart((char *)hidden, (char *)b_gu, (char *)b_d, rows, E, H, I, p->bias, dt, s, contrib, V,
                       n_max, on_i);
    requires gate_up: fwd_ckpt_x_ok((char *)gate_up_ckpt_T, N * (2 * I) * B, dt, p, x, V, E, N, ids, N * B, s,
      contrib, n_max, H, I, on_i);
    requires down: fwd_ckpt_x_ok((char *)down_ckpt, N * B * H, dt, p, x, V, E, N, ids, N * B, s, contrib, n_max,
      H, I, on_i);
    terminates \true;
    assigns s->X[0 .. n_max * H - 1], s->D[0 .. n_max * H - 1], s->GU[0 .. n_max * (2 * I) - 1],
      s->M[0 .. n_max * I - 1], s->M0[0 .. (on_i != 0 ? n_max * I : 0) - 1],
      s->D0[0 .. (on_i != 0 ? n_max * H : 0) - 1], s->a[0 .. n_max - 1], s->bgu[0 .. 2 * I - 1],
      s->bd[0 .. H - 1], s->bbuf[0 .. PC * NC - 1], contrib[0 .. V * H - 1], errno,
      ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * (2 * I) * B, dt)) - 1],
      ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(N * B * H, dt)) - 1]; */
static void fwd_experts(const moe_mlp_problem *p, moe_dtype dt, int64_t E, int64_t B, int64_t H,
                        int64_t I, int on_i, int write_d0, const slot_index *x, const int64_t *ids,
                        const void *hidden, const void *affinities, const void *w_gu, const void *w_d,
                        const void *b_gu, const void *b_d, void *gate_up_ckpt_T, void *down_ckpt, float *contrib,
                        const fwd_scratch *s) /*@ ghost (int64_t T, int64_t N, int64_t V, int64_t n_max, int64_t rows) */
{
    /*@ loop invariant bounds: 0 <= e <= E;
        loop assigns e, s->X[0 .. n_max * H - 1], s->D[0 .. n_max * H - 1], s->GU[0 .. n_max * (2 * I) - 1],
          s->M[0 .. n_max * I - 1], s->M0[0 .. (on_i != 0 ? n_max * I : 0) - 1],
          s->D0[0 .. (on_i != 0 ? n_max * H : 0) - 1], s->a[0 .. n_max - 1], s->bgu[0 .. 2 * I - 1],
          s->bd[0 .. H - 1], s->bbuf[0 .. PC * NC - 1], contrib[0 .. V * H - 1], errno,
          ((char *)gate_up_ckpt_T)[0 .. (gate_up_ckpt_T == \null ? 0 : byte_offset(N * (2 * I) * B, dt)) - 1],
          ((char *)down_ckpt)[0 .. (down_ckpt == \null ? 0 : byte_offset(N * B * H, dt)) - 1];
        loop variant E - e; */
    MLP_OMP(for schedule(dynamic, 1))
    for (int64_t e = 0; e < E; e++) {
        const int64_t first = x->expert_start[e], n = x->expert_start[e + 1] - first;
        const int64_t q0 = x->block_start[e], q1 = x->block_start[e + 1];
        /*@ assert slots_in: 0 <= first && first + n <= V && 0 <= n <= n_max; */
        /*@ assert slots_kept: \forall integer r; first <= r < first + n ==> 0 <= x->expert_slots[r] < V; */
        /*@ assert blocks_in: 0 <= q0 <= q1 <= N; */
        fwd_expert(p, dt, E, B, H, I, on_i, write_d0, e, x->expert_slots + first, n, x->pos, x->token, ids,
                   x->expert_blocks, q0, q1, hidden, affinities, w_gu, w_d, b_gu, b_d, gate_up_ckpt_T, down_ckpt,
                   contrib, s) /*@ ghost (T, N, V, n_max, rows) */;
    }
}

/* One thread's share of the token rows: the orphaned `omp for` (static) of moe_ref_mlp_fwd's parallel region,
 * fwd_token_row for each row t < rows (the padding row t = T, when there is one, has no slots: +0).
 *   token_start [T + 1], token_slots [V]: the slot index by token;  acc [H] when V >= 1 */
/*@ requires dims: 0 <= H && 0 <= T <= rows && rows * H <= INT64_MAX && 0 <= V && V * H <= INT64_MAX;
    requires dtype: dtype_ok(dt);
    requires index: \valid_read(token_start + (0 .. T)) && token_start[0] == 0 && token_start[T] == V &&
      sorted_offsets(token_start, T) && \valid_read(token_slots + (0 .. V - 1)) && in_range(token_slots, V, 0, V);
    requires contrib: \valid_read(contrib + (0 .. V * H - 1));
    requires acc: V >= 1 ==> \valid(acc + (0 .. H - 1)) && \separated(acc + (0 .. H - 1), contrib + (0 .. V * H - 1));
    requires out: tensor_writable((char *)out, rows * H, dt) &&
      \separated((char *)out + (0 .. byte_offset(rows * H, dt) - 1), token_slots + (0 .. V - 1),
                 token_start + (0 .. T)) &&
      (V >= 1 ==> \separated((char *)out + (0 .. byte_offset(rows * H, dt) - 1), acc + (0 .. H - 1)));
    terminates \true;
    assigns acc[0 .. (V >= 1 ? H : 0) - 1], ((char *)out)[0 .. byte_offset(rows * H, dt) - 1]; */
static void fwd_tokens(moe_dtype dt, int64_t T, int64_t H, int64_t rows, const int64_t *token_start,
                       const int64_t *token_slots, const float *contrib, float *acc, void *out) /*@ ghost (int64_t V) */
{
    /*@ loop invariant bounds: 0 <= t <= rows;
        loop assigns t, acc[0 .. (V >= 1 ? H : 0) - 1], ((char *)out)[0 .. byte_offset(rows * H, dt) - 1];
        loop variant rows - t; */
    MLP_OMP(for schedule(static))
    for (int64_t t = 0; t < rows; t++) {
        const int64_t first = t < T ? token_start[t] : 0, last = t < T ? token_start[t + 1] : 0;
        /*@ assert range: 0 <= first <= last <= V; */
        /*@ ghost lemma_row_fits(t, rows, H); */
        fwd_token_row(dt, H, contrib, token_slots, first, last, acc, out, t) /*@ ghost (V, rows) */;
    }
}

/* The allocating shell of the forward (contract on the prototype in ref/mlp_ref.h; stated, not proved: it
 * allocates, and WP 25 has no model of allocation): the slot index (mlp_build_index), the per-slot contributions
 * and the per-thread arenas, then the parallel region, in which each thread carves its scratch and runs its
 * share of the experts (fwd_experts) and of the token rows (fwd_tokens), both proved; then it frees. */
moe_status moe_ref_mlp_fwd(const moe_mlp_problem *p, const void *hidden, const void *affinities,
                           const void *w_gu, const void *w_d, const void *b_gu, const void *b_d, void *out,
                           void *gate_up_ckpt_T, void *down_ckpt)
{
    const int64_t E = p->E, B = p->B, H = p->H, I = p->I, I2 = 2 * p->I, T = p->T;
    const moe_dtype dt = p->dtype;
    const int on_i = p->affinity == MOE_AFFINITY_ON_I;
    slot_index x;
    moe_status status = mlp_build_index(p, &x);
    if (status != MOE_OK)
        return status;
    const int64_t n_max = x.max_slots;
    const int threads = mlp_threads_for(x.count, H, I);
    /* per thread: X, D [n][H]; GU [n][2I]; M [n][I]; (ON_I: M0 [n][I], D0 [n][H]); a [n]; bias rows
     * [2I + H]; bbuf */
    const double need = (double)n_max * (double)(2 * H + I2 + I + (on_i ? I + H : 0) + 2) + (double)(I2 + H);
    const size_t per_thread = need > 0x1p60 ? SIZE_MAX
                              : (size_t)n_max * (size_t)(2 * H + I2 + I + (on_i ? I + H : 0) + 2) +
                                    (size_t)(I2 + H) + PC * NC + 16 * 12;
    arena ws;
    float *contrib = mlp_alloc_floats(x.count, H);
    if (contrib == NULL || !mlp_arena_alloc(&ws, threads, per_thread)) {
        free(contrib);
        mlp_free_index(&x);
        return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: no memory for the float32 workspace (%" PRId64
                        " slots, H = %" PRId64 ", I = %" PRId64 ")", p->op, x.count, H, I);
    }

    MLP_OMP(parallel num_threads(threads))
    {
        float *cur = ws.base + (size_t)team_member(threads) * ws.per_thread;
        float *X = mlp_carve(&cur, n_max * H), *D = mlp_carve(&cur, n_max * H), *GU = mlp_carve(&cur, n_max * I2);
        float *M = mlp_carve(&cur, n_max * I), *M0 = on_i ? mlp_carve(&cur, n_max * I) : NULL;
        float *D0 = on_i ? mlp_carve(&cur, n_max * H) : NULL;
        float *a = mlp_carve(&cur, n_max), *bgu = mlp_carve(&cur, I2), *bd = mlp_carve(&cur, H);
        float *bbuf = mlp_carve(&cur, PC * NC);
        const fwd_scratch s = {X, D, GU, M, M0, D0, a, bgu, bd, bbuf};
        const int write_d0 = on_i && down_ckpt != NULL;

        fwd_experts(p, dt, E, B, H, I, on_i, write_d0, &x, p->token_position_to_id, hidden, affinities,
                    w_gu, w_d, b_gu, b_d, gate_up_ckpt_T, down_ckpt, contrib, &s)
            /*@ ghost (T, p->N, x.count, n_max, p->token_rows) */;
        /* token rows: acc = X (n_max >= 1 whenever a token has a slot) */
        fwd_tokens(dt, T, H, p->token_rows, x.token_start, x.token_slots, contrib, X, out) /*@ ghost (x.count) */;
    }

    free(contrib);
    free(ws.base);
    mlp_free_index(&x);
    return MOE_OK;
}
