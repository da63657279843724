/* nn.c - placeholder until the nn op family lands. */
#include "../op.h"
const eng_op_def eng_ops_nn[] = {{NULL}};
