/* test_codec.c - unit tests of the REST codecs and metrics (server/json.c, codec-tfs.c, codec-kserve.c,
 * metrics.c): TF Serving row/columnar/b64 decoding and reply encoding, classify/regress, KServe v2 JSON and
 * binary bodies, hostile inputs (malformed JSON, 10,000 nesting levels, ragged lists, wrong names and
 * dtypes, absurd declared shapes), exact number bounds (every integer dtype's range to the last unit, through
 * all four decoders: TF Serving and v2, fast and general path; overflowing floats refused; "NaN" strings in
 * and out), and Prometheus rendering.
 *
 * The unit-test link has only libtensord.a (the engine), so the server sources under test are included here.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "server/codec-kserve.c"
#include "server/codec-tfs.c"
#include "server/json.c"
#include "server/metrics.c"
#include "server/srv.c"

/* ---- fixtures ---- */

static srv_io io_mk(const char *name, eng_dtype dt, int ndim, int64_t d0, int64_t d1) {
    srv_io io = {.name = (char *)name, .onnx_name = (char *)name, .dtype = dt, .ndim = ndim};
    io.dims[0] = d0;
    io.dims[1] = d1;
    return io;
}

static srv_io g_in1[1], g_out1[1], g_in2[2], g_out2[2];
static srv_version_info info1(eng_dtype dt) { /* x: [-1, 3] -> y: [-1, 2] */
    g_in1[0] = io_mk("x", dt, 2, -1, 3);
    g_out1[0] = io_mk("y", ENG_DTYPE_F32, 2, -1, 2);
    srv_version_info i = {.model = "m", .version = 7, .inputs = g_in1, .ninputs = 1, .outputs = g_out1, .noutputs = 1};
    return i;
}
static srv_version_info info2(void) { /* a: f32 [-1, 2], b: i64 [-1] -> p: f32 [-1], q: i32 [-1, 2] */
    g_in2[0] = io_mk("a", ENG_DTYPE_F32, 2, -1, 2);
    g_in2[1] = io_mk("b", ENG_DTYPE_I64, 1, -1, 0);
    g_out2[0] = io_mk("p", ENG_DTYPE_F32, 1, -1, 0);
    g_out2[1] = io_mk("q", ENG_DTYPE_I32, 2, -1, 2);
    srv_version_info i = {.model = "m2", .version = 1, .inputs = g_in2, .ninputs = 2, .outputs = g_out2, .noutputs = 2};
    return i;
}

static srv_code tfs(const char *body, const srv_version_info *info, srv_tensors *in, srv_tfs_format *fmt,
                    srv_error *err) {
    memset(in, 0, sizeof *in);
    memset(err, 0, sizeof *err);
    return srv_tfs_decode_predict(body, strlen(body), info, in, fmt, err);
}

static void expect_bad(const char *body, const srv_version_info *info, const char *needle) {
    srv_tensors in;
    srv_error err;
    srv_code c = tfs(body, info, &in, NULL, &err);
    cr_expect_neq(c, SRV_OK, "accepted: %s", body);
    cr_expect_eq(in.n, 0, "tensors left behind on error");
    if (needle) cr_expect(strstr(err.msg, needle) != NULL, "error '%s' lacks '%s' (body %.80s)", err.msg, needle, body);
    srv_tensors_free(&in);
}

static void add_f32(srv_tensors *s, const char *name, int ndim, const int64_t *dims, const float *v) {
    eng_tensor t = {.dtype = ENG_DTYPE_F32, .ndim = ndim};
    memcpy(t.dims, dims, sizeof(int64_t) * (size_t)ndim);
    size_t nb = eng_tensor_nbytes(&t);
    t.data = eng_alloc(nb ? nb : 1);
    memcpy(t.data, v, nb);
    cr_assert_eq(srv_tensors_add(s, name, &t), 0);
}

/* ---- json.c ---- */

Test(json, depth_check) {
    size_t n = 10000;
    char *deep = malloc(2 * n + 1);
    memset(deep, '[', n);
    memset(deep + n, ']', n);
    deep[2 * n] = 0;
    cr_expect_not(srv_json_depth_ok(deep, 2 * n, SRV_JSON_MAX_DEPTH));
    cr_expect(srv_json_depth_ok(deep + n - 64, 128, 64));
    cr_expect_not(srv_json_depth_ok(deep + n - 65, 130, 64));
    const char *s = "{\"a\":\"[[[[\\\"{{{{\",\"b\":[1]}";
    cr_expect(srv_json_depth_ok(s, strlen(s), 2));
    cr_expect_not(srv_json_depth_ok(s, strlen(s), 1));
    /* the same nesting through the decoder: refused, not parsed */
    srv_version_info info = info1(ENG_DTYPE_F32);
    char *body = malloc(2 * n + 64);
    sprintf(body, "{\"instances\":%s}", deep);
    expect_bad(body, &info, "deeper");
    free(body);
    free(deep);
}

Test(json, base64) {
    const char *msg = "any carnal pleasure.";
    for (size_t n = 0; n <= strlen(msg); n++) {
        size_t el = 0, dl = 0;
        char *e = srv_b64_encode(msg, n, &el);
        cr_assert(e);
        uint8_t out[64];
        cr_expect_eq(srv_b64_decoded_len(e, el), (int64_t)n);
        cr_expect_eq(srv_b64_decode(e, el, out, sizeof out, &dl), 0);
        cr_expect_eq(dl, n);
        cr_expect(memcmp(out, msg, n) == 0);
        if (n >= 3) cr_expect_neq(srv_b64_decode(e, el, out, n - 1, &dl), 0, "cap not enforced");
        free(e);
    }
    uint8_t out[16];
    cr_expect_eq(srv_b64_decode("YW55", 4, out, 16, NULL), 0);
    cr_expect_eq(srv_b64_decode("YW5", 3, out, 16, NULL), 0); /* unpadded is accepted */
    cr_expect_neq(srv_b64_decode("Y", 1, out, 16, NULL), 0);
    cr_expect_neq(srv_b64_decode("YW5=x", 5, out, 16, NULL), 0);
    cr_expect_neq(srv_b64_decode("YW!5", 4, out, 16, NULL), 0);
    cr_expect_neq(srv_b64_decode("Y===", 4, out, 16, NULL), 0);
    cr_expect_neq(srv_b64_decode("YW=5", 4, out, 16, NULL), 0);
    cr_expect_neq(srv_b64_decode("YW5=", 5, out, 16, NULL), 0);
}

