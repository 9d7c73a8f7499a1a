/* The vector path this library was compiled for (vectors.h), read by native.py to pack weights to match. */
#include "vectors.h"

const char *kernel_vector_path(void) { return VECTOR_PATH; }
int kernel_vector_bytes(void) { return VBYTES; }
int kernel_conv_block_vectors(void) { return CONV_BLOCK_VECS; }
int kernel_island_width(void) { return ISLAND_VECS * FLOAT_LANES; }
