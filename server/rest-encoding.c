/* rest-encoding.c - gzip/deflate for REST request bodies and replies (see rest-encoding.h), on zlib. */
#include "rest-encoding.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

srv_enc srv_enc_request(const char *ce) {
    if (!ce) return SRV_ENC_IDENTITY;
    while (*ce == ' ' || *ce == '\t') ce++;
    size_t n = strlen(ce);
    while (n && (ce[n - 1] == ' ' || ce[n - 1] == '\t')) n--;
    if (n == 0 || (n == 8 && strncasecmp(ce, "identity", 8) == 0)) return SRV_ENC_IDENTITY;
    if ((n == 4 && strncasecmp(ce, "gzip", 4) == 0) || (n == 6 && strncasecmp(ce, "x-gzip", 6) == 0)) return SRV_ENC_GZIP;
    if (n == 7 && strncasecmp(ce, "deflate", 7) == 0) return SRV_ENC_DEFLATE;
    return SRV_ENC_UNKNOWN;
}

/* q-value of coding `name` in an Accept-Encoding list (-1 absent; "*" counts for any coding not named). */
static double srv_enc_q(const char *ae, const char *name) {
    double star = -1, q_named = -1;
    for (const char *p = ae; *p;) {
        while (*p == ' ' || *p == ',' || *p == '\t') p++;
        const char *tok = p;
        while (*p && *p != ',' && *p != ';' && *p != ' ') p++;
        size_t tl = (size_t)(p - tok);
        double q = 1;
        while (*p == ' ') p++;
        if (*p == ';') {
            const char *qp = strstr(p, "q=");
            const char *comma = strchr(p, ',');
            if (qp && (!comma || qp < comma)) q = strtod(qp + 2, NULL);
            while (*p && *p != ',') p++;
        }
        if (tl == 1 && tok[0] == '*') star = q;
        else if (tl == strlen(name) && strncasecmp(tok, name, tl) == 0) q_named = q;
        else if (strcmp(name, "gzip") == 0 && tl == 6 && strncasecmp(tok, "x-gzip", 6) == 0) q_named = q;
        if (!tl && *p) p++;
    }
    return q_named >= 0 ? q_named : star;
}

srv_enc srv_enc_reply(const char *ae) {
    if (!ae || !*ae) return SRV_ENC_IDENTITY;
    double g = srv_enc_q(ae, "gzip"), d = srv_enc_q(ae, "deflate");
    if (g > 0 && g >= d) return SRV_ENC_GZIP;
    if (d > 0) return SRV_ENC_DEFLATE;
    return SRV_ENC_IDENTITY;
}

const char *srv_enc_name(srv_enc e) { return e == SRV_ENC_GZIP ? "gzip" : e == SRV_ENC_DEFLATE ? "deflate" : "identity"; }

/* One inflate pass with the given window bits. 0 ok, 1 corrupt, 2 over limit, 3 oom. */
static int srv_enc_pass(int wbits, const char *in, size_t n, size_t limit, char **out, size_t *outlen) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, wbits) != Z_OK) return 3;
    size_t cap = n * 4 + 1024 < limit + 1 ? n * 4 + 1024 : limit + 1, len = 0;
    char *buf = malloc(cap + 1);
    int rc = buf ? 0 : 3;
    z.next_in = (Bytef *)in;
    size_t left = n;
    while (rc == 0) {
        if (len == cap) {
            if (cap > limit) { rc = 2; break; }
            size_t nc = cap * 2 > limit + 1 ? limit + 1 : cap * 2;
            char *nb = realloc(buf, nc + 1);
            if (!nb) { rc = 3; break; }
            buf = nb;
            cap = nc;
        }
        uInt chunk_in = left > (1u << 30) ? (1u << 30) : (uInt)left;
        z.avail_in = chunk_in;
        z.next_out = (Bytef *)buf + len;
        z.avail_out = (uInt)((cap - len) > (1u << 30) ? (1u << 30) : (cap - len));
        uInt out_before = z.avail_out;
        int zr = inflate(&z, Z_NO_FLUSH);
        left -= chunk_in - z.avail_in;
        len += out_before - z.avail_out;
        if (len > limit) { rc = 2; break; }
        if (zr == Z_STREAM_END) {
            if (left == 0) break;
            /* gzip allows concatenated members */
            if (wbits >= 16 && inflateReset(&z) == Z_OK) continue;
            rc = 1;
            break;
        }
        if (zr == Z_BUF_ERROR && left == 0 && z.avail_out > 0) { rc = 1; break; } /* truncated */
        if (zr != Z_OK && zr != Z_BUF_ERROR) { rc = 1; break; }
    }
    inflateEnd(&z);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[len] = 0;
    *out = buf;
    *outlen = len;
    return 0;
}

int srv_enc_inflate(srv_enc e, const char *in, size_t n, size_t limit, char **out, size_t *outlen, char *msg,
                    size_t msg_cap) {
    *out = NULL;
    *outlen = 0;
    int rc = srv_enc_pass(e == SRV_ENC_GZIP ? 15 + 16 : 15, in, n, limit, out, outlen);
    if (rc == 1 && e == SRV_ENC_DEFLATE) rc = srv_enc_pass(-15, in, n, limit, out, outlen); /* raw deflate */
    switch (rc) {
    case 0: return 0;
    case 2:
        snprintf(msg, msg_cap, "the %s request body inflates past the body limit of %zu bytes", srv_enc_name(e), limit);
        return 413;
    case 3: snprintf(msg, msg_cap, "out of memory inflating the request body"); return 500;
    default:
        snprintf(msg, msg_cap, "the request body is not valid %s data (Content-Encoding: %s)", srv_enc_name(e),
                 srv_enc_name(e));
        return 400;
    }
}

int srv_enc_compress(srv_enc e, const char *in, size_t n, char **out, size_t *outlen) {
    if (e != SRV_ENC_GZIP && e != SRV_ENC_DEFLATE) return -1;
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, 1, Z_DEFLATED, e == SRV_ENC_GZIP ? 15 + 16 : 15, 8, Z_DEFAULT_STRATEGY) != Z_OK) return -1;
    size_t cap = deflateBound(&z, (uLong)n) + 32;
    char *buf = malloc(cap);
    if (!buf || n > (1u << 30)) {
        free(buf);
        deflateEnd(&z);
        return -1;
    }
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)n;
    z.next_out = (Bytef *)buf;
    z.avail_out = (uInt)cap;
    int zr = deflate(&z, Z_FINISH);
    size_t len = cap - z.avail_out;
    deflateEnd(&z);
    if (zr != Z_STREAM_END) {
        free(buf);
        return -1;
    }
    *out = buf;
    *outlen = len;
    return 0;
}
