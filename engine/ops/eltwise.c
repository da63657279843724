/* eltwise.c - placeholder until the eltwise op family lands. */
#include "../op.h"
const eng_op_def eng_ops_eltwise[] = {{NULL}};
