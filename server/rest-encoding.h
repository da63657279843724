/* rest-encoding.h - HTTP content codings on the REST server: gzip and deflate request bodies
 * (Content-Encoding; the body limit applies to the inflated size, so a zip bomb stops at the limit) and
 * compressed replies for clients that ask (Accept-Encoding, with q-values; replies under 1 KiB are sent as is).
 * tritonclient's request_compression_algorithm / response_compression_algorithm use exactly these.
 */
#ifndef SRV_REST_ENCODING_H
#define SRV_REST_ENCODING_H

#include <stddef.h>

typedef enum srv_enc { SRV_ENC_IDENTITY = 0, SRV_ENC_GZIP, SRV_ENC_DEFLATE, SRV_ENC_UNKNOWN } srv_enc;

/* A request's Content-Encoding (NULL or "identity": identity; "gzip", "x-gzip", "deflate"; else UNKNOWN). */
srv_enc srv_enc_request(const char *content_encoding);
/* The coding for a reply given the request's Accept-Encoding (gzip preferred over deflate at equal q). */
srv_enc srv_enc_reply(const char *accept_encoding);
/* "gzip" / "deflate" */
const char *srv_enc_name(srv_enc e);

/* Inflate n bytes of in. 0 with *out (malloc'd, NUL-terminated) and *outlen; else the HTTP status (400 corrupt
 * data, 413 inflated size over limit, 500 out of memory) with msg set. deflate accepts zlib-wrapped (RFC 9110)
 * and raw streams. */
int srv_enc_inflate(srv_enc e, const char *in, size_t n, size_t limit, char **out, size_t *outlen, char *msg,
                    size_t msg_cap);
/* Compress n bytes into *out (malloc'd). 0, or -1 (send uncompressed). */
int srv_enc_compress(srv_enc e, const char *in, size_t n, char **out, size_t *outlen);

#endif
