/* main.c - the tensord binary: subcommand dispatch. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "../kernels/kernel.h"
#include "srv.h"

/* Weak while the training files are being written: a build without them says so instead of failing to link. */
int srv_cmd_serve(int argc, char **argv);
int srv_cmd_init(int argc, char **argv) __attribute__((weak));
int srv_cmd_train(int argc, char **argv) __attribute__((weak));
int srv_cmd_evaluate(int argc, char **argv) __attribute__((weak)); /* cli-evaluate.c */
int srv_cmd_quantize(int argc, char **argv) __attribute__((weak)); /* cli-quantize.c */

#ifndef TENSORD_VERSION
#endif

static void usage(FILE *f) {
    fprintf(f,
            "tensord %s - model server with built-in training\n"
            "usage:\n"
            "  tensord serve --model_name=NAME --model_base_path=DIR [--rest_api_port=8501] [...]  (TF Serving flags)\n"
            "  tensord init --arch NAME [--opt key=value ...] [--seed S] --out DIR/1\n"
            "  tensord train --model-base-path DIR --data FILE[,FILE] --epochs E --batch-size B --optimizer adam --lr X\n"
            "                --loss sparse_categorical_crossentropy [--val-split 0.1] [--replicas R] [--resume] [...]\n"
            "  tensord train --job FILE.json   (a worker of the admin API's job queue: JSON lines on stdout)\n"
            "  tensord evaluate --model-base-path DIR --version N --data FILE[,FILE] [--against M] [--precision P]\n"
            "  tensord quantize --model-base-path DIR --version N --calibration FILE[,FILE] [--method minmax|percentile|entropy]\n"
            "                [--per-channel] [--exclude NODE ...]\n"
            "  tensord predict --model PATH --input NAME=FILE.npy [--input ...] --output-dir DIR [--threads T] [--precision P]\n"
            "  tensord bench --model PATH --input NAME=FILE.npy [...] [--iterations N] [--warmup W] [--threads T]\n"
            "                [--precision fp32|bf16|fp16|int8]\n"
            "  tensord conformance DIR [--filter SUBSTR] [-v] [--expect FILE] [--write-passes FILE] [--threads T] [--isolate]\n"
            "  tensord admin [--admin_url http://127.0.0.1:8502] [--admin_token_file F] models | add NAME BASE_PATH [--policy all]\n"
            "                | remove NAME | label MODEL LABEL VERSION | traffic MODEL [--routes a=90,b=10] | promote MODEL | rollback MODEL\n"
            "                | datasets | upload NAME FILE --format F | train MODEL DATASET [...] | jobs | follow ID | cancel ID\n"
            "  tensord version\n"
            "PATH is a model.onnx file or a version directory holding one.\n",
            TENSORD_VERSION);
}

const char *srv_flag(int argc, char **argv, int *i, const char *name) {
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        fprintf(stderr, "error: %s needs a value\n", name);
        exit(2);
    }
    return argv[++*i];
}

int srv_flag_i64(const char *flag, const char *v, long long lo, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno || x < lo) {
        fprintf(stderr, "error: %s: '%s' is not an integer >= %lld\n", flag, v, lo);
        return -1;
    }
    *out = x;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "serve") == 0) {
        /* A server's OpenMP threads must not spin between inferences: they would take the cores the HTTP threads
         * need. libgomp reads OMP_WAIT_POLICY when it loads, so set it and re-execute once (an explicit setting
         * in the environment is respected). */
        if (!getenv("OMP_WAIT_POLICY") && setenv("OMP_WAIT_POLICY", "PASSIVE", 1) == 0) {
            execv("/proc/self/exe", argv);
            unsetenv("OMP_WAIT_POLICY"); /* exec failed: carry on with the default policy */
        }
        return srv_cmd_serve(argc - 1, argv + 1);
    }
    if (strcmp(cmd, "init") == 0 || strcmp(cmd, "train") == 0 || strcmp(cmd, "evaluate") == 0 ||
        strcmp(cmd, "quantize") == 0) {
        int (*fn)(int, char **) = strcmp(cmd, "init") == 0       ? srv_cmd_init
                                  : strcmp(cmd, "train") == 0    ? srv_cmd_train
                                  : strcmp(cmd, "evaluate") == 0 ? srv_cmd_evaluate
                                                                 : srv_cmd_quantize;
        if (!fn) {
            fprintf(stderr, "error: '%s' is not in this build yet\n", cmd);
            return 2;
        }
        return fn(argc - 1, argv + 1);
    }
    if (strcmp(cmd, "predict") == 0) return srv_cmd_predict(argc - 1, argv + 1);
    if (strcmp(cmd, "admin") == 0) return srv_cmd_admin(argc - 1, argv + 1);
    if (strcmp(cmd, "bench") == 0) return srv_cmd_bench(argc - 1, argv + 1);
    if (strcmp(cmd, "conformance") == 0) return srv_cmd_conformance(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("tensord %s\n", TENSORD_VERSION);
        printf("devices: cpu; %s\n", krn_backend_auto_note()); /* CUDA plugin, driver and devices, or why not */
        return 0;
    }
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "error: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
