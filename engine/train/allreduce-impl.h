/* allreduce-impl.h - what a communicator implementation provides (allreduce.h). Not part of the interface. */
#ifndef ENG_ALLREDUCE_IMPL_H
#define ENG_ALLREDUCE_IMPL_H

#include "allreduce.h"

typedef struct eng_comm_ops {
    const char *kind;
    eng_status (*allreduce)(eng_comm *c, int rank, float *buf, int64_t n, int mean);
    void (*barrier)(eng_comm *c, int rank);
    eng_status (*bcast)(eng_comm *c, int rank, void *buf, size_t nbytes); /* from rank 0; size > 1 */
    void (*free)(eng_comm *c);            /* releases c itself */
} eng_comm_ops;

/* The first member of every implementation's struct. */
struct eng_comm {
    const eng_comm_ops *ops;
    int size;
    int rank; /* -1: ranks are threads passing their index */
};

#endif
