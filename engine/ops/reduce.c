/* reduce.c - placeholder until the reduce op family lands. */
#include "../op.h"
const eng_op_def eng_ops_reduce[] = {{NULL}};
