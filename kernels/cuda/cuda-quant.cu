/* cuda-quant.cu - (being written) */
#include "cuda-impl.h"

extern "C" const krn_kernel krn_cuda_quant_kernels[] = {
    {NULL},
};
