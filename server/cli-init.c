/* cli-init.c - `tensord init`: write a freshly initialised model from the zoo (models/zoo.h) as a new version
 * directory of a bundle.
 *
 *   tensord init --arch NAME [--opt key=value ...] [--seed S] --out DIR/N
 *   tensord init --list
 *
 * The version appears atomically through engine/bundle.h: N must be a version name (eng_bundle_parse_version);
 * everything is written into DIR/.tmp-N-<pid>/ (eng_bundle_stage: model.onnx through eng_onnx_save_file,
 * signature.json, zoo.json), then eng_bundle_publish fsyncs each file and the directory, renames it to DIR/N
 * without replacing anything and fsyncs DIR. A failure removes the temp directory. DIR/N that already exists
 * (even empty) is refused, naming it.
 *
 * signature.json (eng_bundle_sig_from_graph) holds only signature_defs, which the server's strict reader
 * accepts; the provenance (arch, every option with its resolved value, seed, parameter count) goes to zoo.json
 * beside it.
 * Exit codes: 0 written, 1 error ("error: ..." on stderr), 2 usage.
 */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../engine/bundle.h"
#include "../engine/ir/file-io.h"
#include "../engine/ir/graph.h"
#include "../engine/ir/onnx.h"
#include "../models/zoo.h"
#include "cli.h"

int srv_cmd_init(int argc, char **argv);

#define INIT_MAX_OPTS 32

static void init_usage(FILE *f) {
    fprintf(f, "usage: tensord init --arch NAME [--opt key=value ...] [--seed S] --out DIR/VERSION\n"
               "       tensord init --list      (architectures and their options)\n");
}

static int init_list(void) {
    for (const char *const *a = mdl_archs(); *a; a++) {
        printf("%s\n    %s\n", *a, mdl_arch_summary(*a));
        for (const mdl_opt_info *o = mdl_arch_options(*a); o->key; o++)
            printf("    --opt %s=%s%*s%s\n", o->key, o->dflt,
                   (int)(24 > strlen(o->key) + strlen(o->dflt) ? 24 - strlen(o->key) - strlen(o->dflt) : 1), "",
                   o->help);
    }
    return 0;
}

static int init_name_ok(const char *s, size_t n) {
    if (n == 0 || (n == 2 && s[0] == '.' && s[1] == '.')) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
              c == '-'))
            return 0;
    }
    return 1;
}

