/* reduce-loss.c - loss ops, Einsum and Det of the reduce family (listed in eng_ops_reduce, reduce.c).
 *
 * NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss share one params struct: input (N, C, D...),
 * target (N, D...), optional weight (C); reduction none/sum/mean; optional ignore_index. Einsum parses its
 * equation at infer time (the ellipsis needs the operand ranks) into letter ids and sizes for the kernel.
 */
#include <stdlib.h>
#include <string.h>

#include "../../kernels/krn-reduce.h"
#include "op.h"

eng_status eng_reduce_loss_prepare(eng_op_ctx *c);
eng_status eng_reduce_loss_infer(eng_op_ctx *c);
eng_status eng_reduce_einsum_prepare(eng_op_ctx *c);
eng_status eng_reduce_einsum_infer(eng_op_ctx *c);
eng_status eng_reduce_det_infer(eng_op_ctx *c);

/* ---- NegativeLogLikelihoodLoss / SoftmaxCrossEntropyLoss ---- */

eng_status eng_reduce_loss_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 2, 3));
    krn_loss_params *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "loss params");
    c->params = p;
    p->log_softmax = strcmp(c->node->op_type, "SoftmaxCrossEntropyLoss") == 0;
    if (c->nout > (p->log_softmax ? 2 : 1))
        return eng_err(ENG_STATUS_INVALID_MODEL, "%d outputs, at most %d", c->nout, p->log_softmax ? 2 : 1);
    const char *r = eng_node_attr_str(c->node, "reduction", "mean");
    if (strcmp(r, "none") == 0) p->reduction = KRN_LOSS_NONE;
    else if (strcmp(r, "sum") == 0) p->reduction = KRN_LOSS_SUM;
    else if (strcmp(r, "mean") == 0) p->reduction = KRN_LOSS_MEAN;
    else return eng_err(ENG_STATUS_INVALID_MODEL, "attribute 'reduction' is '%s', expected none, sum or mean", r);
    p->has_ignore_index = eng_node_attr(c->node, "ignore_index") != NULL;
    p->ignore_index = eng_node_attr_int(c->node, "ignore_index", 0);
    return ENG_STATUS_OK;
}

eng_status eng_reduce_loss_infer(eng_op_ctx *c) {
    krn_loss_params *p = c->params;
    const eng_tensor *x = &c->in[0], *t = &c->in[1];
    if (!eng_dtype_is_float(x->dtype))
        return eng_err(ENG_STATUS_UNSUPPORTED, "input 'input' has dtype %s; expected a floating-point type", eng_dtype_name(x->dtype));
    if (t->dtype != ENG_DTYPE_I32 && t->dtype != ENG_DTYPE_I64)
        return eng_err(ENG_STATUS_INVALID_MODEL, "input 'target' has dtype %s, expected int32 or int64", eng_dtype_name(t->dtype));
    if (x->ndim < 2 || t->ndim != x->ndim - 1)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input has rank %d and target rank %d; expected (N, C, D...) and (N, D...)",
                       x->ndim, t->ndim);
    for (int d = 0; d < t->ndim; d++) {
        if (t->dims[d] != x->dims[d ? d + 1 : 0]) {
            char a[128], b[128];
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "target shape %s does not match input shape %s without dim 1",
                           eng_shape_str(t->dims, t->ndim, a, sizeof a), eng_shape_str(x->dims, x->ndim, b, sizeof b));
        }
    }
    if (eng_op_has_input(c, 2)) {
        if (c->in[2].dtype != x->dtype)
            return eng_err(ENG_STATUS_INVALID_MODEL, "input 'weight' has dtype %s, input has %s",
                           eng_dtype_name(c->in[2].dtype), eng_dtype_name(x->dtype));
        if (c->in[2].ndim != 1 || c->in[2].dims[0] != x->dims[1])
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'weight' must have shape (C) with C = %lld", (long long)x->dims[1]);
    }
    eng_tensor *y = &c->out[0];
    y->dtype = x->dtype;
    if (p->reduction == KRN_LOSS_NONE) {
        y->ndim = t->ndim;
        memcpy(y->dims, t->dims, sizeof y->dims);
    } else {
        y->ndim = 0;
    }
    if (c->nout > 1) eng_op_same_as_input(c, 0, 1);
    return ENG_STATUS_OK;
}

