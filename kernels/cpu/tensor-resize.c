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
#include "../krn-resize-taps.h"

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
