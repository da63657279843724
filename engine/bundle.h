/* bundle.h - the model bundle on disk, the one place that knows its layout: which names under a base path are
 * versions, where a version's files live, how a new version is written and published, and the signature.json
 * text the writers (`tensord train`, `tensord init`) put in it.
 *
 * Layout (TF Serving's): <base>/<n>/model.onnx, optional <n>/signature.json (read by server/bundle.c, which
 * documents its keys), other files beside them (metrics.json, zoo.json, labels, assets.extra/warmup.jsonl).
 * Invariants:
 *  - A version name is a plain positive decimal integer that fits int64: digits only, no sign, no leading zero.
 *    Every other name ("007", "+3", "3.bak", ".tmp-3-123", ".train-3", "logs") is not a version, for the server
 *    and the trainer alike, so a writer's half-built directory is never read as one.
 *  - Writers build a version in <base>/.tmp-<n>-<pid>/ and publish it with one rename() that never replaces an
 *    existing <base>/<n> (not even an empty one): readers see a complete version or none.
 * Nothing here keeps state; every function is safe to call from any thread. Errors are eng_status with an
 * eng_err message naming the path.
 */
#ifndef ENG_BUNDLE_H
#define ENG_BUNDLE_H

#include <stddef.h>
#include <stdint.h>

#include "ir/graph.h"
#include "ir/status.h"

#define ENG_BUNDLE_MODEL_FILE "model.onnx"
#define ENG_BUNDLE_SIGNATURE_FILE "signature.json"

/* 1 and *version set if name is a version name (see above), else 0 (*version untouched). */
int eng_bundle_parse_version(const char *name, int64_t *version);

/* The versions under base, highest first: entries whose name is a version name and that are directories
 * (symlinks followed). *versions is malloc'd (NULL when *n is 0; free()). NOT_FOUND naming base when it cannot
 * be read. Cost: one readdir pass and one stat per version-named entry. */
eng_status eng_bundle_scan(const char *base, int64_t **versions, int *n);
/* The highest version under base, 0 if there is none. Errors as eng_bundle_scan. */
eng_status eng_bundle_latest(const char *base, int64_t *version);

/* "<base>/<version>" (file NULL) or "<base>/<version>/<file>" into buf; INVALID_ARGUMENT naming base when it
 * does not fit in cap bytes. */
eng_status eng_bundle_path(char *buf, size_t cap, const char *base, int64_t version, const char *file);

/* ---- writing a new version ---- */

/* Start version `version` under the existing directory base: refuses (IO, naming it) when <base>/<version>
 * already exists, removes a stale <base>/.tmp-<version>-<pid>/ left by this process, creates it empty and
 * puts its path in tmp (cap bytes). The caller writes the version's files into tmp (flat: no subdirectories
 * are synced), then calls eng_bundle_publish; on any failure of its own it removes tmp with
 * eng_file_remove_dir (ir/file-io.h). */
eng_status eng_bundle_stage(const char *base, int64_t version, char *tmp, size_t cap);
/* Publish the staged tmp as <base>/<version>: fsync every entry in tmp, then tmp itself, rename() it to
 * <base>/<version> without replacing anything (RENAME_NOREPLACE; where the filesystem lacks it, a check then
 * rename), then fsync base. An existing <base>/<version> is left untouched and is an IO error naming it. On
 * failure before the rename tmp is left in place for the caller to remove; once renamed there is no tmp. */
eng_status eng_bundle_publish(const char *base, int64_t version, const char *tmp);

/* ---- signature.json written by tensord ---- */

/* serving_default with every graph input and output under its ONNX name, with its dtype and shape, and
 * method_name "tensorflow/serving/predict". malloc'd text (free()); NULL when out of memory. */
char *eng_bundle_sig_from_graph(const eng_graph *g);
/* signature.json for a version derived from version `from` of base (training): from's signature.json when it
 * exists (it must hold a JSON object; anything else is INVALID_ARGUMENT naming the file), else {}, with its
 * "preprocessing" key set to the JSON text `preprocessing` (kept as a string when it does not parse).
 * *json is malloc'd (free()). */
eng_status eng_bundle_sig_derive(const char *base, int64_t from, const char *preprocessing, char **json);

#endif
