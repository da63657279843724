/* test_train.c - training infrastructure that needs no model: the thread all-reduce (engine/train/allreduce.c) and
 * checkpoints (engine/train/train-ckpt.c).
 *
 * All-reduce: sums and means for 1..5 ranks and sizes that do and do not divide evenly (including n < ranks
 * and n = 0) against a reference summed in rank order, bit-identical across repeated runs whatever the thread
 * timing; back-to-back collectives on the same communicator; ranks that disagree on n fail on every rank.
 * Checkpoints: write -> read restores state, metrics, tensors and optimizer bytes exactly; a flipped byte, a
 * truncated file, a missing or resized tensor are each refused with a message; latest/prune pick by step.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/ir/file-io.h"
#include "engine/train/allreduce.h"
#include "engine/train/train-impl.h"

typedef struct ar_arg {
    eng_comm *c;
    int rank, mean, rounds;
    int64_t n;
    float *buf;
    eng_status st;
} ar_arg;

static float val(int rank, int64_t i, int round) { return (float)sin((double)(rank * 7919 + i * 31 + round)) * 1e3f + 0.1f * rank; }

static void *ar_thread(void *p) {
    ar_arg *a = p;
    for (int r = 0; r < a->rounds; r++) {
        for (int64_t i = 0; i < a->n; i++) a->buf[i] = val(a->rank, i, r);
        if (a->rank % 2) usleep(100 * (unsigned)a->rank); /* perturb arrival order */
        a->st = eng_comm_allreduce(a->c, a->rank, a->buf, a->n, a->mean);
        if (a->st != ENG_STATUS_OK) return NULL;
        eng_comm_barrier(a->c, a->rank);
    }
    return NULL;
}

/* runs `rounds` allreduces; returns rank 0's final buffer (malloc'd) and checks every rank got the same */
static float *run_ar(int R, int64_t n, int mean, int rounds) {
    eng_comm *c = NULL;
    cr_assert_eq(eng_comm_new_threads(R, &c), ENG_STATUS_OK);
    cr_assert_eq(eng_comm_size(c), R);
    pthread_t th[8];
    ar_arg a[8];
    for (int r = 0; r < R; r++) {
        a[r] = (ar_arg){c, r, mean, rounds, n, malloc((size_t)(n + 1) * sizeof(float)), ENG_STATUS_OK};
        pthread_create(&th[r], NULL, ar_thread, &a[r]);
    }
    for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < R; r++) {
        cr_assert_eq(a[r].st, ENG_STATUS_OK, "rank %d: %s", r, eng_last_error());
        cr_assert(memcmp(a[r].buf, a[0].buf, (size_t)n * sizeof(float)) == 0, "rank %d differs from rank 0", r);
    }
    for (int r = 1; r < R; r++) free(a[r].buf);
    eng_comm_free(&c);
    cr_assert_null(c);
    return a[0].buf;
}

Test(allreduce, sum_and_mean_match_rank_order_reference) {
    const int64_t sizes[] = {0, 1, 2, 3, 7, 64, 1000, 4097};
    for (int R = 1; R <= 5; R++)
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
            for (int mean = 0; mean <= 1; mean++) {
                int64_t n = sizes[si];
                float *got = run_ar(R, n, mean, 3);
                for (int64_t i = 0; i < n; i++) {
                    float s = val(0, i, 2);
                    for (int r = 1; r < R; r++) s += val(r, i, 2);
                    if (mean && R > 1) s *= 1.0f / (float)R;
                    cr_assert_eq(got[i], s, "R=%d n=%lld mean=%d i=%lld: %.9g vs %.9g", R, (long long)n, mean,
                                 (long long)i, got[i], s);
                }
                free(got);
            }
}

Test(allreduce, deterministic_across_runs) {
    float *a = run_ar(4, 10007, 1, 2);
    for (int k = 0; k < 5; k++) {
        float *b = run_ar(4, 10007, 1, 2);
        cr_assert(memcmp(a, b, 10007 * sizeof(float)) == 0, "run %d differs", k);
        free(b);
    }
    free(a);
}

