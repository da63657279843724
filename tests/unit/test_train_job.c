/* test_train_job.c - eng_train's job-queue contract (engine/train/train.h): an explicit new_version, the progress
 * callback and the cancel flag, on a small zoo MLP trained on a CSV file.
 *
 * Checked: the report sequence (START once before any step, a STEP per optimizer step with step/global_step counting
 * up, an EPOCH after each epoch's validation, with NaN exactly where a value is not computed); new_version writes
 * that version (checkpoints and logs under its number) and an existing <base>/<new_version> is refused, naming the
 * directory, with nothing written; a cancel seen between steps stops the run at the next step with
 * ENG_STATUS_CANCELLED and "cancelled", writes no version, keeps the checkpoint directory, and a resume from it
 * reports where it resumed and completes; a cancel set before the run starts writes nothing at all. Loss scaling:
 * dynamic scaling at 2^15 writes bit-identical weights to no scaling; a scale grown past FLT_MAX makes steps overflow,
 * which are skipped and counted (result and metrics.json).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/ir/onnx.h"
#include "engine/train/loss-scale.h"
#include "engine/train/train.h"
#include "models/build.c"
#include "models/mlp-cnn.c"
#include "models/resnet.c"
#include "models/transformer.c"
#include "models/two-tower.c"
#include "models/vit.c"
#include "models/zoo.c"

#define N_EXAMPLES 64
#define N_FEATURES 8
#define N_CLASSES 3
#define MAX_EVENTS 256

static char tmpdir[64], base[128], data[128];

/* <tmp>/m/1: a zoo MLP 8 -> 16 -> 3; <tmp>/d.csv: 64 separable examples */
static void setup(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/trainjob-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir));
    snprintf(base, sizeof base, "%s/m", tmpdir);
    char v1[160], model[192];
    snprintf(v1, sizeof v1, "%s/1", base);
    cr_assert_eq(mkdir(base, 0755), 0);
    cr_assert_eq(mkdir(v1, 0755), 0);
    mdl_opt opts[] = {{"input", "8"}, {"hidden", "16"}, {"classes", "3"}};
    eng_graph *g = NULL;
    cr_assert_eq(mdl_build("mlp", opts, 3, 1, &g), ENG_STATUS_OK, "%s", eng_last_error());
    snprintf(model, sizeof model, "%s/model.onnx", v1);
    cr_assert_eq(eng_onnx_save_file(g, model, (size_t)1 << 30), ENG_STATUS_OK, "%s", eng_last_error());
    eng_graph_free(&g);
    snprintf(data, sizeof data, "%s/d.csv", tmpdir);
    FILE *f = fopen(data, "w");
    cr_assert_not_null(f);
    for (int j = 0; j < N_FEATURES; j++) fprintf(f, "f%d,", j);
    fprintf(f, "label\n");
    for (int i = 0; i < N_EXAMPLES; i++) {
        int y = i % N_CLASSES;
        for (int j = 0; j < N_FEATURES; j++) fprintf(f, "%g,", (j % N_CLASSES == y ? 1.0 : 0.0) + 0.1 * sin(i * 7 + j));
        fprintf(f, "%d\n", y);
    }
    cr_assert_eq(fclose(f), 0);
}

static void teardown(void) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    cr_assert_eq(system(cmd), 0);
}

typedef struct recorder {
    eng_train_progress ev[MAX_EVENTS];
    int n;
    atomic_int cancel;
    int64_t cancel_at; /* set cancel once a STEP reports this global step (0: never) */
} recorder;

static void record(void *arg, const eng_train_progress *p) {
    recorder *r = arg;
    cr_assert_lt(r->n, MAX_EVENTS);
    r->ev[r->n++] = *p;
    if (r->cancel_at > 0 && p->kind == ENG_TRAIN_PROGRESS_STEP && p->global_step == r->cancel_at)
        atomic_store(&r->cancel, 1);
}

static const char *files[1];

