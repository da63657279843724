/* grad.c - CPU kernels of the gradient ops (krn-grad.h): elementwise activation gradients, FillLike,
 * ReduceToShape, Softmax/LogSoftmax gradients, reduction/slice/gather/concat gradients, training Dropout and
 * the loss gradients. The nn ones (Conv, pools, MatMul, BatchNorm, LayerNorm) live in grad-nn.c.
 *
 * All float32 (FillLike and ReduceToShape also float64); sums that collapse many elements accumulate in double.
 * Scatter-style kernels (Gather, ReduceToShape) zero their output first and run serially over the scattered
 * axis so that no two threads add to one element.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-grad.h"
#include "ew-math.h"

eng_status krn_cpu_grad_pool_exec(krn_call *c);
eng_status krn_cpu_grad_batchnorm_exec(krn_call *c);
eng_status krn_cpu_grad_layernorm_exec(krn_call *c);

int64_t krn_grad_dropout_step;

void krn_grad_dropout_set_step(int64_t step) { __atomic_store_n(&krn_grad_dropout_step, step, __ATOMIC_RELAXED); }
int64_t krn_grad_dropout_get_step(void) { return __atomic_load_n(&krn_grad_dropout_step, __ATOMIC_RELAXED); }

/* Row-major strides of t. */
static void strides_of(const eng_tensor *t, int64_t *st) {
    int64_t s = 1;
    for (int d = t->ndim - 1; d >= 0; d--) st[d] = s, s *= t->dims[d];
}

/* ---- FillLike ---- */

static eng_status fill_exec(krn_call *c) {
    const krn_fill_params *p = c->params;
    eng_tensor *y = &c->out[0];
    int64_t n = eng_tensor_numel(y);
    for (int64_t i = 0; i < n; i++) eng_tensor_set_f64(y, i, p->value);
    return ENG_STATUS_OK;
}

/* ---- ReduceToShape: out[like index] = sum of dy over broadcast positions ---- */

static eng_status rts_exec(krn_call *c) {
    const eng_tensor *dy = &c->in[0];
    eng_tensor *y = &c->out[0];
    int64_t n = eng_tensor_numel(dy), ny = eng_tensor_numel(y);
    if (n == ny) {
        memcpy(y->data, dy->data, eng_tensor_nbytes(y));
        return ENG_STATUS_OK;
    }
    double *acc = calloc((size_t)(ny > 0 ? ny : 1), sizeof *acc);
    if (!acc) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "ReduceToShape accumulator of %lld", (long long)ny);
    int r = dy->ndim, off = r - y->ndim;
    /* common case (bias gradients): y is dy's trailing dims (leading ones 1 or absent) -> column sums of rows */
    int k = r;
    int64_t tail = 1;
    while (k > 0 && tail < ny) tail *= dy->dims[--k];
    int rows_case = ny > 0 && tail == ny && dy->dtype == ENG_DTYPE_F32;
    for (int d = 0; d < r && rows_case; d++) {
        int64_t yd = d >= off ? y->dims[d - off] : 1;
        rows_case = d >= k ? yd == dy->dims[d] : yd == 1;
    }
    if (rows_case) {
        const float *g = dy->data;
        for (int64_t row = 0; row < n / ny; row++)
            for (int64_t j = 0; j < ny; j++) acc[j] += g[row * ny + j];
        eng_status st = eng_convert(acc, ENG_DTYPE_F64, y->data, y->dtype, ny);
        free(acc);
        return st;
    }
    /* the other common case (a per-channel scale's gradient, [N,C,H,W] -> [N,C,1,1] or [C,1,1]): y is dy's
     * leading dims, the trailing ones summed -> one contiguous run per output, rows over threads */
    int lead = 0;
    while (lead < r && (lead >= off ? y->dims[lead - off] : 1) == dy->dims[lead] && dy->dims[lead] != 1) lead++;
    int runs_case = ny > 0 && dy->dtype == ENG_DTYPE_F32;
    for (int d = 0; d < r && runs_case; d++) {
        int64_t yd = d >= off ? y->dims[d - off] : 1;
        runs_case = d < lead ? yd == dy->dims[d] : yd == 1;
    }
    if (runs_case && n / ny >= 16) {
        const float *g = dy->data;
        int64_t inner = n / ny;
#pragma omp parallel for num_threads(c->nthreads) schedule(static) if (n >= 65536)
        for (int64_t j = 0; j < ny; j++) acc[j] = ew_sum_f32(g + j * inner, inner);
        eng_status st = eng_convert(acc, ENG_DTYPE_F64, y->data, y->dtype, ny);
        free(acc);
        return st;
    }
    int64_t ys[ENG_MAX_DIMS], os[ENG_MAX_DIMS] = {0}, idx[ENG_MAX_DIMS] = {0};
    strides_of(y, ys);
    for (int d = 0; d < r; d++) os[d] = d >= off && y->dims[d - off] != 1 ? ys[d - off] : 0;
    int64_t o = 0;
    int f64 = dy->dtype == ENG_DTYPE_F64;
    for (int64_t i = 0; i < n; i++) {
        acc[o] += f64 ? ((const double *)dy->data)[i] : ((const float *)dy->data)[i];
        for (int d = r - 1; d >= 0; d--) {
            o += os[d];
            if (++idx[d] < dy->dims[d]) break;
            o -= os[d] * idx[d];
            idx[d] = 0;
        }
    }
    eng_status st = eng_convert(acc, ENG_DTYPE_F64, y->data, y->dtype, ny);
    free(acc);
    return st;
}

