/* textproto.c - protobuf text format and JSON config reader (see textproto.h).
 *
 * Text grammar accepted: message := field*; field := NAME (':' scalar | ':' '[' scalar (',' scalar)* ']' |
 * ':'? '{' message '}' | ':'? '<' message '>') [',' | ';']; scalar := string+ (adjacent strings concatenate,
 * single or double quotes, C escapes) | number | identifier (true/false/enum). '#' starts a comment.
 */
#include "textproto.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

typedef struct tp_lex {
    const char *s, *end;
    const char *what;
    int line, col;
    srv_error *err;
} tp_lex;

static srv_code tp_fail(tp_lex *l, const char *msg) {
    return srv_err(l->err, SRV_INVALID_ARGUMENT, "%s:%d:%d: %s", l->what, l->line, l->col, msg);
}

static void tp_adv(tp_lex *l) {
    if (*l->s == '\n') {
        l->line++;
        l->col = 1;
    } else {
        l->col++;
    }
    l->s++;
}

static void tp_skip(tp_lex *l) {
    while (l->s < l->end) {
        if (isspace((unsigned char)*l->s)) tp_adv(l);
        else if (*l->s == '#') {
            while (l->s < l->end && *l->s != '\n') tp_adv(l);
        } else break;
    }
}

static srv_tp *tp_add(srv_tp *m, const char *name, size_t nlen) {
    if (m->nkids == m->cap) {
        int nc = m->cap ? m->cap * 2 : 4;
        srv_tp *k = realloc(m->kids, (size_t)nc * sizeof *k);
        if (!k) return NULL;
        m->kids = k;
        m->cap = nc;
    }
    srv_tp *c = &m->kids[m->nkids];
    memset(c, 0, sizeof *c);
    c->name = strndup(name, nlen);
    if (!c->name) return NULL;
    m->nkids++;
    return c;
}

static int tp_ident_char(char c) { return isalnum((unsigned char)c) || c == '_' || c == '.' || c == '-' || c == '+'; }

/* Append a quoted string (unescaped) to *buf. */
static srv_code tp_string(tp_lex *l, char **buf, size_t *blen) {
    char q = *l->s;
    tp_adv(l);
    while (l->s < l->end && *l->s != q) {
        char c = *l->s;
        if (c == '\n') return tp_fail(l, "newline inside a string");
        if (c == '\\') {
            tp_adv(l);
            if (l->s >= l->end) break;
            c = *l->s;
            switch (c) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case '0': c = '\0'; break;
            default: break; /* \\ \' \" and others stand for themselves */
            }
        }
        char *nb = realloc(*buf, *blen + 2);
        if (!nb) return srv_err(l->err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        *buf = nb;
        (*buf)[(*blen)++] = c;
        (*buf)[*blen] = 0;
        tp_adv(l);
    }
    if (l->s >= l->end) return tp_fail(l, "unterminated string");
    tp_adv(l);
    return SRV_OK;
}

