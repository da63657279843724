/* eval.h - evaluating a bundle's versions on a labelled dataset: top-1 accuracy (classification) or MSE
 * (regression), and the comparison of two versions on the same examples (agreement, accuracy delta). Library
 * code shared by `tensord evaluate`, `tensord quantize`'s report and the admin job.
 *
 * Columns map to model inputs exactly as training maps them (engine/train/train.c): a column named after each
 * data input, or "x" for a one-input model, fitted with eng_dataset_fit. The model's first graph output is the
 * prediction. Classification when the dataset's "label" column has an integer dtype, one element per example,
 * and the output is [N, classes] with classes >= 2: the prediction is the first index of the maximum (numpy's
 * argmax). Otherwise regression: MSE between the output and the label, which must have as many elements per
 * example as the output.
 * Errors are eng_status with a message naming the model (base path and version), the input, the column or file.
 */
#ifndef ENG_EVAL_H
#define ENG_EVAL_H

#include <stdint.h>

#include "../data/data.h"
#include "../ir/graph.h"
#include "../plan/plan.h"

typedef struct eng_eval_opts {
    int64_t batch_size; /* <= 0: 256 */
    int nthreads;       /* <= 0: all cores */
    eng_precision precision;   /* of the model evaluated (eng_eval_versions: version N); fp32 by default */
    eng_precision precision_b; /* eng_eval_versions: of the version compared against (M) */
} eng_eval_opts;

/* One model's predictions over a dataset, kept so that two models can be compared example by example. */
typedef struct eng_eval_preds {
    int64_t n;          /* examples */
    int64_t per;        /* output elements per example */
    int classification; /* 1: cls and accuracy hold; 0: mse holds */
    float *out;         /* (n, per) the first output, as float32; malloc'd */
    int64_t *cls;       /* (n) argmax per example (classification only); malloc'd */
    double accuracy;    /* share of examples whose argmax equals the label, in [0, 1] */
    double mse;         /* mean over all output elements of (output - label)^2 */
} eng_eval_preds;

typedef struct eng_eval_cmp {
    double agreement;      /* classification: share of examples with the same argmax */
    double mean_sq_diff;   /* regression: mean of (a - b)^2 over all output elements */
    double accuracy_delta; /* a.accuracy - b.accuracy (classification) */
    double mse_delta;      /* a.mse - b.mse (regression) */
} eng_eval_cmp;

/* Map and fit the dataset's columns to g's data inputs (the inputs that are not initializers). cols[i] gets
 * the dataset column index feeding data input i (in the order of g->inputs, initializers skipped); *ncols the
 * count (cols must hold g->ninputs entries). `what` names the model in messages ("model 'DIR' version 3").
 * Fitting changes d's columns in place (dtype, per-example shape); fitting again for a model with the same
 * inputs is a no-op. */
eng_status eng_eval_fit(const eng_graph *g, eng_dataset *d, const char *what, int *cols, int *ncols);
/* Views of rows [b0, b0 + rows) of the columns cols[0..ncols) (as eng_eval_fit picked them) into in[0..ncols): the
 * dataset's own memory, no copy. */
void eng_eval_rows(const eng_dataset *d, const int *cols, int ncols, int64_t b0, int64_t rows, eng_tensor *in);

/* Run the model at `path` (model.onnx or a version directory) over every example of d (fitted here) and score
 * it against d's "label" column. *p is filled (free with eng_eval_preds_free). Cost: one pass over d with
 * batches of opts->batch_size. */
eng_status eng_eval_model(const char *path, const char *what, eng_dataset *d, const eng_eval_opts *opts,
                          eng_eval_preds *p);

/* Compare a and b (same dataset, same output size): INVALID_ARGUMENT when they do not match. */
eng_status eng_eval_compare(const eng_eval_preds *a, const eng_eval_preds *b, eng_eval_cmp *c);

void eng_eval_preds_free(eng_eval_preds *p);

/* ---- versions of a bundle ---- */

typedef struct eng_eval_report {
    int64_t version, against; /* against 0: no comparison */
    int64_t examples;
    eng_eval_preds a;         /* version */
    eng_eval_preds b;         /* against (zeroed when against is 0) */
    eng_eval_cmp cmp;         /* a vs b */
} eng_eval_report;

/* Load files (eng_dataset_load), then evaluate <base>/<version> and, when against > 0, <base>/<against> on the
 * same examples and compare them. A version that does not exist is NOT_FOUND naming base, the version and the
 * versions present. Free r with eng_eval_report_free (also after an error). */
eng_status eng_eval_versions(const char *base, int64_t version, int64_t against, const char *const *files, int nfiles,
                             const eng_eval_opts *opts, eng_eval_report *r);
void eng_eval_report_free(eng_eval_report *r);

#endif
