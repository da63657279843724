/* zoo.c - the model zoo's registry: architecture table, option tables with defaults and bounds, option parsing,
 * and mdl_build (zoo.h). The graphs themselves are built in the per-architecture files through build.c.
 *
 * Option values: an int ("128"), a list of ints ("512,512" or "[512,512]"; "" or "[]" is the empty list
 * where a list may be empty) or one word of a fixed set ("relu"). Every error names the architecture, the
 * option and the value, and says what was expected.
 */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zoo-impl.h"

typedef enum mdl_kind {
    MDL_KIND_INT,   /* one integer in [lo, hi] */
    MDL_KIND_LIST,  /* lo_n..hi_n integers, each in [lo, hi] */
    MDL_KIND_WORD,  /* one of `words` (space separated); the value is its index */
} mdl_kind;

typedef struct mdl_opt_spec {
    mdl_opt_info info;
    mdl_kind kind;
    int64_t lo, hi;
    int lo_n, hi_n;
    const char *words;
} mdl_opt_spec;

typedef struct mdl_arch {
    const char *name;
    const char *summary;
    eng_status (*build)(const mdl_args *a, mdl_b *b);
    mdl_opt_spec opts[12];
    mdl_opt_info infos[12]; /* copies of opts[].info (terminated by key NULL), filled once */
} mdl_arch;

#define DIM_MAX 65536
#define BIG_MAX (1 << 24)
#define OPT_INT(k, d, lo, hi, h) {{k, d, h}, MDL_KIND_INT, lo, hi, 1, 1, NULL}
#define OPT_LIST(k, d, lo, hi, nlo, nhi, h) {{k, d, h}, MDL_KIND_LIST, lo, hi, nlo, nhi, NULL}
#define OPT_WORD(k, d, w, h) {{k, d, h}, MDL_KIND_WORD, 0, 0, 1, 1, w}
#define OPT_SOFTMAX OPT_INT("softmax", "1", 0, 1, "1: output softmax 'probabilities'; 0: raw 'logits'")

