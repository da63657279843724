/* reduce-einsum.c - the Einsum kernel: a GEMM fast path for two-operand float32 contractions, and general
 * index loops for everything else.
 *
 * Fast path (planned in init, with final shapes): size-1 dims are dropped first (a size-1 dim of an operand
 * broadcasts, which is the same as its letter being absent there). Every remaining letter is then
 *   batch (both operands and the output), M (left operand and output), N (right operand and output),
 *   K (both operands, not the output), or summed (one operand only, not the output: summed while packing).
 * Batch, M and N letters keep the output's order, K letters the left operand's (the right one's when the left
 * is packed anyway). An operand is read in place when it already is [batch, M, K] or [batch, K, M] (right:
 * [batch, K, N] or [batch, N, K]), else it is packed into [batch, M, K] / [batch, K, N] (a constant operand
 * once, in init). When the output is [batch, N, M] the operands swap roles, so the output is still written in
 * place; any other output order goes through a scratch C [batch, M, N] and one permute.
 * Every batch is one cblas_sgemm: a plain loop when a GEMM is big enough for OpenBLAS to thread it itself,
 * else an OpenMP loop over the batch (OpenBLAS runs GEMMs of M*N*K <= 262144 single-threaded in the caller).
 * Not taken (the index loops run instead): other than two operands, dtypes other than float32, a letter
 * repeated within an operand or in the output (diagonals), empty tensors, sizes over INT_MAX; and always when
 * TENSORD_EINSUM_REF is set and not "0" (tests compare both paths).
 *
 * Index loops: every combination of subscript values (output subscripts outermost) with per-operand strides,
 * accumulating in double; general (diagonals, broadcast ellipses, any operand count), O(product of all sizes).
 *
 * State: one plan per node and plan; its scratch buffers are reused by every exec, so one exec at a time (as
 * every plan runs one request at a time).
 */
#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-reduce.h"
#include "reduce-math.h"

eng_status krn_cpu_einsum_init(krn_call *c);
eng_status krn_cpu_einsum_exec(krn_call *c);
void krn_cpu_einsum_free(void *state);

/* OpenBLAS (interface/gemm.c) runs a GEMM single-threaded when M*N*K <= 65536 * GEMM_MULTITHREAD_THRESHOLD (4). */
#define ES_BLAS_SINGLE_THREAD_MNK 262144.0

/* dst (contiguous, row-major dims dim[0..nd-1]) = src read with src_stride per dim, summed over the sum dims. */
typedef struct es_gather {
    int nd, nsum;
    int64_t dim[ENG_MAX_DIMS], src_stride[ENG_MAX_DIMS];
    int64_t sum_dim[ENG_MAX_DIMS], sum_stride[ENG_MAX_DIMS];
} es_gather;

typedef struct es_operand {
    int in;         /* the krn_call input this role reads */
    int packed;     /* read from buf (laid out by gather) instead of the input */
    int trans;      /* in place, stored as the transpose of the GEMM's view ([batch, K, M] / [batch, N, K]) */
    int pconst;     /* buf was filled once in init (constant input) */
    es_gather gather;
    float *buf;     /* owned; NULL when read in place */
} es_operand;

typedef struct es_state {
    int64_t nb, M, N, K;
    es_operand L, R;    /* L: (M, K) per batch, R: (K, N) per batch */
    int out_direct;     /* the output is [batch, M, N]: the GEMMs write it */
    es_gather out;      /* else: output = permute of cbuf */
    float *cbuf;        /* [batch, M, N], owned */
} es_state;

void krn_cpu_einsum_free(void *state) {
    es_state *s = state;
    if (!s) return;
    eng_free(s->L.buf);
    eng_free(s->R.buf);
    eng_free(s->cbuf);
    free(s);
}

