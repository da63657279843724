/* admin-http.c - the admin listener's JSON replies (admin-http.h), shared by its route files. */
#include "admin/admin-http.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

enum MHD_Result adm_send(struct MHD_Connection *c, int status, char *body, const char *retry_after) {
    size_t n = body ? strlen(body) : 0;
    struct MHD_Response *r = MHD_create_response_from_buffer(n, body ? body : (char *)"", body ? MHD_RESPMEM_MUST_FREE
                                                                                                : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (retry_after) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, retry_after);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result adm_error(struct MHD_Connection *c, int status, const char *msg) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", msg);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return adm_send(c, status, s, status == 429 || status == 503 ? "1" : NULL);
}

int adm_http(srv_code c) {
    switch (c) {
    case SRV_OK: return 200;
    case SRV_INVALID_ARGUMENT: case SRV_FAILED_PRECONDITION: case SRV_OUT_OF_RANGE: return 400;
    case SRV_NOT_FOUND: return 404;
    case SRV_ALREADY_EXISTS: case SRV_ABORTED: return 409;
    case SRV_PERMISSION_DENIED: return 403;
    case SRV_UNAUTHENTICATED: return 401;
    case SRV_RESOURCE_EXHAUSTED: return 429;
    case SRV_UNAVAILABLE: return 503;
    case SRV_DEADLINE_EXCEEDED: return 504;
    case SRV_UNIMPLEMENTED: return 501;
    default: return 500;
    }
}

enum MHD_Result adm_code(struct MHD_Connection *c, const srv_error *e) {
    return adm_error(c, adm_http(e->code == SRV_OK ? SRV_INTERNAL : e->code), e->msg);
}
