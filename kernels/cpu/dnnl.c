/* dnnl.c - the oneDNN glue shared by the nn kernels: one process-wide CPU engine, one stream per calling
 * thread, the error check behind KRN_DNNL_CHECK, activation -> post-op mapping, and the reference activation
 * loops used by fallback paths.
 *
 * Invariants: the engine is created once (pthread_once) and lives for the process; a thread's stream is
 * created on first use and destroyed by a pthread key destructor when the thread exits. Nothing here keeps
 * model state, so any number of models/plans share them.
 */
#include <dnnl.h>
#include <dnnl_debug.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "../krn-nn.h"
#include "../../engine/ir/tensor.h"

int krn_nn_blocked16(int64_t C) {
    static int nhwc = -1;
    if (nhwc < 0) {
        const char *e = getenv("TENSORD_BLOCKED");
        nhwc = e && !strcmp(e, "nhwc");
    }
    return !nhwc && C % 16 == 0;
}

eng_status krn_dnnl_fail(dnnl_status_t s, const char *stmt, const char *func, const char *file, int line) {
    return eng_err(s == dnnl_unimplemented ? ENG_STATUS_UNSUPPORTED : ENG_STATUS_INTERNAL,
                   "oneDNN call %s failed: %s (%s at %s:%d)", stmt, dnnl_status2str(s), func, file, line);
}

static pthread_once_t krn_dnnl_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t krn_dnnl_eng;
static dnnl_status_t krn_dnnl_eng_status;
static pthread_key_t krn_dnnl_stream_key;
static _Thread_local dnnl_stream_t krn_dnnl_tls_stream;

static void krn_dnnl_stream_dtor(void *p) { dnnl_stream_destroy((dnnl_stream_t)p); }

static void krn_dnnl_init_once(void) {
    krn_dnnl_eng_status = dnnl_engine_create(&krn_dnnl_eng, dnnl_cpu, 0);
    if (krn_dnnl_eng_status == dnnl_success) pthread_key_create(&krn_dnnl_stream_key, krn_dnnl_stream_dtor);
}

eng_status krn_dnnl_engine(dnnl_engine_t *out) {
    pthread_once(&krn_dnnl_once, krn_dnnl_init_once);
    *out = krn_dnnl_eng;
    if (krn_dnnl_eng_status != dnnl_success)
        return krn_dnnl_fail(krn_dnnl_eng_status, "dnnl_engine_create(cpu)", __func__, __FILE__, __LINE__);
    return ENG_STATUS_OK;
}

eng_status krn_dnnl_stream(dnnl_stream_t *out) {
    if (krn_dnnl_tls_stream) {
        *out = krn_dnnl_tls_stream;
        return ENG_STATUS_OK;
    }
    dnnl_engine_t eng;
    ENG_TRY(krn_dnnl_engine(&eng));
    KRN_DNNL_CHECK(dnnl_stream_create(&krn_dnnl_tls_stream, eng, dnnl_stream_default_flags));
    pthread_setspecific(krn_dnnl_stream_key, krn_dnnl_tls_stream);
    *out = krn_dnnl_tls_stream;
    return ENG_STATUS_OK;
}

void krn_dnnl_set_threads(int n) {
    if (n > 0 && omp_get_max_threads() != n) omp_set_num_threads(n);
}

