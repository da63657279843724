/* mlp-cnn.c - the zoo's small classifiers: the MLP and the seed CNN (options and layer plans in zoo.c's table).
 *
 * mlp:  x [N, input...] -> Flatten (only if input has several dims) -> dense_1..dense_k (Gemm + activation)
 *       -> head (Gemm) -> softmax.
 * cnn:  x [N, C, H, W] -> conv1 (Conv, valid, bias) -> ReLU -> pool1 (MaxPool, window = stride = pool)
 *       -> flatten (Flatten, axis 1) -> head (Gemm) -> softmax. With the defaults this is exactly the seed CNN
 *       (Conv2D(32, 3x3) + ReLU, MaxPool 2x2, Flatten, Dense(10), Softmax on [N,1,28,28]; 54,410 parameters).
 */
#include <stdio.h>

#include "zoo-impl.h"

eng_status mdl_build_mlp(const mdl_args *a, mdl_b *b) {
    int nin, nh;
    const int64_t *in = mdl_arg_list(a, "input", &nin);
    const int64_t *hidden = mdl_arg_list(a, "hidden", &nh);
    int64_t dims[4] = {-1};
    int64_t width = 1;
    for (int i = 0; i < nin; i++) {
        dims[i + 1] = in[i];
        width *= in[i]; /* each dim <= 2^24, at most 3 dims: no overflow */
    }
    if (width > ((int64_t)1 << 30)) return mdl_arg_err(a, "input", "%lld features are too many", (long long)width);
    int x = mdl_b_input(b, "x", ENG_DTYPE_F32, nin + 1, dims);
    if (nin > 1) {
        x = mdl_b_op1(b, "flatten", "Flatten", x);
        mdl_b_attr_int(b, "axis", 1);
    }
    mdl_act act = (mdl_act)mdl_arg(a, "activation"); /* the table lists the words in mdl_act order */
    for (int i = 0; i < nh; i++) {
        char name[32];
        snprintf(name, sizeof name, "dense_%d", i + 1);
        x = mdl_b_dense(b, name, x, 2, width, hidden[i]);
        x = mdl_b_act(b, name, x, act);
        width = hidden[i];
    }
    mdl_b_classifier(b, x, width, mdl_arg(a, "classes"), (int)mdl_arg(a, "softmax"));
    return b->st;
}

eng_status mdl_build_cnn(const mdl_args *a, mdl_b *b) {
    int nin;
    const int64_t *in = mdl_arg_list(a, "input", &nin);
    int64_t c = in[0], h = in[1], w = in[2];
    int64_t filters = mdl_arg(a, "filters"), k = mdl_arg(a, "kernel"), pool = mdl_arg(a, "pool");
    if (k > h || k > w)
        return mdl_arg_err(a, "kernel", "%lld is larger than the input's %lldx%lld", (long long)k, (long long)h,
                           (long long)w);
    int64_t ch = h - k + 1, cw = w - k + 1;
    if (pool > ch || pool > cw)
        return mdl_arg_err(a, "pool", "%lld is larger than the convolution's %lldx%lld output", (long long)pool,
                           (long long)ch, (long long)cw);
    int64_t ph = ch / pool, pw = cw / pool;
    int64_t flat = filters * ph * pw;
    if (flat > ((int64_t)1 << 30)) return mdl_arg_err(a, "filters", "%lld features after pooling are too many", (long long)flat);
    int x = mdl_b_input(b, "x", ENG_DTYPE_F32, 4, (int64_t[]){-1, c, h, w});
    x = mdl_b_conv(b, "conv1", x, c, filters, k, 1, 0, 1);
    x = mdl_b_act(b, "conv1", x, MDL_ACT_RELU);
    x = mdl_b_op1(b, "pool1/MaxPool", "MaxPool", x);
    mdl_b_attr_ints(b, "kernel_shape", (int64_t[]){pool, pool}, 2);
    mdl_b_attr_ints(b, "strides", (int64_t[]){pool, pool}, 2);
    x = mdl_b_op1(b, "flatten", "Flatten", x);
    mdl_b_attr_int(b, "axis", 1);
    mdl_b_classifier(b, x, flat, mdl_arg(a, "classes"), (int)mdl_arg(a, "softmax"));
    return b->st;
}
