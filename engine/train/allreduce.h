/* allreduce.h - the collective interface data-parallel training uses: `size` ranks, each calls allreduce with its
 * own buffer and gets the element-wise sum (or mean) of all ranks' buffers in place. Implementations:
 *  - threads of one process (allreduce.c): every rank thread uses the same handle with its own rank index;
 *  - MPI (comm-mpi.c, built when OpenMPI is found): the processes of MPI_COMM_WORLD, one rank per process, which
 *    passes its own rank (eng_comm_rank); NCCL (GPUs) implements the same interface with the CUDA backend;
 *  - the coordinator (rendezvous.c): processes started without mpirun (a Kubernetes indexed Job) joined over TCP
 *    through rank 0 at TENSORD_COORDINATOR; only for small things (metrics, flags, a communicator id), never
 *    gradients, which travel through the device backend's collectives (NCCL) or MPI.
 * Every rank calls the same sequence of collectives (as MPI and NCCL require).
 */
#ifndef ENG_ALLREDUCE_H
#define ENG_ALLREDUCE_H

#include <stdint.h>

#include "../ir/status.h"

typedef struct eng_comm eng_comm;

/* A communicator for `size` thread ranks; every rank thread uses the same handle with its own rank index. */
eng_status eng_comm_new_threads(int size, eng_comm **out);

/* 1 when this process was started by an MPI launcher (mpirun/mpiexec) with more than one rank, whether or not this
 * build has MPI (so that a build without it can refuse instead of training alone). */
int eng_comm_mpi_launched(void);
/* The MPI world (MPI_Init on first use). UNSUPPORTED, with a message, in a build without MPI. */
eng_status eng_comm_new_mpi(eng_comm **out);

/* Releases the communicator (MPI: MPI_Finalize, which waits for the other ranks; a rank that failed while the
 * others may wait in a collective must not call it: the program ends the job instead, see server/cli-train.c). */
void eng_comm_free(eng_comm **c);
int eng_comm_size(const eng_comm *c);
/* This process's rank (MPI); -1 for thread communicators, whose ranks pass their own index. */
int eng_comm_rank(const eng_comm *c);
const char *eng_comm_kind(const eng_comm *c); /* "threads", "mpi", "coordinator" */
/* Blocks until all ranks called it with the same n; buf becomes the mean over ranks (mean = 1) or the sum. */
eng_status eng_comm_allreduce(eng_comm *c, int rank, float *buf, int64_t n, int mean);
/* All ranks wait for each other. */
void eng_comm_barrier(eng_comm *c, int rank);
/* Every rank calls it with the same nbytes; rank 0's buf is copied into every other rank's (a communicator id). */
eng_status eng_comm_bcast(eng_comm *c, int rank, void *buf, size_t nbytes);

#endif
