/* admin-http.h - the admin listener's JSON replies, shared by its route files (admin.c, jobs.c, datasets.c). */
#ifndef ADM_ADMIN_HTTP_H
#define ADM_ADMIN_HTTP_H

#include <microhttpd.h>

#include "server/srv.h"

/* Queue a JSON reply; body is malloc'd (taken) or NULL for an empty one; retry_after may be NULL. */
enum MHD_Result adm_send(struct MHD_Connection *c, int status, char *body, const char *retry_after);
/* {"error": msg} with status. */
enum MHD_Result adm_error(struct MHD_Connection *c, int status, const char *msg);
/* The HTTP status of a status code (400, 404, 409, 503, ...). */
int adm_http(srv_code c);
/* {"error": e->msg} with adm_http(e->code). */
enum MHD_Result adm_code(struct MHD_Connection *c, const srv_error *e);

#endif
