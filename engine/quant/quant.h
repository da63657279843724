/* quant.h - post-training static quantization into ONNX's QDQ form (what onnxruntime's quantize_static writes
 * with QuantFormat.QDQ), in two steps:
 *
 *   calibration (calib.c): run the float model over calibration data and pick a scale and zero point for every
 *     activation that feeds a quantized node (the first input of a Conv, Gemm or MatMul with a constant weight;
 *     MatMuls of two activations stay float: no int8 kernel takes a quantized non-constant B). Methods: minmax (asymmetric uint8 over [min(0, min), max(0, max)],
 *     onnxruntime's default), percentile (the 99.99th percentile of |x|) and entropy (the threshold minimising
 *     the KL divergence between the 2048-bin histogram of |x| and its quantized form, TensorRT's method). For
 *     percentile and entropy the range is [0, T] as uint8 when the activation was never negative (ReLU outputs,
 *     images), else [-T, T] as symmetric int8.
 *   Adds of two activations (residual connections) are quantized too where their result (through a Relu) feeds a
 *     quantized node, so that they run as one int8 add after the load-time fusion.
 *   rewrite (qdq.c): one QuantizeLinear/DequantizeLinear pair per quantized activation, read by all its readers
 *     (as onnxruntime's QDQ models do), and
 *     each weight stored as an int8 initializer (symmetric, zero point 0, per output channel or per tensor)
 *     followed by a DequantizeLinear whose output keeps the weight's old name. Biases stay float32.
 *
 * Errors are eng_status with messages naming the model (`what`), the node or the value.
 */
#ifndef ENG_QUANT_H
#define ENG_QUANT_H

#include <stdint.h>

#include "../data/data.h"
#include "../ir/graph.h"

typedef enum eng_quant_method {
    ENG_QUANT_MINMAX = 0,
    ENG_QUANT_PERCENTILE = 1,
    ENG_QUANT_ENTROPY = 2,
} eng_quant_method;

const char *eng_quant_method_name(eng_quant_method m);
/* -1 when s names no method. */
int eng_quant_method_parse(const char *s);

typedef struct eng_quant_opts {
    eng_quant_method method;
    int per_channel;            /* 1: one weight scale per output channel (default); 0: one per tensor */
    const char *const *exclude; /* node names left in float */
    int nexclude;
    double percentile;          /* <= 0: 99.99 */
    int64_t batch_size;         /* calibration batch; <= 0: 256 */
    int nthreads;               /* <= 0: all cores */
} eng_quant_opts;

/* The quantization parameters of one activation. */
typedef struct eng_quant_act {
    int value;         /* value index in the float graph */
    float min, max;    /* observed over the calibration data */
    float scale;       /* > 0 */
    int zero_point;    /* in the dtype's range */
    eng_dtype dtype;   /* ENG_DTYPE_U8 or ENG_DTYPE_I8 */
} eng_quant_act;

/* What will be (calibration) or was (rewrite) quantized. Names are borrowed from the float graph. */
typedef struct eng_quant_plan {
    int *nodes;            /* indices of the nodes to quantize, in graph order */
    int nnodes;
    int *excluded;         /* indices of quantizable nodes left in float (opts->exclude) */
    int nexcluded;
    eng_quant_act *acts;   /* one per activation value feeding a quantized node */
    int nacts;
} eng_quant_plan;

/* Choose the nodes to quantize. INVALID_ARGUMENT when an exclude name matches no node (naming it), when g has
 * no Conv, MatMul or Gemm, or when every one of them is excluded. */
eng_status eng_quant_select(const eng_graph *g, const char *what, const eng_quant_opts *o, eng_quant_plan *p);

/* Run g over every example of d (fitted to g's inputs here, as evaluation does: engine/train/eval.h) and fill
 * p->acts. Cost: one pass over d (two for percentile and entropy, which histogram |x| on the range the first
 * pass found). */
eng_status eng_quant_calibrate(const eng_graph *g, const char *what, eng_dataset *d, const eng_quant_opts *o,
                               eng_quant_plan *p);

/* A new graph in QDQ form from g and the calibrated plan (g is unchanged). The node order stays topological. */
eng_status eng_quant_rewrite(const eng_graph *g, const eng_quant_plan *p, const eng_quant_opts *o, eng_graph **out);

void eng_quant_plan_free(eng_quant_plan *p);

/* ---- scale selection (exposed for tests) ---- */

/* Threshold T for |x| from a histogram of |x| over [0, amax] with nbins bins: the entropy (KL) choice with
 * `levels` quantization levels (128 for int8, 255 for uint8). */
float eng_quant_entropy_threshold(const double *hist, int nbins, float amax, int levels);
/* The smallest bin upper edge below which `pct` percent of the histogram's mass lies. */
float eng_quant_percentile_threshold(const double *hist, int nbins, float amax, double pct);

#endif
