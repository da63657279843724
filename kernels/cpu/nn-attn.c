/* nn-attn.c - the CPU reference of com.tensord FusedAttention (kernels/krn-attn.h): one query row at a time, its
 * scores in a row of scratch, accumulated in double from float, double, f16 or bf16 tensors (all of one dtype; the
 * mask float or the same dtype). The CPU's own sessions keep the unfused MatMul / Softmax chain (oneDNN); this kernel
 * is the reference the device kernels are checked against, the sim device's kernel, and a device plan's fallback. */
#include <math.h>
#include <stdlib.h>

#include "../kernel.h"
#include "../krn-attn.h"

static int attn_float(eng_dtype t) {
    return t == ENG_DTYPE_F32 || t == ENG_DTYPE_F64 || t == ENG_DTYPE_F16 || t == ENG_DTYPE_BF16;
}

static inline double attn_ld(const void *p, eng_dtype t, int64_t i) {
    switch (t) {
    case ENG_DTYPE_F32: return ((const float *)p)[i];
    case ENG_DTYPE_F64: return ((const double *)p)[i];
    case ENG_DTYPE_F16: return eng_f16_to_f32(((const uint16_t *)p)[i]);
    default: return eng_bf16_to_f32(((const uint16_t *)p)[i]);
    }
}

static inline void attn_st(void *p, eng_dtype t, int64_t i, double v) {
    switch (t) {
    case ENG_DTYPE_F32: ((float *)p)[i] = (float)v; break;
    case ENG_DTYPE_F64: ((double *)p)[i] = v; break;
    case ENG_DTYPE_F16: ((uint16_t *)p)[i] = eng_f32_to_f16((float)v); break;
    default: ((uint16_t *)p)[i] = eng_f32_to_bf16((float)v); break;
    }
}

/* Shared by the kernel and shape checks: dtypes (Q, KT, V, Y one float dtype; M float or that dtype). */
static eng_status attn_check(const krn_call *c) {
    const krn_attn_params *p = c->params;
    eng_dtype t = c->in[0].dtype;
    if (!attn_float(t)) return eng_err(ENG_STATUS_UNSUPPORTED, "FusedAttention: dtype %s", eng_dtype_name(t));
    if (c->in[1].dtype != t || c->in[2].dtype != t || c->out[0].dtype != t)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "FusedAttention: Q is %s but KT %s, V %s, Y %s", eng_dtype_name(t),
                       eng_dtype_name(c->in[1].dtype), eng_dtype_name(c->in[2].dtype), eng_dtype_name(c->out[0].dtype));
    if (p->has_mask && (c->nin < 4 || !attn_float(c->in[3].dtype)))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "FusedAttention: the mask must be a float tensor");
    return ENG_STATUS_OK;
}

static eng_status attn_exec(krn_call *c) {
    const krn_attn_params *p = c->params;
    ENG_TRY(attn_check(c));
    const eng_tensor *m = p->has_mask ? &c->in[3] : NULL;
    krn_attn_view w;
    ENG_TRY(krn_attn_view_make(&c->in[0], &c->in[1], &c->in[2], m, &w, NULL, NULL));
    int64_t rows = w.nb * w.sq;
    if (rows <= 0 || w.dv <= 0) return ENG_STATUS_OK;
    eng_dtype t = c->in[0].dtype, mt = m ? m->dtype : t;
    const void *Q = c->in[0].data, *KT = c->in[1].data, *V = c->in[2].data, *M = m ? m->data : NULL;
    void *Y = c->out[0].data;
    int nt = c->nthreads > 0 ? c->nthreads : 1;
    if (rows * w.sk * (w.d + w.dv) < 65536) nt = 1;
    int failed = 0;
    double scale = p->scale;
#pragma omp parallel num_threads(nt) reduction(| : failed)
    {
        double *s = malloc((size_t)(w.sk > 0 ? w.sk : 1) * sizeof *s), *acc = malloc((size_t)w.dv * sizeof *acc);
        if (!s || !acc) failed = 1;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            if (!s || !acc) continue;
            int64_t bi = r / w.sq, i = r % w.sq, o[4];
            krn_attn_offsets(&w, bi, o);
            int64_t qo = o[0] + i * w.q_row, mo = o[3] + i * w.m_row;
            double mx = -INFINITY;
            for (int64_t j = 0; j < w.sk; j++) {
                double a = 0;
                for (int64_t k = 0; k < w.d; k++)
                    a += attn_ld(Q, t, qo + k) * attn_ld(KT, t, o[1] + k * w.k_row + j * w.k_col);
                a = p->scale_div ? a / scale : a * scale;
                if (M) a += attn_ld(M, mt, mo + j * w.m_col);
                s[j] = a;
                if (a > mx) mx = a;
            }
            double sum = 0;
            for (int64_t j = 0; j < w.sk; j++) sum += (s[j] = exp(s[j] - mx));
            for (int64_t e = 0; e < w.dv; e++) acc[e] = 0;
            for (int64_t j = 0; j < w.sk; j++) {
                double pj = s[j] / sum;
                int64_t vo = o[2] + j * w.dv;
                for (int64_t e = 0; e < w.dv; e++) acc[e] += pj * attn_ld(V, t, vo + e);
            }
            int64_t yo = r * w.dv;
            for (int64_t e = 0; e < w.dv; e++) attn_st(Y, t, yo + e, acc[e]);
        }
        free(s);
        free(acc);
    }
    if (failed) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "FusedAttention: out of memory for a row of %lld scores",
                               (long long)w.sk);
    return ENG_STATUS_OK;
}

static void attn_describe(const krn_call *c, krn_impl_info *info) {
    (void)c;
    krn_str_copy(info->impl, sizeof info->impl, "reference (double accumulation, one query row at a time)");
}

const krn_kernel krn_cpu_attn_kernels[] = {
    {"attention", NULL, attn_exec, NULL, attn_describe},
    {NULL},
};
