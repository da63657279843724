/* codec.h - request/response bodies <-> tensors, for TF Serving's REST API and KServe v2.
 *
 * All JSON is checked for nesting depth BEFORE it is parsed (srv_json_depth_ok, limit SRV_JSON_MAX_DEPTH),
 * and every recursive walk re-checks depth; element counts times dtype sizes use checked arithmetic; a
 * tensor's declared or implied shape must match the number of values given. Errors are INVALID_ARGUMENT
 * with a message naming the input, expected vs got.
 *
 * Numbers (json.h, srv_json_store): integers are converted exactly within each dtype's range, non-finite
 * parses (1e400) and float overflows (1e39 for FP32) are refused, and float inputs accept the strings "NaN",
 * "Infinity", "-Infinity". Replies write non-finite floats as those strings, so every reply is strict JSON
 * (TF Serving and v2 alike). The decoders accept zero-sized tensors; serving refuses them (version.c).
 */
#ifndef SRV_CODEC_H
#define SRV_CODEC_H

#include "registry.h"
#include "srv.h"

#define SRV_JSON_MAX_DEPTH 64

/* 1 if the JSON text never nests objects/arrays deeper than max_depth (strings are skipped correctly). */
int srv_json_depth_ok(const char *body, size_t len, int max_depth);

/* ---- TF Serving REST ---- */
typedef enum srv_tfs_format { SRV_TFS_ROW = 0, SRV_TFS_COLUMNAR = 1 } srv_tfs_format;

/* Body of POST /v1/models/m[/versions/n|/labels/l]:predict -> inputs (client names of info's signature).
 * Row format ("instances": list of per-example values, or of {name: value} objects) stacks examples along
 * a new dim 0; columnar ("inputs": value or {name: value}) takes whole tensors. {"b64": "..."} in place of a
 * list gives the raw little-endian bytes of that (sub)tensor. signature_name, if given, must be
 * "serving_default" or "". *fmt says which form was used, for the reply. */
srv_code srv_tfs_decode_predict(const char *body, size_t len, const srv_version_info *info, srv_tensors *in,
                                srv_tfs_format *fmt, srv_error *err);
/* {"predictions": ...} (row) or {"outputs": ...} (columnar). malloc'd. */
char *srv_tfs_encode_predict(const srv_version_info *info, const srv_tensors *out, srv_tfs_format fmt,
                             size_t *len, srv_error *err);
/* :classify / :regress bodies ({"examples": [{feature: value}...], "context": {...}}) -> inputs. */
srv_code srv_tfs_decode_examples(const char *body, size_t len, const srv_version_info *info, srv_tensors *in,
                                 srv_error *err);
/* {"results": [[[label, score], ...], ...]} for classify (labels from info->labels or "0".."K-1");
 * {"results": [v, ...]} for regress. */
char *srv_tfs_encode_classify(const srv_version_info *info, const srv_tensors *out, size_t *len, srv_error *err);
char *srv_tfs_encode_regress(const srv_version_info *info, const srv_tensors *out, size_t *len, srv_error *err);
/* The output classify reports (named scores/probabilities/..., else the first float one), shape [n, k] or [n]:
 * its index, or -1 with err set. The output regress reports: one value per example. Both front doors use these. */
int srv_tfs_classify_scores(const srv_tensors *out, int64_t *n, int64_t *k, srv_error *err);
int srv_tfs_regress_values(const srv_tensors *out, srv_error *err);

/* ---- KServe v2 ---- */
typedef struct srv_kserve_req {
    char *id;                 /* request id echoed back, or NULL */
    int binary_output_all;    /* parameters.binary_data_output */
    int noutputs;             /* requested outputs; 0 = all */
    char **outputs;
    int *output_binary;       /* per requested output: parameters.binary_data */
    int64_t *output_class;    /* per requested output: parameters.classification (top k), 0 = the raw tensor */
    int batch_first;          /* set by the caller before encoding: outputs have a batch dimension (Triton's
                               * max_batch_size > 0), so classification is per row of dim 0 */
} srv_kserve_req;
void srv_kserve_req_free(srv_kserve_req *r);

/* body: JSON header of json_len bytes followed by binary tensor data (Inference-Header-Content-Length);
 * json_len == len when there is no binary part. */
srv_code srv_kserve_decode_infer(const char *body, size_t len, size_t json_len, const srv_version_info *info,
                                 srv_tensors *in, srv_kserve_req *req, srv_error *err);
/* Reply body; *json_len < *len when binary outputs follow the JSON header (caller sets
 * Inference-Header-Content-Length to *json_len). An output requested with parameters.classification = k comes
 * back as Triton's classification extension has it: BYTES "value:index[:label]" entries, shape [rows, k] or [k]
 * (req->batch_first), in JSON or as length-prefixed binary data. */
char *srv_kserve_encode_infer(const srv_version_info *info, const srv_tensors *out, const srv_kserve_req *req,
                              size_t *len, size_t *json_len, srv_error *err);
/* Triton's max_batch_size of a version: batching's max_batch_size when batching is on; else, as Triton's ONNX
 * auto-complete says, SRV_KSERVE_AUTO_MAX_BATCH when dim 0 of every input and output is dynamic; else 0 (no
 * batch dimension). A classified output of a model with max_batch_size > 0 is classified per row. */
#define SRV_KSERVE_AUTO_MAX_BATCH 4
int64_t srv_kserve_max_batch(const srv_version_info *info, const srv_batch_opts *batching);
/* "FP32", "INT64", "BOOL", "BYTES", ... and back (UNDEFINED if unknown). */
const char *srv_kserve_dtype(eng_dtype dt);
eng_dtype srv_kserve_dtype_parse(const char *s);
/* Triton's repository index state of a version: "READY", "LOADING", "UNLOADING", "UNAVAILABLE". */
const char *srv_kserve_state(srv_state s);
/* TF's "DT_FLOAT", ... for metadata. */
const char *srv_tf_dtype(eng_dtype dt);

#endif