/* Run g: src -> dst. Parallel over dst rows (all dims but the last) when the work is large. */
static void es_gather_run(const es_gather *g, const float *src, float *dst, int nthreads) {
    int nd = g->nd;
    int64_t inner = nd ? g->dim[nd - 1] : 1, istr = nd ? g->src_stride[nd - 1] : 0, rows = 1, nsumel = 1;
    for (int i = 0; i < nd - 1; i++) rows *= g->dim[i];
    for (int i = 0; i < g->nsum; i++) nsumel *= g->sum_dim[i];
    if (nthreads < 1) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (rows * inner * nsumel > 65536)
    for (int64_t r = 0; r < rows; r++) {
        int64_t off = 0, q = r;
        for (int i = nd - 2; i >= 0; i--) {
            off += (q % g->dim[i]) * g->src_stride[i];
            q /= g->dim[i];
        }
        float *d = dst + r * inner;
        const float *sp = src + off;
        if (g->nsum == 0) {
            if (istr == 1) memcpy(d, sp, (size_t)inner * sizeof *d);
            else
                for (int64_t j = 0; j < inner; j++) d[j] = sp[j * istr];
            continue;
        }
        for (int64_t j = 0; j < inner; j++) d[j] = 0.f;
        int64_t idx[ENG_MAX_DIMS] = {0}, soff = 0;
        for (int64_t t = 0; t < nsumel; t++) {
            for (int64_t j = 0; j < inner; j++) d[j] += sp[soff + j * istr];
            for (int i = g->nsum - 1; i >= 0; i--) {
                soff += g->sum_stride[i];
                if (++idx[i] < g->sum_dim[i]) break;
                soff -= g->sum_stride[i] * g->sum_dim[i];
                idx[i] = 0;
            }
        }
    }
}

/* One operand after dropping its size-1 dims: letter ids in order and their element strides. */
typedef struct es_ids {
    int n;
    int id[ENG_MAX_DIMS];
    int64_t stride[ENG_MAX_DIMS];
} es_ids;

/* Fills *o from the dims (rank r, letters ids[]); 0 if a letter repeats (a diagonal) or a dim is 0. */
static int es_ids_get(const int *ids, const int64_t *dims, int r, es_ids *o) {
    int64_t st = 1;
    o->n = 0;
    int tmp_id[ENG_MAX_DIMS];
    int64_t tmp_st[ENG_MAX_DIMS];
    int n = 0;
    for (int j = r - 1; j >= 0; j--) {
        if (dims[j] == 0) return 0;
        if (dims[j] != 1) {
            for (int q = 0; q < n; q++)
                if (tmp_id[q] == ids[j]) return 0;
            tmp_id[n] = ids[j];
            tmp_st[n++] = st;
        }
        st *= dims[j];
    }
    for (int q = 0; q < n; q++) o->id[q] = tmp_id[n - 1 - q], o->stride[q] = tmp_st[n - 1 - q];
    o->n = n;
    return 1;
}

static int es_find(const es_ids *o, int id) {
    for (int q = 0; q < o->n; q++)
        if (o->id[q] == id) return q;
    return -1;
}

/* 1 if o's letters are exactly a ++ b ++ c (lists of na, nb, nc ids). */
static int es_seq_is(const es_ids *o, const int *a, int na, const int *b, int nb, const int *c, int nc) {
    if (o->n != na + nb + nc) return 0;
    for (int q = 0; q < na; q++)
        if (o->id[q] != a[q]) return 0;
    for (int q = 0; q < nb; q++)
        if (o->id[na + q] != b[q]) return 0;
    for (int q = 0; q < nc; q++)
        if (o->id[na + nb + q] != c[q]) return 0;
    return 1;
}

/* Gather packing operand o into contiguous a ++ b ++ c, summing its letters listed in sum. */
static void es_gather_pack(es_gather *g, const es_ids *o, const krn_einsum_params *p, const int *a, int na, const int *b,
                           int nb, const int *c, int nc, const int *sum, int nsum) {
    const int *lists[3] = {a, b, c};
    int lens[3] = {na, nb, nc};
    g->nd = 0;
    for (int l = 0; l < 3; l++)
        for (int q = 0; q < lens[l]; q++) {
            int id = lists[l][q];
            g->dim[g->nd] = p->id_size[id];
            g->src_stride[g->nd++] = o->stride[es_find(o, id)];
        }
    g->nsum = nsum;
    for (int q = 0; q < nsum; q++) {
        g->sum_dim[q] = p->id_size[sum[q]];
        g->sum_stride[q] = o->stride[es_find(o, sum[q])];
    }
}

static int64_t es_size(const krn_einsum_params *p, const int *ids, int n) {
    int64_t s = 1;
    for (int q = 0; q < n; q++) s *= p->id_size[ids[q]];
    return s;
}

