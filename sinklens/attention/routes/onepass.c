/* One pass of attention on the CPU: the output and what a capture records, per L2-sized tile.
 *
 * Per (batch row, query head, tile of `tile` query rows):
 *   1. the tile's scores against the keys [k0, k1) some row of the tile can see;
 *   2. per row: softcap, row max, exp and row sum Z (vectorised, our own exp), then one pass that
 *      reads the row, weighted by 1 / Z, into the column sums (all rows, its query group, the
 *      would-be sums before blocking, the diagonal and the distance profile);
 *   3. the tile's output from the unnormalised rows, each output row then scaled by its 1 / Z
 *      (the rows are never written back normalised: one store per probability fewer).
 * The products (1, 3): where D is a multiple of 16, this file's register-blocked loops over the
 * kv head's keys and values packed once (tiles of a few dozen rows, whose scores stay about L2-sized);
 * else one sgemm each (tall tiles: BLAS packs the keys anew per call); a tiny layer's, plain vector loops.
 * GQA by indexing (query head h reads kv head h / rep): no key or value is repeated. Work is split
 * over (batch row, head) pairs, whose sums never overlap, so threads need no reduction.
 *
 * BLAS comes in as a function pointer (Fortran sgemm_ calling convention) that the loader takes
 * from a public interface (scipy.linalg.cython_blas); this file links against nothing but libc
 * and pthreads. Semantics follow sinklens/attention/function.py's exact route: a float32 softmax
 * over the allowed keys; blocked keys zeroed and each row renormalised over the rest (a row
 * whose visible keys are all blocked keeps them); a learned sink joins the max and the normaliser
 * with no value; a row that may see no key has probabilities 0 and output 0.
 *
 * Also here, at the end, passes that are not part of attention: `sl_top1`, the sink masking's
 * default selection of the keys to block next step (sinklens/masking/select.py), and
 * `sl_hidden_top`, `sl_median_abs` and `sl_qkv_readouts`, the hidden-state and q / k / v readouts
 * (attention/readouts.py).
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*sgemm_fn)(const char *ta, const char *tb, const int *m, const int *n, const int *k,
                         const float *alpha, const float *a, const int *lda, const float *b, const int *ldb,
                         const float *beta, float *c, const int *ldc);
typedef int (*blas_threads_fn)(int);
enum { SL_BLAS = 0, SL_LOOPS = 1, SL_PACKED = 2 };   /* sl_args.products (compiled.py PRODUCTS) */

typedef struct {
    int b, h, h_kv, s_q, s_k, d;
    float scale;
    float softcap;                 /* 0: none; else logits -> cap * tanh(logits / cap) */
    const float *q;                /* (B, H, S_q, D) */
    const float *k, *v;            /* (B, H_kv, S_k, D) */
    float *out;                    /* (B, S_q, H, D) */
    int64_t q_str[3], k_str[3], v_str[3];   /* (batch, head, row) strides in floats; D is contiguous */
    int causal;                    /* with allowed == NULL: row r sees keys j <= r + S_k - S_q */
    const uint8_t *allowed;        /* (B|1, S_q, S_k) keys each row may see before blocking, or NULL */
    int64_t allowed_bstride;       /* 0 when one mask serves every batch row */
    const uint8_t *blocked;        /* (B, H, S_k) or NULL */
    int keep_self;                 /* a blocked key still receives attention from its own query */
    const float *sinks;            /* (H,) learned sink logits, or NULL */
    const float *row_w;            /* (B, S_q) weight of each row in the sums (0 or 1), or NULL: all 1 */
    const int64_t *groups;         /* (B, S_q) group id, -1 none, or NULL */
    int num_groups;
    float *received;               /* (B, H, S_k) or NULL; every sum is accumulated into zeros */
    float *unblocked;              /* (B, H, S_k) or NULL: the softmax before blocking */
    float *group_sums;             /* (B, G, H, S_k) or NULL */
    float *sink_sums;              /* (B, H) or NULL */
    float *diagonal;               /* (B, H) or NULL: sum of A[i, i] */
    float *distance;               /* (B, H, 2 S_k - 1) or NULL: sums by offset j - i, index j - i + S_k - 1 */
    int tile;                      /* query rows per tile */
    int threads;
    sgemm_fn sgemm;
    blas_threads_fn blas_threads;  /* the BLAS' per-thread thread count setter, or NULL */
    int products;                  /* how the products are made (compiled.py chooses): SL_BLAS, SL_LOOPS (a tiny
                                    * layer, whose arithmetic costs less than BLAS' per-call setup: compiled.py's
                                    * SMALL_WORK) or SL_PACKED (a kv head's keys and values packed once; D a
                                    * multiple of 16) */
} sl_args;

/* ---- 8-lane vectors (GCC / Clang vector extensions: the compiler maps them to the machine's registers) */
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8fu __attribute__((vector_size(32), aligned(4)));   /* unaligned loads / stores */

static inline v8f splat(float x) { return (v8f){x, x, x, x, x, x, x, x}; }
/* lane-wise mask ? a : b (C has no vector ?:) */
static inline v8f select8(v8i mask, v8f a, v8f b) { return (v8f)(((v8i)a & mask) | ((v8i)b & ~mask)); }

/* ---- products without BLAS (a tiny model's layer: BLAS' per-call setup costs more than them) -- */

/* (sum of a0's lanes, ..., sum of a7's lanes): three rounds of pairwise adds of interleaved lanes
 * (8 separate lane-by-lane sums cost twice the products they finish at D = 32). Compilers without
 * __builtin_shufflevector get the lane-by-lane sums (SL_NO_SHUFFLE forces them: the tests build both). */
#if !defined(SL_NO_SHUFFLE) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12))
#define SHUF(x, y, ...) __builtin_shufflevector(x, y, __VA_ARGS__)
static inline v8f sum_lanes8(v8f a0, v8f a1, v8f a2, v8f a3, v8f a4, v8f a5, v8f a6, v8f a7) {
    v8f b01 = SHUF(a0, a1, 0, 8, 2, 10, 4, 12, 6, 14) + SHUF(a0, a1, 1, 9, 3, 11, 5, 13, 7, 15);
    v8f b23 = SHUF(a2, a3, 0, 8, 2, 10, 4, 12, 6, 14) + SHUF(a2, a3, 1, 9, 3, 11, 5, 13, 7, 15);
    v8f b45 = SHUF(a4, a5, 0, 8, 2, 10, 4, 12, 6, 14) + SHUF(a4, a5, 1, 9, 3, 11, 5, 13, 7, 15);
    v8f b67 = SHUF(a6, a7, 0, 8, 2, 10, 4, 12, 6, 14) + SHUF(a6, a7, 1, 9, 3, 11, 5, 13, 7, 15);
    /* lanes: (x0 of 0-3, x1 of 0-3, x2 of 0-3, x3 of 0-3, the same of lanes 4-7) */
    v8f c0 = SHUF(b01, b23, 0, 1, 8, 9, 4, 5, 12, 13) + SHUF(b01, b23, 2, 3, 10, 11, 6, 7, 14, 15);
    v8f c1 = SHUF(b45, b67, 0, 1, 8, 9, 4, 5, 12, 13) + SHUF(b45, b67, 2, 3, 10, 11, 6, 7, 14, 15);
    return SHUF(c0, c1, 0, 1, 2, 3, 8, 9, 10, 11) + SHUF(c0, c1, 4, 5, 6, 7, 12, 13, 14, 15);
}
#else
static inline float sum8(v8f a) { float z = 0.0f; for (int l = 0; l < 8; l++) z += a[l]; return z; }
static inline v8f sum_lanes8(v8f a0, v8f a1, v8f a2, v8f a3, v8f a4, v8f a5, v8f a6, v8f a7) {
    return (v8f){sum8(a0), sum8(a1), sum8(a2), sum8(a3), sum8(a4), sum8(a5), sum8(a6), sum8(a7)};
}
#endif

