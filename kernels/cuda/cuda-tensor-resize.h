/* cuda-tensor-resize.h - Resize / Upsample of the CUDA "tensor" family, included once by cuda-tensor.cu (which
 * supplies ts_state, ts_div, TS_BY_ELEM): the taps of every output coordinate are built on the host in init exactly
 * as kernels/cpu/tensor-resize.c builds them (so coordinates and weights are the CPU's doubles) and uploaded once;
 * the device kernels take the tap product per output element, nearest by raw bytes (every dtype), linear / cubic
 * accumulating in double in the CPU's order and storing with eng_tensor_set_f64's rules.
 */
#ifndef KRN_CUDA_TENSOR_RESIZE_H
#define KRN_CUDA_TENSOR_RESIZE_H

#include "../krn-resize-taps.h"

/* ---- Resize ---- */

/* The taps (kernels/krn-resize-taps.h, shared with the CPU kernel): built on the host in init. */
typedef krn_tap ts_tap;

struct ts_resize_args {
    int r;
    ts_div od[TS_MAXD];     /* output dims */
    int64_t toff[TS_MAXD];  /* first tap of each dim */
    int64_t total;
    unsigned long long extrap; /* extrapolation value in the output dtype (eng_tensor_set_f64) */
};

/* The taps of output element i, and whether any is outside (tf_crop_and_resize). */
template <bool BIG>
__device__ __forceinline__ bool ts_resize_taps(const ts_resize_args &a, const ts_tap *taps, int64_t i,
                                               const ts_tap **tp) {
    bool outside = false;
#pragma unroll
    for (int d = TS_MAXD - 1; d >= 0; d--)
        if (d < a.r) {
            int64_t q = d > 0 ? ts_q<BIG>(i, a.od[d]) : 0, ci = i - q * a.od[d].d;
            i = q;
            tp[d] = &taps[a.toff[d] + ci];
            outside |= tp[d]->outside != 0;
        }
    return outside;
}

template <typename T, bool BIG>
__global__ void ts_resize_nearest_kernel(T *__restrict__ dst, const T *__restrict__ src, const ts_tap *__restrict__ taps,
                                         const __grid_constant__ ts_resize_args a) {
    T ex;
    memcpy(&ex, &a.extrap, sizeof ex);
    TS_GRID_STRIDE(i, a.total) {
        const ts_tap *tp[TS_MAXD];
        if (ts_resize_taps<BIG>(a, taps, i, tp)) {
            dst[i] = ex;
            continue;
        }
        int64_t off = 0;
#pragma unroll
        for (int d = 0; d < TS_MAXD; d++)
            if (d < a.r) off += tp[d]->off[0];
        dst[i] = src[off];
    }
}

/* Weighted sum over the tap product in double, in the CPU's order; stored with eng_tensor_set_f64's rules
 * (integers: rounded half to even, u8/i8 saturated). */
template <typename S> __device__ __forceinline__ void ts_resize_store(S *p, double acc) {
    if constexpr (std::is_integral_v<S>) {
        double v = rint(acc);
        if constexpr (std::is_same_v<S, uint8_t>) v = v < 0 ? 0 : (v > 255 ? 255 : v);
        if constexpr (std::is_same_v<S, int8_t>) v = v < -128 ? -128 : (v > 127 ? 127 : v);
        ts_st_f64(p, v);
    } else ts_st_f64(p, acc);
}

