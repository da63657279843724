/* seq.c - sequence values in one block (see seq.h). */
#include "seq.h"

#include <stdio.h>
#include <string.h>

static size_t seq_align(size_t n) { return (n + 63) & ~(size_t)63; }

const eng_seq *eng_seq_get(const eng_tensor *t) {
    if (!t || t->dtype != ENG_DTYPE_SEQUENCE || !t->data) return NULL;
    const eng_seq *s = t->data;
    return s->magic == ENG_SEQ_MAGIC && s->n >= 0 ? s : NULL;
}

eng_status eng_seq_make(eng_dtype elem, const eng_tensor *items, int64_t n, eng_tensor *out) {
    memset(out, 0, sizeof *out);
    if (n < 0 || n > ENG_SEQ_MAX_ITEMS)
        return eng_err(ENG_STATUS_OUT_OF_MEMORY, "a sequence of %lld elements exceeds the limit of %lld", (long long)n,
                       (long long)ENG_SEQ_MAX_ITEMS);
    size_t head = seq_align(sizeof(eng_seq) + (size_t)n * sizeof(eng_tensor)), total = head;
    for (int64_t i = 0; i < n; i++) {
        if (items[i].dtype != elem)
            return eng_err(ENG_STATUS_INVALID_ARGUMENT, "sequence element %lld has dtype %s; the sequence holds %s",
                           (long long)i, eng_dtype_name(items[i].dtype), eng_dtype_name(elem));
        size_t nb;
        char what[48];
        snprintf(what, sizeof what, "sequence element %lld", (long long)i);
        ENG_TRY(eng_tensor_nbytes_checked(&items[i], what, &nb));
        if (nb && !items[i].data) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "%s has no data", what);
        if (total > (size_t)ENG_MAX_TENSOR_BYTES)
            return eng_err(ENG_STATUS_OUT_OF_MEMORY, "a sequence of %lld elements is too large", (long long)n);
        total += seq_align(nb);
    }
    eng_seq *s = eng_alloc(total);
    if (!s) return eng_err(ENG_STATUS_OUT_OF_MEMORY, "cannot allocate a sequence of %zu bytes", total);
    s->magic = ENG_SEQ_MAGIC;
    s->elem = elem;
    s->n = n;
    s->bytes = total;
    size_t off = head;
    for (int64_t i = 0; i < n; i++) {
        size_t nb = eng_tensor_nbytes(&items[i]);
        s->items[i] = items[i];
        s->items[i].data = (char *)s + off;
        if (nb) memcpy(s->items[i].data, items[i].data, nb);
        off += seq_align(nb);
    }
    out->dtype = ENG_DTYPE_SEQUENCE;
    out->data = s;
    return ENG_STATUS_OK;
}

eng_status eng_seq_clone(const eng_tensor *src, eng_tensor *out) {
    const eng_seq *s = eng_seq_get(src);
    if (!s) return eng_err(ENG_STATUS_INVALID_ARGUMENT, "value is not a sequence");
    return eng_seq_make(s->elem, s->items, s->n, out);
}

size_t eng_value_nbytes(const eng_tensor *t) {
    if (t->dtype == ENG_DTYPE_SEQUENCE) {
        const eng_seq *s = eng_seq_get(t);
        return s ? s->bytes : 0;
    }
    return eng_tensor_nbytes(t);
}
