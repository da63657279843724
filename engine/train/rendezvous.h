/* rendezvous.h - how the processes of a multi-process training job find each other without mpirun (a Kubernetes
 * indexed Job, deploy/k8s/train-job.yaml): rank 0 listens at TENSORD_COORDINATOR (host:port), every other rank
 * connects there and says who it is, rank 0 checks them all and answers once the whole world has joined. The
 * result is an eng_comm (allreduce.h, kind "coordinator"): a star over those TCP connections, rank 0 in the middle,
 * for the small collectives a job needs besides its gradients (a communicator id broadcast, loss sums, the cancel
 * flag, barriers). It refuses large all-reduces: gradients only ever travel through the device backend's
 * collectives (NCCL) or MPI.
 *
 * Wire protocol (version 1; every integer is a big-endian uint32):
 *   hello  (rank k -> rank 0, on connect):  "TSRD" magic, protocol version, rank k, world size
 *   answer (rank 0 -> rank k, when all world-1 peers said hello, or at once when k's hello is wrong):
 *          "TSRA" magic, status (0 joined, else refused), message length (<= 1024), message bytes
 *   then collectives, each a frame: op (1 all-reduce, 2 barrier, 3 broadcast, 4 acknowledgement), status (0 ok,
 *   else the payload is an error message), payload length in bytes (<= ENG_COORD_MAX_BYTES), payload. All-reduce:
 *   every peer sends its floats (bit patterns), rank 0 sums rank 0, 1, ..., W-1 in that order and sends the result
 *   back; barrier: an all-reduce of nothing; broadcast: rank 0 sends its bytes, every peer acknowledges.
 * Rank 0 refuses a hello whose rank is out of range, already taken, or whose world size differs from its own: it
 * tells that peer why, logs it, and gives up the whole rendezvous (a misconfigured job cannot train). Connections
 * that do not speak the protocol (no magic within 10 s) are logged and dropped. Every read has a size limit and a
 * deadline: the rendezvous' timeout while joining, the operation timeout after.
 */
#ifndef ENG_RENDEZVOUS_H
#define ENG_RENDEZVOUS_H

#include "allreduce.h"

#define ENG_COORD_MAX_BYTES 65536 /* a coordinator collective's payload: metrics and ids, never gradients */

typedef struct eng_rdv_opts {
    int rank, world_size;
    char host[256];     /* rank 0's address (rank 0 itself listens on every interface) */
    int port;
    double timeout_s;   /* joining: connecting (with backoff), the hello and the answer; TENSORD_COORDINATOR_TIMEOUT */
    double op_timeout_s; /* each collective after joining (a step, a validation pass or a checkpoint may lie between) */
} eng_rdv_opts;

/* Fills o from TENSORD_RANK, TENSORD_WORLD_SIZE, TENSORD_COORDINATOR (host:port, [v6addr]:port) and
 * TENSORD_COORDINATOR_TIMEOUT (seconds, default 300; op_timeout_s is the larger of it and 1800). INVALID_ARGUMENT
 * naming the variable and its value when one is missing or wrong. */
eng_status eng_rdv_opts_from_env(eng_rdv_opts *o);

/* Joins the job described by o (blocks until every rank joined, or o->timeout_s); *out is a communicator of
 * o->world_size ranks in which this process is o->rank. Called from one thread; the communicator's collectives are
 * too (the trainer's main thread). eng_comm_free closes the connections. */
eng_status eng_comm_new_coordinator(const eng_rdv_opts *o, eng_comm **out);

#endif