/* ---- Einsum ---- */

eng_status eng_reduce_einsum_prepare(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, KRN_EINSUM_MAX_OPS));
    krn_einsum_params *p = calloc(1, sizeof *p);
    if (!p) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "einsum params");
    c->params = p;
    const char *eq = eng_node_attr_str(c->node, "equation", NULL);
    if (!eq) return eng_err(ENG_STATUS_INVALID_MODEL, "missing attribute 'equation'");
    size_t n = 0;
    for (const char *s = eq; *s; s++) {
        if (*s == ' ') continue;
        if (n + 1 >= sizeof p->equation) return eng_err(ENG_STATUS_UNSUPPORTED, "equation '%s' is too long", eq);
        p->equation[n++] = *s;
    }
    p->equation[n] = 0;
    return ENG_STATUS_OK;
}

static int einsum_letter(char ch) {
    if (ch >= 'a' && ch <= 'z') return ch - 'a';
    if (ch >= 'A' && ch <= 'Z') return 26 + ch - 'A';
    return -1;
}

/* Map (id) to an ASCII sort key for implicit-output ordering; ellipsis ids sort first. */
static int einsum_sort_key(int id) { return id >= 52 ? id - 52 : (id < 26 ? 'a' + id : 'A' + id - 26) + 64; }