static int init_mkdirs(const char *dir) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf) return -1;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
    struct stat st;
    if (stat(buf, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* Write a new file (never replacing one): text and a newline, then fsync. */
static int init_write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    size_t n = strlen(text), off = 0;
    while (off < n) {
        ssize_t w = write(fd, text + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno ? errno : EIO;
            close(fd);
            errno = e;
            return -1;
        }
        off += (size_t)w;
    }
    if (write(fd, "\n", 1) != 1 || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return close(fd);
}

static char *init_zoo_json(const char *arch, const mdl_opt *opts, int nopts, uint64_t seed, int64_t params) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "arch", arch);
    cJSON *o = cJSON_AddObjectToObject(root, "options");
    for (const mdl_opt_info *info = mdl_arch_options(arch); info->key; info++) {
        const char *v = info->dflt;
        for (int i = 0; i < nopts; i++)
            if (strcmp(opts[i].key, info->key) == 0) v = opts[i].value;
        cJSON_AddStringToObject(o, info->key, v);
    }
    char sb[32];
    snprintf(sb, sizeof sb, "%llu", (unsigned long long)seed);
    /* JSON numbers lose integers above 2^53 in most readers: the seed is a number only when exact */
    if (seed <= ((uint64_t)1 << 53)) cJSON_AddNumberToObject(root, "seed", (double)seed);
    else cJSON_AddStringToObject(root, "seed", sb);
    cJSON_AddNumberToObject(root, "parameters", (double)params);
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

static int init_fail(const char *tmp, const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "error: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    if (tmp) eng_file_remove_dir(tmp);
    return 1;
}

int srv_cmd_init(int argc, char **argv) {
    const char *arch = NULL, *out = NULL, *seed_s = NULL;
    mdl_opt opts[INIT_MAX_OPTS];
    char *opt_keys[INIT_MAX_OPTS];
    int nopts = 0, list = 0, rc = 1;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--list") == 0) list = 1;
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            init_usage(stdout);
            return 0;
        } else if ((v = srv_flag(argc, argv, &i, "--arch"))) arch = v;
        else if ((v = srv_flag(argc, argv, &i, "--out"))) out = v;
        else if ((v = srv_flag(argc, argv, &i, "--seed"))) seed_s = v;
        else if ((v = srv_flag(argc, argv, &i, "--opt"))) {
            const char *eq = strchr(v, '=');
            if (!eq || eq == v) {
                fprintf(stderr, "error: --opt takes key=value, got '%s'\n", v);
                init_usage(stderr);
                goto usage;
            }
            if (nopts == INIT_MAX_OPTS) {
                fprintf(stderr, "error: more than %d --opt flags\n", INIT_MAX_OPTS);
                goto usage;
            }
            opt_keys[nopts] = strndup(v, (size_t)(eq - v));
            if (!opt_keys[nopts]) {
                fprintf(stderr, "error: out of memory\n");
                goto done;
            }
            opts[nopts].key = opt_keys[nopts];
            opts[nopts].value = eq + 1;
            nopts++;
        } else {
            fprintf(stderr, "error: unknown option '%s'\n", argv[i]);
            init_usage(stderr);
            goto usage;
        }
    }
    if (list) {
        rc = init_list();
        goto done;
    }
    if (!arch || !out) {
        fprintf(stderr, "error: %s is required\n", !arch ? "--arch" : "--out");
        init_usage(stderr);
        goto usage;
    }
    uint64_t seed = 0;
    if (seed_s) {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(seed_s, &end, 10);
        if (errno || end == seed_s || *end || *seed_s == '-' || *seed_s == '+') {
            fprintf(stderr, "error: --seed must be an integer in [0, 2^64), got '%s'\n", seed_s);
            goto done;
        }
        seed = s;
    }

    /* Split --out into DIR and the version; check both before building anything. */
    char path[4096];
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') n--;
    if (n >= 3000) {
        fprintf(stderr, "error: --out path is too long\n");
        goto done;
    }
    memcpy(path, out, n);
    path[n] = '\0';
    char *slash = strrchr(path, '/');
    const char *version = slash ? slash + 1 : path;
    char dir[4096];
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int64_t ver;
    if (!eng_bundle_parse_version(version, &ver)) {
        rc = init_fail(NULL, "--out '%s': the last component '%s' must be a positive integer version (1, 2, ...)",
                       out, version);
        goto done;
    }
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    if (*base && strcmp(base, ".") != 0 && !init_name_ok(base, strlen(base))) {
        rc = init_fail(NULL, "--out: model directory name '%s' may hold only A-Z a-z 0-9 _ . - (in '%s')", base, out);
        goto done;
    }

    eng_graph *g = NULL;
    if (mdl_build(arch, opts, nopts, seed, &g) != ENG_STATUS_OK) {
        fprintf(stderr, "error: %s\n", eng_last_error());
        goto done;
    }
    int64_t params = mdl_param_count(g);
    char vdir[4200], tmp[4200], file[4300];
    if (eng_bundle_path(vdir, sizeof vdir, dir, ver, NULL) != ENG_STATUS_OK) {
        rc = init_fail(NULL, "%s%s", eng_last_error(), "");
    } else if (init_mkdirs(dir) != 0) {
        rc = init_fail(NULL, "cannot create model directory '%s': %s", dir, strerror(errno));
    } else if (eng_bundle_stage(dir, ver, tmp, sizeof tmp) != ENG_STATUS_OK) {
        rc = init_fail(NULL, "%s%s", eng_last_error(), "");
    } else {
        char *sig = eng_bundle_sig_from_graph(g), *zoo = init_zoo_json(arch, opts, nopts, seed, params);
        /* very large models keep their weights beside model.onnx (protobuf caps one message at 2 GiB) */
        size_t threshold = params > ((int64_t)1 << 28) ? ((size_t)1 << 20) : 0;
        snprintf(file, sizeof file, "%s/" ENG_BUNDLE_MODEL_FILE, tmp);
        if (!sig || !zoo) rc = init_fail(tmp, "%s%s", "out of memory", "");
        else if (eng_onnx_save_file(g, file, threshold) != ENG_STATUS_OK)
            rc = init_fail(tmp, "%s%s", eng_last_error(), "");
        else if (snprintf(file, sizeof file, "%s/" ENG_BUNDLE_SIGNATURE_FILE, tmp), init_write_file(file, sig) != 0)
            rc = init_fail(tmp, "cannot write '%s': %s", file, strerror(errno));
        else if (snprintf(file, sizeof file, "%s/zoo.json", tmp), init_write_file(file, zoo) != 0)
            rc = init_fail(tmp, "cannot write '%s': %s", file, strerror(errno));
        else if (eng_bundle_publish(dir, ver, tmp) != ENG_STATUS_OK)
            rc = init_fail(tmp, "%s%s", eng_last_error(), "");
        else {
            printf("wrote %s (arch %s, %lld parameters, seed %llu)\n", vdir, arch, (long long)params,
                   (unsigned long long)seed);
            rc = 0;
        }
        free(sig);
        cJSON_free(zoo);
    }
    eng_graph_free(&g);
    goto done;
usage:
    rc = 2;
done:
    for (int i = 0; i < nopts; i++) free(opt_keys[i]);
    return rc;
}
