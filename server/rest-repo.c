/* rest-repo.c - Triton's model repository extension, its control half: POST /v2/repository/models/{m}/load and
 * POST /v2/repository/models/{m}/unload (the index, POST /v2/repository/index, is rest-kserve.c's).
 *
 * Rules, in the order they are checked:
 *   - POST only (405 naming POST).
 *   - With an admin token configured, "Authorization: Bearer <token>" is required: missing or wrong is 401 with
 *     a JSON error. The comparison takes the same time wherever the first difference is.
 *   - Only with --model_control_mode=explicit: otherwise 503 with Triton's words ("explicit model load / unload
 *     is not allowed if polling is enabled"), as Triton answers in its poll and none modes.
 *   - Body: empty or a JSON object whose optional "parameters" object may hold Triton's "unload_dependents"
 *     (accepted; tensord has no ensembles). Triton's "config" and "file:<path>" overrides are refused (400): a
 *     model's config comes from --model_config_file and its files from its base path.
 * A load re-reads the model's base path and returns once its loads ended (each bounded by
 * --model_load_timeout_seconds), so both calls run on a REST worker thread, never on an HTTP polling thread.
 * Replies: 200 {} on success; a failed load (also an unreadable base path) is 400 with the reason, a model
 * that is not configured 404 (Triton answers 400 for both; 404 lets a client tell them apart).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "rest-impl.h"

#define REPO_PREFIX "/v2/repository/models/"

typedef struct repo_job {
    srv_rest_job job; /* first: the REST server sees only this */
    srv_registry *reg;
    int unload;
    char model[256];
} repo_job;

/* unknown: the model is not configured (404); any other failure of a configured model is 400, as Triton. */
static void repo_reply(srv_reply *o, srv_code c, int unknown, const srv_error *err) {
    if (c == SRV_OK) {
        srv_buf b = {0};
        srv_buf_puts(&b, "{}");
        srv_reply_buf(o, 200, &b);
        return;
    }
    int status = c == SRV_UNAVAILABLE ? 503 : c == SRV_UNAUTHENTICATED ? 401 : unknown ? 404 : 400;
    srv_reply_error(o, status, err->msg);
}

static void repo_do(srv_registry *reg, int unload, const char *model, srv_reply *o) {
    srv_error err = {0};
    srv_code c = unload ? srv_registry_unload_model(reg, model, &err) : srv_registry_load_model(reg, model, &err);
    repo_reply(o, c, c == SRV_NOT_FOUND && !srv_registry_has_model(reg, model), &err);
}

static void repo_run(srv_rest_job *job, srv_reply *o) {
    repo_job *j = (repo_job *)job;
    repo_do(j->reg, j->unload, j->model, o);
    free(j);
}

/* The request body: empty, or an object with an optional "parameters" object. */
static srv_code repo_body(const srv_rest_req *q, const char *model, int unload, srv_error *err) {
    if (!q->body || q->len == 0) return SRV_OK;
    cJSON *root = srv_json_parse(q->body, q->len, err);
    if (!root) return SRV_INVALID_ARGUMENT;
    srv_code c = SRV_OK;
    const cJSON *params = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "parameters") : NULL;
    if (!cJSON_IsObject(root))
        c = srv_err(err, SRV_INVALID_ARGUMENT, "the %s request body must be a JSON object", unload ? "unload" : "load");
    else if (params && !cJSON_IsObject(params))
        c = srv_err(err, SRV_INVALID_ARGUMENT, "'parameters' must be a JSON object");
    for (const cJSON *k = params ? params->child : NULL; c == SRV_OK && k; k = k->next) {
        if (unload && strcmp(k->string, "unload_dependents") == 0 && !cJSON_IsBool(k))
            c = srv_err(err, SRV_INVALID_ARGUMENT, "parameter 'unload_dependents' must be true or false");
        else if (!unload && (strcmp(k->string, "config") == 0 || strncmp(k->string, "file:", 5) == 0))
            c = srv_err(err, SRV_INVALID_ARGUMENT,
                        "model '%s': load parameter '%.200s' is not supported (the config comes from "
                        "--model_config_file, the files from the model's base path)",
                        model, k->string);
    }
    cJSON_Delete(root);
    return c;
}

int srv_rest_repo(const srv_rest_req *q, srv_reply *o) {
    if (strncmp(q->path, REPO_PREFIX, sizeof REPO_PREFIX - 1) != 0) return 0;
    char segs[2][256];
    int n = srv_rest_split(q->path + sizeof REPO_PREFIX - 1, segs, 2);
    if (n != 2 || (strcmp(segs[1], "load") != 0 && strcmp(segs[1], "unload") != 0)) return 0;
    int unload = segs[1][0] == 'u';
    srv_rest *r = q->r;
    srv_error err = {0};
    if (strcmp(q->method, "POST") != 0) {
        o->allow = "POST";
        srv_reply_error(o, 405, "method not allowed: use POST");
        return 1;
    }
    if (r->admin_token && !srv_bearer_ok(q->authorization, r->admin_token)) {
        srv_err(&err, SRV_UNAUTHENTICATED, "model %s needs the admin token: send 'Authorization: Bearer <token>' (%s)",
                unload ? "unload" : "load", q->authorization ? "the token given is wrong" : "none was given");
        repo_reply(o, SRV_UNAUTHENTICATED, 0, &err);
        return 1;
    }
    if (!r->explicit_control) {
        srv_err(&err, SRV_UNAVAILABLE,
                "explicit model load / unload is not allowed if polling is enabled: start tensord with "
                "--model_control_mode=explicit to load and unload models on request");
        repo_reply(o, SRV_UNAVAILABLE, 0, &err);
        return 1;
    }
    if (!srv_name_valid(segs[0])) {
        srv_err(&err, SRV_INVALID_ARGUMENT, "model name '%.200s' is invalid: use [A-Za-z0-9_.-]", segs[0]);
        repo_reply(o, SRV_INVALID_ARGUMENT, 0, &err);
        return 1;
    }
    srv_code c = repo_body(q, segs[0], unload, &err);
    if (c != SRV_OK) {
        repo_reply(o, c, 0, &err);
        return 1;
    }
    repo_job *j = q->defer ? calloc(1, sizeof *j) : NULL;
    if (!j) { /* already on a worker (or out of memory): run it here */
        repo_do(r->reg, unload, segs[0], o);
        return 1;
    }
    j->job.run = repo_run;
    j->reg = r->reg;
    j->unload = unload;
    snprintf(j->model, sizeof j->model, "%s", segs[0]);
    *q->defer = &j->job;
    return 1;
}
