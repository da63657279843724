/* transformer.c - transformer-encoder: a BERT-style text classifier.
 *
 * tokens int64 [N, seq] -> embeddings/token (Gather from [vocab, d]) + embeddings/position ([seq, d], added
 * with broadcasting: positions are 0..seq-1, so no Gather is needed) -> embeddings/ln
 * -> layer_i (post-LN, as BERT): x = LN(x + attention(x)); x = LN(x + ffn(x))   (attention has no padding mask)
 * -> pool (ReduceMean over positions) -> head (Gemm) -> softmax.
 * Embeddings are normal(0, 0.02); dense kernels Glorot uniform; LayerNorm eps 1e-5.
 */
#include <stdio.h>

#include "zoo-impl.h"

eng_status mdl_build_transformer(const mdl_args *a, mdl_b *b) {
    int64_t vocab = mdl_arg(a, "vocab"), seq = mdl_arg(a, "seq"), d = mdl_arg(a, "d"), heads = mdl_arg(a, "heads");
    int64_t layers = mdl_arg(a, "layers"), ffn = mdl_arg(a, "ffn");
    if (d % heads != 0)
        return mdl_arg_err(a, "heads", "%lld does not divide d=%lld", (long long)heads, (long long)d);
    int tokens = mdl_b_input(b, "tokens", ENG_DTYPE_I64, 2, (int64_t[]){-1, seq});
    int table = mdl_b_param(b, "embeddings/token/embeddings", 2, (int64_t[]){vocab, d}, MDL_INIT_NORMAL, 0, 0);
    int pos = mdl_b_param(b, "embeddings/position/embeddings", 2, (int64_t[]){seq, d}, MDL_INIT_NORMAL, 0, 0);
    int x = mdl_b_op2(b, "embeddings/token/Gather", "Gather", table, tokens);
    mdl_b_attr_int(b, "axis", 0);
    x = mdl_b_op2(b, "embeddings/position/Add", "Add", x, pos);
    x = mdl_b_layernorm(b, "embeddings/ln", x, d);
    for (int64_t l = 1; l <= layers; l++) {
        char p[64], n[96];
        snprintf(p, sizeof p, "layer_%lld/attention", (long long)l);
        int y = mdl_b_attention(b, p, x, seq, d, heads);
        snprintf(n, sizeof n, "layer_%lld/attention/residual", (long long)l);
        x = mdl_b_op2(b, n, "Add", x, y);
        snprintf(n, sizeof n, "layer_%lld/attention/ln", (long long)l);
        x = mdl_b_layernorm(b, n, x, d);
        snprintf(p, sizeof p, "layer_%lld/ffn", (long long)l);
        y = mdl_b_ffn(b, p, x, d, ffn);
        snprintf(n, sizeof n, "layer_%lld/ffn/residual", (long long)l);
        x = mdl_b_op2(b, n, "Add", x, y);
        snprintf(n, sizeof n, "layer_%lld/ffn/ln", (long long)l);
        x = mdl_b_layernorm(b, n, x, d);
    }
    x = mdl_b_op1(b, "pool/ReduceMean", "ReduceMean", x);
    mdl_b_attr_ints(b, "axes", (int64_t[]){1}, 1);
    mdl_b_attr_int(b, "keepdims", 0);
    mdl_b_classifier(b, x, d, mdl_arg(a, "classes"), (int)mdl_arg(a, "softmax"));
    return b->st;
}
