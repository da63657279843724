/* cpu-backend.c - the CPU backend's kernel table: one array per op family file in kernels/cpu/. */
#include <dnnl.h>

#include "../backend-impl.h"

extern const krn_kernel krn_cpu_eltwise_kernels[];
extern const krn_kernel krn_cpu_tensor_kernels[];
extern const krn_kernel krn_cpu_nn_kernels[];
extern const krn_kernel krn_cpu_attn_kernels[];
extern const krn_kernel krn_cpu_reduce_kernels[];
extern const krn_kernel krn_cpu_grad_kernels[];
extern const krn_kernel krn_cpu_quant_kernels[];
extern const krn_kernel krn_cpu_grad_lowp_kernels[];
extern const krn_kernel krn_cpu_optim_kernels[];
extern const krn_kernel krn_cpu_rnn_kernels[];
extern const krn_kernel krn_cpu_rnn_grad_kernels[];

static const krn_kernel *const krn_cpu_tables[] = {
    krn_cpu_eltwise_kernels, krn_cpu_tensor_kernels, krn_cpu_nn_kernels, krn_cpu_attn_kernels, krn_cpu_reduce_kernels, krn_cpu_grad_kernels, krn_cpu_quant_kernels,
    krn_cpu_grad_lowp_kernels, krn_cpu_optim_kernels, krn_cpu_rnn_kernels, krn_cpu_rnn_grad_kernels, NULL,
};

static const char *cpu_isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2: return "avx2";
    default: return "older than avx2";
    }
}

/* What oneDNN (Debian's 2.6) runs fast here: bf16 needs AVX512_BF16 (jit avx512_core_bf16 / AMX kernels; on
 * older CPUs oneDNN emulates bf16 more slowly than fp32); int8 needs AVX2 at least (VNNI makes it 4x fp32);
 * fp16 has no fast CPU kernel in oneDNN 2.6 on any CPU (its AVX512_FP16 kernels came in 3.x). */
static eng_status cpu_precision_check(eng_dtype dt) {
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    switch (dt) {
    case ENG_DTYPE_UNDEFINED:
    case ENG_DTYPE_F32: return ENG_STATUS_OK;
    case ENG_DTYPE_BF16:
        if ((isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16) return ENG_STATUS_OK;
        return eng_err(ENG_STATUS_UNSUPPORTED, "bf16 needs a CPU with AVX512_BF16 or AMX; oneDNN found %s here, where "
                       "bf16 runs slower than fp32 (serve fp32, or int8 via tensord quantize)", cpu_isa_name(isa));
    case ENG_DTYPE_F16:
        return eng_err(ENG_STATUS_UNSUPPORTED, "fp16 has no fast CPU kernels in this build's oneDNN (2.6; %s here): "
                       "serve bf16 or fp32 on the CPU, fp16 on a CUDA backend", cpu_isa_name(isa));
    case ENG_DTYPE_I8:
    case ENG_DTYPE_U8:
        if ((isa & dnnl_cpu_isa_avx2) == dnnl_cpu_isa_avx2) return ENG_STATUS_OK;
        return eng_err(ENG_STATUS_UNSUPPORTED, "int8 needs AVX2 at least; oneDNN found %s here", cpu_isa_name(isa));
    default: return eng_err(ENG_STATUS_UNSUPPORTED, "no %s compute on the CPU backend", eng_dtype_name(dt));
    }
}

static const krn_backend krn_cpu_backend = {.abi = KRN_BACKEND_ABI, .name = "cpu", .tables = krn_cpu_tables,
                                           .precision_check = cpu_precision_check, .is_host = 1, .alignment = 64};

const krn_backend *krn_backend_cpu(void) { return &krn_cpu_backend; }