static mdl_arch mdl_arch_table[] = {
    {"mlp", "Flatten (if the input has several dims) -> [Dense(h) -> activation] per hidden -> Dense(classes) -> Softmax",
     mdl_build_mlp,
     {OPT_LIST("input", "784", 1, BIG_MAX, 1, 3, "input shape without the batch dim"),
      OPT_LIST("hidden", "512,512", 1, DIM_MAX, 0, MDL_MAX_LIST, "hidden layer widths (may be empty)"),
      OPT_INT("classes", "10", 1, DIM_MAX, "output classes"),
      OPT_WORD("activation", "relu", "relu gelu tanh sigmoid", "hidden activation: relu, gelu, tanh, sigmoid"),
      OPT_SOFTMAX}},
    {"cnn", "the seed CNN: Conv2D(filters, kernel, valid, bias) -> ReLU -> MaxPool(pool, stride pool) -> Flatten -> "
            "Dense(classes) -> Softmax",
     mdl_build_cnn,
     {OPT_LIST("input", "1,28,28", 1, DIM_MAX, 3, 3, "input shape C,H,W"),
      OPT_INT("filters", "32", 1, DIM_MAX, "convolution filters"),
      OPT_INT("kernel", "3", 1, 64, "square kernel size"),
      OPT_INT("pool", "2", 1, 64, "max-pool window and stride"),
      OPT_INT("classes", "10", 1, DIM_MAX, "output classes"), OPT_SOFTMAX}},
    {"resnet-small",
     "CIFAR ResNet (v1, basic blocks): Conv3x3(width)+BN+ReLU, 3 stages of `blocks` blocks at width, 2*width, "
     "4*width (stride 2 and a 1x1 conv+BN shortcut entering stages 2 and 3), GlobalAveragePool -> Dense(classes) "
     "-> Softmax; convs have no bias, BatchNorm eps 1e-3",
     mdl_build_resnet,
     {OPT_LIST("input", "3,32,32", 1, DIM_MAX, 3, 3, "input shape C,H,W"),
      OPT_INT("width", "16", 1, 4096, "channels of the first stage"),
      OPT_INT("blocks", "2", 1, 64, "basic blocks per stage (3 stages)"),
      OPT_INT("classes", "10", 1, DIM_MAX, "output classes"), OPT_SOFTMAX}},
    {"transformer-encoder",
     "BERT-style: token + position embeddings -> LayerNorm, `layers` post-LN blocks (self-attention without mask, "
     "GELU feed-forward), mean over positions -> Dense(classes) -> Softmax; input 'tokens' int64 [N, seq]",
     mdl_build_transformer,
     {OPT_INT("vocab", "1000", 2, BIG_MAX, "vocabulary size (token ids 0..vocab-1)"),
      OPT_INT("seq", "128", 1, DIM_MAX, "sequence length"), OPT_INT("d", "128", 1, DIM_MAX, "model width"),
      OPT_INT("heads", "4", 1, 1024, "attention heads (must divide d)"),
      OPT_INT("layers", "2", 1, 128, "encoder layers"), OPT_INT("ffn", "512", 1, BIG_MAX, "feed-forward width"),
      OPT_INT("classes", "2", 1, DIM_MAX, "output classes"), OPT_SOFTMAX}},
    {"vit-tiny",
     "ViT: patch embedding (Conv patch x patch, stride patch) + position embeddings, `layers` pre-LN blocks "
     "(self-attention, GELU MLP), final LayerNorm, mean over patches (no class token) -> Dense(classes) -> Softmax",
     mdl_build_vit,
     {OPT_LIST("input", "3,32,32", 1, DIM_MAX, 3, 3, "input shape C,H,W (H and W multiples of patch)"),
      OPT_INT("patch", "4", 1, 1024, "patch size"), OPT_INT("d", "192", 1, DIM_MAX, "model width"),
      OPT_INT("heads", "3", 1, 1024, "attention heads (must divide d)"),
      OPT_INT("layers", "4", 1, 128, "encoder layers"), OPT_INT("ffn", "768", 1, BIG_MAX, "MLP width"),
      OPT_INT("classes", "10", 1, DIM_MAX, "output classes"), OPT_SOFTMAX}},
    {"two-tower",
     "user and item embeddings (normal(0, 0.02)) -> dot product -> Sigmoid; inputs 'user', 'item' int64 [N], "
     "output 'probability' [N,1]",
     mdl_build_two_tower,
     {OPT_INT("users", "1000", 1, BIG_MAX, "user ids 0..users-1"),
      OPT_INT("items", "1000", 1, BIG_MAX, "item ids 0..items-1"),
      OPT_INT("dim", "32", 1, DIM_MAX, "embedding width")}},
};
#define MDL_NARCH ((int)(sizeof mdl_arch_table / sizeof mdl_arch_table[0]))

static const mdl_arch *mdl_arch_find(const char *name) {
    for (int i = 0; name && i < MDL_NARCH; i++)
        if (strcmp(mdl_arch_table[i].name, name) == 0) return &mdl_arch_table[i];
    return NULL;
}

const char *const *mdl_archs(void) {
    static const char *names[MDL_NARCH + 1] = {
        "mlp", "cnn", "resnet-small", "transformer-encoder", "vit-tiny", "two-tower", NULL,
    };
    return names;
}

static pthread_once_t mdl_infos_once = PTHREAD_ONCE_INIT;

static void mdl_infos_fill(void) {
    for (int k = 0; k < MDL_NARCH; k++)
        for (int i = 0; i < 12 && mdl_arch_table[k].opts[i].info.key; i++)
            mdl_arch_table[k].infos[i] = mdl_arch_table[k].opts[i].info;
}

const mdl_opt_info *mdl_arch_options(const char *arch) {
    const mdl_arch *a = mdl_arch_find(arch);
    if (!a) return NULL;
    pthread_once(&mdl_infos_once, mdl_infos_fill);
    return a->infos;
}

const char *mdl_arch_summary(const char *arch) {
    const mdl_arch *a = mdl_arch_find(arch);
    return a ? a->summary : NULL;
}