static eng_train_opts opts(recorder *r) {
    files[0] = data;
    eng_train_opts o = {
        .model_base_path = base,
        .data_files = files,
        .ndata = 1,
        .val_split = 0.25, /* 48 train, 16 validation */
        .epochs = 2,
        .batch_size = 8,   /* 6 steps per epoch */
        .optim = {.kind = ENG_OPTIM_ADAM, .lr = 0.01f},
        .loss = ENG_LOSS_SPARSE_CCE,
        .from_logits = -1,
        .nthreads = 1,
        .replicas = 1,
        .seed = 5,
        .monitor = "val_loss",
        .on_progress = record,
        .progress_arg = r,
        .cancel = &r->cancel,
    };
    return o;
}

static int exists(const char *rel) {
    char p[256];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", base, rel);
    return lstat(p, &sb) == 0;
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

TestSuite(train_job, .init = setup, .fini = teardown);

Test(train_job, reports_start_steps_and_epochs_in_order) {
    recorder *r = calloc(1, sizeof *r);
    eng_train_opts o = opts(r);
    eng_train_result res;
    cr_assert_eq(eng_train(&o, &res), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(res.version, 2);
    cr_assert_eq(r->n, 1 + 12 + 2, "events: %d", r->n);
    const eng_train_progress *s = &r->ev[0];
    cr_assert_eq(s->kind, ENG_TRAIN_PROGRESS_START);
    cr_assert_eq(s->version, 2);
    cr_assert_eq(s->global_step, 0);
    cr_assert_eq(s->resumed_from_step, 0);
    cr_assert_eq(s->examples, 48);
    cr_assert_eq(s->val_examples, 16);
    cr_assert_eq(s->steps_per_epoch, 6);
    cr_assert_eq(s->epochs, 2);
    cr_assert(isnan(s->loss) && isnan(s->eta_s) && isnan(s->val_loss));
    int64_t g = 0;
    for (int e = 1; e <= 2; e++) {
        for (int k = 1; k <= 6; k++) {
            const eng_train_progress *p = &r->ev[(e - 1) * 7 + k];
            cr_assert_eq(p->kind, ENG_TRAIN_PROGRESS_STEP, "event %d", (e - 1) * 7 + k);
            cr_assert_eq(p->epoch, e);
            cr_assert_eq(p->step, k);
            cr_assert_eq(p->global_step, ++g);
            cr_assert(isfinite(p->loss) && p->loss > 0, "loss %g", p->loss);
            cr_assert(p->accuracy >= 0 && p->accuracy <= 1, "accuracy %g", p->accuracy);
            cr_assert(isnan(p->val_loss) && isnan(p->val_accuracy));
            cr_assert(isfinite(p->eta_s) && p->eta_s >= 0, "eta %g", p->eta_s);
            cr_assert(p->examples_per_sec > 0);
            cr_assert_float_eq(p->learning_rate, 0.01, 1e-7);
        }
        const eng_train_progress *p = &r->ev[e * 7];
        cr_assert_eq(p->kind, ENG_TRAIN_PROGRESS_EPOCH);
        cr_assert_eq(p->epoch, e);
        cr_assert_eq(p->step, 6);
        cr_assert_eq(p->global_step, 6 * e);
        cr_assert(isfinite(p->val_loss) && p->val_accuracy >= 0 && p->val_accuracy <= 1);
        cr_assert_eq(p->early_stop, 0);
    }
    cr_assert_eq(r->ev[14].eta_s, 0, "nothing left after the last epoch");
    cr_assert_eq(r->ev[14].loss, res.loss);
    cr_assert_eq(r->ev[14].val_accuracy, res.val_accuracy);
    free(r);
}

Test(train_job, explicit_new_version_is_written_and_an_existing_one_refused) {
    recorder *r = calloc(1, sizeof *r);
    eng_train_opts o = opts(r);
    o.new_version = 7;
    o.checkpoint_every = 2;
    eng_train_result res;
    cr_assert_eq(eng_train(&o, &res), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(res.version, 7);
    cr_assert(exists("7/model.onnx") && exists("7/metrics.json") && exists("logs/7"));
    cr_assert(!exists("2") && !exists(".train-7"), "a finished run's checkpoints are removed");
    cr_assert_eq(r->ev[0].version, 7);

    /* 7 and 1 exist now: both refused before anything is written; so is a plain file with a version name */
    char nine[160];
    snprintf(nine, sizeof nine, "%s/9", base);
    FILE *f = fopen(nine, "w");
    cr_assert_not_null(f);
    fclose(f);
    const int64_t taken[] = {7, 1, 9};
    for (int i = 0; i < 3; i++) {
        r->n = 0;
        o.new_version = taken[i];
        char want[160];
        snprintf(want, sizeof want, "%s/%lld'", base, (long long)taken[i]);
        cr_assert_eq(eng_train(&o, &res), ENG_STATUS_INVALID_ARGUMENT);
        cr_assert(strstr(eng_last_error(), "new_version") && strstr(eng_last_error(), want), "%s", eng_last_error());
        cr_assert_eq(r->n, 0, "no progress before the refusal");
    }
    char logs[160];
    snprintf(logs, sizeof logs, "%s/logs", base);
    cr_assert_eq(count_entries(base), 4, "1, 7, 9 and logs only"); /* no .train-N, no .tmp-N */
    cr_assert_eq(count_entries(logs), 1, "only logs/7");
    o.new_version = -1;
    cr_assert_eq(eng_train(&o, &res), ENG_STATUS_INVALID_ARGUMENT);
    free(r);
}

Test(train_job, cancel_stops_at_the_next_step_and_resume_continues) {
    recorder *r = calloc(1, sizeof *r);
    eng_train_opts o = opts(r);
    o.checkpoint_every = 2;
    r->cancel_at = 3;
    eng_train_result res;
    cr_assert_eq(eng_train(&o, &res), ENG_STATUS_CANCELLED);
    cr_assert_str_eq(eng_last_error(), "cancelled");
    cr_assert_str_eq(eng_status_name(ENG_STATUS_CANCELLED), "CANCELLED");
    const eng_train_progress *last = &r->ev[r->n - 1];
    cr_assert_eq(last->kind, ENG_TRAIN_PROGRESS_STEP);
    cr_assert_eq(last->global_step, 3, "stopped at the step boundary after the cancel");
    cr_assert(!exists("2"), "no version written");
    cr_assert(exists(".train-2/ckpt-2.bin"), "the checkpoint directory is kept");
    cr_assert(!exists(".train-2/ckpt-4.bin"));

    /* resume from it: START says where, and the run completes */
    r->n = 0;
    r->cancel_at = 0;
    atomic_store(&r->cancel, 0);
    o.resume = 1;
    cr_assert_eq(eng_train(&o, &res), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(r->ev[0].kind, ENG_TRAIN_PROGRESS_START);
    cr_assert_eq(r->ev[0].resumed_from_step, 2);
    cr_assert_eq(r->ev[0].global_step, 2);
    cr_assert_eq(r->ev[1].global_step, 3);
    cr_assert_eq(r->ev[1].step, 3);
    cr_assert_eq(res.steps, 12);
    cr_assert(exists("2/model.onnx") && !exists(".train-2"));
    free(r);
}

Test(train_job, cancel_before_the_first_step_writes_nothing) {
    recorder *r = calloc(1, sizeof *r);
    eng_train_opts o = opts(r);
    atomic_store(&r->cancel, 1);
    eng_train_result res;
    cr_assert_eq(eng_train(&o, &res), ENG_STATUS_CANCELLED);
    cr_assert_eq(r->n, 0);
    cr_assert_eq(count_entries(base), 1, "only version 1");
    free(r);
}

/* 1 when every float initializer of <base>/<v>/model.onnx equals <base>/<w>'s bit for bit. */
static int same_weights(int64_t v, int64_t w) {
    char pa[192], pb[192];
    snprintf(pa, sizeof pa, "%s/%lld/model.onnx", base, (long long)v);
    snprintf(pb, sizeof pb, "%s/%lld/model.onnx", base, (long long)w);
    eng_graph *a = NULL, *b = NULL;
    cr_assert_eq(eng_onnx_load_file(pa, &a), ENG_STATUS_OK, "%s", eng_last_error());
    cr_assert_eq(eng_onnx_load_file(pb, &b), ENG_STATUS_OK, "%s", eng_last_error());
    int same = 1, compared = 0;
    for (int i = 0; i < a->nvalues; i++) {
        const eng_tensor *t = a->values[i].init;
        if (!t || t->dtype != ENG_DTYPE_F32) continue;
        int j = eng_graph_find_value(b, a->values[i].name);
        cr_assert(j >= 0 && b->values[j].init);
        same &= memcmp(t->data, b->values[j].init->data, eng_tensor_nbytes(t)) == 0;
        compared++;
    }
    cr_assert_gt(compared, 0);
    eng_graph_free(&a);
    eng_graph_free(&b);
    return same;
}

/* Dynamic loss scaling at a power of two changes nothing where nothing overflows: the same weights as no scaling. */
Test(train_job, dynamic_loss_scaling_without_overflow_gives_the_same_weights) {
    recorder *r = calloc(1, sizeof *r);
    eng_train_opts o = opts(r);
    eng_train_result res;
    o.base_version = 1; /* not "the latest", which the first run changes */
    o.new_version = 2;
    cr_assert_eq(eng_train(&o, &res), ENG_STATUS_OK, "%s", eng_last_error());
    cr_expect_eq(res.loss_scale, 1.0);
    o.new_version = 3;
    o.loss_scale = ENG_LOSS_SCALE_DYNAMIC + 1;
    cr_assert_eq(eng_train(&o, &res), ENG_STATUS_OK, "%s", eng_last_error());
    cr_expect_eq(res.skipped_steps, 0);
    cr_expect_eq(res.loss_scale, 32768.0);
    cr_expect(same_weights(2, 3), "loss scaling by 2^15 changed the trained weights");
    free(r);
}

/* Growth every step from 2^120: the scale passes FLT_MAX within 8 steps, those steps overflow and are skipped
 * (the scale halves back); training still ends with a finite loss, and metrics.json says how many were skipped. */
Test(train_job, overflowing_steps_are_skipped_and_counted) {
    recorder *r = calloc(1, sizeof *r);
    eng_train_opts o = opts(r);
    eng_train_result res;
    o.base_version = 1;
    o.new_version = 2;
    o.epochs = 4; /* 24 steps */
    o.loss_scale = ENG_LOSS_SCALE_DYNAMIC + 1;
    o.loss_scale_init = 0x1p120;
    o.loss_scale_growth_steps = 1;
    cr_assert_eq(eng_train(&o, &res), ENG_STATUS_OK, "%s", eng_last_error());
    cr_expect_geq(res.skipped_steps, 2, "skipped %lld", (long long)res.skipped_steps);
    cr_expect_leq(res.loss_scale, 0x1p128);
    cr_expect(isfinite(res.loss));
    cr_expect_eq(res.steps, 24, "skipped steps still consume their batch");
    char path[192], buf[8192];
    snprintf(path, sizeof path, "%s/2/metrics.json", base);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    size_t nb = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[nb] = 0;
    const char *k = strstr(buf, "\"skipped_steps\":"), *m = strstr(buf, "\"loss_scale\":");
    cr_assert(k && m, "metrics.json lacks loss_scale / skipped_steps:\n%s", buf);
    cr_expect_eq(strtoll(k + strlen("\"skipped_steps\":"), NULL, 10), res.skipped_steps);
    m += strlen("\"loss_scale\":");
    while (*m == ' ' || *m == '\t') m++;
    cr_expect(!strncmp(m, "\"dynamic\"", 9), "settings.loss_scale: %.20s", m);
    /* the same weights as no scaling? no: skipped updates change the run */
    o.new_version = 3;
    o.loss_scale = 0;
    cr_assert_eq(eng_train(&o, &res), ENG_STATUS_OK, "%s", eng_last_error());
    cr_expect(!same_weights(2, 3));
    free(r);
}
