/* rnn.h - what the recurrent op definitions (rnn.c) share with their gradient ops (grad-rnn.c). */
#ifndef ENG_OPS_RNN_H
#define ENG_OPS_RNN_H

#include "../../kernels/krn-rnn.h"
#include "op.h"

/* Parse node n's attributes (an RNN, GRU or LSTM node, or its gradient op, which carries the same attributes) for
 * cell `cell` (krn_rnn_cell) at `opset` into *p. Errors name the attribute and the value. */
eng_status eng_rnn_parse(const eng_node *n, int64_t opset, int cell, krn_rnn_params *p);
/* Resolve sizes from the forward inputs (in[KRN_RNN_IN_*]; omitted ones have dtype UNDEFINED) and check every
 * shape and dtype; errors name the input, expected vs got. */
eng_status eng_rnn_resolve(krn_rnn_params *p, const eng_tensor *in, int nin);

#endif