/* ---- parsed options ---- */

static int mdl_arg_index(const mdl_args *a, const char *key) {
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->keys[i], key) == 0) return i;
    return -1;
}

int64_t mdl_arg(const mdl_args *a, const char *key) {
    int i = mdl_arg_index(a, key);
    return i >= 0 && a->len[i] > 0 ? a->v[i][0] : 0;
}

const int64_t *mdl_arg_list(const mdl_args *a, const char *key, int *n) {
    int i = mdl_arg_index(a, key);
    *n = i >= 0 ? a->len[i] : 0;
    return i >= 0 ? a->v[i] : NULL;
}

eng_status mdl_arg_err(const mdl_args *a, const char *key, const char *fmt, ...) {
    char m[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return eng_err(ENG_STATUS_INVALID_ARGUMENT, "arch '%s': option '%s': %s", a->arch, key, m);
}

/* Parse `val` for option spec `o` into slot i of a. */
static eng_status mdl_parse_value(mdl_args *a, int i, const mdl_opt_spec *o, const char *val) {
    const char *key = o->info.key;
    a->len[i] = 0;
    if (o->kind == MDL_KIND_WORD) {
        const char *w = o->words;
        size_t n = strlen(val);
        for (int k = 0; *w; k++) {
            size_t wl = strcspn(w, " ");
            if (wl == n && n && strncmp(w, val, n) == 0) {
                a->v[i][0] = k;
                a->len[i] = 1;
                return ENG_STATUS_OK;
            }
            w += wl;
            while (*w == ' ') w++;
        }
        return mdl_arg_err(a, key, "'%s' is not one of: %s", val, o->words);
    }
    const char *p = val;
    while (isspace((unsigned char)*p)) p++;
    int bracket = *p == '[';
    if (bracket) p++;
    for (;;) {
        while (isspace((unsigned char)*p)) p++;
        if (*p == '\0' || (bracket && *p == ']')) {
            if (a->len[i] > 0) /* "1,2," */
                return mdl_arg_err(a, key, "'%s' has a trailing comma", val);
            break;
        }
        if (!isdigit((unsigned char)*p) && *p != '-')
            return mdl_arg_err(a, key, "'%s' is not %s", val, o->kind == MDL_KIND_INT ? "an integer" : "a list of integers like 512,512");
        errno = 0;
        char *end;
        long long x = strtoll(p, &end, 10);
        if (errno || end == p)
            return mdl_arg_err(a, key, "'%s' is not %s", val, o->kind == MDL_KIND_INT ? "an integer" : "a list of integers");
        if (x < o->lo || x > o->hi)
            return mdl_arg_err(a, key, "%lld is out of range [%lld, %lld]", x, (long long)o->lo, (long long)o->hi);
        if (a->len[i] == o->hi_n)
            return mdl_arg_err(a, key, "'%s' has more than %d entr%s", val, o->hi_n, o->hi_n == 1 ? "y" : "ies");
        a->v[i][a->len[i]++] = x;
        p = end;
        while (isspace((unsigned char)*p)) p++;
        if (*p == ',') {
            p++;
            while (isspace((unsigned char)*p)) p++;
            if (*p == '\0' || (bracket && *p == ']')) return mdl_arg_err(a, key, "'%s' has a trailing comma", val);
            continue;
        }
        if (*p == '\0' || (bracket && *p == ']')) break;
        return mdl_arg_err(a, key, "'%s' is not %s", val, o->kind == MDL_KIND_INT ? "an integer" : "a list of integers like 512,512");
    }
    if (bracket) {
        if (*p != ']') return mdl_arg_err(a, key, "'%s' lacks its closing ']'", val);
        p++;
        while (isspace((unsigned char)*p)) p++;
        if (*p) return mdl_arg_err(a, key, "'%s' has text after ']'", val);
    }
    if (a->len[i] < o->lo_n) {
        if (o->kind == MDL_KIND_INT) return mdl_arg_err(a, key, "'%s' is not an integer", val);
        return mdl_arg_err(a, key, "'%s' has %d entr%s, expected %s%d", val, a->len[i], a->len[i] == 1 ? "y" : "ies",
                           o->lo_n == o->hi_n ? "" : "at least ", o->lo_n);
    }
    return ENG_STATUS_OK;
}

static eng_status mdl_parse(const mdl_arch *arch, const mdl_opt *opts, int nopts, mdl_args *a) {
    memset(a, 0, sizeof *a);
    a->arch = arch->name;
    for (int i = 0; i < 12 && arch->opts[i].info.key; i++) {
        a->keys[a->n] = arch->opts[i].info.key;
        ENG_TRY(mdl_parse_value(a, a->n, &arch->opts[i], arch->opts[i].info.dflt));
        a->n++;
    }
    if (nopts < 0 || (nopts > 0 && !opts)) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "arch '%s': bad option array", arch->name);
    for (int k = 0; k < nopts; k++) {
        const char *key = opts[k].key ? opts[k].key : "";
        int i = mdl_arg_index(a, key);
        if (i < 0) {
            char known[256] = "";
            for (int j = 0; j < a->n; j++)
                snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", j ? ", " : "", a->keys[j]);
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "arch '%s': unknown option '%s' (options: %s)", arch->name, key,
                           known);
        }
        for (int j = 0; j < k; j++)
            if (opts[j].key && strcmp(opts[j].key, key) == 0)
                return eng_err(ENG_STATUS_INVALID_ARGUMENT, "arch '%s': option '%s' given twice", arch->name, key);
        ENG_TRY(mdl_parse_value(a, i, &arch->opts[i], opts[k].value ? opts[k].value : ""));
    }
    return ENG_STATUS_OK;
}