/* Plan the fast path into s. Returns 1 when it applies, 0 when the index loops must run. */
static int es_plan(const krn_call *c, es_state *s) {
    const krn_einsum_params *p = c->params;
    if (p->nops != 2 || c->nin != 2) return 0;
    if (c->in[0].dtype != ENG_DTYPE_F32 || c->in[1].dtype != ENG_DTYPE_F32 || c->out[0].dtype != ENG_DTYPE_F32) return 0;
    es_ids op[2], out;
    for (int k = 0; k < 2; k++)
        if (!es_ids_get(p->op_ids[k], c->in[k].dims, p->op_rank[k], &op[k])) return 0;
    if (!es_ids_get(p->out_ids, c->out[0].dims, p->out_rank, &out)) return 0;
    for (int q = 0; q < out.n; q++)
        if (es_find(&op[0], out.id[q]) < 0 && es_find(&op[1], out.id[q]) < 0) return 0;
    /* input 0 on the left when the output is [batch, M, N] that way; input 1 when it is [batch, N, M] */
    int batch[ENG_MAX_DIMS], mi[ENG_MAX_DIMS], ni[ENG_MAX_DIMS], nbt, nm, nn, swap = 0, direct = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        const es_ids *L = &op[attempt], *R = &op[1 - attempt];
        nbt = nm = nn = 0;
        for (int q = 0; q < out.n; q++) {
            int id = out.id[q], inl = es_find(L, id) >= 0, inr = es_find(R, id) >= 0;
            if (inl && inr) batch[nbt++] = id;
            else if (inl) mi[nm++] = id;
            else ni[nn++] = id;
        }
        if (es_seq_is(&out, batch, nbt, mi, nm, ni, nn)) {
            swap = attempt, direct = 1;
            break;
        }
    }
    if (!direct) { /* no GEMM order writes the output in place: keep input 0 on the left, permute at the end */
        const es_ids *L = &op[0], *R = &op[1];
        nbt = nm = nn = 0;
        for (int q = 0; q < out.n; q++) {
            int id = out.id[q], inl = es_find(L, id) >= 0, inr = es_find(R, id) >= 0;
            if (inl && inr) batch[nbt++] = id;
            else if (inl) mi[nm++] = id;
            else ni[nn++] = id;
        }
    }
    const es_ids *L = &op[swap], *R = &op[1 - swap];
    int ki[ENG_MAX_DIMS], sl[ENG_MAX_DIMS], sr[ENG_MAX_DIMS], nk = 0, nsl = 0, nsr = 0;
    for (int q = 0; q < L->n; q++) {
        int id = L->id[q];
        if (es_find(&out, id) >= 0) continue;
        if (es_find(R, id) >= 0) ki[nk++] = id;
        else sl[nsl++] = id;
    }
    for (int q = 0; q < R->n; q++)
        if (es_find(&out, R->id[q]) < 0 && es_find(L, R->id[q]) < 0) sr[nsr++] = R->id[q];
    s->L.in = swap, s->R.in = 1 - swap;
    s->L.packed = 1;
    if (nsl == 0 && es_seq_is(L, batch, nbt, mi, nm, ki, nk)) s->L.packed = 0, s->L.trans = 0;
    else if (nsl == 0 && es_seq_is(L, batch, nbt, ki, nk, mi, nm)) s->L.packed = 0, s->L.trans = 1;
    if (s->L.packed) { /* L is copied anyway: take K's order from R, so R may be read in place */
        nk = 0;
        for (int q = 0; q < R->n; q++)
            if (es_find(&out, R->id[q]) < 0 && es_find(L, R->id[q]) >= 0) ki[nk++] = R->id[q];
    }
    s->R.packed = 1;
    if (nsr == 0 && es_seq_is(R, batch, nbt, ki, nk, ni, nn)) s->R.packed = 0, s->R.trans = 0;
    else if (nsr == 0 && es_seq_is(R, batch, nbt, ni, nn, ki, nk)) s->R.packed = 0, s->R.trans = 1;
    s->nb = es_size(p, batch, nbt), s->M = es_size(p, mi, nm), s->N = es_size(p, ni, nn), s->K = es_size(p, ki, nk);
    if (s->M > INT_MAX || s->N > INT_MAX || s->K > INT_MAX || s->M * s->K > INT_MAX || s->K * s->N > INT_MAX ||
        s->M * s->N > INT_MAX)
        return 0;
    if (s->L.packed) es_gather_pack(&s->L.gather, L, p, batch, nbt, mi, nm, ki, nk, sl, nsl);
    if (s->R.packed) es_gather_pack(&s->R.gather, R, p, batch, nbt, ki, nk, ni, nn, sr, nsr);
    s->out_direct = direct;
    if (!direct) { /* output[out order] = C[batch ++ M ++ N] */
        int cids[ENG_MAX_DIMS], nc = 0;
        int64_t cst[ENG_MAX_DIMS], st = 1;
        for (int q = 0; q < nbt; q++) cids[nc++] = batch[q];
        for (int q = 0; q < nm; q++) cids[nc++] = mi[q];
        for (int q = 0; q < nn; q++) cids[nc++] = ni[q];
        for (int q = nc - 1; q >= 0; q--) cst[q] = st, st *= p->id_size[cids[q]];
        s->out.nd = out.n, s->out.nsum = 0;
        for (int q = 0; q < out.n; q++) {
            int j = 0;
            while (cids[j] != out.id[q]) j++;
            s->out.dim[q] = p->id_size[out.id[q]];
            s->out.src_stride[q] = cst[j];
        }
    }
    return 1;
}

