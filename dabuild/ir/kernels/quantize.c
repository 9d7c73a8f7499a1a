/* float32 -> integers as dabuild.qir.qgraph.QuantParams.quantize does it, for the integer reference's graph
 * input and the outputs of its float islands (a numpy pass per step made these a third of a trial that
 * leaves ResNet-50's first conv in fp32).
 *
 * Each value: s = x / scale in float32, bounded to [-span - 1, span] (NaN to the bottom) before rounding,
 * rounded half away from zero as numpy's sign(s) * floor(|s| + 0.5) does in float32 (so 0.49999997 rounds
 * to 1, as there), plus the zero point, clamped to [qmin, qmax] and stored in 1 or 2 bytes. Every step is
 * one float32 operation with the numpy code's operands, so the bits are the same.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* floorf vectorises only without trapping math (the flags an operation raises), which nothing here reads. */
#if defined(__GNUC__) && !defined(__clang__)
#define QUANTIZE_FUNCTION __attribute__((optimize("no-trapping-math")))
#else
#define QUANTIZE_FUNCTION
#endif

QUANTIZE_FUNCTION static inline float quantize_one(float x, float scale, float span, float bottom, float zero_point, float qmin,
                                 float qmax)
{
    float s = x / scale;
    s = s >= bottom ? s : bottom;
    s = s < span ? s : span;
    float magnitude = floorf(fabsf(s) + 0.5f);
    float q = (s > 0.0f ? magnitude : s < 0.0f ? -magnitude : 0.0f) + zero_point;
    return q < qmin ? qmin : q > qmax ? qmax : q;
}

/* One conversion: x, its quantization parameters (span = qmax - qmin) and y, of out_bytes (1 or 2) per element. */
typedef struct {
    const float *x;
    float scale, span, zero_point, qmin, qmax;
    ptrdiff_t out_bytes;
    void *y;
} Quantize;

/* Elements [first, end) of x into y (two's complement or unsigned alike): threads.c's rows are elements here. */
QUANTIZE_FUNCTION void quantize_f32(const Quantize *p, ptrdiff_t first, ptrdiff_t end)
{
    const float scale = p->scale, span = p->span, zero_point = p->zero_point, qmin = p->qmin, qmax = p->qmax;
    const float bottom = -span - 1.0f;
    const float *x = p->x;
    if (p->out_bytes == 1) {
        uint8_t *out = p->y;
        for (ptrdiff_t i = first; i < end; i++)
            out[i] = (uint8_t)(int32_t)quantize_one(x[i], scale, span, bottom, zero_point, qmin, qmax);
    } else {
        uint16_t *out = p->y;
        for (ptrdiff_t i = first; i < end; i++)
            out[i] = (uint16_t)(int32_t)quantize_one(x[i], scale, span, bottom, zero_point, qmin, qmax);
    }
}
