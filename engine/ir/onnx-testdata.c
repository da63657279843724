/* onnx-testdata.c - loading ONNX backend test cases (see onnx-testdata.h): directory listings, expected-pass
 * lists, a data set's inputs mapped to the graph's feeds, and expected outputs.
 *
 * Invariants: every tensor a set holds is owned by it (eng_testdata_set_free releases exactly those), and
 * feed[k] is a view of owned[k] with at most its dtype changed (uint16 -> bfloat16, same element size).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "onnx.h"
#include "onnx-testdata.h"

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Append a copy of s to *v (capacity *cap); 0 on allocation failure. */
static int names_push(char ***v, int *n, int *cap, const char *s) {
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        char **nv = realloc(*v, (size_t)nc * sizeof *nv);
        if (!nv) return 0;
        *v = nv, *cap = nc;
    }
    char *c = strdup(s);
    if (!c) return 0;
    (*v)[(*n)++] = c;
    return 1;
}

char **eng_testdata_dirs(const char *dir, const char *prefix, int *n) {
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    char **v = NULL;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (prefix && strncmp(e->d_name, prefix, strlen(prefix)) != 0) continue;
        char p[4096];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        if (!names_push(&v, n, &cap, e->d_name)) break;
    }
    closedir(d);
    if (v) qsort(v, (size_t)*n, sizeof *v, name_cmp);
    return v;
}

char **eng_testdata_names_read(const char *file, int *n) {
    *n = 0;
    FILE *f = fopen(file, "r");
    if (!f) return NULL;
    char line[1024];
    char **v = NULL;
    int cap = 0;
    while (fgets(line, sizeof line, f)) {
        char *c = strchr(line, '#');
        if (c) *c = 0;
        char *s = line, *e;
        while (*s == ' ' || *s == '\t') s++;
        e = s + strlen(s);
        while (e > s && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t')) *--e = 0;
        if (*s && !names_push(&v, n, &cap, s)) break;
    }
    fclose(f);
    return v;
}

void eng_testdata_names_free(char **v, int n) {
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

eng_status eng_testdata_set_load(const char *case_dir, const char *set, const eng_graph *g, eng_testdata_set *d) {
    memset(d, 0, sizeof *d);
    const eng_value *fed[ENG_TESTDATA_MAX_INPUTS]; /* the graph input each file feeds */
    for (int i = 0; i < g->ninputs; i++) {
        if (g->values[g->inputs[i]].init) continue;
        if (d->nfeed < ENG_TESTDATA_MAX_INPUTS) {
            fed[d->nfeed] = &g->values[g->inputs[i]];
            d->names[d->nfeed] = fed[d->nfeed]->name;
        }
        d->nfeed++; /* counted past the cap, so that a larger graph is refused below */
    }
    char path[4096];
    for (int k = 0; k < ENG_TESTDATA_MAX_INPUTS; k++) {
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s/input_%d.pb", case_dir, set, k);
        if (stat(path, &sb) != 0) break;
        /* an input the graph declares a sequence is a SequenceProto */
        eng_status st = k < d->nfeed && fed[k]->dtype == ENG_DTYPE_SEQUENCE ? eng_onnx_seq_load_file(path, &d->owned[k])
                                                                           : eng_onnx_tensor_load_file(path, &d->owned[k], NULL);
        if (st != ENG_STATUS_OK) return eng_err_prefix(st, "%s/input_%d.pb: ", set, k);
        d->nin = k + 1;
        d->feed[k] = *d->owned[k];
    }
    /* Older ONNX test data stores bfloat16 tensors as uint16 bit patterns. */
    for (int k = 0, fi = 0; k < g->ninputs && fi < d->nin; k++) {
        const eng_value *gv = &g->values[g->inputs[k]];
        if (gv->init) continue;
        if (gv->dtype == ENG_DTYPE_BF16 && d->feed[fi].dtype == ENG_DTYPE_U16) d->feed[fi].dtype = ENG_DTYPE_BF16;
        fi++;
    }
    if (d->nin != d->nfeed)
        return eng_err(ENG_STATUS_UNSUPPORTED, "%s has %d inputs, the model takes %d", set, d->nin, d->nfeed);
    return ENG_STATUS_OK;
}

void eng_testdata_set_free(eng_testdata_set *d) {
    for (int k = 0; k < d->nin; k++) eng_tensor_destroy(&d->owned[k]);
    d->nin = 0;
}

eng_status eng_testdata_output_load(const char *case_dir, const char *set, int k, eng_dtype as_dtype, eng_tensor **out) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/output_%d.pb", case_dir, set, k);
    eng_status st = as_dtype == ENG_DTYPE_SEQUENCE ? eng_onnx_seq_load_file(path, out)
                                                   : eng_onnx_tensor_load_file(path, out, NULL);
    if (st != ENG_STATUS_OK) return eng_err_prefix(st, "%s/output_%d.pb: ", set, k);
    if ((*out)->dtype == ENG_DTYPE_U16 && as_dtype == ENG_DTYPE_BF16) (*out)->dtype = ENG_DTYPE_BF16;
    return ENG_STATUS_OK;
}
