/* Any of the native kernels' functions called from a request on stdin, for tests/ir/arm64_kernels.py: linked
 * statically with the library's translation units cross-compiled for arm64 and run under qemu-aarch64, so the
 * NEON paths are checked (and counted, bench/arm64.py) on an x86 machine.
 *
 *   kernel_driver info       prints the vector path, its vector bytes, conv block vectors, island width and
 *                            qconv lanes, as native.py reads them from a loaded library
 *   kernel_driver call [N]   reads a request on stdin, calls one function (N times, 1 by default: bench/arm64.py
 *                            counts the instructions of N calls and of 1), writes the response on stdout; a
 *                            function "parallel_rows:KERNEL" shares KERNEL's rows among threads (threads.c)
 *
 * Request (little-endian int64 words): the buffer count, then each buffer's byte size and bytes (padded to
 * whole words); the relocation count, then each as (buffer, byte offset, target buffer, target byte offset):
 * a pointer to the target stored in the buffer (a call structure's pointer fields); the function name's
 * length and bytes (padded); the argument count, then each as (kind, value): 0 an integer, 1 a double's
 * bits, 2 a pointer to the buffer of that index. Response: the function's result as an int64 word (0 for
 * a void function), then every buffer's bytes as the call left them. Buffers start on 64-byte boundaries,
 * as native.py aligns packed weights and outputs. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef union {
    int64_t i;
    double d;
    void *p;
} Arg;

/* The library's functions (each defined in its own translation unit, as native.py builds it); a call
 * structure is passed as the pointer the function reads it through. */
typedef void (*RowsFunction)(const void *call, ptrdiff_t row0, ptrdiff_t row1);
#define ROWS_FUNCTIONS(X) X(conv2d_nhwc_f32) X(depthwise2d_nhwc_f32) X(conv2d_nhwc_f64) X(depthwise2d_nhwc_f64) \
    X(max_pool_nhwc) X(avg_pool_nhwc) X(island_conv_nhwc) X(island_grouped_nhwc) X(qconv2d_nhwc)          \
    X(qadd_lookup) X(quantize_f32)
#define DECLARE(name) void name(const void *call, ptrdiff_t row0, ptrdiff_t row1);
ROWS_FUNCTIONS(DECLARE)
ptrdiff_t channel_extremes(const void *view, float *low, float *high, ptrdiff_t c0, ptrdiff_t c1);
void channel_counts(const void *view, const double *reciprocal, const int64_t *offset, int32_t *counts,
                    double whole_reciprocal, int64_t whole_offset, int64_t *whole, ptrdiff_t c0, ptrdiff_t c1);
void rebin_channels(int32_t *counts, const int64_t *channels, ptrdiff_t n, const int64_t *old_offset,
                    const int64_t *doublings, const int64_t *new_offset);
void whole_counts(const float *x, ptrdiff_t n, double reciprocal, int64_t offset, int64_t *counts, double skip_low,
                  double skip_high, ptrdiff_t count, float *extremes, int64_t *tallies);
int requantize_channels(const double *acc, ptrdiff_t outer, ptrdiff_t channels, ptrdiff_t inner, const int64_t *bias,
                        const int64_t *multiplier, const int64_t *shift, ptrdiff_t per_channel, int64_t zero_point,
                        int64_t low, int64_t high, int32_t *y);
const char *kernel_vector_path(void);
int kernel_vector_bytes(void);
int kernel_conv_block_vectors(void);
int kernel_island_width(void);
ptrdiff_t qconv_lanes(void);
ptrdiff_t qconv_block_vectors(void);

void parallel_rows(RowsFunction function, const void *call, ptrdiff_t rows, ptrdiff_t chunk, int threads);