/* ---- activation gradients ---- */

static eng_status act_exec(krn_call *c) {
    const krn_act_grad_params *p = c->params;
    const float *dy = c->in[0].data, *x = c->in[1].data;
    float *dx = c->out[0].data;
    int64_t n = eng_tensor_numel(&c->out[0]);
    float lo = p->clip_min, hi = p->clip_max;
    if (c->nin > 2 && c->in[2].data) lo = (float)eng_tensor_get_f64(&c->in[2], 0);
    if (c->nin > 3 && c->in[3].data) hi = (float)eng_tensor_get_f64(&c->in[3], 0);
    int kind = p->kind;
    float alpha = p->alpha;
    int gt = p->gelu_tanh;
    /* One pass per kind, each loop vectorised (ew-math.h); threads for large tensors only: the selects are
     * memory-bound, the transcendental ones (Gelu, Erf) compute-bound and split earlier. */
    int heavy = kind == KRN_ACT_GRAD_GELU || kind == KRN_ACT_GRAD_ERF || kind == KRN_ACT_GRAD_SILU;
    int nt = n > (heavy ? 16384 : 262144) ? c->nthreads : 1;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        int t = omp_get_thread_num(), T = omp_get_num_threads();
        int64_t per = ((n + T - 1) / T + 15) & ~(int64_t)15, b = t * per, e = b + per < n ? b + per : n;
        switch (kind) {
        case KRN_ACT_GRAD_RELU:
            for (int64_t i = b; i < e; i++) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
            break;
        case KRN_ACT_GRAD_LEAKY_RELU:
            for (int64_t i = b; i < e; i++) dx[i] = x[i] > 0.0f ? dy[i] : dy[i] * alpha;
            break;
        case KRN_ACT_GRAD_GELU:
            if (gt)
                for (int64_t i = b; i < e; i++) dx[i] = dy[i] * ew_gelu_tanh_grad(x[i]);
            else
                for (int64_t i = b; i < e; i++) dx[i] = dy[i] * ew_gelu_grad(x[i]);
            break;
        case KRN_ACT_GRAD_ERF:
            for (int64_t i = b; i < e; i++) dx[i] = dy[i] * 1.1283791670955126f * ew_exp(-x[i] * x[i]);
            break;
        case KRN_ACT_GRAD_SIGMOID: /* x is the forward output */
            for (int64_t i = b; i < e; i++) dx[i] = dy[i] * x[i] * (1.0f - x[i]);
            break;
        case KRN_ACT_GRAD_TANH:
            for (int64_t i = b; i < e; i++) dx[i] = dy[i] * (1.0f - x[i] * x[i]);
            break;
        case KRN_ACT_GRAD_SILU:
            for (int64_t i = b; i < e; i++) {
                float s = ew_sigmoid(x[i]);
                dx[i] = dy[i] * s * (1.0f + x[i] * (1.0f - s));
            }
            break;
        default:
            for (int64_t i = b; i < e; i++) dx[i] = x[i] >= lo && x[i] <= hi ? dy[i] : 0.0f;
            break;
        }
    }
    return ENG_STATUS_OK;
}