typedef struct bad_arg {
    eng_comm *c;
    int rank;
    eng_status st;
} bad_arg;

static void *bad_thread(void *p) {
    bad_arg *a = p;
    float buf[8] = {0};
    a->st = eng_comm_allreduce(a->c, a->rank, buf, a->rank == 0 ? 4 : 5, 0);
    return NULL;
}

Test(allreduce, mismatched_sizes_fail_everywhere) {
    eng_comm *c = NULL;
    cr_assert_eq(eng_comm_new_threads(3, &c), ENG_STATUS_OK);
    pthread_t th[3];
    bad_arg a[3];
    for (int r = 0; r < 3; r++) {
        a[r] = (bad_arg){c, r, ENG_STATUS_OK};
        pthread_create(&th[r], NULL, bad_thread, &a[r]);
    }
    for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 3; r++) cr_assert_eq(a[r].st, ENG_STATUS_INVALID_ARGUMENT, "rank %d", r);
    cr_assert_eq(eng_comm_allreduce(c, 7, NULL, 0, 0), ENG_STATUS_INVALID_ARGUMENT);
    eng_comm_free(&c);
    cr_assert_eq(eng_comm_new_threads(0, &c), ENG_STATUS_INVALID_ARGUMENT);
}

/* ---- checkpoints ---- */

static char tmpdir[64];

static void mk_tmp(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/trainckpt-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
}