Test(json, floats_round_trip) {
    float f[] = {0.1f, 1.0f / 3, 16777216.0f, -0.0f, 1e-45f, 3.4028235e38f, NAN, INFINITY, -INFINITY};
    eng_tensor t = {.dtype = ENG_DTYPE_F32, .ndim = 1, .dims = {9}, .data = f};
    srv_buf b = {0};
    srv_buf_json_nested(&b, &t, 0, t.dims, 1);
    char *s = srv_buf_take(&b, NULL);
    cr_expect_str_eq(s, "[0.1,0.33333334,16777216,-0,1.4013e-45,3.4028235e+38,\"NaN\",\"Infinity\",\"-Infinity\"]");
    free(s);
    double d[] = {0.1, 1.0 / 3};
    eng_tensor td = {.dtype = ENG_DTYPE_F64, .ndim = 1, .dims = {2}, .data = d};
    srv_buf_json_nested(&b, &td, 0, td.dims, 1);
    s = srv_buf_take(&b, NULL);
    cr_expect_str_eq(s, "[0.1,0.3333333333333333]");
    free(s);
    srv_buf_json_str(&b, "a\"b\\c\n\x01");
    s = srv_buf_take(&b, NULL);
    cr_expect_str_eq(s, "\"a\\\"b\\\\c\\n\\u0001\"");
    free(s);
}

/* The number reader must give exactly strtod's double for every JSON number, and its float32 path exactly
 * (float)strtod when it answers: random digit strings of 1-25 significant digits with leading zeros, fractions
 * and exponents (the eight-at-a-time digit reader, Clinger's fast path, the x87 path, the strtod fallback), and
 * 17-digit prints of doubles right at and next to points halfway between two floats. */
static void num_check(const char *s, size_t k, int *f32_answered) {
    srv_jnum n;
    cr_assert(srv_json_scan_num(s, s + k, &n), "rejected %s", s);
    cr_assert_eq(n.end, s + k, "stopped early in %s", s);
    double got = srv_jnum_double(&n), want = strtod(s, NULL);
    cr_assert(memcmp(&got, &want, sizeof got) == 0, "%s: got %.17g, strtod %.17g", s, got, want);
    float f, wf = (float)want;
    if (srv_jnum_f32(&n, &f)) {
        (*f32_answered)++;
        cr_assert(memcmp(&f, &wf, sizeof f) == 0, "%s: float path %.9g, (float)strtod %.9g", s, f, wf);
    }
}

Test(json, number_reader_matches_strtod) {
    unsigned st = 99;
    char s[80];
    int answered = 0;
    for (int it = 0; it < 200000; it++) {
        int k = 0;
        st = st * 1103515245u + 12345u;
        if (st >> 31) s[k++] = '-';
        st = st * 1103515245u + 12345u;
        int ni = (st >> 16) % 12, nf = (st >> 8) % 22, lz = (st >> 4) % 9;
        if (ni == 0) s[k++] = '0';
        for (int i = 0; i < ni; i++) {
            st = st * 1103515245u + 12345u;
            s[k++] = (char)('0' + (i == 0 ? 1 + (st >> 16) % 9 : (st >> 16) % 10));
        }
        if (nf) {
            s[k++] = '.';
            for (int i = 0; i < nf; i++) {
                st = st * 1103515245u + 12345u;
                s[k++] = (char)(i < lz ? '0' : '0' + (st >> 16) % 10);
            }
        }
        st = st * 1103515245u + 12345u;
        if ((st >> 20) % 3 == 0) k += sprintf(s + k, "e%d", (int)((st >> 8) % 80) - 40);
        s[k] = '\0';
        num_check(s, (size_t)k, &answered);
    }
    cr_expect_gt(answered, 100000, "float path answered only %d of 200000", answered);
    /* doubles at float midpoints (and 1-3 double ulps either side), printed with 17 and 18 digits */
    for (int it = 0; it < 20000; it++) {
        st = st * 1103515245u + 12345u;
        float f = (float)((st >> 8) & 0xffff) / 4096.0f + (float)(st >> 24) * 1e-3f;
        double mid = ((double)f + (double)nextafterf(f, INFINITY)) / 2;
        for (int d = -3; d <= 3; d++) {
            uint64_t b;
            memcpy(&b, &mid, sizeof b);
            b += (uint64_t)(int64_t)d;
            double v;
            memcpy(&v, &b, sizeof v);
            int k = snprintf(s, sizeof s, (it & 1) ? "%.16e" : "%.17g", v);
            num_check(s, (size_t)k, &answered);
        }
    }
    const char *bad[] = {"-", ".5", "1.", "01", "1e", "1e+", "+1", "--1", "1.e5"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        srv_jnum n;
        int ok = srv_json_scan_num(bad[i], bad[i] + strlen(bad[i]), &n);
        cr_expect(!ok || n.end != bad[i] + strlen(bad[i]), "accepted %s whole", bad[i]);
    }
}

/* ---- TF Serving predict ---- */

Test(tfs, row_single_input) {
    srv_version_info info = info1(ENG_DTYPE_F32);
    srv_tensors in;
    srv_error err;
    srv_tfs_format fmt = SRV_TFS_COLUMNAR;
    cr_assert_eq(tfs("{\"instances\": [[1, 2, 3], [4, 5.5, -6e2]]}", &info, &in, &fmt, &err), SRV_OK, "%s", err.msg);
    cr_expect_eq(fmt, SRV_TFS_ROW);
    cr_assert_eq(in.n, 1);
    cr_expect_str_eq(in.names[0], "x");
    cr_expect_eq(in.t[0].ndim, 2);
    cr_expect_eq(in.t[0].dims[0], 2);
    cr_expect_eq(in.t[0].dims[1], 3);
    float *v = in.t[0].data;
    cr_expect(v[0] == 1 && v[4] == 5.5f && v[5] == -600.0f);
    srv_tensors_free(&in);
}

Test(tfs, row_named_multi_input) {
    srv_version_info info = info2();
    srv_tensors in;
    srv_error err;
    cr_assert_eq(tfs("{\"signature_name\":\"serving_default\",\"instances\":[{\"a\":[1,2],\"b\":3},{\"b\":-4,\"a\":[5,6]}]}",
                     &info, &in, NULL, &err), SRV_OK, "%s", err.msg);
    cr_assert_eq(in.n, 2);
    int a = srv_tensors_find(&in, "a"), b = srv_tensors_find(&in, "b");
    cr_assert(a >= 0 && b >= 0);
    cr_expect_eq(in.t[a].dims[0], 2);
    cr_expect_eq(in.t[a].dims[1], 2);
    cr_expect_eq(in.t[b].ndim, 1);
    cr_expect_eq(((int64_t *)in.t[b].data)[1], -4);
    cr_expect_eq(((float *)in.t[a].data)[3], 6.0f);
    srv_tensors_free(&in);
}