static RowsFunction rows_function(const char *name)
{
#define FIND(function) \
    if (!strcmp(name, #function)) return function;
    ROWS_FUNCTIONS(FIND)
    return NULL;
}

/* NAME(args), or for "parallel_rows:NAME" threads.c's parallel_rows(NAME, call, rows, chunk, threads). */
static int64_t call(const char *name, const Arg *a, int64_t count)
{
    RowsFunction rows = rows_function(name);
    if (rows && count == 3) {
        rows(a[0].p, a[1].i, a[2].i);
        return 0;
    }
    rows = strncmp(name, "parallel_rows:", 14) ? NULL : rows_function(name + 14);
    if (rows && count == 4) {
        parallel_rows(rows, a[0].p, a[1].i, a[2].i, (int)a[3].i);
        return 0;
    }
    if (!strcmp(name, "channel_extremes") && count == 5)
        return channel_extremes(a[0].p, a[1].p, a[2].p, a[3].i, a[4].i);
    if (!strcmp(name, "channel_counts") && count == 9) {
        channel_counts(a[0].p, a[1].p, a[2].p, a[3].p, a[4].d, a[5].i, a[6].p, a[7].i, a[8].i);
        return 0;
    }
    if (!strcmp(name, "whole_counts") && count == 10) {
        whole_counts(a[0].p, a[1].i, a[2].d, a[3].i, a[4].p, a[5].d, a[6].d, a[7].i, a[8].p, a[9].p);
        return 0;
    }
    if (!strcmp(name, "rebin_channels") && count == 6) {
        rebin_channels(a[0].p, a[1].p, a[2].i, a[3].p, a[4].p, a[5].p);
        return 0;
    }
    if (!strcmp(name, "requantize_channels") && count == 12)
        return requantize_channels(a[0].p, a[1].i, a[2].i, a[3].i, a[4].p, a[5].p, a[6].p, a[7].i, a[8].i, a[9].i,
                                   a[10].i, a[11].p);
    fprintf(stderr, "kernel_driver: no function %s of %lld arguments\n", name, (long long)count);
    exit(2);
}

static void read_exactly(void *data, size_t bytes)
{
    if (bytes && fread(data, 1, bytes, stdin) != bytes) {
        fprintf(stderr, "kernel_driver: the request ended early\n");
        exit(2);
    }
}

static int64_t word(void)
{
    int64_t value;
    read_exactly(&value, sizeof value);
    return value;
}

static size_t padded(int64_t bytes) { return (size_t)(bytes + 7) / 8 * 8; }

static void *buffer(char **buffers, int64_t count, int64_t index)
{
    if (index < 0 || index >= count) {
        fprintf(stderr, "kernel_driver: no buffer %lld\n", (long long)index);
        exit(2);
    }
    return buffers[index];
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "info")) {
        printf("%s %d %d %d %td %td\n", kernel_vector_path(), kernel_vector_bytes(), kernel_conv_block_vectors(),
               kernel_island_width(), qconv_lanes(), qconv_block_vectors());
        return 0;
    }
    long times = argc == 3 ? strtol(argv[2], NULL, 10) : 1;
    if (argc < 2 || argc > 3 || strcmp(argv[1], "call") || times < 1) {
        fprintf(stderr, "usage: kernel_driver info | call [times] < request\n");
        return 2;
    }
    int64_t count = word();
    char **buffers = calloc((size_t)(count > 0 ? count : 1), sizeof *buffers);
    int64_t *sizes = calloc((size_t)(count > 0 ? count : 1), sizeof *sizes);
    for (int64_t b = 0; b < count; b++) {
        sizes[b] = word();
        buffers[b] = aligned_alloc(64, (padded(sizes[b]) + 63) / 64 * 64 + 64);
        read_exactly(buffers[b], padded(sizes[b]));
    }
    for (int64_t r = word(); r > 0; r--) {
        int64_t at = word(), offset = word(), target = word(), target_offset = word();
        char *pointer = (char *)buffer(buffers, count, target) + target_offset;
        memcpy((char *)buffer(buffers, count, at) + offset, &pointer, sizeof pointer);
    }
    char name[128] = {0};
    int64_t length = word();
    if (length < 0 || (size_t)length >= sizeof name) {
        fprintf(stderr, "kernel_driver: a function name of %lld bytes\n", (long long)length);
        return 2;
    }
    read_exactly(name, padded(length));
    name[length] = 0;
    int64_t arguments = word();
    Arg args[16] = {{0}};
    if (arguments < 0 || arguments > 16) {
        fprintf(stderr, "kernel_driver: %lld arguments\n", (long long)arguments);
        return 2;
    }
    for (int64_t i = 0; i < arguments; i++) {
        int64_t kind = word(), value = word();
        if (kind == 2)
            args[i].p = buffer(buffers, count, value);
        else
            args[i].i = value;  /* a double's bits land in the union's double */
    }
    int64_t result = 0;
    for (long time = 0; time < times; time++)
        result = call(name, args, arguments);
    fwrite(&result, sizeof result, 1, stdout);
    for (int64_t b = 0; b < count; b++)
        fwrite(buffers[b], 1, (size_t)sizes[b], stdout);
    return fflush(stdout) != 0;
}
