/* registry.c - every op family's definitions, looked up by (domain, op_type). */
#include "op.h"

#include <stdio.h>
#include <string.h>

extern const eng_op_def eng_ops_eltwise[];
extern const eng_op_def eng_ops_tensor[];
extern const eng_op_def eng_ops_nn[];
extern const eng_op_def eng_ops_reduce[];
extern const eng_op_def eng_ops_grad[];
extern const eng_op_def eng_ops_quant[];
extern const eng_op_def eng_ops_rnn[];
extern const eng_op_def eng_ops_rnn_grad[];
extern const eng_op_def eng_ops_ctrl[];
extern const eng_op_def eng_ops_seq[];

static const eng_op_def *const eng_op_tables[] = {eng_ops_eltwise, eng_ops_tensor, eng_ops_nn, eng_ops_reduce, eng_ops_grad, eng_ops_quant, eng_ops_rnn, eng_ops_rnn_grad, eng_ops_ctrl, eng_ops_seq, NULL};

const eng_op_def *eng_op_find(const char *domain, const char *op_type) {
    if (!domain || strcmp(domain, "ai.onnx") == 0) domain = "";
    for (const eng_op_def *const *t = eng_op_tables; *t; t++)
        for (const eng_op_def *d = *t; d->op_type; d++)
            if (strcmp(d->op_type, op_type) == 0 && strcmp(d->domain ? d->domain : "", domain) == 0) return d;
    return NULL;
}

eng_status eng_broadcast_shapes(const eng_tensor *const *ts, int n, eng_tensor *out) {
    int rank = 0;
    for (int i = 0; i < n; i++)
        if (ts[i]->ndim > rank) rank = ts[i]->ndim;
    out->ndim = rank;
    for (int d = 0; d < rank; d++) {
        int64_t dim = 1;
        for (int i = 0; i < n; i++) {
            int off = rank - ts[i]->ndim;
            if (d < off) continue;
            int64_t v = ts[i]->dims[d - off];
            if (v == 1) continue;
            if (dim == 1) dim = v;
            else if (v != dim) {
                char a[128], b[128];
                return eng_err(ENG_STATUS_INVALID_ARGUMENT, "shapes %s and %s cannot be broadcast together",
                               eng_shape_str(ts[0]->dims, ts[0]->ndim, a, sizeof a),
                               eng_shape_str(ts[i]->dims, ts[i]->ndim, b, sizeof b));
            }
        }
        out->dims[d] = dim;
    }
    return ENG_STATUS_OK;
}

eng_status eng_norm_axis(int64_t axis, int rank, int *out) {
    int64_t lo = rank == 0 ? -1 : -rank, hi = rank == 0 ? 1 : rank;
    if (axis < lo || axis >= hi)
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "axis %lld is out of range for rank %d", (long long)axis, rank);
    *out = (int)(axis < 0 ? axis + rank : axis);
    return ENG_STATUS_OK;
}

eng_status eng_op_check_arity(const eng_op_ctx *c, int lo, int hi) {
    if (c->nin < lo || (hi >= 0 && c->nin > hi))
        return eng_err(ENG_STATUS_INVALID_MODEL, "expected %d..%d inputs, got %d", lo, hi, c->nin);
    if (c->nout < 1) return eng_err(ENG_STATUS_INVALID_MODEL, "node has no outputs");
    return ENG_STATUS_OK;
}

void eng_op_same_as_input(eng_op_ctx *c, int in, int out) {
    c->out[out].dtype = c->in[in].dtype;
    c->out[out].ndim = c->in[in].ndim;
    memcpy(c->out[out].dims, c->in[in].dims, sizeof c->out[out].dims);
}