Test(tfs, columnar) {
    srv_version_info info = info2();
    srv_tensors in;
    srv_error err;
    srv_tfs_format fmt = SRV_TFS_ROW;
    cr_assert_eq(tfs("{\"inputs\":{\"a\":[[1,2],[3,4],[5,6]],\"b\":[7]}}", &info, &in, &fmt, &err), SRV_OK, "%s", err.msg);
    cr_expect_eq(fmt, SRV_TFS_COLUMNAR);
    int b = srv_tensors_find(&in, "b");
    cr_expect_eq(in.t[b].dims[0], 1);
    srv_tensors_free(&in);
    srv_version_info i1 = info1(ENG_DTYPE_I32);
    cr_assert_eq(tfs("{\"inputs\":[[1,2,3]]}", &i1, &in, &fmt, &err), SRV_OK, "%s", err.msg);
    cr_expect_eq(((int32_t *)in.t[0].data)[2], 3);
    srv_tensors_free(&in);
}

Test(tfs, b64_tensors) {
    srv_version_info info = info1(ENG_DTYPE_F32);
    float v[3] = {1.5f, -2, 3};
    size_t el;
    char *e = srv_b64_encode(v, sizeof v, &el);
    char body[256];
    snprintf(body, sizeof body, "{\"instances\":[{\"b64\":\"%s\"},[4,5,6]]}", e);
    srv_tensors in;
    srv_error err;
    cr_assert_eq(tfs(body, &info, &in, NULL, &err), SRV_OK, "%s", err.msg);
    float *d = in.t[0].data;
    cr_expect(d[0] == 1.5f && d[1] == -2 && d[2] == 3 && d[5] == 6);
    srv_tensors_free(&in);
    /* b64 per element row too, and in columnar form with the batch dim inferred from the byte count */
    snprintf(body, sizeof body, "{\"inputs\":{\"b64\":\"%s\"}}", e);
    cr_assert_eq(tfs(body, &info, &in, NULL, &err), SRV_OK, "%s", err.msg);
    cr_expect_eq(in.t[0].dims[0], 1);
    srv_tensors_free(&in);
    free(e);
    e = srv_b64_encode(v, 8, &el); /* 2 floats where 3 are needed */
    snprintf(body, sizeof body, "{\"instances\":[{\"b64\":\"%s\"}]}", e);
    expect_bad(body, &info, "b64");
    free(e);
    expect_bad("{\"instances\":[{\"b64\":\"!!!!!!!!!!!!!!!!\"}]}", &info, "base64");
    expect_bad("{\"instances\":[{\"b64\":12}]}", &info, "b64");
}

Test(tfs, bad_bodies) {
    srv_version_info info = info1(ENG_DTYPE_F32);
    expect_bad("", &info, "empty");
    expect_bad("{\"instances\": [[1,2,3]", &info, "malformed");
    expect_bad("{\"instances\": [[1,2,3]]} x", &info, "trailing");
    expect_bad("[1,2,3]", &info, "object");
    expect_bad("{}", &info, "missing");
    expect_bad("{\"instances\":[[1,2,3]],\"inputs\":[[1,2,3]]}", &info, "both");
    expect_bad("{\"instances\":[]}", &info, "empty");
    expect_bad("{\"instances\":[[1,2,3],[4,5]]}", &info, "ragged");
    expect_bad("{\"instances\":[[1,2,3],[4,5,[6]]]}", &info, "ragged");
    expect_bad("{\"instances\":[[1,2,3],4]}", &info, "ragged");
    expect_bad("{\"instances\":[[1,2]]}", &info, "expected shape");
    expect_bad("{\"instances\":[[[1,2,3]]]}", &info, "expected shape");
    expect_bad("{\"instances\":[[1,\"2\",3]]}", &info, "expected a number");
    expect_bad("{\"instances\":[[1,null,3]]}", &info, "null");
    expect_bad("{\"instances\":[[1,true,3]]}", &info, "bool");
    expect_bad("{\"instances\":[[1,1e39,3]]}", &info, "out of range");
    expect_bad("{\"instances\":[{\"z\":[1,2,3]}]}", &info, "unknown input 'z'");
    expect_bad("{\"signature_name\":\"other\",\"instances\":[[1,2,3]]}", &info, "other");
    expect_bad("{\"instances\":[[[[[[[[[[1]]]]]]]]]]}", &info, "deeper than 8");
    srv_version_info i2 = info2();
    expect_bad("{\"instances\":[[1,2]]}", &i2, "2 inputs");
    expect_bad("{\"instances\":[{\"a\":[1,2]}]}", &i2, "missing input 'b'");
    expect_bad("{\"instances\":[{\"a\":[1,2],\"b\":1},{\"a\":[1,2]}]}", &i2, "instance 1");
    expect_bad("{\"instances\":[{\"a\":[1,2],\"b\":1.5}]}", &i2, "integer");
    expect_bad("{\"inputs\":{\"a\":[[1,2]]}}", &i2, "missing input 'b'");
    expect_bad("{\"instances\":[{\"a\":[1,2],\"b\":1,\"b\":2}]}", &i2, "twice");
    srv_version_info u8 = info1(ENG_DTYPE_U8);
    expect_bad("{\"instances\":[[1,2,256]]}", &u8, "out of range");
    expect_bad("{\"instances\":[[1,2,-1]]}", &u8, "element 2");
    srv_version_info bl = info1(ENG_DTYPE_BOOL);
    expect_bad("{\"instances\":[[1,0,1]]}", &bl, "true/false");
    srv_tensors in;
    srv_error err;
    cr_expect_eq(tfs("{\"instances\":[[true,false,true]]}", &bl, &in, NULL, &err), SRV_OK, "%s", err.msg);
    srv_tensors_free(&in);
}

