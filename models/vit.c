/* vit.c - vit-tiny: a Vision Transformer (Dosovitskiy et al. 2020) sized for small images.
 *
 * x [N, C, H, W] -> patch_embed (Conv patch x patch, stride patch, bias) -> [N, d, H/p, W/p]
 * -> Reshape [N, d, P] -> Transpose [N, P, d] -> + pos_embed ([P, d], normal(0, 0.02))
 * -> layer_i (pre-LN, as ViT): x = x + attention(LN(x)); x = x + mlp(LN(x))
 * -> final_ln -> pool (ReduceMean over patches; no class token, so no batch-sized Expand/Concat is needed)
 * -> head (Gemm) -> softmax.
 */
#include <stdio.h>

#include "zoo-impl.h"

eng_status mdl_build_vit(const mdl_args *a, mdl_b *b) {
    int nin;
    const int64_t *in = mdl_arg_list(a, "input", &nin);
    int64_t patch = mdl_arg(a, "patch"), d = mdl_arg(a, "d"), heads = mdl_arg(a, "heads");
    int64_t layers = mdl_arg(a, "layers"), ffn = mdl_arg(a, "ffn");
    if (in[1] % patch != 0 || in[2] % patch != 0)
        return mdl_arg_err(a, "patch", "%lld does not divide the input's %lldx%lld", (long long)patch,
                           (long long)in[1], (long long)in[2]);
    if (d % heads != 0)
        return mdl_arg_err(a, "heads", "%lld does not divide d=%lld", (long long)heads, (long long)d);
    int64_t np = (in[1] / patch) * (in[2] / patch);
    int x = mdl_b_input(b, "x", ENG_DTYPE_F32, 4, (int64_t[]){-1, in[0], in[1], in[2]});
    x = mdl_b_conv(b, "patch_embed", x, in[0], d, patch, patch, 0, 1);
    int shape = mdl_b_const_i64s(b, "const/shape_patches", (int64_t[]){0, d, np}, 3);
    x = mdl_b_op2(b, "patch_embed/Reshape", "Reshape", x, shape);
    x = mdl_b_op1(b, "patch_embed/Transpose", "Transpose", x);
    mdl_b_attr_ints(b, "perm", (int64_t[]){0, 2, 1}, 3);
    int pos = mdl_b_param(b, "pos_embed/embeddings", 2, (int64_t[]){np, d}, MDL_INIT_NORMAL, 0, 0);
    x = mdl_b_op2(b, "pos_embed/Add", "Add", x, pos);
    for (int64_t l = 1; l <= layers; l++) {
        char p[64], n[96];
        snprintf(n, sizeof n, "layer_%lld/ln1", (long long)l);
        int y = mdl_b_layernorm(b, n, x, d);
        snprintf(p, sizeof p, "layer_%lld/attention", (long long)l);
        y = mdl_b_attention(b, p, y, np, d, heads);
        snprintf(n, sizeof n, "layer_%lld/attention/residual", (long long)l);
        x = mdl_b_op2(b, n, "Add", x, y);
        snprintf(n, sizeof n, "layer_%lld/ln2", (long long)l);
        y = mdl_b_layernorm(b, n, x, d);
        snprintf(p, sizeof p, "layer_%lld/mlp", (long long)l);
        y = mdl_b_ffn(b, p, y, d, ffn);
        snprintf(n, sizeof n, "layer_%lld/mlp/residual", (long long)l);
        x = mdl_b_op2(b, n, "Add", x, y);
    }
    x = mdl_b_layernorm(b, "final_ln", x, d);
    x = mdl_b_op1(b, "pool/ReduceMean", "ReduceMean", x);
    mdl_b_attr_ints(b, "axes", (int64_t[]){1}, 1);
    mdl_b_attr_int(b, "keepdims", 0);
    mdl_b_classifier(b, x, d, mdl_arg(a, "classes"), (int)mdl_arg(a, "softmax"));
    return b->st;
}
