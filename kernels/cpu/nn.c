/* nn.c - placeholder until the nn kernel family lands. */
#include "../kernel.h"
const krn_kernel krn_cpu_nn_kernels[] = {{NULL}};