/* scores (m, n) = scale * Q (m, D) K^T (n, D), rows of Q and K `ldq` / `ldk` floats apart: per row,
 * eight keys at a time, each a sum over D in 8 lanes (eight independent chains of adds), then
 * `sum_lanes8`. Keys past n in the last group re-read key n - 1 and are not stored. */
static void scores_loop(int m, int n, int d, float scale, const float *q, int ldq, const float *k, int ldk, float *s) {
    const int d8 = d & ~7;
    for (int j = 0; j < n; j += 8) {   /* the group's keys stay in L1 while every row reads them */
        const float *kp[8];
        for (int l = 0; l < 8; l++) kp[l] = k + (int64_t)(j + l < n ? j + l : n - 1) * ldk;
        for (int r = 0; r < m; r++) {
            const float *qr = q + (int64_t)r * ldq;
            v8f a0 = splat(0.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            for (int c = 0; c < d8; c += 8) {
                const v8f x = *(const v8fu *)(qr + c);
                a0 += x * *(const v8fu *)(kp[0] + c);
                a1 += x * *(const v8fu *)(kp[1] + c);
                a2 += x * *(const v8fu *)(kp[2] + c);
                a3 += x * *(const v8fu *)(kp[3] + c);
                a4 += x * *(const v8fu *)(kp[4] + c);
                a5 += x * *(const v8fu *)(kp[5] + c);
                a6 += x * *(const v8fu *)(kp[6] + c);
                a7 += x * *(const v8fu *)(kp[7] + c);
            }
            v8f t = sum_lanes8(a0, a1, a2, a3, a4, a5, a6, a7);
            for (int c = d8; c < d; c++)
                for (int l = 0; l < 8; l++) t[l] += qr[c] * kp[l][c];
            t *= splat(scale);
            float *sr = s + (int64_t)r * n + j;
            if (j + 8 <= n) *(v8fu *)sr = t;
            else for (int l = 0; j + l < n; l++) sr[l] = t[l];
        }
    }
}

/* out (m, D) rows `ldo` apart = P (m, n) V (n, D), rows of V `ldv` floats apart: per row, 32 columns
 * of D at a time held in four vector sums over the keys */
static void output_loop(int m, int n, int d, const float *p, const float *v, int ldv, float *out, int ldo) {
    for (int r = 0; r < m; r++) {
        const float *pr = p + (int64_t)r * n;
        float *o = out + (int64_t)r * ldo;
        int c = 0;
        for (; c + 32 <= d; c += 32) {
            v8f a0 = splat(0.0f), a1 = a0, a2 = a0, a3 = a0;
            const float *vj = v + c;
            int j = 0;
            for (; j + 2 <= n; j += 2, vj += 2 * (int64_t)ldv) {   /* two keys a turn: half the loop's overhead */
                const v8f w = splat(pr[j]), w1 = splat(pr[j + 1]);
                const float *vk = vj + ldv;
                a0 += w * *(const v8fu *)(vj) + w1 * *(const v8fu *)(vk);
                a1 += w * *(const v8fu *)(vj + 8) + w1 * *(const v8fu *)(vk + 8);
                a2 += w * *(const v8fu *)(vj + 16) + w1 * *(const v8fu *)(vk + 16);
                a3 += w * *(const v8fu *)(vj + 24) + w1 * *(const v8fu *)(vk + 24);
            }
            if (j < n) {
                const v8f w = splat(pr[j]);
                a0 += w * *(const v8fu *)(vj);
                a1 += w * *(const v8fu *)(vj + 8);
                a2 += w * *(const v8fu *)(vj + 16);
                a3 += w * *(const v8fu *)(vj + 24);
            }
            *(v8fu *)(o + c) = a0; *(v8fu *)(o + c + 8) = a1; *(v8fu *)(o + c + 16) = a2; *(v8fu *)(o + c + 24) = a3;
        }
        for (; c + 8 <= d; c += 8) {
            v8f a = splat(0.0f);
            for (int j = 0; j < n; j++)
                a += splat(pr[j]) * *(const v8fu *)(v + (int64_t)j * ldv + c);
            *(v8fu *)(o + c) = a;
        }
        for (; c < d; c++) {
            float a = 0.0f;
            for (int j = 0; j < n; j++) a += pr[j] * v[(int64_t)j * ldv + c];
            o[c] = a;
        }
    }
}

/* ---- products of a long tile: register-blocked kernels (6 query rows at a time) ---------------
 * BLAS packs the keys anew for every call, so it wants tall tiles, whose scores (rows x keys) leave
 * L2; here the keys and values are packed once per kv head and a tile of a few dozen rows keeps its
 * scores in L2 (benchmarks/bench_layer.py times a layer through both). */

/* A 6 x 16 block's step: row i's scalar s_i times the 16 columns (v0, v1), added to a{i}0, a{i}1 (the
 * caller's 12 accumulators, which the compiler keeps in registers) */
#define FMA_6x16(v0, v1, s0, s1, s2, s3, s4, s5)                 \
    do {                                                         \
        v8f x_;                                                  \
        x_ = splat(s0); a00 += x_ * (v0); a01 += x_ * (v1);      \
        x_ = splat(s1); a10 += x_ * (v0); a11 += x_ * (v1);      \
        x_ = splat(s2); a20 += x_ * (v0); a21 += x_ * (v1);      \
        x_ = splat(s3); a30 += x_ * (v0); a31 += x_ * (v1);      \
        x_ = splat(s4); a40 += x_ * (v0); a41 += x_ * (v1);      \
        x_ = splat(s5); a50 += x_ * (v0); a51 += x_ * (v1);      \
    } while (0)

/* Where the CPU has AVX-512, the packed products also take blocks of 12 rows x one 16-lane vector (a panel's
 * 16 keys, or 16 output columns): 12 sums in registers per load, twice the lanes of the 6 x 16 block's
 * 8-lane halves. Each element is still one chain of multiply-adds over D (or the keys) in the same order:
 * the same bits as the 6 x 16 block, which takes the rows past the last 12 (and every row without AVX-512). */
#if defined(__AVX512F__) && !defined(SL_NO_WIDE)
#define SL_WIDE 1
typedef float v16f __attribute__((vector_size(64)));
typedef float v16fu __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i __attribute__((vector_size(64)));
static inline v16f splat16(float x) { return (v16f){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }
static inline v16f select16(v16i mask, v16f a, v16f b) { return (v16f)(((v16i)a & mask) | ((v16i)b & ~mask)); }
#define FMA_12(v, x)                                                                                       \
    do {                                                                                                   \
        b0 += splat16((x)[0]) * (v); b1 += splat16((x)[1]) * (v); b2 += splat16((x)[2]) * (v);             \
        b3 += splat16((x)[3]) * (v); b4 += splat16((x)[4]) * (v); b5 += splat16((x)[5]) * (v);             \
        b6 += splat16((x)[6]) * (v); b7 += splat16((x)[7]) * (v); b8 += splat16((x)[8]) * (v);             \
        b9 += splat16((x)[9]) * (v); b10 += splat16((x)[10]) * (v); b11 += splat16((x)[11]) * (v);         \
    } while (0)
#endif

/* kp[(jb * d + c) * 16 + l] = K[jb * 16 + l][c]: keys in panels of 16, a panel's 16 values of one
 * channel side by side; keys past n are 0 */
static void pack_keys(int n, int d, const float *k, int ldk, float *kp) {
    for (int jb = 0; jb * 16 < n; jb++) {
        float *p = kp + (int64_t)jb * d * 16;
        for (int l = 0; l < 16; l++) {
            const int j = jb * 16 + l;
            const float *kr = k + (int64_t)j * ldk;
            for (int c = 0; c < d; c++) p[c * 16 + l] = j < n ? kr[c] : 0.0f;
        }
    }
}

/* s (m, 16 np) rows lds apart = scale * Q (m, D) K^T over the np panels at kp: per 6 rows and
 * 16 keys, 12 vector sums held in registers across D */
static void scores_mk(int m, int np, int d, float scale, const float *q, int ldq, const float *kp, float *s, int lds) {
    const v8f sc = splat(scale);
    for (int jb = 0; jb < np; jb++) {   /* a panel stays in L1 while every row of the tile reads it */
        const float *panel = kp + (int64_t)jb * d * 16;
        int r = 0;
#ifdef SL_WIDE
        for (; r + 12 <= m; r += 12) {
            const float *qr = q + (int64_t)r * ldq, *p = panel;
            v16f b0 = splat16(0.0f), b1 = b0, b2 = b0, b3 = b0, b4 = b0, b5 = b0, b6 = b0, b7 = b0, b8 = b0,
                 b9 = b0, b10 = b0, b11 = b0;
            for (int c = 0; c < d; c++, p += 16) {
                const float x[12] = {qr[c], qr[ldq + c], qr[2 * ldq + c], qr[3 * ldq + c], qr[4 * ldq + c],
                                     qr[5 * ldq + c], qr[6 * ldq + c], qr[7 * ldq + c], qr[8 * ldq + c],
                                     qr[9 * ldq + c], qr[10 * ldq + c], qr[11 * ldq + c]};
                const v16f k = *(const v16fu *)p;
                FMA_12(k, x);
            }
            const v16f sc16 = splat16(scale);
            const v16f rows[12] = {b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11};
            float *o = s + (int64_t)r * lds + jb * 16;
            for (int i = 0; i < 12; i++, o += lds) *(v16fu *)o = rows[i] * sc16;
        }
#endif
        for (; r + 6 <= m; r += 6) {
            const float *q0 = q + (int64_t)r * ldq, *q1 = q0 + ldq, *q2 = q1 + ldq, *q3 = q2 + ldq, *q4 = q3 + ldq,
                        *q5 = q4 + ldq;
            const float *p = panel;
            v8f a00 = splat(0.0f), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00,
                a40 = a00, a41 = a00, a50 = a00, a51 = a00;
            for (int c = 0; c < d; c++, p += 16) {
                const v8f k0 = *(const v8fu *)p, k1 = *(const v8fu *)(p + 8);
                FMA_6x16(k0, k1, q0[c], q1[c], q2[c], q3[c], q4[c], q5[c]);
            }
            float *o = s + (int64_t)r * lds + jb * 16;
            *(v8fu *)o = a00 * sc; *(v8fu *)(o + 8) = a01 * sc; o += lds;
            *(v8fu *)o = a10 * sc; *(v8fu *)(o + 8) = a11 * sc; o += lds;
            *(v8fu *)o = a20 * sc; *(v8fu *)(o + 8) = a21 * sc; o += lds;
            *(v8fu *)o = a30 * sc; *(v8fu *)(o + 8) = a31 * sc; o += lds;
            *(v8fu *)o = a40 * sc; *(v8fu *)(o + 8) = a41 * sc; o += lds;
            *(v8fu *)o = a50 * sc; *(v8fu *)(o + 8) = a51 * sc;
        }
        for (; r < m; r++) {   /* the last m % 6 rows one at a time */
            const float *q0 = q + (int64_t)r * ldq, *p = panel;
            v8f a00 = splat(0.0f), a01 = a00;
            for (int c = 0; c < d; c++, p += 16) {
                const v8f x = splat(q0[c]);
                a00 += x * *(const v8fu *)p;
                a01 += x * *(const v8fu *)(p + 8);
            }
            float *o = s + (int64_t)r * lds + jb * 16;
            *(v8fu *)o = a00 * sc; *(v8fu *)(o + 8) = a01 * sc;
        }
    }
}

/* vp[(cb * n + j) * 16 + l] = V[j][cb * 16 + l]: values in blocks of 16 columns, a block's keys one after
 * another, so the output product reads a block's keys contiguously, not one 64-byte piece of a row
 * H_kv * D floats long per key (the same sums in the same order: the same bits) */
static void pack_values(int n, int d, const float *v, int ldv, float *vp) {
    for (int cb = 0; cb < d / 16; cb++)
        for (int j = 0; j < n; j++)
            memcpy(vp + ((int64_t)cb * n + j) * 16, v + (int64_t)j * ldv + cb * 16, sizeof(float) * 16);
}

/* out (m, D) rows ldo apart = P (m, keys [k0, k0 + n)) rows ldp apart . V, D a multiple of 16, V packed
 * by pack_values over all `n_all` keys: per 6 rows and 16 columns of D, 12 vector sums over a block of
 * keys (a block of V stays in L2 while every row of the tile reads it) */
static void output_mk(int m, int n, int d, const float *p, int ldp, const float *vp, int n_all, int k0, float *out, int ldo) {
    enum { KEYS = 256 };
    for (int r = 0; r < m; r++) memset(out + (int64_t)r * ldo, 0, sizeof(float) * d);
    for (int j0 = 0; j0 < n; j0 += KEYS) {
        const int j1 = j0 + KEYS < n ? j0 + KEYS : n;
        int r = 0;
#ifdef SL_WIDE
        for (; r + 12 <= m; r += 12) {
            const float *pr = p + (int64_t)r * ldp;
            for (int c = 0; c < d; c += 16) {
                float *o = out + (int64_t)r * ldo + c;
                v16f b0 = *(v16fu *)o, b1 = *(v16fu *)(o + ldo), b2 = *(v16fu *)(o + 2 * ldo),
                     b3 = *(v16fu *)(o + 3 * ldo), b4 = *(v16fu *)(o + 4 * ldo), b5 = *(v16fu *)(o + 5 * ldo),
                     b6 = *(v16fu *)(o + 6 * ldo), b7 = *(v16fu *)(o + 7 * ldo), b8 = *(v16fu *)(o + 8 * ldo),
                     b9 = *(v16fu *)(o + 9 * ldo), b10 = *(v16fu *)(o + 10 * ldo), b11 = *(v16fu *)(o + 11 * ldo);
                const float *vj = vp + ((int64_t)(c / 16) * n_all + k0 + j0) * 16;
                for (int j = j0; j < j1; j++, vj += 16) {
                    const float x[12] = {pr[j], pr[ldp + j], pr[2 * ldp + j], pr[3 * ldp + j], pr[4 * ldp + j],
                                         pr[5 * ldp + j], pr[6 * ldp + j], pr[7 * ldp + j], pr[8 * ldp + j],
                                         pr[9 * ldp + j], pr[10 * ldp + j], pr[11 * ldp + j]};
                    const v16f v = *(const v16fu *)vj;
                    FMA_12(v, x);
                }
                const v16f rows[12] = {b0, b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11};
                for (int i = 0; i < 12; i++) *(v16fu *)(o + i * ldo) = rows[i];
            }
        }
#endif
        for (; r + 6 <= m; r += 6) {
            const float *p0 = p + (int64_t)r * ldp, *p1 = p0 + ldp, *p2 = p1 + ldp, *p3 = p2 + ldp, *p4 = p3 + ldp,
                        *p5 = p4 + ldp;
            for (int c = 0; c < d; c += 16) {
                float *o = out + (int64_t)r * ldo + c;
                v8f a00 = *(v8fu *)o, a01 = *(v8fu *)(o + 8);
                v8f a10 = *(v8fu *)(o + ldo), a11 = *(v8fu *)(o + ldo + 8);
                v8f a20 = *(v8fu *)(o + 2 * ldo), a21 = *(v8fu *)(o + 2 * ldo + 8);
                v8f a30 = *(v8fu *)(o + 3 * ldo), a31 = *(v8fu *)(o + 3 * ldo + 8);
                v8f a40 = *(v8fu *)(o + 4 * ldo), a41 = *(v8fu *)(o + 4 * ldo + 8);
                v8f a50 = *(v8fu *)(o + 5 * ldo), a51 = *(v8fu *)(o + 5 * ldo + 8);
                const float *vj = vp + ((int64_t)(c / 16) * n_all + k0 + j0) * 16;
                for (int j = j0; j < j1; j++, vj += 16) {
                    const v8f v0 = *(const v8fu *)vj, v1 = *(const v8fu *)(vj + 8);
                    FMA_6x16(v0, v1, p0[j], p1[j], p2[j], p3[j], p4[j], p5[j]);
                }
                *(v8fu *)o = a00; *(v8fu *)(o + 8) = a01;
                *(v8fu *)(o + ldo) = a10; *(v8fu *)(o + ldo + 8) = a11;
                *(v8fu *)(o + 2 * ldo) = a20; *(v8fu *)(o + 2 * ldo + 8) = a21;
                *(v8fu *)(o + 3 * ldo) = a30; *(v8fu *)(o + 3 * ldo + 8) = a31;
                *(v8fu *)(o + 4 * ldo) = a40; *(v8fu *)(o + 4 * ldo + 8) = a41;
                *(v8fu *)(o + 5 * ldo) = a50; *(v8fu *)(o + 5 * ldo + 8) = a51;
            }
        }
        for (; r < m; r++) {   /* the last m % 6 rows one at a time */
            const float *pr = p + (int64_t)r * ldp;
            for (int c = 0; c < d; c += 16) {
                float *o = out + (int64_t)r * ldo + c;
                v8f a0 = *(v8fu *)o, a1 = *(v8fu *)(o + 8);
                const float *vj = vp + ((int64_t)(c / 16) * n_all + k0 + j0) * 16;
                for (int j = j0; j < j1; j++, vj += 16) {
                    const v8f x = splat(pr[j]);
                    a0 += x * *(const v8fu *)vj;
                    a1 += x * *(const v8fu *)(vj + 8);
                }
                *(v8fu *)o = a0; *(v8fu *)(o + 8) = a1;
            }
        }
    }
}

/* ---- vectorised exp ------------------------------------------------------------------------ */

/* exp(x) for x <= 0 (scores minus their row max): 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2],
 * p the degree-7 Taylor polynomial (relative error < 1e-7 there); 0 below -87.3 (and for -inf or
 * NaN from a masked score), where float32 leaves the normal range. */
#define EXP_BODY(V, VI, SPLAT)                                                       \
    const V magic = SPLAT(12582912.0f);   /* 1.5 * 2^23: adding it rounds to an integer */ \
    VI small = x < SPLAT(-87.3f);                                                    \
    V t = x * SPLAT(1.44269504f) + magic;                                            \
    V n = t - magic;                                                                 \
    V r = x - n * SPLAT(0.693145752f) - n * SPLAT(1.42860677e-6f);                   \
    V p = SPLAT(1.0f / 5040) * r + SPLAT(1.0f / 720);                                \
    p = p * r + SPLAT(1.0f / 120);                                                   \
    p = p * r + SPLAT(1.0f / 24);                                                    \
    p = p * r + SPLAT(1.0f / 6);                                                     \
    p = p * r + SPLAT(0.5f);                                                         \
    p = p * r + SPLAT(1.0f);                                                         \
    p = p * r + SPLAT(1.0f);                                                         \
    VI ni = (VI)t - (VI)magic;                                                       \
    VI bits = (VI)p + (ni << 23);                                                    \
    return (V)(bits & ~small);

static inline v8f exp8(v8f x) { EXP_BODY(v8f, v8i, splat) }
#ifdef SL_WIDE
static inline v16f exp16(v16f x) { EXP_BODY(v16f, v16i, splat16) }   /* the same bits lane by lane */
#endif

static inline float exp1(float x) {
    v8f v = exp8(splat(x));
    return v[0];
}

/* The last n % 8 entries of s as a vector, the lanes past n set to `fill` */
static inline v8f tail8(const float *s, int n, float fill) {
    v8f t = splat(fill);
    for (int l = 0; l < n; l++) t[l] = s[l];
    return t;
}

/* e[j] = exp(s[j] - m) over [0, n), in place; returns the sum */
static float exp_sum(float *s, int n, float m) {
    v8f acc = splat(0.0f), mm = splat(m);
    int j = 0;
#ifdef SL_WIDE
    for (const v16f mm16 = splat16(m); j + 16 <= n; j += 16) {   /* the sum in exp8's order: the same bits */
        *(v16fu *)(s + j) = exp16(*(v16fu *)(s + j) - mm16);
        acc += *(v8fu *)(s + j);
        acc += *(v8fu *)(s + j + 8);
    }
#endif
    for (; j + 8 <= n; j += 8) {
        v8f e = exp8(*(v8fu *)(s + j) - mm);
        *(v8fu *)(s + j) = e;
        acc += e;
    }
    if (j < n) {   /* one more vector, not n % 8 single exps: its lanes past n are exp(-inf) = 0 */
        v8f e = exp8(tail8(s + j, n - j, -INFINITY) - mm);
        for (int l = 0; j + l < n; l++) s[j + l] = e[l];
        acc += e;
    }
    float z = 0.0f;
    for (int l = 0; l < 8; l++) z += acc[l];
    return z;
}

static float row_max(const float *s, int n) {
    v8f acc = splat(-INFINITY);
    int j = 0;
#ifdef SL_WIDE
    v16f acc16 = splat16(-INFINITY);
    for (; j + 16 <= n; j += 16) {
        v16f x = *(const v16fu *)(s + j);
        acc16 = select16(x > acc16, x, acc16);
    }
    acc = (v8f){acc16[0], acc16[1], acc16[2], acc16[3], acc16[4], acc16[5], acc16[6], acc16[7]};
    v8f hi = {acc16[8], acc16[9], acc16[10], acc16[11], acc16[12], acc16[13], acc16[14], acc16[15]};
    acc = select8(hi > acc, hi, acc);
#endif
    for (; j + 8 <= n; j += 8) {
        v8f x = *(const v8fu *)(s + j);
        acc = select8(x > acc, x, acc);
    }
    if (j < n) {
        v8f x = tail8(s + j, n - j, -INFINITY);
        acc = select8(x > acc, x, acc);
    }
    float m = -INFINITY;
    for (int l = 0; l < 8; l++) m = acc[l] > m ? acc[l] : m;
    return m;
}

/* cap * tanh(x / cap) = cap * (1 - 2 / (exp(2x / cap) + 1)), through exp of a non-positive argument */
static void softcap_row(float *s, int n, float cap) {
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        v8f x = *(v8fu *)(s + j) * splat(1.0f / cap);
        v8i neg = x < splat(0.0f);
        v8f ax = select8(neg, -x, x);
        v8f e = exp8(splat(-2.0f) * ax);                  /* in (0, 1] */
        v8f th = (splat(1.0f) - e) / (splat(1.0f) + e);
        th = select8(neg, -th, th);
        *(v8fu *)(s + j) = th * splat(cap);
    }
    for (; j < n; j++) s[j] = cap * tanhf(s[j] / cap);
}

/* ---- rows and keys ------------------------------------------------------------------------ */

typedef struct { int lo, hi, dense; } span;   /* visible keys of a row lie in [lo, hi); dense: all of them */

/* The visible key span of every row of batch row `bi` (shared by all heads). */
static void row_spans(const sl_args *a, int bi, span *sp) {
    int off = a->s_k - a->s_q;
    for (int r = 0; r < a->s_q; r++) {
        if (a->allowed == NULL) {
            int hi = a->causal ? r + off + 1 : a->s_k;
            sp[r] = (span){0, hi < 0 ? 0 : (hi > a->s_k ? a->s_k : hi), 1};
            continue;
        }
        const uint8_t *m = a->allowed + bi * a->allowed_bstride + (int64_t)r * a->s_k;
        int lo = 0, hi = a->s_k, count = 0;
        while (lo < a->s_k && !m[lo]) lo++;
        while (hi > lo && !m[hi - 1]) hi--;
        for (int j = lo; j < hi; j++) count += m[j] != 0;
        sp[r] = (span){lo, hi < lo ? lo : hi, count == hi - lo};
    }
}

/* Is key j (absolute) blocked for a row at key position pos? */
static inline int is_blocked(const uint8_t *bk, int j, int pos, int keep_self) {
    return bk[j] && !(keep_self && j == pos);
}

typedef struct {
    const sl_args *a;
    const span *spans;        /* (B, S_q) */
    int next;                 /* the next (batch row, head) pair to take */
    pthread_mutex_t lock;
} pool;

/* One (batch row, head): every tile of its query rows. kp and vp hold the keys and values of kv head
 * *packed (batch row times H_kv plus kv head; -1 none): the query heads of one kv head, taken in turn,
 * pack them once. */
static void run_head(const sl_args *a, const span *sp, int bi, int hi_, float *buf, float *tmp, float *rinv, float *kp,
                     float *vp, int64_t *packed) {
    const int s_q = a->s_q, s_k = a->s_k, d = a->d, rep = a->h / a->h_kv;
    const int off = s_k - s_q;
    const int kvh = hi_ / rep;
    const float *qh = a->q + bi * a->q_str[0] + hi_ * a->q_str[1];
    const float *kh = a->k + bi * a->k_str[0] + kvh * a->k_str[1];
    const float *vh = a->v + bi * a->v_str[0] + kvh * a->v_str[1];
    const int ldq = (int)a->q_str[2], ldk = (int)a->k_str[2], ldv = (int)a->v_str[2];
    const uint8_t *bk = a->blocked ? a->blocked + ((int64_t)bi * a->h + hi_) * s_k : NULL;
    const uint8_t *mask = a->allowed ? a->allowed + bi * a->allowed_bstride : NULL;
    const int64_t bh = (int64_t)bi * a->h + hi_;
    float *rcv = a->received ? a->received + bh * s_k : NULL;
    float *unb = a->unblocked ? a->unblocked + bh * s_k : NULL;
    float *dist = a->distance ? a->distance + bh * (2 * s_k - 1) : NULL;
    const float sink = a->sinks ? a->sinks[hi_] : 0.0f;
    const int ldo = a->h * d;
    const float one = 1.0f, zero = 0.0f;
    const int mk = a->products == SL_PACKED;   /* the register-blocked products: keys packed at kp, values at vp */
    if (mk && *packed != (int64_t)bi * a->h_kv + kvh) {
        pack_keys(s_k, d, kh, ldk, kp);
        pack_values(s_k, d, vh, ldv, vp);
        *packed = (int64_t)bi * a->h_kv + kvh;
    }

    for (int r0 = 0; r0 < s_q; r0 += a->tile) {
        int r1 = r0 + a->tile < s_q ? r0 + a->tile : s_q, m = r1 - r0;
        int k0 = s_k, k1 = 0;
        for (int r = r0; r < r1; r++) {
            if (sp[r].hi > sp[r].lo) {
                if (sp[r].lo < k0) k0 = sp[r].lo;
                if (sp[r].hi > k1) k1 = sp[r].hi;
            }
        }
        float *orow = a->out + ((int64_t)bi * s_q + r0) * ldo + (int64_t)hi_ * d;
        if (k1 <= k0) {   /* no row of the tile sees a key: output 0, nothing recorded */
            for (int r = 0; r < m; r++) memset(orow + (int64_t)r * ldo, 0, sizeof(float) * d);
            continue;
        }
        if (mk) k0 &= ~15;   /* from a panel's first key: the keys before k0 lie outside every row's span */
        /* ls: a row's length in buf: whole panels, and never a multiple of 256 floats (rows 1 KB apart
         * share L1 sets: the output product reads 6 rows at once) */
        const int n = k1 - k0, np = (n + 15) / 16, ls = mk ? 16 * np + (np % 16 ? 0 : 16) : n;
        /* scores (m, n) row-major = Q (m, D) K[k0:k1]^T: column-major, S^T = K^T' Q^T */
        if (a->products == SL_LOOPS)
            scores_loop(m, n, d, a->scale, qh + (int64_t)r0 * ldq, ldq, kh + (int64_t)k0 * ldk, ldk, buf);
        else if (mk)
            scores_mk(m, np, d, a->scale, qh + (int64_t)r0 * ldq, ldq, kp + (int64_t)k0 * d, buf, ls);
        else
            a->sgemm("T", "N", &n, &m, &d, &a->scale, kh + (int64_t)k0 * ldk, &ldk, qh + (int64_t)r0 * ldq, &ldq, &zero, buf, &n);
        for (int r = r0; r < r1; r++) {
            float *s = buf + (int64_t)(r - r0) * ls;
            const int pos = r + off;
            const int lo = sp[r].lo - k0, hi = sp[r].hi - k0;
            rinv[r - r0] = 1.0f;
            if (hi <= lo) { memset(s, 0, sizeof(float) * ls); continue; }
            float w = a->row_w ? a->row_w[(int64_t)bi * s_q + r] : 1.0f;
            int64_t g = a->groups ? a->groups[(int64_t)bi * s_q + r] : -1;
            if (g >= a->num_groups) g = -1;   /* never write outside the sums (the request checks ids) */
            if (a->softcap > 0.0f) softcap_row(s + lo, hi - lo, a->softcap);
            if (!sp[r].dense) {   /* a mask with holes inside the span: those scores never count */
                const uint8_t *mr = mask + (int64_t)r * s_k + k0;
                for (int j = lo; j < hi; j++) s[j] = mr[j] ? s[j] : -INFINITY;
            }
            if (lo > 0) memset(s, 0, sizeof(float) * lo);
            if (hi < ls) memset(s + hi, 0, sizeof(float) * (ls - hi));
            float mx = row_max(s + lo, hi - lo);
            if (a->sinks && sink > mx) mx = sink;
            /* the blocked keys of this row, and the max over what blocking leaves */
            int blocking = 0;
            float mx_b = -INFINITY;
            if (bk) {
                for (int j = lo; j < hi; j++) {
                    if (s[j] == -INFINITY) continue;
                    if (is_blocked(bk, j + k0, pos, a->keep_self)) blocking = 1;
                    else if (s[j] > mx_b) mx_b = s[j];
                }
                if (mx_b == -INFINITY) blocking = 0;   /* every visible key blocked: the row keeps them */
                if (a->sinks && sink > mx_b) mx_b = sink;
            }
            float *e = s + lo;
            const int len = hi - lo;
            float inv;
            if (blocking && mx_b < mx - 60.0f) {
                /* a blocked key held (almost) all the mass: the would-be sums from a copy, then the
                 * model's softmax with the max over the keys left (exact, no underflow) */
                if (unb && w != 0.0f) {
                    memcpy(tmp, e, sizeof(float) * len);
                    float c = w / (exp_sum(tmp, len, mx) + (a->sinks ? exp1(sink - mx) : 0.0f));
                    for (int j = 0; j < len; j++) unb[k0 + lo + j] += tmp[j] * c;
                }
                for (int j = 0; j < len; j++) e[j] = is_blocked(bk, j + lo + k0, pos, a->keep_self) ? -INFINITY : e[j];
                float sink_e = a->sinks ? exp1(sink - mx_b) : 0.0f;
                inv = 1.0f / (exp_sum(e, len, mx_b) + sink_e);
                if (a->sink_sums) a->sink_sums[bh] += w * sink_e * inv;
            } else {
                float sink_e = a->sinks ? exp1(sink - mx) : 0.0f;
                float z = exp_sum(e, len, mx) + sink_e;
                if (unb && w != 0.0f) {   /* the softmax before blocking (= the model's, where nothing is blocked) */
                    float c = w / z;
                    for (int j = 0; j < len; j++) unb[k0 + lo + j] += e[j] * c;
                }
                if (blocking) {   /* zero the blocked keys, renormalise over the rest */
                    z = sink_e;
                    for (int j = 0; j < len; j++) {
                        e[j] = is_blocked(bk, j + lo + k0, pos, a->keep_self) ? 0.0f : e[j];
                        z += e[j];
                    }
                }
                inv = 1.0f / z;
                if (a->sink_sums) a->sink_sums[bh] += w * sink_e * inv;
            }
            /* the row stays unnormalised (the output is scaled by 1 / Z after its product): one pass reads
             * it into the column sums, weighted by w / Z */
            rinv[r - r0] = inv;
            if (w == 0.0f) continue;
            const float c = w * inv;
            float *rc = rcv ? rcv + k0 + lo : NULL;
            float *gs = a->group_sums && g >= 0
                ? a->group_sums + (((int64_t)bi * a->num_groups + g) * a->h + hi_) * s_k + k0 + lo : NULL;
            if (rc && gs) {
                for (int j = 0; j < len; j++) { float p = c * e[j]; rc[j] += p; gs[j] += p; }
            } else if (rc || gs) {
                float *to = rc ? rc : gs;
                for (int j = 0; j < len; j++) to[j] += c * e[j];
            }
            if (a->diagonal && pos >= k0 + lo && pos < k0 + hi) a->diagonal[bh] += c * e[pos - k0 - lo];
            if (dist) {   /* offsets j - pos of this row's keys are contiguous: one vector add */
                float *dd = dist + (k0 + lo - pos + s_k - 1);
                for (int j = 0; j < len; j++) dd[j] += c * e[j];
            }
        }
        /* output (m, D) = P (m, n) V[k0:k1] (n, D): column-major, O^T = V^T P^T */
        if (a->products == SL_LOOPS)
            output_loop(m, n, d, buf, vh + (int64_t)k0 * ldv, ldv, orow, ldo);
        else if (mk)
            output_mk(m, n, d, buf, ls, vp, s_k, k0, orow, ldo);
        else
            a->sgemm("N", "N", &d, &m, &n, &one, vh + (int64_t)k0 * ldv, &ldv, buf, &n, &zero, orow, &ldo);
        for (int r = 0; r < m; r++) {   /* each row's 1 / Z */
            float *o = orow + (int64_t)r * ldo;
            for (int c = 0; c < d; c++) o[c] *= rinv[r];
        }
    }
}

static void *worker(void *arg) {
    pool *p = (pool *)arg;
    const sl_args *a = p->a;
    const int switch_blas = a->blas_threads && a->products == SL_BLAS;
    int old = switch_blas ? a->blas_threads(1) : 0;   /* parallel here, not inside BLAS */
    /* scores (tile rows, S_k) and one row's copy (S_k): a decoding step's one row needs one row's scores */
    const size_t n_buf = (size_t)(a->tile < a->s_q ? a->tile : a->s_q) * (a->s_k + 31);   /* rows of whole panels */
    /* the packed keys, and as many floats for the packed values */
    const size_t n_kp = a->products == SL_PACKED ? (size_t)(a->s_k + 15) / 16 * 16 * a->d : 0;
    const size_t n_rows = (size_t)(a->tile < a->s_q ? a->tile : a->s_q);   /* a tile's 1 / Z per row */
    float *buf = malloc(sizeof(float) * (n_buf + a->s_k + n_rows + 2 * n_kp));
    if (buf) {
        int64_t packed = -1;
        for (;;) {
            pthread_mutex_lock(&p->lock);
            int job = p->next++;
            pthread_mutex_unlock(&p->lock);
            if (job >= a->b * a->h) break;
            int bi = job / a->h, hd = job % a->h;
            float *rows = buf + n_buf + a->s_k, *kp = rows + n_rows;
            run_head(a, p->spans + (int64_t)bi * a->s_q, bi, hd, buf, buf + n_buf, rows, kp, kp + n_kp, &packed);
        }
        free(buf);
    }
    if (switch_blas) a->blas_threads(old);
    return NULL;
}

/* 0 on success, 1 if out of memory (the caller falls back). A thread that cannot start leaves its
 * share to the others. */
int sl_attention(const sl_args *a) {
    span *spans = malloc(sizeof(span) * (size_t)a->b * a->s_q);
    if (!spans) return 1;
    for (int bi = 0; bi < a->b; bi++) row_spans(a, bi, spans + (int64_t)bi * a->s_q);
    pool p = {.a = a, .spans = spans, .next = 0};
    pthread_mutex_init(&p.lock, NULL);
    int n = a->threads < 1 ? 1 : a->threads, rc = 0;
    if (n > a->b * a->h) n = a->b * a->h;
    pthread_t *ids = malloc(sizeof(pthread_t) * n);
    int started = 0;
    if (ids) {
        for (; started < n - 1; started++)
            if (pthread_create(&ids[started], NULL, worker, &p) != 0) break;
    }
    worker(&p);   /* the calling thread works too */
    for (int t = 0; t < started; t++) pthread_join(ids[t], NULL);
    if (p.next < a->b * a->h) rc = 1;   /* no thread had a buffer */
    free(ids);
    free(spans);
    pthread_mutex_destroy(&p.lock);
    return rc;
}

/* The sink masking's default selection for batch row `bi` (sinklens/masking/select.py holds the
 * semantics; tests/test_masking_select.py holds this equal to it): per (layer l, head h), the
 * scores of the ranking source r in scaled_sum units, scores[l,bi,h,j] = (float)((double)r * scale[l])
 * on the visible keys and 0 elsewhere (numpy's float64 product rounded once), and the one key to
 * block, blocked[l,bi,h,j]: the first of the largest scores among the visible keys in scope, found
 * as numpy's argmax finds it over those scores with -inf elsewhere (a NaN is the largest; a head
 * with no such key blocks nothing; a head whose largest is -inf blocks key 0 if it may). A masked
 * step's ranking is one call here instead of a dozen numpy operations, each of which costs a tiny
 * model's step ~20-30 us the first time it runs (docs/design.md, "Per-step bookkeeping").
 * r, scores: (L, B, H, S) float32; blocked: (L, B, H, W) bool, W >= S, zeroed by the caller;
 * scale: (L,) float64; visible: (L, S) bool of this row; scope: (S,) bool of this row. */
void sl_top1(int L, int B, int H, int S, int W, int bi, const float *r, const double *scale,
             const uint8_t *visible, const uint8_t *scope, float *scores, uint8_t *blocked) {
    if (S < 1) return;   /* no key: nothing to score or block (key 0 below must exist) */
    for (int l = 0; l < L; l++) {
        const uint8_t *vis = visible + (int64_t)l * S;
        for (int h = 0; h < H; h++) {
            int64_t row = ((int64_t)l * B + bi) * H + h;
            const float *rr = r + row * S;
            float *sc = scores + row * S;
            float best = 0.0f;
            int at = 0;
            for (int j = 0; j < S; j++) {
                float s = vis[j] ? (float)((double)rr[j] * scale[l]) : 0.0f;
                sc[j] = s;
                float key = vis[j] && scope[j] ? s : -INFINITY;
                if (j == 0) {
                    best = key;
                } else if (!isnan(best) && !(key <= best)) {   /* numpy: a larger value, or the first NaN */
                    best = key;
                    at = j;
                }
            }
            blocked[row * W + at] = vis[at] && scope[at];
        }
    }
}

/* ---- the hidden-state readouts' pass (sinklens/attention/readouts.py calls it; not part of attention)
 * Per row of h (rows, d) float32, in one read: norm = sqrt(sum of h^2) and the k <= 8
 * channels of the largest |h| with their values of h, largest first, the lower channel first among
 * equal magnitudes. torch's abs + topk + norm + gather read the activations four times (at S = 1024 a
 * SmolLM2 layer's 2.4 MB, past L2 each time: 1.5 ms against this pass' 0.7 ms).
 * Returns 1 (its outputs then undefined) where a row holds a NaN: the caller takes torch's path,
 * which orders a NaN as the largest. */
static inline int any8(v8i m) {
    uint64_t w[4];   /* the lanes as four words: one test (a loop over lanes was half the pass) */
    memcpy(w, &m, sizeof w);
    return (w[0] | w[1] | w[2] | w[3]) != 0;
}

static inline void top_insert(float a, int c, int k, float *best, int *at) {
    if (!(a > best[k - 1])) return;   /* an equal magnitude keeps the lower channel first */
    int i = k - 1;
    while (i > 0 && a > best[i - 1]) {
        best[i] = best[i - 1];
        at[i] = at[i - 1];
        i--;
    }
    best[i] = a;
    at[i] = c;
}

int sl_hidden_top(int64_t rows, int d, int k, const float *h, float *norm, int32_t *top, float *vals) {
    if (k < 1 || k > 8 || k > d) return 1;
    const v8i abs_bits = {0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff,
                          0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff};
    int full = d / 8 * 8;   /* channels in whole groups of 8 */
    for (int64_t r = 0; r < rows; r++) {
        const float *x = h + r * d;
        /* 1. the sum of squares and each lane's largest |h|, without a branch */
        v8f acc = splat(0.0f), lane_max = splat(-1.0f);
        v8i nan = {0};
        for (int c = 0; c < full; c += 8) {
            v8f v = *(const v8fu *)(x + c);
            v8f a = (v8f)((v8i)v & abs_bits);
            acc += v * v;
            nan |= (v8i)(v != v);
            lane_max = select8((v8i)(a > lane_max), a, lane_max);
        }
        float sum = 0.0f;
        int tail_nan = 0;
        for (int c = full; c < d; c++) {
            sum += x[c] * x[c];
            tail_nan |= x[c] != x[c];
        }
        if (tail_nan || any8(nan)) return 1;
        for (int l = 0; l < 8; l++) sum += acc[l];
        norm[r] = sqrtf(sum);
        /* 2. the lanes' maxima are 8 of the row's magnitudes: their k-th largest is at most the row's
         * k-th largest, so only magnitudes at or above it can be among the k (a few a row) */
        float bound = -1.0f;
        for (int l = 0; full && l < 8; l++) {
            int rank = 0;   /* lane l's maximum's rank among the 8, 0 = the largest (ties by lane) */
            for (int o = 0; o < 8; o++) rank += lane_max[o] > lane_max[l] || (lane_max[o] == lane_max[l] && o < l);
            if (rank == k - 1) bound = lane_max[l];
        }
        float best[8];
        int at[8];
        for (int i = 0; i < k; i++) {
            best[i] = -1.0f;   /* below every magnitude: the first candidates fill the list */
            at[i] = 0;
        }
        v8f b8 = splat(bound);
        for (int c = 0; c < full; c += 8) {
            v8f a = (v8f)((v8i)*(const v8fu *)(x + c) & abs_bits);
            if (any8((v8i)(a >= b8)))
                for (int l = 0; l < 8; l++) top_insert(a[l], c + l, k, best, at);
        }
        for (int c = full; c < d; c++) top_insert(fabsf(x[c]), c, k, best, at);
        for (int i = 0; i < k; i++) {
            top[r * k + i] = at[i];
            vals[r * k + i] = x[at[i]];
        }
    }
    return 0;
}

/* ---- the median magnitude of each row (attention/readouts.py, the hidden-state readouts) ----------
 * out[r] = the lower middle of |x| over row r's n floats (rank (n - 1) / 2 from the smallest: the element
 * torch.median returns), exactly, by a radix select on the bits: with the sign cleared, a float's bits
 * order as its value. One pass counts the top 16 bits of every magnitude; a second counts the low 16
 * bits of those in the bin that holds the rank; the two bins are the element's bits. x is only read
 * (a partitioned copy of a layer's activations is megabytes of fresh pages). Returns 1 where a row
 * holds a NaN (torch's median is NaN there: the caller takes its path), 2 without memory. */
int sl_median_abs(int64_t rows, int64_t n, const float *x, float *out) {
    if (n < 1) return 1;
    uint32_t *count = malloc(65536 * sizeof *count);
    if (!count) return 2;
    for (int64_t r = 0; r < rows; r++) {
        const uint32_t *u = (const uint32_t *)(x + r * n);
        int64_t rank = (n - 1) / 2;
        uint32_t nan = 0;
        memset(count, 0, 65536 * sizeof *count);
        for (int64_t i = 0; i < n; i++) {
            uint32_t a = u[i] & 0x7fffffffu;
            nan |= a > 0x7f800000u;
            count[a >> 16]++;
        }
        if (nan) {
            free(count);
            return 1;
        }
        uint32_t hi = 0;
        while (rank >= count[hi]) rank -= count[hi++];
        memset(count, 0, 65536 * sizeof *count);
        for (int64_t i = 0; i < n; i++) {
            uint32_t a = u[i] & 0x7fffffffu;
            if (a >> 16 == hi) count[a & 0xffffu]++;
        }
        uint32_t lo = 0;
        while (rank >= count[lo]) rank -= count[lo++];
        uint32_t bits = hi << 16 | lo;
        memcpy(out + r, &bits, sizeof bits);
    }
    free(count);
    return 0;
}

/* ---- the q / k / v readouts' pass (attention/readouts.py `record_vectors`; not part of attention)
 * q (B, H, S_q, D), k and v (B, H_kv, S_k, D): float32, unit stride along D; strides: their (batch,
 * head, row) strides, q's, k's, v's; w (B, S_q) float32 weights of the query rows, or NULL (every row 1). Query head h
 * reads kv head h / (H / H_kv). Per (b, h), with n = max(sum_i w_i, 1):
 *   value_norm[b, h, j] = |v_j|;  key_norm[b, h, j] = |k_j|;
 *   q_dir = sum_i w_i q_i / max(|q_i|, 1e-30) / n;  qk_cos[b, h, j] = k_j . q_dir / max(|k_j|, 1e-30);
 *   query_norm[b, h] = sum_i w_i |q_i| / n.
 * value_norm NULL: not asked; key_norm NULL: no q . k readouts (qk_cos, query_norm unused). torch's
 * dozen calls for these took a SmolLM2 layer 0.37 ms against this pass' 0.11 at S = 256. */
static inline float dot_d(const float *a, const float *b, int d) {
    v8f acc = splat(0.0f);
    int c = 0;
    for (; c + 8 <= d; c += 8) acc += *(const v8fu *)(a + c) * *(const v8fu *)(b + c);
    float s = 0.0f;
    for (; c < d; c++) s += a[c] * b[c];
    for (int l = 0; l < 8; l++) s += acc[l];
    return s;
}

/* out[j] = a_j . b_j for j < n, rows `as` / `bs` floats apart (bs 0: one b for every row); eight rows
 * at a time, their lanes summed together by `sum_lanes8` (a sum of lanes per row cost as much as
 * the row's products at D = 64). sqrt_out: out[j] = sqrt of that. */
static void dots(const float *a, int64_t as, const float *b, int64_t bs, int n, int d, float *out, int sqrt_out) {
    int j = 0;
    if (d % 8 == 0) {
        for (; j + 8 <= n; j += 8) {
            v8f acc[8];
            for (int r = 0; r < 8; r++) acc[r] = splat(0.0f);
            for (int c = 0; c < d; c += 8)
                for (int r = 0; r < 8; r++)
                    acc[r] += *(const v8fu *)(a + (j + r) * as + c) * *(const v8fu *)(b + (j + r) * bs + c);
            v8f sums = sum_lanes8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]);
            for (int r = 0; r < 8; r++) out[j + r] = sqrt_out ? sqrtf(sums[r]) : sums[r];
        }
    }
    for (; j < n; j++) {
        float x = dot_d(a + j * as, b + j * bs, d);
        out[j] = sqrt_out ? sqrtf(x) : x;
    }
}

