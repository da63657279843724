/* allreduce.h - the collective interface data-parallel training uses: R ranks, each calls allreduce with its
 * own buffer and gets the element-wise sum (or mean) of all ranks' buffers in place. The CPU implementation
 * runs ranks as threads of one process; NCCL (GPUs) and MPI (hosts) implement the same interface later.
 */
#ifndef ENG_ALLREDUCE_H
#define ENG_ALLREDUCE_H

#include <stdint.h>

#include "../ir/status.h"

typedef struct eng_comm eng_comm;

/* A communicator for `size` thread ranks; every rank thread uses the same handle with its own rank index. */
eng_status eng_comm_new_threads(int size, eng_comm **out);
void eng_comm_free(eng_comm **c);
int eng_comm_size(const eng_comm *c);
/* Blocks until all ranks called it with the same n; buf becomes the mean over ranks (mean = 1) or the sum. */
eng_status eng_comm_allreduce(eng_comm *c, int rank, float *buf, int64_t n, int mean);
/* All ranks wait for each other. */
void eng_comm_barrier(eng_comm *c, int rank);

#endif
