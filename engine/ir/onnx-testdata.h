/* onnx-testdata.h - ONNX backend test cases on disk, as Debian's libonnx-testdata lays them out:
 * DIR/<test>/model.onnx and DIR/<test>/test_data_set_N/{input,output}_K.pb. One loader for both users:
 * `tensord conformance` (server/cli-conformance.c) checks our outputs against the expected ones, and
 * tests/test_ops.c checks every backend and precision against the CPU's fp32 outputs on the same inputs.
 *
 * A data set's inputs feed, positionally, the graph inputs that are not initializers, as ONNX's backend runner
 * does. Older test data stores bfloat16 tensors as uint16 bit patterns: loading retypes them where the graph
 * (inputs) or the caller (expected outputs) says bfloat16.
 */
#ifndef ENG_ONNX_TESTDATA_H
#define ENG_ONNX_TESTDATA_H

#include "graph.h"

#define ENG_TESTDATA_MAX_INPUTS 64

/* Sorted names of dir's subdirectories that start with prefix (NULL: all), malloc'd. NULL with *n = 0 when dir
 * cannot be read. Free with eng_testdata_names_free. */
char **eng_testdata_dirs(const char *dir, const char *prefix, int *n);
/* The names in file, one per line; '#' starts a comment, blanks around a name and empty lines are ignored
 * (the expected-pass lists of tests/conformance). NULL with *n = 0 when the file cannot be read. */
char **eng_testdata_names_read(const char *file, int *n);
void eng_testdata_names_free(char **v, int n);

/* One test data set: its inputs, ready for eng_session_run(s, d.nfeed, d.names, d.feed, ...). */
typedef struct eng_testdata_set {
    int nin;                                       /* input_K.pb files read */
    eng_tensor *owned[ENG_TESTDATA_MAX_INPUTS];    /* nin loaded tensors (eng_testdata_set_free frees them) */
    eng_tensor feed[ENG_TESTDATA_MAX_INPUTS];      /* views of owned[] */
    int nfeed;                                     /* graph inputs that are not initializers */
    const char *names[ENG_TESTDATA_MAX_INPUTS];    /* their names (the first ENG_TESTDATA_MAX_INPUTS), borrowed */
} eng_testdata_set;

/* Load case_dir/set/input_K.pb for K = 0, 1, ... (at most ENG_TESTDATA_MAX_INPUTS) into *d, for graph g.
 * Errors name the set and the file; a set whose input count is not the graph's (optional inputs, sequences the
 * positional feed cannot map) is UNSUPPORTED. Free *d with eng_testdata_set_free on success and on error. */
eng_status eng_testdata_set_load(const char *case_dir, const char *set, const eng_graph *g, eng_testdata_set *d);
void eng_testdata_set_free(eng_testdata_set *d);

/* Expected output k of a set (case_dir/set/output_k.pb). as_dtype ENG_DTYPE_BF16 (the dtype the run produced)
 * reads a uint16 file as bfloat16; ENG_DTYPE_SEQUENCE reads a SequenceProto; any other value leaves the file's
 * dtype. Inputs the graph declares as sequences are read as SequenceProto too. Free with eng_tensor_destroy. */
eng_status eng_testdata_output_load(const char *case_dir, const char *set, int k, eng_dtype as_dtype, eng_tensor **out);

#endif
