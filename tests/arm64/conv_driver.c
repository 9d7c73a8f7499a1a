/* conv.c's float32 conv run from raw files, for tests/ir/test_arm64_kernels.py: cross-compiled for arm64 and run
 * under qemu-aarch64, so the NEON path is checked against numpy on an x86 machine.
 *
 *   conv_driver info                 prints the vector path, its vector bytes and conv block vectors
 *   conv_driver conv GEOMETRY x w b y
 *
 * GEOMETRY is 20 integers: batch height width channels kernel_h kernel_w out_channels padded_channels out_h
 * out_w stride_h stride_w pad_top pad_left dilation_h dilation_w activation (0, 1 relu) depthwise has_bias groups,
 * channels, out_channels and padded_channels per group where groups > 1.
 * x, w (packed as native.py packs it for this path) and b are float32 files; y is written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define ELEM float
#define MASK int
#define NAME(name) name##_f32
#include "conv.c"
#include "vector_path.c"

static float *load(const char *path, size_t count)
{
    float *data = calloc(count ? count : 1, sizeof *data);
    FILE *file = fopen(path, "rb");
    if (!data || !file || fread(data, sizeof *data, count, file) != count) {
        fprintf(stderr, "cannot read %zu floats from %s\n", count, path);
        exit(2);
    }
    fclose(file);
    return data;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "info")) {
        printf("%s %d %d\n", kernel_vector_path(), kernel_vector_bytes(), kernel_conv_block_vectors());
        return 0;
    }
    if (argc != 2 + 20 + 4 || strcmp(argv[1], "conv")) {
        fprintf(stderr, "usage: conv_driver info | conv GEOMETRY(20) x w b y\n");
        return 2;
    }
    long g[20];
    for (int i = 0; i < 20; i++)
        g[i] = strtol(argv[2 + i], NULL, 10);
    Conv_f32 c = {0};
    long batch = g[0];
    c.height = g[1]; c.width = g[2]; c.channels = g[3]; c.kernel_h = g[4]; c.kernel_w = g[5];
    c.out_channels = g[6]; c.padded_channels = g[7]; c.out_h = g[8]; c.out_w = g[9];
    c.stride_h = g[10]; c.stride_w = g[11]; c.pad_top = g[12]; c.pad_left = g[13];
    c.dilation_h = g[14]; c.dilation_w = g[15]; c.activation = (int)g[16];
    int depthwise = (int)g[17], has_bias = (int)g[18];
    c.groups = g[19];
    c.rows = batch * c.out_h;
    c.parts = 1;
    size_t taps = (size_t)(c.kernel_h * c.kernel_w) * (depthwise ? 1 : (size_t)c.channels) * c.padded_channels
                  * (size_t)c.groups;
    c.x = load(argv[22], (size_t)(batch * c.height * c.width * c.channels * c.groups));
    c.weight = load(argv[23], taps);
    c.bias = has_bias ? load(argv[24], (size_t)(c.padded_channels * c.groups)) : NULL;
    c.zeros = calloc((size_t)c.channels, sizeof(float));
    size_t outputs = (size_t)(batch * c.out_h * c.out_w * c.out_channels * c.groups);
    float *y = calloc(outputs ? outputs : 1, sizeof *y);
    c.y = y;
    if (depthwise)
        depthwise2d_nhwc_f32(&c, 0, batch * c.out_h);
    else
        conv2d_nhwc_f32(&c, 0, batch * c.out_h);
    FILE *file = fopen(argv[25], "wb");
    if (!file || fwrite(y, sizeof *y, outputs, file) != outputs) {
        fprintf(stderr, "cannot write %s\n", argv[25]);
        return 2;
    }
    fclose(file);
    return 0;
}
