/* admin-ops.h - the call table the server hands the admin room (admin/admin.h), over the registry. */
#ifndef SRV_ADMIN_OPS_H
#define SRV_ADMIN_OPS_H

#include "admin/admin.h"
#include "registry.h"

typedef struct srv_admin_ctx {
    srv_registry *reg;
    const char *model_root; /* --model_root: base paths must resolve inside it (NULL: any) */
} srv_admin_ctx;

adm_ops srv_admin_ops(srv_admin_ctx *a);

#endif
