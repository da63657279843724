/* tensor-resize.c - CPU kernel for Resize / Upsample: nearest (4 rounding modes), N-linear and cubic, with the
 * ONNX coordinate transformation modes (half_pixel, asymmetric, pytorch_half_pixel, align_corners,
 * tf_half_pixel_for_nn, tf_crop_and_resize, half_pixel_symmetric).
 *
 * Separable: for every output coordinate of every dim we precompute up to 4 taps (source offset, weight), with
 * zero-weight taps pruned so unscaled dims cost one tap; an output element is the weighted sum over the tap
 * product. Nearest copies raw bytes (every dtype). Source indices are always clamped into [0, in-1] (edge
 * padding, as the ONNX reference does), so no read leaves the input.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-tensor.h"

typedef struct krn_tap {
    int64_t off[4]; /* source index * stride of this dim */
    double w[4];
    int n;
    int outside; /* tf_crop_and_resize: coordinate outside the input -> extrapolation value */
} krn_tap;

/* Output coordinate xo -> input coordinate. `out` is the unrounded resized length in * scale, as ONNX defines. */
static double krn_resize_coord_of(const krn_resize_params *p, double xo, double scale, int64_t in, double out,
                                  double rs, double re) {
    switch (p->coord) {
    case KRN_COORD_ASYMMETRIC: return xo / scale;
    case KRN_COORD_PYTORCH_HALF_PIXEL: return out > 1 ? (xo + 0.5) / scale - 0.5 : 0.0;
    case KRN_COORD_ALIGN_CORNERS: return out == 1 ? 0.0 : xo * (double)(in - 1) / (out - 1);
    case KRN_COORD_TF_HALF_PIXEL_FOR_NN: return (xo + 0.5) / scale;
    case KRN_COORD_TF_CROP_AND_RESIZE:
        return out > 1 ? rs * (double)(in - 1) + xo * (re - rs) * (double)(in - 1) / (out - 1)
                       : 0.5 * (rs + re) * (double)(in - 1);
    case KRN_COORD_HALF_PIXEL_SYMMETRIC: {
        double adj = out / (scale * (double)in), center = (double)in / 2;
        return center * (1 - adj) + (xo + 0.5) / scale - 0.5;
    }
    default: return (xo + 0.5) / scale - 0.5;
    }
}

static int64_t krn_clamp_idx(int64_t i, int64_t n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }

static void krn_make_taps(const krn_resize_params *p, double x, int64_t in, int64_t stride, krn_tap *t) {
    t->n = 0;
    if (p->mode == KRN_RESIZE_NEAREST) {
        double f = floor(x), r;
        switch (p->nearest) {
        case KRN_NEAREST_ROUND_PREFER_CEIL: r = (x - f == 0.5) ? f + 1 : round(x); break;
        case KRN_NEAREST_FLOOR: r = f; break;
        case KRN_NEAREST_CEIL: r = ceil(x); break;
        default: r = (x - f == 0.5) ? f : round(x); break;
        }
        t->off[0] = krn_clamp_idx((int64_t)r, in) * stride;
        t->w[0] = 1.0;
        t->n = 1;
        return;
    }
    if (p->mode == KRN_RESIZE_LINEAR) {
        double xc = x < 0 ? 0 : (x > (double)(in - 1) ? (double)(in - 1) : x);
        int64_t i0 = (int64_t)floor(xc), i1 = i0 + 1 < in ? i0 + 1 : in - 1;
        double w1 = xc - (double)i0;
        if (i1 == i0 || w1 == 0) {
            t->off[0] = i0 * stride;
            t->w[0] = 1.0;
            t->n = 1;
        } else {
            t->off[0] = i0 * stride;
            t->w[0] = 1.0 - w1;
            t->off[1] = i1 * stride;
            t->w[1] = w1;
            t->n = 2;
        }
        return;
    }
    /* cubic */
    double A = p->cubic_a, f = floor(x), s = x - f, c[4], sum = 0;
    double d0 = s + 1, d1 = s, d2 = 1 - s, d3 = 2 - s;
    c[0] = ((A * d0 - 5 * A) * d0 + 8 * A) * d0 - 4 * A;
    c[1] = ((A + 2) * d1 - (A + 3)) * d1 * d1 + 1;
    c[2] = ((A + 2) * d2 - (A + 3)) * d2 * d2 + 1;
    c[3] = ((A * d3 - 5 * A) * d3 + 8 * A) * d3 - 4 * A;
    int64_t base = (int64_t)f - 1;
    for (int k = 0; k < 4; k++) {
        int64_t i = base + k;
        if (p->exclude_outside && (i < 0 || i >= in)) c[k] = 0;
        sum += c[k];
    }
    for (int k = 0; k < 4; k++) {
        double w = p->exclude_outside && sum != 0 ? c[k] / sum : c[k];
        if (w == 0) continue;
        t->off[t->n] = krn_clamp_idx(base + k, in) * stride;
        t->w[t->n] = w;
        t->n++;
    }
    if (t->n == 0) {
        t->off[0] = krn_clamp_idx((int64_t)f, in) * stride;
        t->w[0] = 0;
        t->n = 1;
    }
}

