/* two-tower.c - a two-tower recommender in its smallest form: one embedding table per side, scored by a dot
 * product through a sigmoid.
 *
 * user int64 [N] -> user_tower (Gather from [users, dim]) ┐
 * item int64 [N] -> item_tower (Gather from [items, dim]) ┴-> Mul -> ReduceSum(axis 1, keepdims) -> Sigmoid
 * -> probability [N, 1]. Embeddings are normal(0, 0.02), so a fresh model scores every pair close to 0.5.
 */
#include "zoo-impl.h"

eng_status mdl_build_two_tower(const mdl_args *a, mdl_b *b) {
    int64_t users = mdl_arg(a, "users"), items = mdl_arg(a, "items"), dim = mdl_arg(a, "dim");
    int user = mdl_b_input(b, "user", ENG_DTYPE_I64, 1, (int64_t[]){-1});
    int item = mdl_b_input(b, "item", ENG_DTYPE_I64, 1, (int64_t[]){-1});
    int ut = mdl_b_param(b, "user_tower/embeddings", 2, (int64_t[]){users, dim}, MDL_INIT_NORMAL, 0, 0);
    int it = mdl_b_param(b, "item_tower/embeddings", 2, (int64_t[]){items, dim}, MDL_INIT_NORMAL, 0, 0);
    int u = mdl_b_op2(b, "user_tower/Gather", "Gather", ut, user);
    mdl_b_attr_int(b, "axis", 0);
    int v = mdl_b_op2(b, "item_tower/Gather", "Gather", it, item);
    mdl_b_attr_int(b, "axis", 0);
    int s = mdl_b_op2(b, "score/Mul", "Mul", u, v);
    int axes = mdl_b_const_i64s(b, "const/axes_1", (int64_t[]){1}, 1);
    s = mdl_b_op2(b, "score/ReduceSum", "ReduceSum", s, axes);
    mdl_b_attr_int(b, "keepdims", 1);
    s = mdl_b_op1(b, "score/Sigmoid", "Sigmoid", s);
    mdl_b_output(b, s, "probability", 2, (int64_t[]){-1, 1});
    return b->st;
}
