/* tensor.c - placeholder until the tensor op family lands. */
#include "../op.h"
const eng_op_def eng_ops_tensor[] = {{NULL}};