Test(tfs, encode_predict) {
    srv_version_info info = info2();
    srv_tensors out = {0};
    int64_t d1[] = {2}, d2[] = {2, 2};
    float p[] = {0.5f, -1};
    add_f32(&out, "p", 1, d1, p);
    eng_tensor q = {.dtype = ENG_DTYPE_I32, .ndim = 2, .dims = {2, 2}};
    q.data = eng_alloc(16);
    int32_t qv[] = {1, 2, 3, 4};
    memcpy(q.data, qv, 16);
    srv_tensors_add(&out, "q", &q);
    srv_error err = {0};
    size_t len;
    char *s = srv_tfs_encode_predict(&info, &out, SRV_TFS_ROW, &len, &err);
    cr_assert(s, "%s", err.msg);
    cr_expect_str_eq(s, "{\"predictions\":[{\"p\":0.5,\"q\":[1,2]},{\"p\":-1,\"q\":[3,4]}]}");
    cr_expect_eq(len, strlen(s));
    free(s);
    s = srv_tfs_encode_predict(&info, &out, SRV_TFS_COLUMNAR, &len, &err);
    cr_expect_str_eq(s, "{\"outputs\":{\"p\":[0.5,-1],\"q\":[[1,2],[3,4]]}}");
    free(s);
    srv_tensors_free(&out);
    float y[] = {1, 2, 3, 4};
    add_f32(&out, "y", 2, d2, y);
    s = srv_tfs_encode_predict(&info, &out, SRV_TFS_ROW, &len, &err);
    cr_expect_str_eq(s, "{\"predictions\":[[1,2],[3,4]]}");
    free(s);
    s = srv_tfs_encode_predict(&info, &out, SRV_TFS_COLUMNAR, &len, &err);
    cr_expect_str_eq(s, "{\"outputs\":[[1,2],[3,4]]}");
    free(s);
    /* inconsistent batch sizes cannot be split into rows */
    add_f32(&out, "z", 1, (int64_t[]){3}, y);
    cr_expect_null(srv_tfs_encode_predict(&info, &out, SRV_TFS_ROW, &len, &err));
    cr_expect(strstr(err.msg, "batch") != NULL);
    srv_tensors_free(&out);
}

Test(tfs, round_trip) {
    srv_version_info info = info1(ENG_DTYPE_F32);
    const char *body = "{\"instances\":[[0.1,0.2,0.30000001],[1e-07,-3.5,1e+20]]}";
    srv_tensors in;
    srv_error err;
    cr_assert_eq(tfs(body, &info, &in, NULL, &err), SRV_OK, "%s", err.msg);
    size_t len;
    char *s = srv_tfs_encode_predict(&info, &in, SRV_TFS_ROW, &len, &err);
    cr_expect_str_eq(s, "{\"predictions\":[[0.1,0.2,0.3],[1e-07,-3.5,1e+20]]}");
    srv_tensors in2;
    char *again = malloc(len + 32);
    sprintf(again, "{\"instances\":%s}", strchr(s, '['));
    again[strlen(again) - 1] = '\0'; /* drop the extra closing brace of the reply */
    cr_assert_eq(tfs(again, &info, &in2, NULL, &err), SRV_OK, "%s: %s", err.msg, again);
    cr_expect(memcmp(in.t[0].data, in2.t[0].data, 24) == 0, "values changed in a round trip");
    free(again);
    free(s);
    srv_tensors_free(&in);
    srv_tensors_free(&in2);
}

Test(tfs, classify_regress) {
    srv_version_info info = info1(ENG_DTYPE_F32);
    srv_tensors in = {0};
    srv_error err = {0};
    const char *b1 = "{\"examples\":[{\"x\":[1,2,3]},{\"x\":[4,5,6]}]}";
    cr_assert_eq(srv_tfs_decode_examples(b1, strlen(b1), &info, &in, &err), SRV_OK, "%s", err.msg);
    cr_expect_eq(in.t[0].dims[0], 2);
    cr_expect_eq(((float *)in.t[0].data)[5], 6.0f);
    srv_tensors_free(&in);
    const char *b2 = "{\"context\":{\"feat\":[1,2,3]},\"examples\":[{},{}]}"; /* the only feature, from context */
    cr_assert_eq(srv_tfs_decode_examples(b2, strlen(b2), &info, &in, &err), SRV_OK, "%s", err.msg);
    cr_expect_eq(in.t[0].dims[0], 2);
    srv_tensors_free(&in);
    const char *b3 = "{\"examples\":[{\"x\":[1,2]}]}";
    cr_expect_neq(srv_tfs_decode_examples(b3, strlen(b3), &info, &in, &err), SRV_OK);
    const char *b4 = "{\"examples\":[{\"a\":1,\"b\":2}]}";
    cr_expect_neq(srv_tfs_decode_examples(b4, strlen(b4), &info, &in, &err), SRV_OK);
    cr_expect(strstr(err.msg, "no feature 'x'") != NULL, "%s", err.msg);
    cr_expect_eq(in.n, 0);

    srv_tensors out = {0};
    float sc[] = {0.25f, 0.75f, 1, 0};
    add_f32(&out, "scores", 2, (int64_t[]){2, 2}, sc);
    size_t len;
    char *s = srv_tfs_encode_classify(&info, &out, &len, &err);
    cr_expect_str_eq(s, "{\"results\":[[[\"0\",0.25],[\"1\",0.75]],[[\"0\",1],[\"1\",0]]]}");
    free(s);
    const char *labels[] = {"cat", "dog"};
    info.labels = labels;
    info.nlabels = 2;
    s = srv_tfs_encode_classify(&info, &out, &len, &err);
    cr_expect_str_eq(s, "{\"results\":[[[\"cat\",0.25],[\"dog\",0.75]],[[\"cat\",1],[\"dog\",0]]]}");
    free(s);
    cr_expect_null(srv_tfs_encode_regress(&info, &out, &len, &err));
    srv_tensors_free(&out);
    add_f32(&out, "outputs", 2, (int64_t[]){2, 1}, sc);
    s = srv_tfs_encode_regress(&info, &out, &len, &err);
    cr_expect_str_eq(s, "{\"results\":[0.25,0.75]}");
    free(s);
    srv_tensors_free(&out);
}

/* ---- KServe v2 ---- */

static srv_code ks(const char *body, size_t len, size_t json_len, const srv_version_info *info, srv_tensors *in,
                   srv_kserve_req *r, srv_error *err) {
    memset(in, 0, sizeof *in);
    memset(err, 0, sizeof *err);
    return srv_kserve_decode_infer(body, len, json_len, info, in, r, err);
}

static void ks_bad(const char *body, const srv_version_info *info, const char *needle) {
    srv_tensors in;
    srv_kserve_req r;
    srv_error err;
    cr_expect_neq(ks(body, strlen(body), strlen(body), info, &in, &r, &err), SRV_OK, "accepted %s", body);
    cr_expect_eq(in.n, 0);
    cr_expect_null(r.id);
    if (needle) cr_expect(strstr(err.msg, needle) != NULL, "error '%s' lacks '%s'", err.msg, needle);
}