eng_status eng_reduce_einsum_infer(eng_op_ctx *c) {
    krn_einsum_params *p = c->params;
    const char *eq = p->equation;
    const char *arrow = strstr(eq, "->");
    int64_t size[KRN_EINSUM_MAX_IDS];
    int count[KRN_EINSUM_MAX_IDS];
    for (int i = 0; i < KRN_EINSUM_MAX_IDS; i++) size[i] = -1, count[i] = 0;
    int ell_rank = -1, ell_of[KRN_EINSUM_MAX_OPS] = {0};
    const char *s = eq;
    p->nops = c->nin;
    for (int k = 0; k < c->nin; k++) {
        const eng_tensor *t = &c->in[k];
        if (t->dtype != c->in[0].dtype)
            return eng_err(ENG_STATUS_INVALID_MODEL, "operand %d has dtype %s, operand 0 has %s", k,
                           eng_dtype_name(t->dtype), eng_dtype_name(c->in[0].dtype));
        if (!eng_dtype_is_float(t->dtype) && !eng_dtype_is_int(t->dtype))
            return eng_err(ENG_STATUS_UNSUPPORTED, "operand %d has dtype %s", k, eng_dtype_name(t->dtype));
        int letters = 0, has_ell = 0;
        const char *e = s;
        while (*e && *e != ',' && *e != '-') {
            if (e[0] == '.' && e[1] == '.' && e[2] == '.') { has_ell = 1; e += 3; continue; }
            if (einsum_letter(*e) < 0) return eng_err(ENG_STATUS_INVALID_MODEL, "equation '%s': bad character '%c'", eq, *e);
            letters++;
            e++;
        }
        int er = has_ell ? t->ndim - letters : 0;
        if (er < 0 || (!has_ell && letters != t->ndim))
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "equation '%s': operand %d has rank %d but %d subscripts", eq, k,
                           t->ndim, letters);
        if (has_ell && er > ell_rank) ell_rank = er;
        ell_of[k] = er;
        int r = 0;
        for (const char *q = s; q < e;) {
            if (q[0] == '.') {
                for (int j = 0; j < er; j++) p->op_ids[k][r++] = -1 - j; /* ellipsis dim j; numbered below */
                q += 3;
                continue;
            }
            p->op_ids[k][r++] = einsum_letter(*q);
            q++;
        }
        p->op_rank[k] = r;
        s = e;
        if (k + 1 < c->nin) {
            if (*s != ',') return eng_err(ENG_STATUS_INVALID_MODEL, "equation '%s' has fewer operands than the %d inputs", eq, c->nin);
            s++;
        }
    }
    if (*s && *s != '-') return eng_err(ENG_STATUS_INVALID_MODEL, "equation '%s' has more operands than the %d inputs", eq, c->nin);
    if (ell_rank < 0) ell_rank = 0;
    /* Ellipsis dims align right across operands: dim j of an operand's er-dim ellipsis is id 52 + ell_rank - er + j. */
    for (int k = 0; k < c->nin; k++)
        for (int j = 0; j < p->op_rank[k]; j++)
            if (p->op_ids[k][j] < 0) p->op_ids[k][j] = 52 + ell_rank - ell_of[k] + (-1 - p->op_ids[k][j]);
    for (int k = 0; k < c->nin; k++) {
        for (int j = 0; j < p->op_rank[k]; j++) {
            int id = p->op_ids[k][j];
            int64_t d = c->in[k].dims[j];
            count[id]++;
            if (size[id] < 0 || size[id] == 1) size[id] = d;
            else if (d != 1 && d != size[id])
                return eng_err(ENG_STATUS_INVALID_ARGUMENT, "equation '%s': subscript %d of operand %d has size %lld, elsewhere %lld",
                               eq, j, k, (long long)d, (long long)size[id]);
        }
    }
    p->out_rank = 0;
    if (arrow) {
        const char *q = arrow + 2;
        while (*q) {
            if (q[0] == '.' && q[1] == '.' && q[2] == '.') {
                for (int j = 0; j < ell_rank; j++) p->out_ids[p->out_rank++] = 52 + j;
                q += 3;
                continue;
            }
            int id = einsum_letter(*q);
            if (id < 0 || size[id] < 0)
                return eng_err(ENG_STATUS_INVALID_MODEL, "equation '%s': output subscript '%c' is not an input subscript", eq, *q);
            if (p->out_rank >= ENG_MAX_DIMS) return eng_err(ENG_STATUS_UNSUPPORTED, "equation '%s': output rank too high", eq);
            p->out_ids[p->out_rank++] = id;
            q++;
        }
    } else {
        for (int j = 0; j < ell_rank; j++) p->out_ids[p->out_rank++] = 52 + j;
        int ids[52], nid = 0;
        for (int id = 0; id < 52; id++)
            if (count[id] == 1) ids[nid++] = id;
        for (int i = 1; i < nid; i++)
            for (int j = i; j > 0 && einsum_sort_key(ids[j]) < einsum_sort_key(ids[j - 1]); j--) {
                int t = ids[j]; ids[j] = ids[j - 1]; ids[j - 1] = t;
            }
        for (int i = 0; i < nid; i++) {
            if (p->out_rank >= ENG_MAX_DIMS) return eng_err(ENG_STATUS_UNSUPPORTED, "equation '%s': output rank too high", eq);
            p->out_ids[p->out_rank++] = ids[i];
        }
    }
    p->nids = KRN_EINSUM_MAX_IDS;
    for (int i = 0; i < KRN_EINSUM_MAX_IDS; i++) p->id_size[i] = size[i] < 0 ? 0 : size[i];
    eng_tensor *y = &c->out[0];
    y->dtype = c->in[0].dtype;
    y->ndim = p->out_rank;
    for (int j = 0; j < p->out_rank; j++) y->dims[j] = p->id_size[p->out_ids[j]];
    return ENG_STATUS_OK;
}

/* ---- Det ---- */

eng_status eng_reduce_det_infer(eng_op_ctx *c) {
    ENG_TRY(eng_op_check_arity(c, 1, 1));
    const eng_tensor *x = &c->in[0];
    if (!eng_dtype_is_float(x->dtype))
        return eng_err(ENG_STATUS_UNSUPPORTED, "input 'X' has dtype %s; expected a floating-point type", eng_dtype_name(x->dtype));
    if (x->ndim < 2 || x->dims[x->ndim - 1] != x->dims[x->ndim - 2]) {
        char a[128];
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "input 'X' has shape %s, expected (..., M, M)",
                       eng_shape_str(x->dims, x->ndim, a, sizeof a));
    }
    eng_tensor *y = &c->out[0];
    y->dtype = x->dtype;
    y->ndim = x->ndim - 2;
    memcpy(y->dims, x->dims, sizeof y->dims);
    return ENG_STATUS_OK;
}