static eng_status es_alloc(float **buf, int64_t n, const char *what) {
    *buf = eng_alloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!*buf) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "einsum %s buffer of %lld floats", what, (long long)n);
    return ENG_STATUS_OK;
}

static eng_status es_init_buffers(krn_call *c, es_state *s) {
    es_operand *ops[2] = {&s->L, &s->R};
    int64_t sizes[2] = {s->nb * s->M * s->K, s->nb * s->K * s->N};
    for (int r = 0; r < 2; r++) {
        es_operand *o = ops[r];
        if (!o->packed) continue;
        ENG_TRY(es_alloc(&o->buf, sizes[r], r ? "right operand" : "left operand"));
        if ((c->const_mask >> o->in) & 1) {
            es_gather_run(&o->gather, c->in[o->in].data, o->buf, c->nthreads);
            o->pconst = 1;
        }
    }
    if (!s->out_direct) ENG_TRY(es_alloc(&s->cbuf, s->nb * s->M * s->N, "result"));
    return ENG_STATUS_OK;
}

eng_status krn_cpu_einsum_init(krn_call *c) {
    const char *e = getenv("TENSORD_EINSUM_REF");
    if (e && *e && strcmp(e, "0") != 0) return ENG_STATUS_OK;
    es_state *s = calloc(1, sizeof *s);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "einsum state");
    if (!es_plan(c, s)) {
        free(s);
        return ENG_STATUS_OK; /* index loops */
    }
    eng_status st = es_init_buffers(c, s);
    if (st != ENG_STATUS_OK) {
        krn_cpu_einsum_free(s);
        return st;
    }
    c->state = s;
    return ENG_STATUS_OK;
}

static eng_status es_exec_gemm(krn_call *c, const es_state *s) {
    const float *A = s->L.packed ? s->L.buf : c->in[s->L.in].data;
    const float *B = s->R.packed ? s->R.buf : c->in[s->R.in].data;
    if (s->L.packed && !s->L.pconst) es_gather_run(&s->L.gather, c->in[s->L.in].data, s->L.buf, c->nthreads);
    if (s->R.packed && !s->R.pconst) es_gather_run(&s->R.gather, c->in[s->R.in].data, s->R.buf, c->nthreads);
    float *C = s->out_direct ? (float *)c->out[0].data : s->cbuf;
    int M = (int)s->M, N = (int)s->N, K = (int)s->K;
    CBLAS_TRANSPOSE ta = s->L.trans ? CblasTrans : CblasNoTrans, tb = s->R.trans ? CblasTrans : CblasNoTrans;
    int lda = s->L.trans ? M : K, ldb = s->R.trans ? K : N;
    int64_t sa = s->M * s->K, sb = s->K * s->N, sc = s->M * s->N, nb = s->nb;
    int nt = c->nthreads < 1 ? 1 : c->nthreads;
    if (nb > 1 && nt > 1 && (double)M * N * K <= ES_BLAS_SINGLE_THREAD_MNK) {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int64_t b = 0; b < nb; b++)
            cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.f, A + b * sa, lda, B + b * sb, ldb, 0.f, C + b * sc, N);
    } else {
        for (int64_t b = 0; b < nb; b++)
            cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.f, A + b * sa, lda, B + b * sb, ldb, 0.f, C + b * sc, N);
    }
    if (!s->out_direct) es_gather_run(&s->out, s->cbuf, c->out[0].data, c->nthreads);
    return ENG_STATUS_OK;
}