Test(kserve, json_infer) {
    srv_version_info info = info1(ENG_DTYPE_F32);
    const char *b = "{\"id\":\"r1\",\"parameters\":{\"binary_data_output\":false},\"inputs\":[{\"name\":\"x\","
                    "\"shape\":[2,3],\"datatype\":\"FP32\",\"data\":[[1,2,3],[4,5,6]]}],"
                    "\"outputs\":[{\"name\":\"y\",\"parameters\":{\"binary_data\":true}}]}";
    srv_tensors in;
    srv_kserve_req r;
    srv_error err;
    cr_assert_eq(ks(b, strlen(b), strlen(b), &info, &in, &r, &err), SRV_OK, "%s", err.msg);
    cr_expect_str_eq(r.id, "r1");
    cr_expect_eq(r.noutputs, 1);
    cr_expect_str_eq(r.outputs[0], "y");
    cr_expect_eq(r.output_binary[0], 1);
    cr_expect_eq(in.t[0].dims[1], 3);
    cr_expect_eq(((float *)in.t[0].data)[4], 5.0f);
    /* reply: y as binary, with the JSON header length */
    srv_tensors out = {0};
    float y[] = {1, 2, 3, 4};
    add_f32(&out, "y", 2, (int64_t[]){2, 2}, y);
    size_t len, hl;
    char *s = srv_kserve_encode_infer(&info, &out, &r, &len, &hl, &err);
    cr_assert(s, "%s", err.msg);
    cr_expect_eq(len, hl + 16);
    cr_expect(memcmp(s + hl, y, 16) == 0);
    s[hl] = 0;
    cr_expect_str_eq(s, "{\"id\":\"r1\",\"model_name\":\"m\",\"model_version\":\"7\",\"outputs\":[{\"name\":\"y\","
                        "\"datatype\":\"FP32\",\"shape\":[2,2],\"parameters\":{\"binary_data_size\":16}}]}");
    free(s);
    srv_kserve_req_free(&r);
    s = srv_kserve_encode_infer(&info, &out, NULL, &len, &hl, &err);
    cr_expect_eq(len, hl);
    cr_expect_str_eq(s, "{\"model_name\":\"m\",\"model_version\":\"7\",\"outputs\":[{\"name\":\"y\",\"datatype\":"
                        "\"FP32\",\"shape\":[2,2],\"data\":[1,2,3,4]}]}");
    free(s);
    srv_tensors_free(&out);
    srv_tensors_free(&in);
}

Test(kserve, binary_infer) {
    srv_version_info info = info2();
    const char *hdr = "{\"inputs\":[{\"name\":\"b\",\"shape\":[2],\"datatype\":\"INT64\",\"parameters\":"
                      "{\"binary_data_size\":16}},{\"name\":\"a\",\"shape\":[2,2],\"datatype\":\"FP32\","
                      "\"parameters\":{\"binary_data_size\":16}}]}";
    size_t hl = strlen(hdr);
    char body[512];
    int64_t bv[] = {-5, 9};
    float av[] = {1, 2, 3, 4};
    memcpy(body, hdr, hl);
    memcpy(body + hl, bv, 16);
    memcpy(body + hl + 16, av, 16);
    srv_tensors in;
    srv_kserve_req r;
    srv_error err;
    cr_assert_eq(ks(body, hl + 32, hl, &info, &in, &r, &err), SRV_OK, "%s", err.msg);
    int a = srv_tensors_find(&in, "a"), b = srv_tensors_find(&in, "b");
    cr_expect_eq(((int64_t *)in.t[b].data)[0], -5);
    cr_expect_eq(((float *)in.t[a].data)[3], 4.0f);
    srv_tensors_free(&in);
    srv_kserve_req_free(&r);
    /* short binary part, trailing bytes, header longer than the body */
    cr_expect_neq(ks(body, hl + 31, hl, &info, &in, &r, &err), SRV_OK);
    cr_expect(strstr(err.msg, "past the end") != NULL, "%s", err.msg);
    memcpy(body + hl + 32, "xx", 2);
    cr_expect_neq(ks(body, hl + 34, hl, &info, &in, &r, &err), SRV_OK);
    cr_expect(strstr(err.msg, "additional") != NULL, "%s", err.msg);
    cr_expect_neq(ks(body, hl, hl + 1, &info, &in, &r, &err), SRV_OK);
    cr_expect_eq(in.n, 0);
}

Test(kserve, bad_requests) {
    srv_version_info info = info1(ENG_DTYPE_F32);
    ks_bad("{\"inputs\":[{\"name\":\"x\",\"shape\":[1099511627776],\"datatype\":\"FP32\",\"data\":[1]}]}", &info,
           "shape");
    ks_bad("{\"inputs\":[{\"name\":\"x\",\"shape\":[1099511627776,3],\"datatype\":\"FP32\",\"data\":[1]}]}", &info,
           "too large");
    ks_bad("{\"inputs\":[{\"name\":\"x\",\"shape\":[4294967296,3],\"datatype\":\"FP32\",\"parameters\":"
           "{\"binary_data_size\":12}}]}", &info, NULL);
    ks_bad("{\"inputs\":[{\"name\":\"x\",\"shape\":[1000000,3],\"datatype\":\"FP32\",\"data\":[1,2,3]}]}", &info,
           "needs 3000000");
    ks_bad("{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP64\",\"data\":[1,2,3]}]}", &info,
           "datatype");
    ks_bad("{\"inputs\":[{\"name\":\"x\",\"shape\":[1,4],\"datatype\":\"FP32\",\"data\":[1,2,3,4]}]}", &info,
           "unexpected shape");
    ks_bad("{\"inputs\":[{\"name\":\"x\",\"shape\":[1,-3],\"datatype\":\"FP32\",\"data\":[1,2,3]}]}", &info, NULL);
    ks_bad("{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3.5],\"datatype\":\"FP32\",\"data\":[1,2,3]}]}", &info, NULL);
    ks_bad("{\"inputs\":[{\"name\":\"w\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,2,3]}]}", &info,
           "unexpected inference input 'w'");
    ks_bad("{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,\"a\",3]}]}", &info,
           "element 1");
    ks_bad("{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,{},3]}]}", &info, NULL);
    ks_bad("{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\"}]}", &info, "neither");
    ks_bad("{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,2,3]}],"
           "\"outputs\":[{\"name\":\"nope\"}]}", &info, "nope");
    ks_bad("{\"id\":\"a\",\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,2,3]},"
           "{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,2,3]}]}", &info, "twice");
    ks_bad("{\"inputs\":[]}", &info, "non-empty");
    ks_bad("{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\",\"data\":[1,2,3]}", &info, "malformed");
    ks_bad("{\"inputs\":[{\"name\":\"x\",\"shape\":[1,1,1,1,1,1,1,1,1],\"datatype\":\"FP32\",\"data\":[1]}]}", &info,
           NULL);
    srv_version_info i2 = info2();
    ks_bad("{\"inputs\":[{\"name\":\"a\",\"shape\":[1,2],\"datatype\":\"FP32\",\"data\":[1,2]}]}", &i2, "missing 'b'");
}