template <typename S, bool BIG>
__global__ void ts_resize_interp_kernel(S *__restrict__ dst, const S *__restrict__ src, const ts_tap *__restrict__ taps,
                                        const __grid_constant__ ts_resize_args a) {
    S ex;
    memcpy(&ex, &a.extrap, sizeof ex);
    TS_GRID_STRIDE(i, a.total) {
        const ts_tap *tp[TS_MAXD];
        if (ts_resize_taps<BIG>(a, taps, i, tp)) {
            dst[i] = ex;
            continue;
        }
        int k[TS_MAXD];
#pragma unroll
        for (int d = 0; d < TS_MAXD; d++) k[d] = 0;
        double acc = 0;
        for (;;) {
            int64_t off = 0;
            double w = 1;
#pragma unroll
            for (int d = 0; d < TS_MAXD; d++)
                if (d < a.r) {
                    off += tp[d]->off[k[d]];
                    w = __dmul_rn(w, tp[d]->w[k[d]]);
                }
            acc = __dadd_rn(acc, __dmul_rn(w, ts_to_f64(src[off])));
            bool carry = true;
#pragma unroll
            for (int d = TS_MAXD - 1; d >= 0; d--)
                if (d < a.r && carry) {
                    if (++k[d] < tp[d]->n) carry = false;
                    else k[d] = 0;
                }
            if (carry) break;
        }
        ts_resize_store(&dst[i], acc);
    }
}

static int ts_resize_interp_dtype_ok(eng_dtype dt) {
    return dt == ENG_DTYPE_F32 || dt == ENG_DTYPE_F64 || dt == ENG_DTYPE_F16 || dt == ENG_DTYPE_BF16 ||
           dt == ENG_DTYPE_U8 || dt == ENG_DTYPE_I8 || dt == ENG_DTYPE_I32;
}

static int ts_resize_supports(const krn_call *c) {
    const krn_resize_params *p = (const krn_resize_params *)c->params;
    const eng_tensor *x = &c->in[0], *o = &c->out[0];
    if (!p || x->ndim > TS_MAXD || o->ndim != x->ndim || o->dtype != x->dtype) return 0;
    if (p->mode < KRN_RESIZE_NEAREST || p->mode > KRN_RESIZE_CUBIC) return 0;
    if (p->coord < KRN_COORD_HALF_PIXEL || p->coord > KRN_COORD_HALF_PIXEL_SYMMETRIC) return 0;
    if (p->nearest < KRN_NEAREST_ROUND_PREFER_FLOOR || p->nearest > KRN_NEAREST_CEIL) return 0;
    if (eng_tensor_numel(o) > 0 && eng_tensor_numel(x) <= 0) return 0; /* the CPU's error */
    return p->mode == KRN_RESIZE_NEAREST ? ts_es_ok(eng_dtype_size(x->dtype)) : ts_resize_interp_dtype_ok(x->dtype);
}

/* init: every tap of every output coordinate, computed on the host as the CPU does and uploaded once. */
static eng_status ts_resize_init(krn_call *c) {
    const krn_resize_params *p = (const krn_resize_params *)c->params;
    const eng_tensor *x = &c->in[0], *o = &c->out[0];
    const int r = x->ndim;
    ts_state *st;
    ENG_TRY(ts_state_new(c, "resize", TS_ERR_INDEX, 0, &st));
    if (r == 0 || eng_tensor_numel(o) <= 0 || eng_tensor_numel(x) <= 0) return ENG_STATUS_OK;
    int64_t xst[TS_MAXD], ntap = 0;
    ts_strides(x->dims, r, xst);
    for (int d = 0; d < r; d++) ntap += o->dims[d];
    const size_t nb = (size_t)ntap * sizeof(ts_tap);
    ts_tap *taps = (ts_tap *)calloc((size_t)ntap, sizeof(ts_tap));
    if (!taps) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "resize: %lld taps", (long long)ntap);
    st->hbuf = taps;
    int64_t k = 0;
    for (int d = 0; d < r; d++)
        for (int64_t i = 0; i < o->dims[d]; i++, k++) {
            ts_tap *t = &taps[k];
            double xo = krn_resize_coord_of(p, (double)i, p->scales[d], x->dims[d], (double)x->dims[d] * p->scales[d],
                                        p->roi[d], p->roi[r + d]);
            t->outside = p->coord == KRN_COORD_TF_CROP_AND_RESIZE && (xo < 0 || xo > (double)(x->dims[d] - 1));
            krn_make_taps(p, xo, x->dims[d], xst[d], t);
        }
    ENG_TRY(cuda_mem_alloc(st->device, nb, &st->dbuf));
    CUDA_TRY("resize", cudaMemcpyAsync(st->dbuf, taps, nb, cudaMemcpyHostToDevice, CUDA_CTX(c)->stream));
    return ENG_STATUS_OK;
}