static void rm_tmp(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

static void fill_state(trn_state *s) {
    memset(s, 0, sizeof *s);
    s->epoch = 2;
    s->step_in_epoch = 17;
    s->global_step = 1234;
    eng_rng_seed(&s->rng, 99);
    s->ep_loss_sum = 12.5;
    s->ep_acc_sum = 3.25;
    s->ep_seconds = 1.75;
    s->ep_rows = 1088;
    s->best = 0.3125;
    s->best_epoch = 2;
    s->wait = 1;
    s->fingerprint = 0xdeadbeefcafef00dull;
    for (int e = 0; e < 2; e++) {
        trn_epoch ep = {e + 1, 1.0 / (e + 1), 0.5, NAN, 0.25, 1e-3, 1234.5, 9.75};
        cr_assert_eq(trn_state_add_epoch(s, &ep), ENG_STATUS_OK);
    }
    for (int i = 0; i < 300; i++) cr_assert_eq(trn_state_add_step(s, i + 1, 2.0 - i * 0.001), ENG_STATUS_OK);
}

Test(checkpoint, round_trip, .init = mk_tmp, .fini = rm_tmp) {
    trn_state s;
    fill_state(&s);
    float w1[6] = {1, 2, 3, 4, 5, 6}, w2[3] = {-1.5f, NAN, INFINITY};
    trn_ckpt_tensor t[2] = {{"dense/kernel", w1, 6}, {"bn/running_mean", w2, 3}};
    uint8_t opt[100];
    for (int i = 0; i < 100; i++) opt[i] = (uint8_t)(i * 13);
    char path[128];
    snprintf(path, sizeof path, "%s/ckpt-1234.bin", tmpdir);
    cr_assert_eq(trn_ckpt_write(path, &s, t, 2, opt, sizeof opt), ENG_STATUS_OK, "%s", eng_last_error());

    trn_state r;
    memset(&r, 0, sizeof r);
    float g1[6] = {0}, g2[3] = {0};
    trn_ckpt_tensor u[2] = {{"bn/running_mean", g2, 3}, {"dense/kernel", g1, 6}}; /* any order */
    void *ob = NULL;
    size_t ol = 0;
    cr_assert_eq(trn_ckpt_read(path, &r, u, 2, &ob, &ol), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert(memcmp(g1, w1, sizeof w1) == 0);
    cr_assert(memcmp(g2, w2, sizeof w2) == 0);
    cr_assert_eq(ol, sizeof opt);
    cr_assert(memcmp(ob, opt, ol) == 0);
    free(ob);
    cr_assert_eq(r.epoch, 2);
    cr_assert_eq(r.step_in_epoch, 17);
    cr_assert_eq(r.global_step, 1234);
    cr_assert(memcmp(&r.rng, &s.rng, sizeof r.rng) == 0);
    cr_assert_eq(r.ep_loss_sum, 12.5);
    cr_assert_eq(r.ep_rows, 1088);
    cr_assert_eq(r.best, 0.3125);
    cr_assert_eq(r.wait, 1);
    cr_assert_eq(r.fingerprint, s.fingerprint);
    cr_assert_eq(r.nepochs, 2);
    cr_assert_eq(r.epochs[1].loss, 0.5);
    cr_assert(isnan(r.epochs[0].val_loss));
    cr_assert_eq(r.nsteps, 300);
    cr_assert_eq(r.steps[299].step, 300);
    cr_assert_eq(r.steps[299].loss, s.steps[299].loss);

    /* wrong size / missing tensor */
    float h[5];
    trn_ckpt_tensor bad[2] = {{"dense/kernel", h, 5}, {"bn/running_mean", g2, 3}};
    cr_assert_eq(trn_ckpt_read(path, &r, bad, 2, &ob, &ol), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "dense/kernel") != NULL, "%s", eng_last_error());
    trn_ckpt_tensor extra[3] = {{"dense/kernel", g1, 6}, {"bn/running_mean", g2, 3}, {"other", h, 5}};
    cr_assert_eq(trn_ckpt_read(path, &r, extra, 3, &ob, &ol), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "other") != NULL, "%s", eng_last_error());

    /* corruption: flip one byte in the middle, then truncate */
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, len / 2, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, len / 2, SEEK_SET);
    fputc(ch ^ 0x40, f);
    fclose(f);
    cr_assert_eq(trn_ckpt_read(path, &r, u, 2, &ob, &ol), ENG_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(eng_last_error(), "CRC") != NULL, "%s", eng_last_error());
    cr_assert_eq(truncate(path, 30), 0);
    cr_assert_eq(trn_ckpt_read(path, &r, u, 2, &ob, &ol), ENG_STATUS_INVALID_ARGUMENT);
    trn_state_free(&s);
    trn_state_free(&r);
}

Test(checkpoint, latest_and_prune, .init = mk_tmp, .fini = rm_tmp) {
    trn_state s;
    fill_state(&s);
    float w[2] = {1, 2};
    trn_ckpt_tensor t = {"w", w, 2};
    char path[256];
    int found = 1;
    cr_assert_eq(trn_ckpt_latest(tmpdir, path, sizeof path, &found), ENG_STATUS_OK);
    cr_assert_eq(found, 0);
    const int steps[] = {5, 100, 20, 9};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/ckpt-%d.bin", tmpdir, steps[i]);
        cr_assert_eq(trn_ckpt_write(path, &s, &t, 1, NULL, 0), ENG_STATUS_OK);
    }
    cr_assert_eq(trn_ckpt_latest(tmpdir, path, sizeof path, &found), ENG_STATUS_OK);
    cr_assert_eq(found, 1);
    cr_assert(strstr(path, "/ckpt-100.bin") != NULL, "%s", path);
    trn_ckpt_prune(tmpdir, 2);
    snprintf(path, sizeof path, "%s/ckpt-20.bin", tmpdir);
    cr_assert_eq(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/ckpt-9.bin", tmpdir);
    cr_assert_neq(access(path, F_OK), 0);
    eng_file_remove_dir(tmpdir);
    cr_assert_neq(access(tmpdir, F_OK), 0);
    cr_assert_eq(mkdir(tmpdir, 0755), 0); /* for .fini */
    trn_state_free(&s);
}
