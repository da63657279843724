/* eltwise.c - placeholder until the eltwise kernel family lands. */
#include "../kernel.h"
const krn_kernel krn_cpu_eltwise_kernels[] = {{NULL}};