eng_status krn_dnnl_append_act(dnnl_post_ops_t po, const krn_nn_act_params *a) {
    switch (a->kind) {
    case KRN_NN_ACT_NONE: return ENG_STATUS_OK;
    case KRN_NN_ACT_RELU: KRN_DNNL_CHECK(dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_relu, a->alpha, 0.f)); break;
    case KRN_NN_ACT_CLIP: KRN_DNNL_CHECK(dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_clip_v2, a->alpha, a->beta)); break;
    case KRN_NN_ACT_SIGMOID: KRN_DNNL_CHECK(dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_logistic, 0.f, 0.f)); break;
    case KRN_NN_ACT_TANH: KRN_DNNL_CHECK(dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_tanh, 0.f, 0.f)); break;
    case KRN_NN_ACT_HARD_SIGMOID:
        KRN_DNNL_CHECK(dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_linear, a->alpha, a->beta));
        KRN_DNNL_CHECK(dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_clip_v2, 0.f, 1.f));
        break;
    case KRN_NN_ACT_GELU_ERF: KRN_DNNL_CHECK(dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_gelu_erf, 0.f, 0.f)); break;
    case KRN_NN_ACT_GELU_TANH: KRN_DNNL_CHECK(dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_gelu_tanh, 0.f, 0.f)); break;
    case KRN_NN_ACT_ELU: KRN_DNNL_CHECK(dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_elu, a->alpha, 0.f)); break;
    case KRN_NN_ACT_SWISH: KRN_DNNL_CHECK(dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_swish, a->alpha, 0.f)); break;
    case KRN_NN_ACT_HARD_SWISH: KRN_DNNL_CHECK(dnnl_post_ops_append_eltwise(po, 1.f, dnnl_eltwise_hardswish, 0.f, 0.f)); break;
    default: return eng_err(ENG_STATUS_INTERNAL, "unknown fused activation %d", a->kind);
    }
    return ENG_STATUS_OK;
}

eng_status krn_dnnl_prim(const void *op_desc, dnnl_post_ops_t po, const krn_nn_act_params *act,
                         dnnl_primitive_desc_t *pd_out, dnnl_primitive_t *prim_out, dnnl_memory_t *scratch_out) {
    *pd_out = NULL;
    *prim_out = NULL;
    *scratch_out = NULL;
    dnnl_engine_t eng;
    eng_status est = krn_dnnl_engine(&eng);
    if (est == ENG_STATUS_OK && !po && dnnl_post_ops_create(&po) != dnnl_success)
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "oneDNN post-ops");
    if (est == ENG_STATUS_OK && act) est = krn_dnnl_append_act(po, act);
    /* User scratchpad: the library's shared one may only be used by the thread that created the primitive, and
     * plans run on whichever thread serves the request (or one per sub-batch). One buffer per primitive is safe
     * because a plan runs one request at a time. */
    dnnl_primitive_attr_t a = NULL;
    dnnl_status_t s = dnnl_success;
    if (est == ENG_STATUS_OK) {
        s = dnnl_primitive_attr_create(&a);
        if (s == dnnl_success) s = dnnl_primitive_attr_set_post_ops(a, po);
        if (s == dnnl_success) s = dnnl_primitive_attr_set_scratchpad_mode(a, dnnl_scratchpad_mode_user);
        if (s == dnnl_success) s = dnnl_primitive_desc_create(pd_out, op_desc, a, eng, NULL);
        if (s != dnnl_success) {
            *pd_out = NULL;
            est = krn_dnnl_fail(s, "dnnl_primitive_desc_create", __func__, __FILE__, __LINE__);
        }
    }
    if (a) dnnl_primitive_attr_destroy(a);
    if (po) dnnl_post_ops_destroy(po);
    ENG_TRY(est);
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(*pd_out, dnnl_query_scratchpad_md, 0);
    if (smd && dnnl_memory_desc_get_size(smd) > 0) s = dnnl_memory_create(scratch_out, smd, eng, DNNL_MEMORY_ALLOCATE);
    if (s == dnnl_success) s = dnnl_primitive_create(prim_out, *pd_out);
    if (s != dnnl_success) {
        if (*scratch_out) dnnl_memory_destroy(*scratch_out);
        *scratch_out = NULL;
        dnnl_primitive_desc_destroy(*pd_out);
        *pd_out = NULL;
        return krn_dnnl_fail(s, "dnnl_primitive_create", __func__, __FILE__, __LINE__);
    }
    return ENG_STATUS_OK;
}

