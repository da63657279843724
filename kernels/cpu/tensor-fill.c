/* tensor-fill.c - CPU kernels of the "tensor" family that synthesise or mask values: Pad (constant, reflect,
 * edge, wrap), Trilu, EyeLike, Range.
 *
 * Pad maps every output coordinate to a source coordinate per dim (or "fill") once, then copies rows; constant
 * mode memcpy's the in-range middle of each row. Negative pads crop. Values are written in the output's dtype.
 */
#include <stdlib.h>
#include <string.h>

#include "../kernel.h"
#include "../krn-tensor.h"

#define KRN_FILL_PAR_BYTES ((int64_t)1 << 17)

/* Source index for output coordinate i of a padded dim (n source elements, pb leading pads); -1: fill value. */
static int64_t krn_pad_map(int64_t i, int64_t pb, int64_t n, krn_pad_mode mode) {
    int64_t s = i - pb;
    if (s >= 0 && s < n) return s;
    switch (mode) {
    case KRN_PAD_EDGE: return s < 0 ? 0 : n - 1;
    case KRN_PAD_WRAP: return ((s % n) + n) % n;
    case KRN_PAD_REFLECT: {
        if (n == 1) return 0;
        int64_t m = 2 * (n - 1);
        s = ((s % m) + m) % m;
        return s < n ? s : m - s;
    }
    default: return -1;
    }
}

eng_status krn_cpu_pad_exec(krn_call *c) {
    const krn_pad_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *o = &c->out[0];
    size_t es = eng_dtype_size(x->dtype);
    int r = x->ndim;
    unsigned char val[16] = {0};
    if (c->nin > 2 && c->in[2].data && eng_tensor_numel(&c->in[2]) >= 1) {
        if (c->in[2].dtype == x->dtype) memcpy(val, c->in[2].data, es);
        else {
            eng_tensor t = {x->dtype, 0, {0}, val};
            eng_tensor_set_f64(&t, 0, eng_tensor_get_f64(&c->in[2], 0));
        }
    } else {
        eng_tensor t = {x->dtype, 0, {0}, val};
        eng_tensor_set_f64(&t, 0, p->value);
    }
    int64_t total = eng_tensor_numel(o);
    if (total <= 0) return ENG_STATUS_OK;
    if (r == 0) {
        memcpy(o->data, x->data, es);
        return ENG_STATUS_OK;
    }
    if (eng_tensor_numel(x) == 0 && p->mode != KRN_PAD_CONSTANT)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "pad: input 'data' is empty; only constant mode can pad it");
    int64_t nmap = 0, moff[ENG_MAX_DIMS], xst[ENG_MAX_DIMS];
    for (int d = 0; d < r; d++) {
        moff[d] = nmap;
        nmap += o->dims[d];
    }
    {
        int64_t s = 1;
        for (int d = r - 1; d >= 0; d--) {
            xst[d] = s;
            s *= x->dims[d];
        }
    }
    int64_t *map = malloc((size_t)nmap * sizeof *map);
    if (!map) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "pad: index map of %lld entries", (long long)nmap);
    for (int d = 0; d < r; d++)
        for (int64_t i = 0; i < o->dims[d]; i++) map[moff[d] + i] = krn_pad_map(i, p->pads[d], x->dims[d], p->mode);
    const int64_t W = o->dims[r - 1], rows = total / W, pb = p->pads[r - 1], nw = x->dims[r - 1];
    const int64_t lo = pb > 0 ? pb : 0, hi = pb + nw < W ? pb + nw : W;
    const int64_t *lmap = map + moff[r - 1];
    const size_t rowb = (size_t)W * es;
    int par = rows > 1 && total * (int64_t)es >= KRN_FILL_PAR_BYTES && c->nthreads > 1;
