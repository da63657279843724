/* rest-repo.c - Triton's model repository extension: POST /v2/repository/models/{m}/load and .../unload. */
#include "rest-impl.h"

int srv_rest_repo(const srv_rest_req *q, srv_reply *o) {
    (void)q;
    (void)o;
    return 0;
}