/* ---- SoftmaxGrad / LogSoftmaxGrad ---- */

static eng_status softmax_exec(krn_call *c) {
    const krn_softmax_grad_params *p = c->params;
    const float *dy = c->in[0].data, *y = c->in[1].data;
    float *dx = c->out[0].data;
    int64_t outer = p->sm.outer, n = p->sm.n, inner = p->sm.inner;
    int lg = p->log;
#pragma omp parallel for num_threads(c->nthreads) if (outer * n * inner > 65536)
    for (int64_t o = 0; o < outer; o++) {
        if (inner == 1) { /* the last axis (attention, classifiers): contiguous rows, vectorised */
            const float *g = dy + o * n, *yr = y + o * n;
            float *d = dx + o * n, s = 0;
            if (lg) {
#pragma omp simd reduction(+ : s)
                for (int64_t k = 0; k < n; k++) s += g[k];
                for (int64_t k = 0; k < n; k++) d[k] = g[k] - ew_exp(yr[k]) * s;
            } else {
#pragma omp simd reduction(+ : s)
                for (int64_t k = 0; k < n; k++) s += g[k] * yr[k];
#pragma omp simd
                for (int64_t k = 0; k < n; k++) d[k] = yr[k] * (g[k] - s);
            }
            continue;
        }
        for (int64_t j = 0; j < inner; j++) {
            int64_t b = o * n * inner + j;
            double s = 0;
            for (int64_t k = 0; k < n; k++) s += lg ? dy[b + k * inner] : (double)dy[b + k * inner] * y[b + k * inner];
            for (int64_t k = 0; k < n; k++) {
                int64_t i = b + k * inner;
                dx[i] = (float)(lg ? dy[i] - exp(y[i]) * s : y[i] * (dy[i] - s));
            }
        }
    }
    return ENG_STATUS_OK;
}

/* ---- ReduceSumGrad / ReduceMeanGrad: dx = dy broadcast back over the reduced axes ---- */

static eng_status reduce_exec(krn_call *c) {
    const krn_reduce_grad_params *p = c->params;
    const eng_tensor *dy = &c->in[0];
    eng_tensor *dx = &c->out[0];
    int r = dx->ndim;
    int64_t ds[ENG_MAX_DIMS], xs[ENG_MAX_DIMS] = {0}, cnt = 1;
    strides_of(dy, ds);
    for (int d = 0, k = 0; d < r; d++) {
        int red = (p->red.axis_mask >> d) & 1u;
        if (red) cnt *= dx->dims[d];
        if (red && !p->red.keepdims) continue;
        xs[d] = red ? 0 : ds[k];
        k++;
    }
    double scale = p->mean && cnt > 0 ? 1.0 / (double)cnt : 1.0;
    const float *g = dy->data;
    float *o = dx->data;
    int64_t n = eng_tensor_numel(dx), idx[ENG_MAX_DIMS] = {0}, off = 0;
    for (int64_t i = 0; i < n; i++) {
        o[i] = (float)(g[off] * scale);
        for (int d = r - 1; d >= 0; d--) {
            off += xs[d];
            if (++idx[d] < dx->dims[d]) break;
            off -= xs[d] * idx[d];
            idx[d] = 0;
        }
    }
    return ENG_STATUS_OK;
}

/* ---- SliceGrad: zeros, dy written at the sliced positions ---- */

static eng_status slice_exec(krn_call *c) {
    const krn_slice_params *p = c->params;
    const eng_tensor *dy = &c->in[0];
    eng_tensor *dx = &c->out[0];
    memset(dx->data, 0, eng_tensor_nbytes(dx));
    int r = dx->ndim;
    int64_t xs[ENG_MAX_DIMS], step[ENG_MAX_DIMS], idx[ENG_MAX_DIMS] = {0}, base = 0;
    strides_of(dx, xs);
    for (int d = 0; d < r; d++) base += p->starts[d] * xs[d], step[d] = p->steps[d] * xs[d];
    int64_t n = eng_tensor_numel(dy), off = base;
    const float *g = dy->data;
    float *o = dx->data;
    for (int64_t i = 0; i < n; i++) {
        o[off] = g[i];
        for (int d = r - 1; d >= 0; d--) {
            off += step[d];
            if (++idx[d] < dy->dims[d]) break;
            off -= step[d] * idx[d];
            idx[d] = 0;
        }
    }
    return ENG_STATUS_OK;
}