/* ---- index loops ---- */

static eng_status es_exec_loops(krn_call *c) {
    const krn_einsum_params *p = c->params;
    /* used ids: output ids first (in output order), then contracted ids */
    int used[KRN_EINSUM_MAX_IDS], nused = 0, is_used[KRN_EINSUM_MAX_IDS] = {0};
    for (int j = 0; j < p->out_rank; j++)
        if (!is_used[p->out_ids[j]]) is_used[p->out_ids[j]] = 1, used[nused++] = p->out_ids[j];
    for (int k = 0; k < p->nops; k++)
        for (int j = 0; j < p->op_rank[k]; j++)
            if (!is_used[p->op_ids[k][j]]) is_used[p->op_ids[k][j]] = 1, used[nused++] = p->op_ids[k][j];
    int pos[KRN_EINSUM_MAX_IDS];
    for (int u = 0; u < nused; u++) pos[used[u]] = u;
    /* per-operand stride for each used id (repeated subscripts add up: diagonals; size-1 dims broadcast) */
    int64_t stride[KRN_EINSUM_MAX_OPS + 1][KRN_EINSUM_MAX_IDS];
    memset(stride, 0, sizeof stride);
    for (int k = 0; k < p->nops; k++) {
        int64_t s = 1;
        for (int j = p->op_rank[k] - 1; j >= 0; j--) {
            int64_t dim = c->in[k].dims[j];
            if (dim != 1) stride[k][pos[p->op_ids[k][j]]] += s;
            s *= dim;
        }
    }
    int64_t s = 1;
    for (int j = p->out_rank - 1; j >= 0; j--) {
        stride[p->nops][pos[p->out_ids[j]]] = s;
        s *= p->id_size[p->out_ids[j]];
    }
    eng_tensor *y = &c->out[0];
    int64_t ny = eng_tensor_numel(y);
    double *acc = calloc((size_t)(ny > 0 ? ny : 1), sizeof *acc);
    const double *xs[KRN_EINSUM_MAX_OPS] = {0};
    int owned[KRN_EINSUM_MAX_OPS] = {0};
    eng_status st = acc ? ENG_STATUS_OK : eng_err(ENG_STATUS_OUT_OF_MEMORY, "einsum accumulator of %lld", (long long)ny);
    for (int k = 0; st == ENG_STATUS_OK && k < p->nops; k++)
        if (!(xs[k] = krn_red_as(&c->in[k], ENG_DTYPE_F64, &owned[k]))) st = ENG_STATUS_OUT_OF_MEMORY;
    int64_t total = 1;
    for (int u = 0; u < nused; u++) total *= p->id_size[used[u]];
    if (st == ENG_STATUS_OK && total > 0) {
        int64_t idx[KRN_EINSUM_MAX_IDS] = {0}, off[KRN_EINSUM_MAX_OPS + 1] = {0};
        for (int64_t it = 0; it < total; it++) {
            double v = 1;
            for (int k = 0; k < p->nops; k++) v *= xs[k][off[k]];
            acc[off[p->nops]] += v;
            for (int u = nused - 1; u >= 0; u--) {
                int64_t sz = p->id_size[used[u]];
                for (int k = 0; k <= p->nops; k++) off[k] += stride[k][u];
                if (++idx[u] < sz) break;
                for (int k = 0; k <= p->nops; k++) off[k] -= stride[k][u] * sz;
                idx[u] = 0;
            }
        }
    }
    if (st == ENG_STATUS_OK) st = eng_convert(acc, ENG_DTYPE_F64, y->data, y->dtype, ny);
    for (int k = 0; k < p->nops; k++)
        if (owned[k]) eng_free((void *)xs[k]);
    free(acc);
    return st;
}

eng_status krn_cpu_einsum_exec(krn_call *c) {
    if (c->state) return es_exec_gemm(c, c->state);
    return es_exec_loops(c);
}
