/* tensor-resize.c - Resize (opset 10..19) and Upsample (7..9) of the "tensor" family (defs listed in tensor.c).
 *
 * Invariants: prepare parses the mode attributes into krn_resize_params (Upsample and Resize-10 use asymmetric
 * coordinates with floor rounding, like onnxruntime); infer reads scales / sizes / roi from data (NEEDS_DATA when
 * unknown), resolves them to one scale per input dim (sizes given: out/in) and the output shape (scales given:
 * floor(in * scale)), honouring Resize-18 `axes` and keep_aspect_ratio_policy. antialias=1 is refused with
 * UNSUPPORTED naming the attribute.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/krn-tensor.h"
#include "op.h"

void *eng_tensor_op_params(eng_op_ctx *c, size_t size);
eng_status eng_tensor_op_read_ints(const eng_op_ctx *c, int i, const char *what, int64_t *out, int max, int *n);

static int is_upsample(const eng_op_ctx *c) { return strcmp(c->node->op_type, "Upsample") == 0; }

eng_status eng_tensor_resize_prepare(eng_op_ctx *c) {
    int up = is_upsample(c);
    ENG_TRY(eng_op_check_arity(c, 1, up ? 2 : 4));
    krn_resize_params *p = eng_tensor_op_params(c, sizeof *p);
    if (!p) return ENG_STATUS_OUT_OF_MEMORY;
    const char *mode = eng_node_attr_str(c->node, "mode", "nearest");
    if (strcmp(mode, "nearest") == 0) p->mode = KRN_RESIZE_NEAREST;
    else if (strcmp(mode, "linear") == 0 || strcmp(mode, "bilinear") == 0) p->mode = KRN_RESIZE_LINEAR;
    else if (strcmp(mode, "cubic") == 0 && !up) p->mode = KRN_RESIZE_CUBIC;
    else return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'mode' = '%s' is not a %s mode", mode, c->node->op_type);
    p->cubic_a = eng_node_attr_float(c->node, "cubic_coeff_a", -0.75f);
    p->exclude_outside = eng_node_attr_int(c->node, "exclude_outside", 0) != 0;
    p->extrapolation_value = eng_node_attr_float(c->node, "extrapolation_value", 0.0f);
    if (up || c->opset < 11) {
        p->coord = KRN_COORD_ASYMMETRIC;
        p->nearest = KRN_NEAREST_FLOOR;
        return ENG_STATUS_OK;
    }
    static const char *coords[] = {"half_pixel",    "asymmetric",        "pytorch_half_pixel",   "align_corners",
                                   "tf_half_pixel_for_nn", "tf_crop_and_resize", "half_pixel_symmetric"};
    const char *ct = eng_node_attr_str(c->node, "coordinate_transformation_mode", "half_pixel");
    int found = 0;
    for (int i = 0; i < 7; i++)
        if (strcmp(ct, coords[i]) == 0) {
            p->coord = (krn_resize_coord)i;
            found = 1;
        }
    if (!found) return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'coordinate_transformation_mode' = '%s'", ct);
    static const char *nms[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
    const char *nm = eng_node_attr_str(c->node, "nearest_mode", "round_prefer_floor");
    found = 0;
    for (int i = 0; i < 4; i++)
        if (strcmp(nm, nms[i]) == 0) {
            p->nearest = (krn_resize_nearest)i;
            found = 1;
        }
    if (!found) return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'nearest_mode' = '%s'", nm);
    if (eng_node_attr_int(c->node, "antialias", 0) != 0)
        return eng_err(ENG_STATUS_UNSUPPORTED, "Resize with antialias=1");
    return ENG_STATUS_OK;
}

/* Read float input i (scales or roi) into out; *n = count; NEEDS_DATA if unknown. */
static eng_status read_floats(const eng_op_ctx *c, int i, const char *what, double *out, int max, int *n) {
    const eng_tensor *t = &c->in[i];
    int64_t k = eng_tensor_numel(t);
    *n = 0;
    if (k == 0) return ENG_STATUS_OK;
    if (!t->data) return ENG_STATUS_NEEDS_DATA;
    if (!eng_dtype_is_float(t->dtype))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s' must be floating point, got %s", what,
                       eng_dtype_name(t->dtype));
    if (k > max) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input '%s' has %lld entries", what, (long long)k);
    for (int64_t j = 0; j < k; j++) out[j] = eng_tensor_get_f64(t, j);
    *n = (int)k;
    return ENG_STATUS_OK;
}