Test(kserve, dtypes) {
    const char *names[] = {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
                           "INT32", "INT64", "FP16", "FP32", "FP64", "BF16", "BYTES"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        cr_expect_str_eq(srv_kserve_dtype(srv_kserve_dtype_parse(names[i])), names[i]);
    cr_expect_eq(srv_kserve_dtype_parse("fp32"), ENG_DTYPE_UNDEFINED);
    cr_expect_str_eq(srv_tf_dtype(ENG_DTYPE_F32), "DT_FLOAT");
    cr_expect_str_eq(srv_tf_dtype(ENG_DTYPE_I64), "DT_INT64");
}

/* ---- exact number bounds ---- */

/* The four ways a number reaches a tensor: TF Serving fast list reader and cJSON path (named instances), KServe
 * v2 fast reader and cJSON path (an extra "parameters" member). Each decodes "[a,b,c]" for x: dt [-1,3]. */
static srv_code num_decode(int way, eng_dtype dt, const char *vals, srv_tensors *in, srv_error *err) {
    srv_version_info info = info1(dt);
    char body[2048];
    const char *kd = srv_kserve_dtype(dt);
    switch (way) {
    case 0: snprintf(body, sizeof body, "{\"instances\":[[%s]]}", vals); break;
    case 1: snprintf(body, sizeof body, "{\"instances\":[{\"x\":[%s]}]}", vals); break;
    case 2: snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"%s\",\"shape\":[1,3],\"data\":[%s]}]}",
                     kd, vals); break;
    default: snprintf(body, sizeof body, "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"%s\",\"shape\":[1,3],"
                      "\"parameters\":{},\"data\":[%s]}]}", kd, vals); break;
    }
    memset(in, 0, sizeof *in);
    memset(err, 0, sizeof *err);
    if (way < 2) return srv_tfs_decode_predict(body, strlen(body), &info, in, NULL, err);
    srv_kserve_req r;
    srv_code c = srv_kserve_decode_infer(body, strlen(body), strlen(body), &info, in, &r, err);
    srv_kserve_req_free(&r);
    return c;
}

static void num_ok(eng_dtype dt, const char *vals, const void *want) {
    for (int way = 0; way < 4; way++) {
        srv_tensors in;
        srv_error err;
        cr_assert_eq(num_decode(way, dt, vals, &in, &err), SRV_OK, "%s [%s] way %d: %s", eng_dtype_name(dt), vals,
                     way, err.msg);
        cr_expect(memcmp(in.t[0].data, want, 3 * eng_dtype_size(dt)) == 0, "%s [%s] way %d: wrong values",
                  eng_dtype_name(dt), vals, way);
        srv_tensors_free(&in);
    }
}

static void num_bad(eng_dtype dt, const char *vals, const char *needle1, const char *needle2) {
    for (int way = 0; way < 4; way++) {
        srv_tensors in;
        srv_error err;
        cr_expect_eq(num_decode(way, dt, vals, &in, &err), SRV_INVALID_ARGUMENT, "%s [%s] way %d accepted",
                     eng_dtype_name(dt), vals, way);
        cr_expect_eq(in.n, 0);
        cr_expect(strstr(err.msg, "input 'x'") != NULL, "[%s] way %d: '%s' does not name the input", vals, way, err.msg);
        if (needle1) cr_expect(strstr(err.msg, needle1) != NULL, "[%s] way %d: '%s' lacks '%s'", vals, way, err.msg, needle1);
        if (needle2) cr_expect(strstr(err.msg, needle2) != NULL, "[%s] way %d: '%s' lacks '%s'", vals, way, err.msg, needle2);
        srv_tensors_free(&in);
    }
}

Test(numbers, int64_exact_bounds) {
    int64_t w1[] = {INT64_MAX, INT64_MIN, 0};
    num_ok(ENG_DTYPE_I64, "9223372036854775807,-9223372036854775808,-0", w1);
    int64_t w2[] = {INT64_MAX, INT64_MAX - 1, 9007199254740993}; /* 2^53 + 1: no double holds it */
    num_ok(ENG_DTYPE_I64, "9.223372036854775807e18,9223372036854775806,9007199254740993", w2);
    int64_t w3[] = {100, 123, -1200};
    num_ok(ENG_DTYPE_I64, "1e2,12300e-2,-1.2e3", w3);
    num_bad(ENG_DTYPE_I64, "1,9223372036854775808,3", "out of range for int64", "9223372036854775808");
    num_bad(ENG_DTYPE_I64, "1,2,-9223372036854775809", "-9223372036854775809", "[-9223372036854775808, 9223372036854775807]");
    num_bad(ENG_DTYPE_I64, "1,2,1e19", "out of range", "1e19");
    num_bad(ENG_DTYPE_I64, "1,2,1e400", "out of range", NULL);
    num_bad(ENG_DTYPE_I64, "1,2,9223372036854775807.5", "expected an integer", NULL);
    num_bad(ENG_DTYPE_I64, "1,2,1e-400", "expected an integer", NULL);
    num_bad(ENG_DTYPE_I64, "1,2,1.5", "expected an integer", "1.5");
    num_bad(ENG_DTYPE_I64, "1,2,\"NaN\"", "expected an integer", "string");
    char big[600];
    memset(big, '9', 400);
    strcpy(big + 400, ",1,2");
    num_bad(ENG_DTYPE_I64, big, "out of range", "400 characters");
}

Test(numbers, other_integer_bounds) {
    int32_t i32[] = {INT32_MAX, INT32_MIN, 7};
    num_ok(ENG_DTYPE_I32, "2147483647,-2147483648,7", i32);
    num_bad(ENG_DTYPE_I32, "2147483648,0,0", "out of range for int32", "[-2147483648, 2147483647]");
    num_bad(ENG_DTYPE_I32, "0,-2147483649,0", "-2147483649", NULL);
    uint8_t u8[] = {255, 0, 0};
    num_ok(ENG_DTYPE_U8, "255,0,-0", u8);
    num_bad(ENG_DTYPE_U8, "256,0,0", "out of range for uint8", "[0, 255]");
    num_bad(ENG_DTYPE_U8, "0,-1,0", "out of range", NULL);
    int8_t i8[] = {127, -128, 0};
    num_ok(ENG_DTYPE_I8, "127,-128,0", i8);
    num_bad(ENG_DTYPE_I8, "-129,0,0", "out of range", NULL);
    uint16_t u16[] = {65535, 0, 1};
    num_ok(ENG_DTYPE_U16, "65535,0,1", u16);
    num_bad(ENG_DTYPE_U16, "65536,0,0", "out of range", NULL);
    int16_t i16[] = {32767, -32768, 1};
    num_ok(ENG_DTYPE_I16, "32767,-32768,1", i16);
    num_bad(ENG_DTYPE_I16, "32768,0,0", "out of range", NULL);
    uint32_t u32[] = {UINT32_MAX, 0, 1};
    num_ok(ENG_DTYPE_U32, "4294967295,0,1", u32);
    num_bad(ENG_DTYPE_U32, "4294967296,0,0", "out of range", NULL);
    uint64_t u64[] = {UINT64_MAX, 0, 10000000000000000000ull};
    num_ok(ENG_DTYPE_U64, "18446744073709551615,0,1e19", u64);
    num_bad(ENG_DTYPE_U64, "18446744073709551616,0,0", "out of range for uint64", "[0, 18446744073709551615]");
    num_bad(ENG_DTYPE_U64, "-1,0,0", "out of range", NULL);
}

