/* krn-resize-taps.h - Resize's separable taps, one definition for the CPU kernel (kernels/cpu/tensor-resize.c) and the
 * CUDA one (kernels/cuda/cuda-tensor-resize.h, which builds them on the host in init and uploads them): for every
 * output coordinate of a dim, up to 4 (source index * stride, weight) pairs, computed in double exactly as ONNX
 * defines the coordinate transformation and interpolation modes. Plain C, also compiled as C++. */
#ifndef KRN_RESIZE_TAPS_H
#define KRN_RESIZE_TAPS_H

#include <math.h>
#include <stdint.h>

#include "krn-tensor.h"

typedef struct krn_tap {
    int64_t off[4]; /* source index * stride of this dim */
    double w[4];
    int n;
    int outside; /* tf_crop_and_resize: coordinate outside the input -> extrapolation value */
} krn_tap;

/* Output coordinate xo -> input coordinate. `out` is the unrounded resized length in * scale, as ONNX defines. */
static inline double krn_resize_coord_of(const krn_resize_params *p, double xo, double scale, int64_t in,
                                         double out, double rs, double re) {
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

static inline int64_t krn_clamp_idx(int64_t i, int64_t n) { return i < 0 ? 0 : (i >= n ? n - 1 : i); }

static inline void krn_make_taps(const krn_resize_params *p, double x, int64_t in, int64_t stride, krn_tap *t) {
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

#endif