static eng_status ts_resize_exec(krn_call *c) {
    const krn_resize_params *p = (const krn_resize_params *)c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *o = &c->out[0];
    const ts_state *st = (const ts_state *)c->state;
    cudaStream_t s = CUDA_CTX(c)->stream;
    const int r = x->ndim;
    const size_t es = eng_dtype_size(x->dtype);
    const int64_t total = eng_tensor_numel(o);
    if (total <= 0) return ENG_STATUS_OK;
    if (eng_tensor_numel(x) <= 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "Resize of an empty input to a non-empty output");
    if (r == 0) {
        CUDA_TRY("resize", cudaMemcpyAsync(o->data, x->data, es, cudaMemcpyDeviceToDevice, s));
        return ENG_STATUS_OK;
    }
    if (!st || !st->dbuf) return eng_err(ENG_STATUS_INTERNAL, "cuda resize: exec without init's taps");
    ts_resize_args a;
    memset(&a, 0, sizeof a);
    a.r = r;
    a.total = total;
    for (int64_t d = 0, k = 0; d < r; d++) {
        a.od[d] = ts_div_make(o->dims[d]);
        a.toff[d] = k;
        k += o->dims[d];
    }
    {
        unsigned char ex[16] = {0};
        eng_tensor t = {o->dtype, 0, {0}, ex};
        eng_tensor_set_f64(&t, 0, p->extrapolation_value);
        memcpy(&a.extrap, ex, sizeof a.extrap);
    }
    const ts_tap *taps = (const ts_tap *)st->dbuf;
    const int big = total >= TS_SMALL;
    const unsigned g = cuda_grid(total, TS_THREADS);
    if (p->mode == KRN_RESIZE_NEAREST) {
        TS_BY_ELEM(es, {
            if (big) ts_resize_nearest_kernel<T, true><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)x->data, taps, a);
            else ts_resize_nearest_kernel<T, false><<<g, TS_THREADS, 0, s>>>((T *)o->data, (const T *)x->data, taps, a);
        });
    } else {
#define TS_RESIZE_INTERP(S)                                                                                        \
    do {                                                                                                           \
        if (big) ts_resize_interp_kernel<S, true><<<g, TS_THREADS, 0, s>>>((S *)o->data, (const S *)x->data, taps, a); \
        else ts_resize_interp_kernel<S, false><<<g, TS_THREADS, 0, s>>>((S *)o->data, (const S *)x->data, taps, a);    \
    } while (0)
        switch (x->dtype) {
        case ENG_DTYPE_F32: TS_RESIZE_INTERP(float); break;
        case ENG_DTYPE_F64: TS_RESIZE_INTERP(double); break;
        case ENG_DTYPE_F16: TS_RESIZE_INTERP(__half); break;
        case ENG_DTYPE_BF16: TS_RESIZE_INTERP(__nv_bfloat16); break;
        case ENG_DTYPE_U8: TS_RESIZE_INTERP(uint8_t); break;
        case ENG_DTYPE_I8: TS_RESIZE_INTERP(int8_t); break;
        case ENG_DTYPE_I32: TS_RESIZE_INTERP(int32_t); break;
        default: return eng_err(ENG_STATUS_UNSUPPORTED, "cuda resize: interpolating %s", eng_dtype_name(x->dtype));
        }
#undef TS_RESIZE_INTERP
    }
    CUDA_LAUNCHED("resize");
    return ENG_STATUS_OK;
}

#endif