eng_status krn_dnnl_reorder_new(const dnnl_memory_desc_t *src_md, const void *src, const dnnl_memory_desc_t *dst_md,
                                void **dst_out) {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    ENG_TRY(krn_dnnl_engine(&eng));
    ENG_TRY(krn_dnnl_stream(&stream));
    size_t sz = dnnl_memory_desc_get_size(dst_md);
    void *dst = eng_alloc(sz ? sz : 64);
    if (!dst) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "packing weights: cannot allocate %zu bytes", sz);
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t ms = NULL, md = NULL;
    eng_status st = ENG_STATUS_OK;
    dnnl_status_t s = dnnl_reorder_primitive_desc_create(&pd, src_md, eng, dst_md, eng, NULL);
    if (s == dnnl_success) s = dnnl_primitive_create(&prim, pd);
    if (s == dnnl_success) s = dnnl_memory_create(&ms, src_md, eng, (void *)src);
    if (s == dnnl_success) s = dnnl_memory_create(&md, dst_md, eng, dst);
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, ms}, {DNNL_ARG_TO, md}};
        s = dnnl_primitive_execute(prim, stream, 2, args);
        if (s == dnnl_success) s = dnnl_stream_wait(stream);
    }
    if (s != dnnl_success) st = krn_dnnl_fail(s, "weight reorder", __func__, __FILE__, __LINE__);
    if (ms) dnnl_memory_destroy(ms);
    if (md) dnnl_memory_destroy(md);
    if (prim) dnnl_primitive_destroy(prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (st != ENG_STATUS_OK) {
        eng_free(dst);
        return st;
    }
    *dst_out = dst;
    return ENG_STATUS_OK;
}

#define KRN_ACT_BODY(T, EXP, TANH, ERF)                                                       \
    switch (a->kind) {                                                                        \
    case KRN_NN_ACT_RELU: return v > 0 ? v : v * (T)a->alpha;                                 \
    case KRN_NN_ACT_CLIP: return v < (T)a->alpha ? (T)a->alpha : v > (T)a->beta ? (T)a->beta : v; \
    case KRN_NN_ACT_SIGMOID: return (T)1 / ((T)1 + EXP(-v));                                  \
    case KRN_NN_ACT_TANH: return TANH(v);                                                     \
    case KRN_NN_ACT_HARD_SIGMOID: {                                                           \
        T h = (T)a->alpha * v + (T)a->beta;                                                   \
        return h < 0 ? 0 : h > 1 ? 1 : h;                                                     \
    }                                                                                         \
    case KRN_NN_ACT_GELU_ERF: return (T)0.5 * v * ((T)1 + ERF(v * (T)0.70710678118654752440)); \
    case KRN_NN_ACT_GELU_TANH:                                                                \
        return (T)0.5 * v * ((T)1 + TANH((T)0.79788456080286535588 * (v + (T)0.044715 * v * v * v))); \
    case KRN_NN_ACT_ELU: return v >= 0 ? v : (T)a->alpha * (EXP(v) - (T)1);                   \
    case KRN_NN_ACT_SWISH: return v / ((T)1 + EXP(-(T)a->alpha * v));                         \
    case KRN_NN_ACT_HARD_SWISH: {                                                             \
        T h = v / (T)6 + (T)0.5;                                                              \
        return v * (h < 0 ? 0 : h > 1 ? 1 : h);                                               \
    }                                                                                         \
    default: return v;                                                                        \
    }

static inline float krn_act1_f32(float v, const krn_nn_act_params *a) { KRN_ACT_BODY(float, expf, tanhf, erff) }
static inline double krn_act1_f64(double v, const krn_nn_act_params *a) { KRN_ACT_BODY(double, exp, tanh, erf) }

void krn_nn_act_apply_f32(float *x, int64_t n, const krn_nn_act_params *a, int nthreads) {
    if (a->kind == KRN_NN_ACT_NONE) return;
    if (nthreads < 1) nthreads = 1;
#pragma omp parallel for num_threads(nthreads) if (n > 65536)
    for (int64_t i = 0; i < n; i++) x[i] = krn_act1_f32(x[i], a);
}

void krn_nn_act_apply_f64(double *x, int64_t n, const krn_nn_act_params *a) {
    if (a->kind == KRN_NN_ACT_NONE) return;
    for (int64_t i = 0; i < n; i++) x[i] = krn_act1_f64(x[i], a);
}

/* ---- implementation names and layout conversion ---- */

const char *krn_dnnl_impl_name(const_dnnl_primitive_desc_t pd) {
    const char *impl = NULL;
    if (!pd || dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl) return "?";
    return impl;
}

int krn_dnnl_is_ref(const_dnnl_primitive_desc_t pd) { return strncmp(krn_dnnl_impl_name(pd), "ref", 3) == 0; }