static srv_code tp_scalar(tp_lex *l, srv_tp *f) {
    tp_skip(l);
    if (l->s >= l->end) return tp_fail(l, "expected a value");
    if (*l->s == '"' || *l->s == '\'') {
        char *buf = calloc(1, 1);
        size_t blen = 0;
        if (!buf) return srv_err(l->err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        while (l->s < l->end && (*l->s == '"' || *l->s == '\'')) {
            srv_code c = tp_string(l, &buf, &blen);
            if (c != SRV_OK) {
                free(buf);
                return c;
            }
            tp_skip(l);
        }
        f->scalar = buf;
        return SRV_OK;
    }
    const char *b = l->s;
    while (l->s < l->end && tp_ident_char(*l->s)) tp_adv(l);
    if (l->s == b) return tp_fail(l, "expected a value");
    f->scalar = strndup(b, (size_t)(l->s - b));
    return f->scalar ? SRV_OK : srv_err(l->err, SRV_RESOURCE_EXHAUSTED, "out of memory");
}

static srv_code tp_message(tp_lex *l, srv_tp *m, int depth, char close);

static srv_code tp_field(tp_lex *l, srv_tp *m, int depth) {
    const char *b = l->s;
    while (l->s < l->end && (isalnum((unsigned char)*l->s) || *l->s == '_')) tp_adv(l);
    if (l->s == b) return tp_fail(l, "expected a field name");
    size_t nlen = (size_t)(l->s - b);
    tp_skip(l);
    int colon = 0;
    if (l->s < l->end && *l->s == ':') {
        colon = 1;
        tp_adv(l);
        tp_skip(l);
    }
    if (l->s < l->end && (*l->s == '{' || *l->s == '<')) {
        char close = *l->s == '{' ? '}' : '>';
        tp_adv(l);
        if (depth + 1 > SRV_TP_MAX_DEPTH) return tp_fail(l, "nesting too deep");
        srv_tp *f = tp_add(m, b, nlen);
        if (!f) return srv_err(l->err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        return tp_message(l, f, depth + 1, close);
    }
    if (!colon) return tp_fail(l, "expected ':' or '{' after the field name");
    if (l->s < l->end && *l->s == '[') {
        tp_adv(l);
        for (;;) {
            tp_skip(l);
            if (l->s < l->end && *l->s == ']') {
                tp_adv(l);
                return SRV_OK;
            }
            srv_tp *f = tp_add(m, b, nlen);
            if (!f) return srv_err(l->err, SRV_RESOURCE_EXHAUSTED, "out of memory");
            srv_code c = tp_scalar(l, f);
            if (c != SRV_OK) return c;
            tp_skip(l);
            if (l->s < l->end && *l->s == ',') tp_adv(l);
            else if (l->s < l->end && *l->s == ']') continue;
            else return tp_fail(l, "expected ',' or ']' in a list");
        }
    }
    srv_tp *f = tp_add(m, b, nlen);
    if (!f) return srv_err(l->err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    return tp_scalar(l, f);
}

static srv_code tp_message(tp_lex *l, srv_tp *m, int depth, char close) {
    for (;;) {
        tp_skip(l);
        if (l->s >= l->end) {
            if (close) return tp_fail(l, "unexpected end of input: missing '}'");
            return SRV_OK;
        }
        if (close && *l->s == close) {
            tp_adv(l);
            return SRV_OK;
        }
        srv_code c = tp_field(l, m, depth);
        if (c != SRV_OK) return c;
        tp_skip(l);
        if (l->s < l->end && (*l->s == ',' || *l->s == ';')) tp_adv(l);
    }
}

srv_code srv_tp_parse_text(const char *text, size_t len, const char *what, srv_tp **out, srv_error *err) {
    *out = NULL;
    if (len > SRV_TP_MAX_BYTES) return srv_err(err, SRV_INVALID_ARGUMENT, "%s: larger than %d bytes", what, SRV_TP_MAX_BYTES);
    srv_tp *root = calloc(1, sizeof *root);
    if (!root || !(root->name = strdup(""))) {
        free(root);
        return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    }
    tp_lex l = {text, text + len, what, 1, 1, err};
    srv_code c = tp_message(&l, root, 0, 0);
    if (c != SRV_OK) {
        srv_tp_free(&root);
        return c;
    }
    *out = root;
    return SRV_OK;
}

static srv_code tp_from_json(const cJSON *j, srv_tp *m, int depth, const char *what, srv_error *err) {
    if (depth > SRV_TP_MAX_DEPTH) return srv_err(err, SRV_INVALID_ARGUMENT, "%s: nesting too deep", what);
    for (const cJSON *c = j->child; c; c = c->next) {
        const char *name = c->string ? c->string : "";
        const cJSON *items = c;
        int is_array = cJSON_IsArray(c);
        for (const cJSON *it = is_array ? c->child : items; it; it = is_array ? it->next : NULL) {
            srv_tp *f = tp_add(m, name, strlen(name));
            if (!f) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
            char num[64];
            if (cJSON_IsObject(it)) {
                srv_code rc = tp_from_json(it, f, depth + 1, what, err);
                if (rc != SRV_OK) return rc;
            } else if (cJSON_IsString(it)) {
                f->scalar = strdup(it->valuestring);
            } else if (cJSON_IsNumber(it)) {
                if (it->valuedouble == (double)(int64_t)it->valuedouble) snprintf(num, sizeof num, "%lld", (long long)it->valuedouble);
                else snprintf(num, sizeof num, "%.17g", it->valuedouble);
                f->scalar = strdup(num);
            } else if (cJSON_IsBool(it)) {
                f->scalar = strdup(cJSON_IsTrue(it) ? "true" : "false");
            } else if (cJSON_IsArray(it)) {
                return srv_err(err, SRV_INVALID_ARGUMENT, "%s: field '%s': nested arrays are not allowed", what, name);
            } else {
                f->scalar = strdup("");
            }
            if (!cJSON_IsObject(it) && !f->scalar) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
        }
    }
    return SRV_OK;
}

srv_code srv_tp_parse_json(const char *text, size_t len, const char *what, srv_tp **out, srv_error *err) {
    *out = NULL;
    if (len > SRV_TP_MAX_BYTES) return srv_err(err, SRV_INVALID_ARGUMENT, "%s: larger than %d bytes", what, SRV_TP_MAX_BYTES);
    if (!srv_json_depth_ok(text, len, SRV_TP_MAX_DEPTH))
        return srv_err(err, SRV_INVALID_ARGUMENT, "%s: JSON nested deeper than %d levels", what, SRV_TP_MAX_DEPTH);
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j) return srv_err(err, SRV_INVALID_ARGUMENT, "%s: malformed JSON", what);
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        return srv_err(err, SRV_INVALID_ARGUMENT, "%s: the top level must be a JSON object", what);
    }
    srv_tp *root = calloc(1, sizeof *root);
    srv_code c = root && (root->name = strdup("")) ? tp_from_json(j, root, 0, what, err)
                                                   : srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    cJSON_Delete(j);
    if (c != SRV_OK) {
        srv_tp_free(&root);
        return c;
    }
    *out = root;
    return SRV_OK;
}

srv_code srv_tp_parse_file(const char *path, srv_tp **out, srv_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return srv_err(err, SRV_NOT_FOUND, "cannot open '%s': %s", path, strerror(errno));
    char *buf = malloc(SRV_TP_MAX_BYTES + 1);
    size_t n = buf ? fread(buf, 1, SRV_TP_MAX_BYTES + 1, f) : 0;
    fclose(f);
    if (!buf) return srv_err(err, SRV_RESOURCE_EXHAUSTED, "out of memory");
    if (n > SRV_TP_MAX_BYTES) {
        free(buf);
        return srv_err(err, SRV_INVALID_ARGUMENT, "'%s' is larger than %d bytes", path, SRV_TP_MAX_BYTES);
    }
    buf[n] = 0;
    size_t i = 0;
    while (i < n && isspace((unsigned char)buf[i])) i++;
    srv_code c = (i < n && buf[i] == '{') ? srv_tp_parse_json(buf, n, path, out, err) : srv_tp_parse_text(buf, n, path, out, err);
    free(buf);
    return c;
}

static void tp_free_contents(srv_tp *t) {
    for (int i = 0; i < t->nkids; i++) tp_free_contents(&t->kids[i]);
    free(t->kids);
    free(t->name);
    free(t->scalar);
}

void srv_tp_free(srv_tp **t) {
    if (!t || !*t) return;
    tp_free_contents(*t);
    free(*t);
    *t = NULL;
}

const srv_tp *srv_tp_get(const srv_tp *m, const char *name, int i) {
    if (!m) return NULL;
    for (int k = 0; k < m->nkids; k++)
        if (strcmp(m->kids[k].name, name) == 0 && i-- == 0) return &m->kids[k];
    return NULL;
}

int srv_tp_count(const srv_tp *m, const char *name) {
    int n = 0;
    for (int k = 0; m && k < m->nkids; k++) n += strcmp(m->kids[k].name, name) == 0;
    return n;
}

const char *srv_tp_str(const srv_tp *m, const char *name) {
    const srv_tp *f = srv_tp_get(m, name, 0);
    return f ? f->scalar : NULL;
}

int srv_tp_int(const srv_tp *m, const char *name, int64_t *out, srv_error *err) {
    const srv_tp *f = srv_tp_get(m, name, 0);
    if (!f) return -1;
    char *end = NULL;
    errno = 0;
    long long v = f->scalar ? strtoll(f->scalar, &end, 10) : 0;
    if (!f->scalar || !*f->scalar || *end || errno) {
        srv_err(err, SRV_INVALID_ARGUMENT, "field '%s': expected an integer, got '%s'", name, f->scalar ? f->scalar : "{...}");
        return -2;
    }
    *out = v;
    return 0;
}

int srv_tp_double(const srv_tp *m, const char *name, double *out, srv_error *err) {
    const srv_tp *f = srv_tp_get(m, name, 0);
    if (!f) return -1;
    char *end = NULL;
    double v = f->scalar ? strtod(f->scalar, &end) : 0;
    if (!f->scalar || !*f->scalar || *end) {
        srv_err(err, SRV_INVALID_ARGUMENT, "field '%s': expected a number, got '%s'", name, f->scalar ? f->scalar : "{...}");
        return -2;
    }
    *out = v;
    return 0;
}

int srv_tp_bool(const srv_tp *m, const char *name, int *out, srv_error *err) {
    const srv_tp *f = srv_tp_get(m, name, 0);
    if (!f) return -1;
    if (f->scalar && (strcmp(f->scalar, "true") == 0 || strcmp(f->scalar, "1") == 0 || strcmp(f->scalar, "True") == 0)) *out = 1;
    else if (f->scalar && (strcmp(f->scalar, "false") == 0 || strcmp(f->scalar, "0") == 0 || strcmp(f->scalar, "False") == 0)) *out = 0;
    else {
        srv_err(err, SRV_INVALID_ARGUMENT, "field '%s': expected true or false, got '%s'", name, f->scalar ? f->scalar : "{...}");
        return -2;
    }
    return 0;
}

int srv_tp_wrapped_int(const srv_tp *m, const char *name, int64_t *out, srv_error *err) {
    const srv_tp *f = srv_tp_get(m, name, 0);
    if (!f) return -1;
    if (f->scalar) return srv_tp_int(m, name, out, err);
    int r = srv_tp_int(f, "value", out, err);
    if (r == -1) {
        srv_err(err, SRV_INVALID_ARGUMENT, "field '%s': expected { value: N }", name);
        return -2;
    }
    return r;
}