Test(numbers, floats_overflow_and_specials) {
    num_bad(ENG_DTYPE_F32, "1e400,0,0", "1e400", "overflows");
    num_bad(ENG_DTYPE_F32, "0,-1e400,0", "out of range", NULL);
    num_bad(ENG_DTYPE_F64, "1e400,0,0", "overflows", NULL);
    num_bad(ENG_DTYPE_F32, "1e39,0,0", "out of range for float32", "3.4028235e+38");
    num_bad(ENG_DTYPE_F32, "3.4028236e38,0,0", "out of range for float32", NULL);
    char big[600];
    memset(big, '1', 400);
    strcpy(big + 400, ",0,0");
    num_bad(ENG_DTYPE_F32, big, "out of range", "400 characters");
    num_bad(ENG_DTYPE_F64, big, "out of range", NULL);
    num_bad(ENG_DTYPE_F32, "\"inf\",0,0", "expected a number", NULL);
    num_bad(ENG_DTYPE_F32, "\"nan\",0,0", "expected a number", NULL);
    float f1[] = {FLT_MAX, -FLT_MAX, 0};
    num_ok(ENG_DTYPE_F32, "3.4028235e38,-3.40282356e38,0", f1); /* the second rounds to the largest float */
    double d1[] = {1e39, -1e308, 5e-324};
    num_ok(ENG_DTYPE_F64, "1e39,-1e308,5e-324", d1);
    num_bad(ENG_DTYPE_F16, "65520,0,0", "out of range for float16", "65504");
    for (int way = 0; way < 4; way++) { /* the strings a reply carries are read back as the same values */
        srv_tensors in;
        srv_error err;
        cr_assert_eq(num_decode(way, ENG_DTYPE_F32, "\"NaN\",\"Infinity\",\"-Infinity\"", &in, &err), SRV_OK,
                     "way %d: %s", way, err.msg);
        const float *v = in.t[0].data;
        cr_expect(isnan(v[0]) && isinf(v[1]) && v[1] > 0 && isinf(v[2]) && v[2] < 0, "way %d", way);
        srv_tensors_free(&in);
        cr_assert_eq(num_decode(way, ENG_DTYPE_F64, "\"NaN\",1,\"-Infinity\"", &in, &err), SRV_OK, "%s", err.msg);
        cr_expect(isnan(((double *)in.t[0].data)[0]));
        srv_tensors_free(&in);
    }
}

Test(numbers, text_and_int64_helper) {
    int neg;
    uint64_t mag;
    cr_expect_eq(srv_text_int("0.0e5", 5, &neg, &mag), SRV_JINT_OK);
    cr_expect_eq(mag, 0);
    cr_expect_eq(srv_text_int("-1.2300e2", 9, &neg, &mag), SRV_JINT_OK);
    cr_expect(neg && mag == 123);
    cr_expect_eq(srv_text_int("123e-2", 6, &neg, &mag), SRV_JINT_FRACTION);
    cr_expect_eq(srv_text_int("1e999999999999", 14, &neg, &mag), SRV_JINT_HUGE);
    cr_expect_eq(srv_text_int("1e-999999999999", 15, &neg, &mag), SRV_JINT_FRACTION);
    cr_expect_eq(srv_text_int("0.00000000000000000000000001e26", 31, &neg, &mag), SRV_JINT_OK);
    cr_expect_eq(mag, 1);
    /* srv_json_parse keeps the text of long numbers, in document order, past strings full of digits */
    const char *b = "{\"k-1\":\"9223372036854775807 \\\" -5e5\",\"v\":[9223372036854775807,1.5,9223372036854775808,"
                    "-9223372036854775808,4611686018427387905,\"x\",1e2,{\"w\":-9223372036854775809}]}";
    srv_error err = {0};
    cJSON *j = srv_json_parse(b, strlen(b), &err);
    cr_assert(j, "%s", err.msg);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "v");
    int64_t x = 0;
    cr_expect(srv_json_int64(cJSON_GetArrayItem(v, 0), &x) && x == INT64_MAX);
    cr_expect_not(srv_json_int64(cJSON_GetArrayItem(v, 1), &x));
    cr_expect_not(srv_json_int64(cJSON_GetArrayItem(v, 2), &x));
    cr_expect(srv_json_int64(cJSON_GetArrayItem(v, 3), &x) && x == INT64_MIN);
    cr_expect(srv_json_int64(cJSON_GetArrayItem(v, 4), &x) && x == 4611686018427387905);
    cr_expect_not(srv_json_int64(cJSON_GetArrayItem(v, 5), &x));
    cr_expect(srv_json_int64(cJSON_GetArrayItem(v, 6), &x) && x == 100);
    cr_expect_not(srv_json_int64(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(v, 7), "w"), &x));
    cr_expect(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "k-1")));
    cr_expect_not_null(cJSON_GetArrayItem(v, 0)->valuestring, "2^63-1 needs its text");
    cr_expect_null(cJSON_GetArrayItem(v, 1)->valuestring, "1.5 needs no text");
    cr_expect_null(cJSON_GetArrayItem(v, 6)->valuestring, "1e2 reads exactly as a double: no text kept");
    /* tokens and nodes that do not pair up (here: one token too many) leave no text at all */
    const char *b2 = "{\"v\":[9223372036854775807,1]}";
    cJSON *j2 = srv_json_parse(b2, strlen(b2), &err);
    cr_assert(j2, "%s", err.msg);
    cr_expect_not_null(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j2, "v"), 0)->valuestring);
    const char *b3 = "{\"v\":[9223372036854775807,1,2]}";
    cr_expect_eq(srv_json_attach_texts(j2, b3, strlen(b3)), 0);
    cr_expect_null(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j2, "v"), 0)->valuestring);
    cJSON_Delete(j2);
    cJSON_Delete(j);
    /* a body of long floats (as json.dumps writes float64s) keeps no texts: no allocation per number */
    const char *b4 = "[0.12573022246360779,-0.13210486329130001,6.4042265112136694e-01,1.2e-05]";
    cJSON *j4 = srv_json_parse(b4, strlen(b4), &err);
    cr_assert(j4, "%s", err.msg);
    for (const cJSON *c = j4->child; c; c = c->next) cr_expect_null(c->valuestring, "%.17g kept its text", c->valuedouble);
    cJSON_Delete(j4);
    /* a v2 shape entry is exact: 2^62 + 1 is refused, not rounded down to 2^62 */
    srv_version_info info = info1(ENG_DTYPE_F32);
    ks_bad("{\"inputs\":[{\"name\":\"x\",\"shape\":[4611686018427387905,3],\"datatype\":\"FP32\",\"data\":[1]}]}",
           &info, "non-negative integers");
}

