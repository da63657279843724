/* reduce.c - placeholder until the reduce kernel family lands. */
#include "../kernel.h"
const krn_kernel krn_cpu_reduce_kernels[] = {{NULL}};
