/* resnet.c - resnet-small: the CIFAR ResNet v1 of He et al. (2015, section 4.2) with `blocks` basic blocks per
 * stage (blocks=3 is ResNet-20), projection shortcuts (1x1 conv + BN) where the shape changes.
 *
 * x [N,C,H,W] -> stem (Conv3x3 width, BN, ReLU) -> stage{1,2,3}/block{1..blocks}:
 *     conv1 (3x3, stride 2 on the first block of stages 2 and 3) -> bn1 -> ReLU -> conv2 (3x3) -> bn2
 *     + shortcut (identity, or conv 1x1 stride s + bn) -> ReLU
 * -> GlobalAveragePool -> Flatten -> head (Gemm) -> softmax. Convs have no bias (BN follows each).
 */
#include <stdio.h>

#include "zoo-impl.h"

static int rn_conv_bn(mdl_b *b, const char *conv, const char *bn, int x, int64_t cin, int64_t cout, int64_t k,
                      int64_t stride) {
    x = mdl_b_conv(b, conv, x, cin, cout, k, stride, k / 2, 0);
    return mdl_b_batchnorm(b, bn, x, cout);
}

static int rn_block(mdl_b *b, const char *name, int x, int64_t cin, int64_t cout, int64_t stride) {
    char c1[128], b1[128], c2[128], b2[128], n[128];
    snprintf(c1, sizeof c1, "%s/conv1", name);
    snprintf(b1, sizeof b1, "%s/bn1", name);
    snprintf(c2, sizeof c2, "%s/conv2", name);
    snprintf(b2, sizeof b2, "%s/bn2", name);
    int y = rn_conv_bn(b, c1, b1, x, cin, cout, 3, stride);
    y = mdl_b_act(b, b1, y, MDL_ACT_RELU);
    y = rn_conv_bn(b, c2, b2, y, cout, cout, 3, 1);
    int sc = x;
    if (stride != 1 || cin != cout) {
        snprintf(c1, sizeof c1, "%s/shortcut/conv", name);
        snprintf(b1, sizeof b1, "%s/shortcut/bn", name);
        sc = rn_conv_bn(b, c1, b1, x, cin, cout, 1, stride);
    }
    snprintf(n, sizeof n, "%s/add", name);
    y = mdl_b_op2(b, n, "Add", y, sc);
    snprintf(n, sizeof n, "%s/out", name);
    return mdl_b_act(b, n, y, MDL_ACT_RELU);
}

eng_status mdl_build_resnet(const mdl_args *a, mdl_b *b) {
    int nin;
    const int64_t *in = mdl_arg_list(a, "input", &nin);
    int64_t width = mdl_arg(a, "width"), blocks = mdl_arg(a, "blocks");
    int x = mdl_b_input(b, "x", ENG_DTYPE_F32, 4, (int64_t[]){-1, in[0], in[1], in[2]});
    x = rn_conv_bn(b, "stem/conv", "stem/bn", x, in[0], width, 3, 1);
    x = mdl_b_act(b, "stem", x, MDL_ACT_RELU);
    int64_t c = width;
    for (int s = 0; s < 3; s++) {
        int64_t cout = width << s;
        for (int64_t k = 0; k < blocks; k++) {
            char name[64];
            snprintf(name, sizeof name, "stage%d/block%lld", s + 1, (long long)k + 1);
            x = rn_block(b, name, x, c, cout, (s > 0 && k == 0) ? 2 : 1);
            c = cout;
        }
    }
    x = mdl_b_op1(b, "pool/GlobalAveragePool", "GlobalAveragePool", x);
    x = mdl_b_op1(b, "flatten", "Flatten", x);
    mdl_b_attr_int(b, "axis", 1);
    mdl_b_classifier(b, x, c, mdl_arg(a, "classes"), (int)mdl_arg(a, "softmax"));
    return b->st;
}