eng_status krn_cpu_resize_exec(krn_call *c) {
    const krn_resize_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *o = &c->out[0];
    int r = x->ndim;
    size_t es = eng_dtype_size(x->dtype);
    int64_t total = eng_tensor_numel(o);
    if (total <= 0) return ENG_STATUS_OK;
    if (eng_tensor_numel(x) <= 0)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "Resize of an empty input to a non-empty output");
    if (r == 0) {
        memcpy(o->data, x->data, es);
        return ENG_STATUS_OK;
    }
    int64_t xst[ENG_MAX_DIMS], ntap = 0, toff[ENG_MAX_DIMS];
    {
        int64_t s = 1;
        for (int d = r - 1; d >= 0; d--) {
            xst[d] = s;
            s *= x->dims[d];
        }
    }
    for (int d = 0; d < r; d++) {
        toff[d] = ntap;
        ntap += o->dims[d];
    }
    krn_tap *taps = malloc((size_t)ntap * sizeof *taps);
    if (!taps) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "resize: %lld taps", (long long)ntap);
    for (int d = 0; d < r; d++)
        for (int64_t i = 0; i < o->dims[d]; i++) {
            krn_tap *t = &taps[toff[d] + i];
            double xo = krn_resize_coord_of(p, (double)i, p->scales[d], x->dims[d],
                                            (double)x->dims[d] * p->scales[d], p->roi[d], p->roi[r + d]);
            t->outside = p->coord == KRN_COORD_TF_CROP_AND_RESIZE && (xo < 0 || xo > (double)(x->dims[d] - 1));
            krn_make_taps(p, xo, x->dims[d], xst[d], t);
        }
    const int64_t W = o->dims[r - 1], rows = total / W;
    const int f32 = x->dtype == ENG_DTYPE_F32;
    const int par = rows > 1 && total >= 4096 && c->nthreads > 1;
#pragma omp parallel for num_threads(c->nthreads) if (par) schedule(static)
    for (int64_t row = 0; row < rows; row++) {
        const krn_tap *rt[ENG_MAX_DIMS];
        int64_t rem = row;
        int outside = 0;
        for (int d = r - 2; d >= 0; d--) {
            int64_t q = rem / o->dims[d], i = rem - q * o->dims[d];
            rem = q;
            rt[d] = &taps[toff[d] + i];
            outside |= rt[d]->outside;
        }
        for (int64_t j = 0; j < W; j++) {
            int64_t oi = row * W + j;
            rt[r - 1] = &taps[toff[r - 1] + j];
            if (outside || rt[r - 1]->outside) {
                eng_tensor_set_f64(o, oi, p->extrapolation_value);
                continue;
            }
            if (p->mode == KRN_RESIZE_NEAREST) {
                int64_t off = 0;
                for (int d = 0; d < r; d++) off += rt[d]->off[0];
                memcpy((char *)o->data + oi * (int64_t)es, (const char *)x->data + off * (int64_t)es, es);
                continue;
            }
            /* odometer over the tap product */
            int k[ENG_MAX_DIMS] = {0};
            double acc = 0;
            for (;;) {
                int64_t off = 0;
                double w = 1;
                for (int d = 0; d < r; d++) {
                    off += rt[d]->off[k[d]];
                    w *= rt[d]->w[k[d]];
                }
                acc += w * (f32 ? (double)((const float *)x->data)[off] : eng_tensor_get_f64(x, off));
                int d = r - 1;
                while (d >= 0 && ++k[d] == rt[d]->n) k[d--] = 0;
                if (d < 0) break;
            }
            if (f32) ((float *)o->data)[oi] = (float)acc;
            else if (eng_dtype_is_float(o->dtype)) eng_tensor_set_f64(o, oi, acc);
            else {
                double v = nearbyint(acc);
                if (o->dtype == ENG_DTYPE_U8) v = v < 0 ? 0 : (v > 255 ? 255 : v);
                else if (o->dtype == ENG_DTYPE_I8) v = v < -128 ? -128 : (v > 127 ? 127 : v);
                eng_tensor_set_f64(o, oi, v);
            }
        }
    }
    free(taps);
    return ENG_STATUS_OK;
}
