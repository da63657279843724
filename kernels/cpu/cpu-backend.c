/* cpu-backend.c - the CPU backend's kernel table: one array per op family file in kernels/cpu/. */
#include "../kernel.h"

extern const krn_kernel krn_cpu_eltwise_kernels[];
extern const krn_kernel krn_cpu_tensor_kernels[];
extern const krn_kernel krn_cpu_nn_kernels[];
extern const krn_kernel krn_cpu_reduce_kernels[];
extern const krn_kernel krn_cpu_grad_kernels[];
extern const krn_kernel krn_cpu_quant_kernels[];

static const krn_kernel *const krn_cpu_tables[] = {
    krn_cpu_eltwise_kernels, krn_cpu_tensor_kernels, krn_cpu_nn_kernels, krn_cpu_reduce_kernels, krn_cpu_grad_kernels, krn_cpu_quant_kernels, NULL,
};

static const krn_backend krn_cpu_backend = {"cpu", krn_cpu_tables};

const krn_backend *krn_backend_cpu(void) { return &krn_cpu_backend; }
