/* test_tfevents.c - TensorBoard event writer (engine/train/tfevents.c): CRC-32C against published check values,
 * TFRecord framing and masking, the protobuf bytes of a scalar event (hand-derived from event.proto), and a
 * written file read back record by record with every CRC verified. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/train/tfevents.h"

static uint32_t le32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

Test(tfevents, crc32c_check_values) {
    /* RFC 3720 B.4 and the "123456789" check value of CRC-32C */
    cr_assert_eq(eng_crc32c("123456789", 9), 0xE3069283u);
    uint8_t z[32], f[32], inc[32];
    memset(z, 0, 32);
    memset(f, 0xff, 32);
    for (int i = 0; i < 32; i++) inc[i] = (uint8_t)i;
    cr_assert_eq(eng_crc32c(z, 32), 0x8A9136AAu);
    cr_assert_eq(eng_crc32c(f, 32), 0x62A8AB43u);
    cr_assert_eq(eng_crc32c(inc, 32), 0x46DD794Eu);
}

Test(tfevents, mask) {
    uint32_t c = 0x12345678u;
    uint32_t m = eng_tfrecord_mask(c);
    cr_assert_eq(m, (((c >> 15) | (c << 17)) + 0xa282ead8u));
    cr_assert_neq(m, c);
}

Test(tfevents, scalar_event_bytes) {
    uint8_t buf[64];
    size_t n = eng_tfevents_encode(buf, sizeof buf, 1.5, 3, NULL, "a", 2.0f);
    const uint8_t want[] = {0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F,            /* wall_time = 1.5 */
                            0x10, 0x03,                                    /* step = 3 */
                            0x2A, 0x0A, 0x0A, 0x08,                        /* summary { value { */
                            0x0A, 0x01, 'a',                               /* tag "a" */
                            0x15, 0x00, 0x00, 0x00, 0x40};                 /* simple_value 2.0f */
    cr_assert_eq(n, sizeof want);
    cr_assert(memcmp(buf, want, n) == 0);
    n = eng_tfevents_encode(buf, sizeof buf, 0.0, 0, "brain.Event:2", NULL, 0);
    cr_assert_eq(n, 9 + 2 + 13);
    cr_assert_eq(buf[9], 0x1A);
    cr_assert_eq(buf[10], 13);
    cr_assert(memcmp(buf + 11, "brain.Event:2", 13) == 0);
    cr_assert_eq(eng_tfevents_encode(buf, 8, 1.5, 3, NULL, "a", 2.0f), 0, "too small a buffer must fail");
}

Test(tfevents, frame) {
    const char *d = "hello";
    uint8_t out[5 + 16];
    eng_tfrecord_frame(d, 5, out);
    cr_assert_eq(le64(out), 5);
    cr_assert_eq(le32(out + 8), eng_tfrecord_mask(eng_crc32c(out, 8)));
    cr_assert(memcmp(out + 12, d, 5) == 0);
    cr_assert_eq(le32(out + 17), eng_tfrecord_mask(eng_crc32c(d, 5)));
}

Test(tfevents, file_round_trip) {
    char dir[] = "/tmp/tfev-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char sub[300];
    snprintf(sub, sizeof sub, "%s/logs/1", dir);
    eng_tfevents *w = NULL;
    cr_assert_eq(eng_tfevents_open(sub, &w), ENG_STATUS_OK);
    cr_assert_eq(eng_tfevents_scalar(w, "loss", 1, 100.0, 0.5f), ENG_STATUS_OK);
    cr_assert_eq(eng_tfevents_scalar(w, "accuracy", 2, 101.0, 0.75f), ENG_STATUS_OK);
    char path[600];
    snprintf(path, sizeof path, "%s", eng_tfevents_path(w));
    cr_assert(strstr(path, "/events.out.tfevents.") != NULL);
    cr_assert_eq(eng_tfevents_close(&w), ENG_STATUS_OK);
    cr_assert_null(w);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    uint8_t buf[4096];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t off = 0;
    int records = 0;
    while (off < len) {
        cr_assert(off + 12 <= len);
        uint64_t n = le64(buf + off);
        cr_assert_eq(le32(buf + off + 8), eng_tfrecord_mask(eng_crc32c(buf + off, 8)));
        cr_assert(off + 16 + n <= len);
        cr_assert_eq(le32(buf + off + 12 + n), eng_tfrecord_mask(eng_crc32c(buf + off + 12, n)));
        if (records == 2) { /* accuracy, step 2, 0.75f */
            uint8_t want[64];
            size_t wn = eng_tfevents_encode(want, sizeof want, 101.0, 2, NULL, "accuracy", 0.75f);
            cr_assert_eq(n, wn);
            cr_assert(memcmp(buf + off + 12, want, wn) == 0);
        }
        off += 16 + n;
        records++;
    }
    cr_assert_eq(records, 3);
    unlink(path);
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    cr_assert_eq(system(path), 0);
}