eng_status mdl_build(const char *arch, const mdl_opt *opts, int nopts, uint64_t seed, eng_graph **out) {
    if (!out) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "mdl_build: out is NULL");
    *out = NULL;
    const mdl_arch *ar = mdl_arch_find(arch);
    if (!ar) {
        char known[256] = "";
        for (int j = 0; j < MDL_NARCH; j++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", j ? ", " : "", mdl_arch_table[j].name);
        return eng_err(ENG_STATUS_INVALID_ARGUMENT, "unknown arch '%s' (known: %s)", arch ? arch : "(null)", known);
    }
    mdl_args a;
    ENG_TRY(mdl_parse(ar, opts, nopts, &a));
    mdl_b b;
    mdl_b_init(&b, ar->name, seed);
    eng_status st = b.st == ENG_STATUS_OK ? ar->build(&a, &b) : b.st;
    if (st != ENG_STATUS_OK) mdl_b_fail(&b, st);
    if (b.st == ENG_STATUS_OK) { /* record what was built in the model itself */
        char doc[2048];
        int n = snprintf(doc, sizeof doc, "tensord zoo: arch=%s seed=%llu", ar->name, (unsigned long long)seed);
        for (int i = 0; i < a.n && n < (int)sizeof doc; i++) {
            n += snprintf(doc + n, sizeof doc - (size_t)n, " %s=", a.keys[i]);
            if (ar->opts[i].kind == MDL_KIND_WORD) {
                const char *w = ar->opts[i].words;
                for (int64_t k = 0; k < a.v[i][0]; k++) w += strcspn(w, " ") + 1;
                n += snprintf(doc + n, n < (int)sizeof doc ? sizeof doc - (size_t)n : 0, "%.*s", (int)strcspn(w, " "), w);
            }
            for (int k = 0; ar->opts[i].kind != MDL_KIND_WORD && k < a.len[i] && n < (int)sizeof doc; k++)
                n += snprintf(doc + n, sizeof doc - (size_t)n, "%s%lld", k ? "," : "", (long long)a.v[i][k]);
        }
        b.g->doc_string = strdup(doc);
        if (!b.g->doc_string) mdl_b_fail(&b, eng_err(ENG_STATUS_OUT_OF_MEMORY, "arch '%s': out of memory", ar->name));
    }
    return mdl_b_finish(&b, out);
}