eng_status eng_tensor_resize_infer(eng_op_ctx *c) {
    krn_resize_params *p = c->params;
    const eng_tensor *x = &c->in[0];
    int r = x->ndim, ns = 0, nz = 0, nroi = 0;
    if (!eng_dtype_size(x->dtype)) return eng_err(ENG_STATUS_UNSUPPORTED, "Resize of %s", eng_dtype_name(x->dtype));
    if (p->mode != KRN_RESIZE_NEAREST && !eng_dtype_is_float(x->dtype) && x->dtype != ENG_DTYPE_U8 &&
        x->dtype != ENG_DTYPE_I8 && x->dtype != ENG_DTYPE_I32)
        return eng_err(ENG_STATUS_UNSUPPORTED, "interpolating Resize of %s", eng_dtype_name(x->dtype));
    double scales[ENG_MAX_DIMS], roi[2 * ENG_MAX_DIMS];
    int64_t sizes[ENG_MAX_DIMS], axes[ENG_MAX_DIMS];
    int na = -1;
    if (is_upsample(c) && c->opset < 9) {
        const float *f = NULL;
        ns = eng_node_attr_floats(c->node, "scales", &f);
        if (ns < 0) return eng_err(ENG_STATUS_INVALID_MODEL, "Upsample needs attribute 'scales'");
        if (ns > ENG_MAX_DIMS) return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'scales' has %d entries", ns);
        for (int i = 0; i < ns; i++) scales[i] = f[i];
    } else if (is_upsample(c) || c->opset < 11) {
        if (!eng_op_has_input(c, 1)) return eng_err(ENG_STATUS_INVALID_MODEL, "missing input 'scales'");
        ENG_TRY(read_floats(c, 1, "scales", scales, ENG_MAX_DIMS, &ns));
    } else {
        if (eng_op_has_input(c, 1)) ENG_TRY(read_floats(c, 1, "roi", roi, 2 * ENG_MAX_DIMS, &nroi));
        if (eng_op_has_input(c, 2)) ENG_TRY(read_floats(c, 2, "scales", scales, ENG_MAX_DIMS, &ns));
        if (ns == 0 && eng_op_has_input(c, 3)) ENG_TRY(eng_tensor_op_read_ints(c, 3, "sizes", sizes, ENG_MAX_DIMS, &nz));
        const int64_t *ax = NULL;
        na = c->opset >= 18 ? eng_node_attr_ints(c->node, "axes", &ax) : -1;
        if (na > r) return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'axes' has %d entries for rank %d", na, r);
        for (int i = 0; i < na; i++) {
            int a;
            ENG_TRY(eng_norm_axis(ax[i], r, &a));
            axes[i] = a;
        }
    }
    int nax = na >= 0 ? na : r;
    if (ns == 0 && nz == 0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "one of 'scales' or 'sizes' must be given");
    if ((ns && ns != nax) || (nz && nz != nax))
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "'%s' has %d entries, expected %d", ns ? "scales" : "sizes",
                       ns ? ns : nz, nax);
    for (int d = 0; d < r; d++) {
        p->scales[d] = 1.0;
        p->roi[d] = 0.0;
        p->roi[r + d] = 1.0;
    }
    if (nroi == 2 * nax)
        for (int k = 0; k < nax; k++) {
            int a = na >= 0 ? (int)axes[k] : k;
            p->roi[a] = roi[k];
            p->roi[r + a] = roi[nax + k];
        }
    eng_tensor *o = &c->out[0];
    eng_op_same_as_input(c, 0, 0);
    if (ns) {
        for (int k = 0; k < nax; k++) {
            int a = na >= 0 ? (int)axes[k] : k;
            if (!(scales[k] > 0))
                return eng_err(ENG_STATUS_INVALID_ARGUMENT, "'scales'[%d] = %g must be positive", k, scales[k]);
            p->scales[a] = scales[k];
            double span = p->coord == KRN_COORD_TF_CROP_AND_RESIZE ? p->roi[r + a] - p->roi[a] : 1.0;
            double d = floor((double)x->dims[a] * span * scales[k] + 1e-9);
            if (!(d >= 0 && d < 9.0e15))
                return eng_err(ENG_STATUS_OUT_OF_MEMORY, "'scales'[%d] = %g gives an output dim out of range", k, scales[k]);
            o->dims[a] = (int64_t)d;
        }
    } else {
        const char *pol = c->opset >= 18 ? eng_node_attr_str(c->node, "keep_aspect_ratio_policy", "stretch") : "stretch";
        int keep = strcmp(pol, "not_larger") == 0 ? 1 : strcmp(pol, "not_smaller") == 0 ? 2 : 0;
        if (!keep && strcmp(pol, "stretch") != 0)
            return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'keep_aspect_ratio_policy' = '%s'", pol);
        double common = keep == 1 ? INFINITY : 0;
        for (int k = 0; k < nax; k++) {
            int a = na >= 0 ? (int)axes[k] : k;
            if (sizes[k] < 0) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "'sizes'[%d] = %lld", k, (long long)sizes[k]);
            double s = x->dims[a] ? (double)sizes[k] / (double)x->dims[a] : 1.0;
            if (keep == 1 && s < common) common = s;
            if (keep == 2 && s > common) common = s;
            p->scales[a] = s;
            o->dims[a] = sizes[k];
        }
        if (keep)
            for (int k = 0; k < nax; k++) {
                int a = na >= 0 ? (int)axes[k] : k;
                p->scales[a] = common;
                o->dims[a] = (int64_t)floor((double)x->dims[a] * common + 0.5);
            }
    }
    size_t nb;
    return eng_tensor_nbytes_checked(o, "output", &nb);
}