int sl_qkv_readouts(int B, int H, int H_kv, int S_q, int S_k, int D, const float *q, const float *k, const float *v,
                    const int64_t *strides, const float *w, float *value_norm, float *key_norm, float *qk_cos,
                    float *query_norm) {
    const int64_t *qs = strides, *ks = strides + 3, *vs = strides + 6;
    int rep = H / H_kv;
    float *q_dir = malloc(sizeof(float) * (size_t)(D > 0 ? D : 1));
    float *k_norm = malloc(sizeof(float) * (size_t)(S_k > 0 ? S_k : 1));
    float *v_norm = malloc(sizeof(float) * (size_t)(S_k > 0 ? S_k : 1));
    float *q_norm = malloc(sizeof(float) * (size_t)(S_q > 0 ? S_q : 1));
    if (!q_dir || !k_norm || !v_norm || !q_norm) {   /* out of memory: the caller takes torch's path */
        free(q_dir);
        free(k_norm);
        free(v_norm);
        free(q_norm);
        return 1;
    }
    for (int b = 0; b < B; b++) {
        const float *wb = w ? w + (int64_t)b * S_q : NULL;
        float n = 0.0f;
        for (int i = 0; i < S_q; i++) n += wb ? wb[i] : 1.0f;
        n = n < 1.0f ? 1.0f : n;
        for (int g = 0; g < H_kv; g++) {
            const float *kg = k + b * ks[0] + g * ks[1], *vg = v + b * vs[0] + g * vs[1];
            if (value_norm) dots(vg, vs[2], vg, vs[2], S_k, D, v_norm, 1);
            if (key_norm) dots(kg, ks[2], kg, ks[2], S_k, D, k_norm, 1);
            for (int r = 0; r < rep; r++) {
                int64_t row = ((int64_t)b * H + g * rep + r) * S_k;
                if (value_norm) memcpy(value_norm + row, v_norm, sizeof(float) * (size_t)S_k);
                if (key_norm) memcpy(key_norm + row, k_norm, sizeof(float) * (size_t)S_k);
            }
            if (!key_norm) continue;
            for (int r = 0; r < rep; r++) {
                int hq = g * rep + r;
                const float *qh = q + b * qs[0] + hq * qs[1];
                dots(qh, qs[2], qh, qs[2], S_q, D, q_norm, 1);
                float q_sum = 0.0f;
                for (int c = 0; c < D; c++) q_dir[c] = 0.0f;
                for (int i = 0; i < S_q; i++) {
                    const float *qi = qh + i * qs[2];
                    float wi = wb ? wb[i] : 1.0f;
                    q_sum += wi * q_norm[i];
                    float coef = wi / (q_norm[i] < 1e-30f ? 1e-30f : q_norm[i]);
                    for (int c = 0; c < D; c++) q_dir[c] += coef * qi[c];
                }
                for (int c = 0; c < D; c++) q_dir[c] /= n;
                query_norm[(int64_t)b * H + hq] = q_sum / n;
                float *cos_row = qk_cos + ((int64_t)b * H + hq) * S_k;
                dots(kg, ks[2], q_dir, 0, S_k, D, cos_row, 0);
                for (int j = 0; j < S_k; j++) cos_row[j] /= k_norm[j] < 1e-30f ? 1e-30f : k_norm[j];
            }
        }
    }
    free(q_dir);
    free(k_norm);
    free(v_norm);
    free(q_norm);
    return 0;
}
