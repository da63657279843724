/* seq.h - sequence values (ONNX sequence(tensor) types: SequenceConstruct, SplitToSequence, Loop-built lists).
 *
 * A sequence is carried in an eng_tensor whose dtype is ENG_DTYPE_SEQUENCE (rank 0) and whose data points to ONE
 * eng_alloc block: an eng_seq header, then the element views, then every element's bytes (64-byte aligned). One
 * block means a sequence is freed, copied and handed between plans like any buffer; ops never modify a sequence in
 * place, they build a new one (ONNX values are immutable). Plans that hold sequences are dynamic (their ops
 * allocate their outputs: ENG_OP_ALLOCATES in engine/ops/op.h).
 */
#ifndef ENG_SEQ_H
#define ENG_SEQ_H

#include "tensor.h"

#define ENG_SEQ_MAGIC 0x51455354u /* "TSEQ" */
/* Most elements one sequence may hold (SplitToSequence of a long axis, a Loop appending per iteration). */
#define ENG_SEQ_MAX_ITEMS ((int64_t)1 << 24)

typedef struct eng_seq {
    uint32_t magic;
    eng_dtype elem;       /* element dtype; UNDEFINED for an empty sequence whose type is unknown */
    int64_t n;            /* elements */
    size_t bytes;         /* the whole block */
    eng_tensor items[];   /* n views into this block */
} eng_seq;

/* The sequence t carries, or NULL when t is not a well-formed sequence value. */
const eng_seq *eng_seq_get(const eng_tensor *t);
/* Build a sequence of n elements (their data copied; NULL items means n == 0) of dtype elem into *out (dtype
 * SEQUENCE, rank 0, data: a new eng_alloc block the caller owns). Elements must all have dtype elem: an error names
 * the position and both dtypes. */
eng_status eng_seq_make(eng_dtype elem, const eng_tensor *items, int64_t n, eng_tensor *out);
/* A copy of sequence value src (a new block) into *out. */
eng_status eng_seq_clone(const eng_tensor *src, eng_tensor *out);
/* Bytes of value t as stored: a sequence's block size, else eng_tensor_nbytes. */
size_t eng_value_nbytes(const eng_tensor *t);

#endif
