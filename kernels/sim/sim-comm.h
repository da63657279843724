/* sim-comm.h - the sim backend's collectives (sim-comm.c), for sim-backend.c's hook table. */
#ifndef KRN_SIM_COMM_H
#define KRN_SIM_COMM_H

#include "../kernel.h"

eng_status sim_comm_new(int n, const int *devices, krn_comm **out);
eng_status sim_comm_allreduce(krn_comm *cm, int rank, krn_ctx *c, float *buf, size_t n, float prescale);
void sim_comm_free(krn_comm *cm);
eng_status sim_comm_id_new(krn_comm_id *id);
eng_status sim_comm_new_ranks(const krn_comm_id *id, int nranks, int first, int nlocal, const int *devices,
                              krn_comm **out);

#endif