/* ---- GatherGrad: zeros + scatter-add along axis ---- */

static eng_status gather_exec(krn_call *c) {
    const krn_gather_params *p = c->params;
    const eng_tensor *dy = &c->in[0], *ind = &c->in[1];
    eng_tensor *dx = &c->out[0];
    memset(dx->data, 0, eng_tensor_nbytes(dx));
    int a = p->axis;
    int64_t outer = eng_shape_numel(dx->dims, a), dim = dx->dims[a];
    int64_t inner = eng_shape_numel(dx->dims + a + 1, dx->ndim - a - 1), k = eng_tensor_numel(ind);
    const float *g = dy->data;
    float *o = dx->data;
    for (int64_t j = 0; j < k; j++) {
        int64_t t = eng_tensor_get_i64(ind, j);
        if (t < 0) t += dim;
        if (t < 0 || t >= dim)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "indices[%lld] = %lld is out of range for axis size %lld",
                           (long long)j, (long long)eng_tensor_get_i64(ind, j), (long long)dim);
    }
#pragma omp parallel for num_threads(c->nthreads) if (outer > 1 && outer * k * inner > 65536)
    for (int64_t ob = 0; ob < outer; ob++)
        for (int64_t j = 0; j < k; j++) {
            int64_t t = eng_tensor_get_i64(ind, j);
            if (t < 0) t += dim;
            const float *src = g + (ob * k + j) * inner;
            float *dst = o + (ob * dim + t) * inner;
            for (int64_t i = 0; i < inner; i++) dst[i] += src[i];
        }
    return ENG_STATUS_OK;
}

/* ---- ConcatGrad: split dy along axis ---- */

static eng_status concat_exec(krn_call *c) {
    const krn_axis_params *p = c->params;
    const eng_tensor *dy = &c->in[0];
    int a = p->axis;
    int64_t outer = eng_shape_numel(dy->dims, a), row = eng_shape_numel(dy->dims + a, dy->ndim - a), pos = 0;
    for (int j = 0; j < c->nout; j++) {
        eng_tensor *o = &c->out[j];
        int64_t chunk = eng_shape_numel(o->dims + a, o->ndim - a);
        if (o->data)
            for (int64_t b = 0; b < outer; b++)
                memcpy((float *)o->data + b * chunk, (const float *)dy->data + b * row + pos, (size_t)chunk * sizeof(float));
        pos += chunk;
    }
    return ENG_STATUS_OK;
}

/* ---- TrainingDropout / DropoutGrad ---- */

static inline uint64_t splitmix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static eng_status tdrop_exec(krn_call *c) {
    const krn_dropout_train_params *p = c->params;
    const float *x = c->in[0].data;
    float *y = c->out[0].data;
    uint8_t *m = c->nout > 1 ? c->out[1].data : NULL;
    int64_t n = eng_tensor_numel(&c->out[0]);
    uint64_t seed = splitmix64((uint64_t)(p->seed + krn_grad_dropout_get_step()));
    double ratio = p->ratio, scale = 1.0 / (1.0 - ratio);
#pragma omp parallel for num_threads(c->nthreads) if (n > 65536)
    for (int64_t i = 0; i < n; i++) {
        double u = (double)(splitmix64(seed ^ (uint64_t)i * 0xd1342543de82ef95ull) >> 11) * (1.0 / 9007199254740992.0);
        int keep = u >= ratio;
        y[i] = keep ? (float)(x[i] * scale) : 0.0f;
        if (m) m[i] = (uint8_t)keep;
    }
    return ENG_STATUS_OK;
}

static eng_status dropout_grad_exec(krn_call *c) {
    const krn_dropout_train_params *p = c->params;
    const float *g = c->in[0].data;
    const uint8_t *m = c->in[1].data;
    float *o = c->out[0].data;
    int64_t n = eng_tensor_numel(&c->out[0]);
    float scale = (float)(1.0 / (1.0 - p->ratio));
    for (int64_t i = 0; i < n; i++) o[i] = m[i] ? g[i] * scale : 0.0f;
    return ENG_STATUS_OK;
}

