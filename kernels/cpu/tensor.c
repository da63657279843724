/* tensor.c - placeholder until the tensor kernel family lands. */
#include "../kernel.h"
const krn_kernel krn_cpu_tensor_kernels[] = {{NULL}};