#pragma omp parallel for num_threads(c->nthreads) if (par) schedule(static)
    for (int64_t row = 0; row < rows; row++) {
        char *dp = (char *)o->data + row * rowb;
        int64_t rem = row, off = 0;
        int fill = 0;
        for (int d = r - 2; d >= 0; d--) {
            int64_t q = rem / o->dims[d], i = rem - q * o->dims[d];
            rem = q;
            int64_t m = map[moff[d] + i];
            if (m < 0) fill = 1;
            else off += m * xst[d];
        }
        if (fill) {
            for (int64_t j = 0; j < W; j++) memcpy(dp + j * es, val, es);
            continue;
        }
        const char *sp = (const char *)x->data + off * (int64_t)es;
        if (p->mode == KRN_PAD_CONSTANT) {
            for (int64_t j = 0; j < lo && j < W; j++) memcpy(dp + j * es, val, es);
            if (hi > lo) memcpy(dp + lo * es, sp + (lo - pb) * es, (size_t)(hi - lo) * es);
            for (int64_t j = hi > lo ? hi : lo; j < W; j++) memcpy(dp + j * es, val, es);
        } else {
            for (int64_t j = 0; j < W; j++) memcpy(dp + j * es, sp + lmap[j] * es, es);
        }
    }
    free(map);
    return ENG_STATUS_OK;
}

/* Trilu: keep (i, j) of each trailing matrix when j - i >= k (upper) or j - i <= k (lower); zero the rest. */
eng_status krn_cpu_trilu_exec(krn_call *c) {
    const krn_trilu_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    eng_tensor *o = &c->out[0];
    size_t es = eng_dtype_size(x->dtype);
    int64_t k = p->k;
    if (c->nin > 1 && c->in[1].data) k = eng_tensor_get_i64(&c->in[1], 0);
    int r = x->ndim;
    int64_t N = x->dims[r - 2], M = x->dims[r - 1], nmat = 1;
    if (k > N + M) k = N + M; /* beyond every row/column: avoids overflow in i + k */
    if (k < -(N + M)) k = -(N + M);
    for (int i = 0; i < r - 2; i++) nmat *= x->dims[i];
    size_t nb = eng_tensor_nbytes(x);
    if (nb) memcpy(o->data, x->data, nb);
    for (int64_t b = 0; b < nmat; b++)
        for (int64_t i = 0; i < N; i++) {
            char *row = (char *)o->data + ((b * N + i) * M) * es;
            /* zero columns j where the element is dropped */
            int64_t j0, j1; /* dropped range [j0, j1) */
            if (p->upper) {
                j0 = 0;
                j1 = i + k; /* keep j >= i + k */
            } else {
                j0 = i + k + 1; /* keep j <= i + k */
                j1 = M;
            }
            if (j0 < 0) j0 = 0;
            if (j1 > M) j1 = M;
            if (j1 > j0) memset(row + j0 * es, 0, (size_t)(j1 - j0) * es);
        }
    return ENG_STATUS_OK;
}

eng_status krn_cpu_eyelike_exec(krn_call *c) {
    const krn_eyelike_params *p = c->params;
    eng_tensor *o = &c->out[0];
    size_t nb = eng_tensor_nbytes(o);
    if (nb) memset(o->data, 0, nb);
    int64_t R = o->dims[0], C = o->dims[1], k = p->k;
    if (k > C) k = C;
    if (k < -R) k = -R;
    for (int64_t i = 0; i < R; i++) {
        int64_t j = i + k;
        if (j >= 0 && j < C) eng_tensor_set_f64(o, i * C + j, 1.0);
    }
    return ENG_STATUS_OK;
}

/* Range: out[i] = start + i * delta for the count infer computed from (start, limit, delta). */
eng_status krn_cpu_range_exec(krn_call *c) {
    eng_tensor *o = &c->out[0];
    int64_t n = eng_tensor_numel(o);
    if (eng_dtype_is_float(o->dtype)) {
        double s = eng_tensor_get_f64(&c->in[0], 0), d = eng_tensor_get_f64(&c->in[2], 0);
        if (o->dtype == ENG_DTYPE_F32) {
            float *y = o->data, fs = (float)s, fd = (float)d;
            for (int64_t i = 0; i < n; i++) y[i] = fs + (float)i * fd;
        } else
            for (int64_t i = 0; i < n; i++) eng_tensor_set_f64(o, i, s + (double)i * d);
    } else {
        int64_t s = eng_tensor_get_i64(&c->in[0], 0), d = eng_tensor_get_i64(&c->in[2], 0);
        for (int64_t i = 0; i < n; i++) eng_tensor_set_i64(o, i, s + i * d);
    }
    return ENG_STATUS_OK;
}