Test(numbers, non_finite_replies_are_strict_json) {
    float f[] = {NAN, INFINITY, -INFINITY, 1.5f};
    srv_version_info info = info1(ENG_DTYPE_F32);
    srv_tensors out = {0};
    add_f32(&out, "y", 2, (int64_t[]){2, 2}, f);
    srv_error err = {0};
    size_t len, hl;
    char *s = srv_tfs_encode_predict(&info, &out, SRV_TFS_ROW, &len, &err);
    cr_expect_str_eq(s, "{\"predictions\":[[\"NaN\",\"Infinity\"],[\"-Infinity\",1.5]]}");
    free(s);
    s = srv_tfs_encode_regress(&info, &(srv_tensors){.n = 1, .names = out.names, .t = &(eng_tensor){
                                   .dtype = ENG_DTYPE_F32, .ndim = 1, .dims = {2}, .data = f}}, &len, &err);
    cr_expect_str_eq(s, "{\"results\":[\"NaN\",\"Infinity\"]}");
    free(s);
    s = srv_kserve_encode_infer(&info, &out, NULL, &len, &hl, &err);
    cr_expect(strstr(s, "\"data\":[\"NaN\",\"Infinity\",\"-Infinity\",1.5]") != NULL, "%s", s);
    free(s);
    double d[] = {NAN, -INFINITY};
    eng_tensor td = {.dtype = ENG_DTYPE_F64, .ndim = 1, .dims = {2}, .data = d};
    srv_buf b = {0};
    srv_buf_json_nested(&b, &td, 0, td.dims, 1);
    s = srv_buf_take(&b, NULL);
    cr_expect_str_eq(s, "[\"NaN\",\"-Infinity\"]");
    free(s);
    srv_tensors_free(&out);
}

/* ---- metrics ---- */

Test(metrics, render) {
    srv_metrics *m = srv_metrics_new();
    cr_assert(m);
    srv_metrics_request(m, "fash\"ion\\", 3, "stable", "predict", "rest", SRV_OK, 700);
    srv_metrics_request(m, "fash\"ion\\", 3, NULL, "predict", "rest", SRV_INVALID_ARGUMENT, 70000000);
    srv_metrics_batch(m, "m", 1, 3, 4);
    srv_metrics_queue(m, "m", 1, 120);
    srv_metrics_load(m, "m", 1, 12.5, 1024);
    srv_metrics_swap(m, "m", 1, "load");
    srv_metrics_swap(m, "m", 1, "load");
    srv_metrics_state(m, "m", 1, 30);
    size_t len;
    char *s = srv_metrics_render(m, &len);
    cr_assert(s);
    cr_expect_eq(len, strlen(s));
    cr_expect(strstr(s, "# HELP tensord_request_count ") != NULL);
    cr_expect(strstr(s, "# TYPE tensord_request_latency_us histogram\n") != NULL);
    cr_expect(strstr(s, "tensord_request_count{model=\"fash\\\"ion\\\\\",version=\"3\",label=\"stable\","
                        "api=\"predict\",protocol=\"rest\",status=\"OK\"} 1\n") != NULL, "%s", s);
    cr_expect(strstr(s, "status=\"INVALID_ARGUMENT\"} 1\n") != NULL);
    /* the labelled request has a latency series of its own (per-route latency) */
    cr_expect(strstr(s, "tensord_request_latency_us_bucket{model=\"fash\\\"ion\\\\\",version=\"3\",label=\"stable\","
                        "api=\"predict\",protocol=\"rest\",le=\"1000\"} 1\n") != NULL, "%s", s);
    cr_expect(strstr(s, "tensord_request_latency_us_bucket{model=\"fash\\\"ion\\\\\",version=\"3\",api=\"predict\","
                        "protocol=\"rest\",le=\"1000\"} 0\n") != NULL, "%s", s);
    cr_expect(strstr(s, "le=\"+Inf\"} 1\n") != NULL);
    cr_expect(strstr(s, "tensord_request_latency_us_count{model=\"fash\\\"ion\\\\\",version=\"3\",api=\"predict\",protocol=\"rest\"} 1\n"));
    cr_expect(strstr(s, "tensord_request_latency_us_sum{model=\"fash\\\"ion\\\\\",version=\"3\",api=\"predict\",protocol=\"rest\"} 70000000\n"));
    cr_expect(strstr(s, "tensord_request_latency_us_sum{model=\"fash\\\"ion\\\\\",version=\"3\",label=\"stable\",api=\"predict\",protocol=\"rest\"} 700\n"));
    cr_expect(strstr(s, "tensord_batch_size_bucket{model=\"m\",version=\"1\",le=\"2\"} 0\n"));
    cr_expect(strstr(s, "tensord_batch_size_bucket{model=\"m\",version=\"1\",le=\"4\"} 1\n"));
    cr_expect(strstr(s, "tensord_model_swap_count{model=\"m\",version=\"1\",event=\"load\"} 2\n"));
    cr_expect(strstr(s, "tensord_model_weights_bytes{model=\"m\",version=\"1\"} 1024\n"));
    cr_expect(strstr(s, "tensord_model_load_latency_ms{model=\"m\",version=\"1\"} 12.5\n"));
    cr_expect(strstr(s, "tensord_model_version_state{model=\"m\",version=\"1\"} 30\n"));
    free(s);
    srv_metrics_forget(m, "m", 1);
    s = srv_metrics_render(m, &len);
    cr_expect_null(strstr(s, "tensord_model_weights_bytes{"));
    cr_expect_null(strstr(s, "tensord_model_version_state{"));
    free(s);
    /* bounded cardinality: client-chosen names cannot grow memory without limit */
    char name[32];
    for (int i = 0; i < SRV_METRICS_MAX_SERIES + 50; i++) {
        snprintf(name, sizeof name, "m%d", i);
        srv_metrics_request(m, name, 1, NULL, "predict", "rest", SRV_OK, 1);
    }
    cr_expect_leq(m->f[SRV_F_REQ_COUNT].n, SRV_METRICS_MAX_SERIES);
    cr_expect_gt(m->dropped, 0);
    srv_metrics_free(&m);
    cr_expect_null(m);
}