/* ---- SoftmaxCrossEntropyLossGrad / NegativeLogLikelihoodLossGrad ---- */

static eng_status loss_exec(krn_call *c) {
    const krn_loss_grad_params *p = c->params;
    const eng_tensor *dl = &c->in[0], *x = &c->in[1], *t = &c->in[2];
    const eng_tensor *w = c->nin > 3 && c->in[3].data ? &c->in[3] : NULL;
    const float *dlp = c->nin > 4 && c->in[4].data ? c->in[4].data : NULL;
    const float *xd = x->data;
    float *dx = c->out[0].data;
    int64_t n = x->dims[0], ch = x->dims[1], d = eng_shape_numel(x->dims + 2, x->ndim - 2), nt = n * d;
    double wsum = 0;
    for (int64_t i = 0; i < nt; i++) {
        int64_t tg = eng_tensor_get_i64(t, i);
        if (p->loss.has_ignore_index && tg == p->loss.ignore_index) continue;
        if (tg < 0 || tg >= ch)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "target[%lld] = %lld is outside [0, %lld)", (long long)i,
                           (long long)tg, (long long)ch);
        wsum += w ? eng_tensor_get_f64(w, tg) : 1.0;
    }
    int sce = p->loss.log_softmax;
    for (int64_t b = 0; b < n; b++)
        for (int64_t j = 0; j < d; j++) {
            int64_t i = b * d + j, tg = eng_tensor_get_i64(t, i);
            const float *xr = xd + b * ch * d + j;
            float *dr = dx + b * ch * d + j;
            int ign = p->loss.has_ignore_index && tg == p->loss.ignore_index;
            double coef = 0;
            if (!ign) {
                double g = p->loss.reduction == KRN_LOSS_NONE ? ((const float *)dl->data)[i] : ((const float *)dl->data)[0];
                coef = g * (w ? eng_tensor_get_f64(w, tg) : 1.0);
                if (p->loss.reduction == KRN_LOSS_MEAN) coef = wsum != 0 ? coef / wsum : 0;
            }
            if (!sce) {
                for (int64_t k = 0; k < ch; k++) dr[k * d] = 0;
                if (!ign) dr[tg * d] = (float)-coef;
                continue;
            }
            double m = -INFINITY, s = 0, sl = 0;
            for (int64_t k = 0; k < ch; k++) m = xr[k * d] > m ? xr[k * d] : m;
            for (int64_t k = 0; k < ch; k++) s += exp(xr[k * d] - m);
            if (dlp)
                for (int64_t k = 0; k < ch; k++) sl += dlp[b * ch * d + k * d + j];
            for (int64_t k = 0; k < ch; k++) {
                double sm = exp(xr[k * d] - m) / s;
                double v = coef * (sm - (k == tg && !ign ? 1.0 : 0.0));
                if (dlp) v += dlp[b * ch * d + k * d + j] - sm * sl;
                dr[k * d] = (float)v;
            }
        }
    return ENG_STATUS_OK;
}

const krn_kernel krn_cpu_grad_kernels[] = {
    {"grad_fill", NULL, fill_exec, NULL},
    {"grad_reduce_to_shape", NULL, rts_exec, NULL},
    {"grad_act", NULL, act_exec, NULL},
    {"grad_softmax", NULL, softmax_exec, NULL},
    {"grad_reduce", NULL, reduce_exec, NULL},
    {"grad_slice", NULL, slice_exec, NULL},
    {"grad_gather", NULL, gather_exec, NULL},
    {"grad_concat", NULL, concat_exec, NULL},
    {"training_dropout", NULL, tdrop_exec, NULL},
    {"grad_dropout", NULL, dropout_grad_exec, NULL},
    {"grad_loss", NULL, loss_exec, NULL},
    {"grad_pool", NULL, krn_cpu_grad_pool_exec, NULL},
    {"grad_batchnorm", NULL, krn_cpu_grad_batchnorm_exec, NULL},
    {"grad_layernorm", NULL, krn_cpu_grad_layernorm_exec, NULL},
    {NULL},
};
