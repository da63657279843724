/* nn-conv-impl.h - what the direct and transposed convolution files (nn-conv.c, nn-deconv.c) share: the
 * geometry of their reference loops. Not part of the kernel interface. */
#ifndef KRN_NN_CONV_IMPL_H
#define KRN_NN_CONV_IMPL_H

#include "../kernel.h"
#include "../krn-nn.h"

#ifdef ONEAPI_DNNL_DNNL_H
/* oneDNN's plain (row-major) tag for a rank, 1..6. */
static const dnnl_format_tag_t conv_plain_tags[7] = {dnnl_format_tag_undef, dnnl_a, dnnl_ab, dnnl_abc,
                                                     dnnl_abcd, dnnl_abcde, dnnl_abcdef};
#endif

/* Shapes padded to 3 spatial dims (missing ones are 1, leading): in/out/kernel/stride/dilation/begin pad. */
typedef struct conv_geo {
    int64_t N, C, M, G, Cg, Mg;
    int64_t in[3], out[3], k[3], s[3], d[3], pb[3];
} conv_geo;

static inline void conv_geo_get(const krn_conv_params *p, const eng_tensor *x, const eng_tensor *y, conv_geo *g) {
    int nsp = p->nspatial, off = 3 - nsp;
    g->N = x->dims[0], g->C = x->dims[1], g->M = y->dims[1], g->G = p->group;
    g->Cg = g->C / g->G, g->Mg = g->M / g->G;
    for (int i = 0; i < 3; i++) g->in[i] = g->out[i] = g->k[i] = g->s[i] = g->d[i] = 1, g->pb[i] = 0;
    for (int i = 0; i < nsp; i++) {
        g->in[off + i] = x->dims[2 + i];
        g->out[off + i] = y->dims[2 + i];
        g->k[off + i] = p->kernel[i];
        g->s[off + i] = p->strides[i];
        g->d[off + i] = p->dilations[i];
        g->pb[off + i] = p->pads[i];
    }
}

#endif