void krn_dnnl_md_str(const dnnl_memory_desc_t *md, char *buf, size_t cap) {
    if (!cap) return;
    buf[0] = 0;
    if (!md || md->ndims <= 0) return;
    if (md->format_kind != dnnl_blocked) {
        snprintf(buf, cap, "%s", md->format_kind == dnnl_format_kind_wino ? "wino" : md->format_kind == dnnl_format_kind_rnn_packed ? "rnn_packed" : "opaque");
        return;
    }
    /* oneDNN's tag notation: outer dims ordered by stride (blocked ones upper-case), then the inner blocks. */
    const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
    int nd = md->ndims, order[DNNL_MAX_NDIMS], blocked[DNNL_MAX_NDIMS] = {0};
    for (int i = 0; i < b->inner_nblks; i++) blocked[b->inner_idxs[i]] = 1;
    for (int i = 0; i < nd; i++) order[i] = i;
    for (int i = 1; i < nd; i++) /* stable insertion sort by stride, descending */
        for (int j = i; j > 0 && b->strides[order[j]] > b->strides[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    size_t k = 0;
    for (int i = 0; i < nd && k + 1 < cap; i++) buf[k++] = (char)((blocked[order[i]] ? 'A' : 'a') + order[i]);
    for (int i = 0; i < b->inner_nblks && k + 8 < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%lld%c", (long long)b->inner_blks[i], 'a' + (int)b->inner_idxs[i]);
    buf[k < cap ? k : cap - 1] = 0;
}

eng_status krn_dnnl_reorder_init(krn_dnnl_reorder *r, const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to) {
    memset(r, 0, sizeof *r);
    dnnl_engine_t eng;
    ENG_TRY(krn_dnnl_engine(&eng));
    dnnl_primitive_desc_t pd = NULL;
    KRN_DNNL_CHECK(dnnl_reorder_primitive_desc_create(&pd, from, eng, to, eng, NULL));
    dnnl_status_t s = dnnl_primitive_create(&r->prim, pd);
    dnnl_primitive_desc_destroy(pd);
    if (s == dnnl_success) s = dnnl_memory_create(&r->src, from, eng, DNNL_MEMORY_NONE);
    if (s == dnnl_success) s = dnnl_memory_create(&r->dst, to, eng, DNNL_MEMORY_NONE);
    if (s != dnnl_success) {
        krn_dnnl_reorder_free(r);
        return krn_dnnl_fail(s, "layout reorder", __func__, __FILE__, __LINE__);
    }
    return ENG_STATUS_OK;
}

eng_status krn_dnnl_reorder_run(krn_dnnl_reorder *r, dnnl_stream_t stream, const void *from, void *to) {
    KRN_DNNL_CHECK(dnnl_memory_set_data_handle(r->src, (void *)from));
    KRN_DNNL_CHECK(dnnl_memory_set_data_handle(r->dst, to));
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, r->src}, {DNNL_ARG_TO, r->dst}};
    KRN_DNNL_CHECK(dnnl_primitive_execute(r->prim, stream, 2, args));
    return ENG_STATUS_OK;
}

eng_status krn_dnnl_io_reorder(const dnnl_memory_desc_t *plan, const dnnl_memory_desc_t *prim, int input,
                               krn_dnnl_reorder *r, void **buf) {
    if (dnnl_memory_desc_equal(plan, prim)) return ENG_STATUS_OK;
    ENG_TRY(input ? krn_dnnl_reorder_init(r, plan, prim) : krn_dnnl_reorder_init(r, prim, plan));
    size_t sz = dnnl_memory_desc_get_size(prim);
    if (!(*buf = eng_alloc(sz ? sz : 64))) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "layout reorder: %zu bytes", sz);
    return ENG_STATUS_OK;
}

void krn_dnnl_reorder_free(krn_dnnl_reorder *r) {
    if (r->prim) dnnl_primitive_destroy(r->prim);
    if (r->src) dnnl_memory_destroy(r->src);
    if (r->dst) dnnl_memory_destroy(r->dst);
    memset(r, 0, sizeof *r);
}

dnnl_data_type_t krn_dnnl_dt(eng_dtype dt) {
    switch (dt) {
    case ENG_DTYPE_F32: return dnnl_f32;
    case ENG_DTYPE_BF16: return dnnl_bf16;
    case ENG_DTYPE_F16: return dnnl_f16;
    default: return dnnl_data_type_undef;
    }
}
