/* npy.h - numpy .npy files (format versions 1.0, 2.0 and 3.0; C order; little-endian; numeric and bool dtypes).
 * Headers are parsed strictly with size limits; shapes are checked against the file's size. */
#ifndef ENG_NPY_H
#define ENG_NPY_H

#include "tensor.h"

/* Free the result with eng_tensor_destroy (graph.h). Fortran-order and big-endian files are refused with a
 * message naming the file. */
eng_status eng_npy_load(const char *path, eng_tensor **out);
eng_status eng_npy_load_buffer(const void *buf, size_t len, const char *what, eng_tensor **out);
/* Written atomically (temp + fsync + rename). */
eng_status eng_npy_save(const char *path, const eng_tensor *t);

#endif
