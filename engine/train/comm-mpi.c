/* comm-mpi.c - eng_comm over MPI_COMM_WORLD (allreduce.h): one rank per process, as `mpirun -np N tensord train`
 * starts them. Built when the Makefile finds OpenMPI (TENSORD_MPI); otherwise eng_comm_new_mpi refuses with a message.
 *
 * MPI is initialised on first use with MPI_THREAD_FUNNELED: only the thread that created the communicator calls MPI
 * (the trainer's main thread). MPI errors keep MPI's default handler (fatal: the launcher ends every rank), so a
 * broken peer never leaves a rank waiting. Means are sums scaled by 1/size after the reduce, in float, as the
 * thread communicator does. eng_comm_bcast is MPI_Bcast from rank 0 (the device communicator's id, train-device.c).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "allreduce-impl.h"

/* The launchers' environment: OpenMPI (mpirun), MPICH/hydra and PMIx-based ones. */
int eng_comm_mpi_launched(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", NULL};
    for (int i = 0; vars[i]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 1) return 1;
    }
    return 0;
}

#ifdef TENSORD_MPI
#include <mpi.h>

typedef struct comm_mpi {
    eng_comm base;
    int inited_here; /* this communicator called MPI_Init, so its free calls MPI_Finalize */
} comm_mpi;

static eng_status mpi_allreduce(eng_comm *c, int rank, float *buf, int64_t n, int mean) {
    (void)rank;
    for (int64_t off = 0; off < n;) { /* MPI counts are int */
        int k = n - off > INT_MAX ? INT_MAX : (int)(n - off);
        int rc = MPI_Allreduce(MPI_IN_PLACE, buf + off, k, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) {
            char msg[MPI_MAX_ERROR_STRING];
            int len = 0;
            MPI_Error_string(rc, msg, &len);
            return eng_err(ENG_STATUS_INTERNAL, "MPI_Allreduce of %d floats failed: %s", k, msg);
        }
        off += k;
    }
    if (mean) {
        float inv = 1.0f / (float)c->size;
        for (int64_t i = 0; i < n; i++) buf[i] *= inv;
    }
    return ENG_STATUS_OK;
}

static void mpi_barrier(eng_comm *c, int rank) {
    (void)c, (void)rank;
    MPI_Barrier(MPI_COMM_WORLD);
}

static eng_status mpi_bcast(eng_comm *c, int rank, void *buf, size_t nbytes) {
    (void)c, (void)rank;
    if (nbytes > INT_MAX) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "MPI_Bcast of %zu bytes: more than MPI counts", nbytes);
    int rc = MPI_Bcast(buf, (int)nbytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        return eng_err(ENG_STATUS_INTERNAL, "MPI_Bcast of %zu bytes from rank 0 failed: %s", nbytes, msg);
    }
    return ENG_STATUS_OK;
}

static void mpi_free(eng_comm *cc) {
    comm_mpi *c = (comm_mpi *)cc;
    int fin = 0;
    if (c->inited_here && MPI_Finalized(&fin) == MPI_SUCCESS && !fin) MPI_Finalize();
    free(c);
}

static const eng_comm_ops mpi_ops = {
    .kind = "mpi", .allreduce = mpi_allreduce, .barrier = mpi_barrier, .bcast = mpi_bcast, .free = mpi_free};

eng_status eng_comm_new_mpi(eng_comm **out) {
    *out = NULL;
    int inited = 0, here = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return eng_err(ENG_STATUS_INTERNAL, "MPI_Init_thread failed");
        here = 1;
    }
    comm_mpi *c = calloc(1, sizeof *c);
    if (!c) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "out of memory");
    c->base.ops = &mpi_ops;
    c->inited_here = here;
    MPI_Comm_size(MPI_COMM_WORLD, &c->base.size);
    MPI_Comm_rank(MPI_COMM_WORLD, &c->base.rank);
    *out = &c->base;
    return ENG_STATUS_OK;
}

#else

eng_status eng_comm_new_mpi(eng_comm **out) {
    *out = NULL;
    return eng_err(ENG_STATUS_UNSUPPORTED, "this tensord was built without MPI (install libopenmpi-dev, i.e. make deps, "
                                           "and rebuild): it cannot train as one rank of an mpirun job");
}

#endif
