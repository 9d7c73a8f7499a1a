/* Channel gathers: the interpreter's fused data movement (dabuild/ir/movement.py) as one pass over the pixels.
 *
 * A run of reshape, transpose, concat and slice nodes that only regroups channels (ShuffleNet's channel
 * shuffle, its concat before and its split after) maps each output pixel's channels to channels of the same
 * pixel of its inputs. The mapping is a list of runs: `length` consecutive channels of one input, from channel
 * `source` on, go to the output's channels target, target + step, ... Each output is channels-last,
 * (pixels, channels); an input's pixels are `pixel_step` elements apart (more than its channels where it is a
 * slice of a wider tensor). Copies only: every value arrives bit for bit.
 */
#include <stddef.h>
#include <string.h>

typedef struct {
    ptrdiff_t input, source, target, step, length;
} GatherRun;

typedef struct {
    const float *const *inputs;   /* each input's pixel 0, channel 0 */
    const ptrdiff_t *pixel_steps; /* each input's elements from one pixel to the next */
    const GatherRun *runs;
    ptrdiff_t count;              /* runs */
    float *y;                     /* (pixels, channels) */
    ptrdiff_t channels;
} ChannelGather;

/* out[k * 2 + r] = x_r[k]: two runs interleaved, stored in order (the compiler vectorises the interleave). */
static void interleave2(float *restrict out, const float *restrict x0, const float *restrict x1, ptrdiff_t length)
{
    for (ptrdiff_t k = 0; k < length; k++) {
        out[2 * k] = x0[k];
        out[2 * k + 1] = x1[k];
    }
}

static void interleave4(float *restrict out, const float *restrict x0, const float *restrict x1,
                        const float *restrict x2, const float *restrict x3, ptrdiff_t length)
{
    for (ptrdiff_t k = 0; k < length; k++) {
        out[4 * k] = x0[k];
        out[4 * k + 1] = x1[k];
        out[4 * k + 2] = x2[k];
        out[4 * k + 3] = x3[k];
    }
}

/* Whether runs[0 .. step) fill the channels target, target + 1, ... target + step * length - 1 between them:
 * ShuffleNet's shuffle of `step` groups, run as one interleave. */
static int interleaved(const GatherRun *runs, ptrdiff_t left)
{
    ptrdiff_t step = runs[0].step;
    if ((step != 2 && step != 4) || left < step)
        return 0;
    for (ptrdiff_t r = 1; r < step; r++)
        if (runs[r].step != step || runs[r].length != runs[0].length || runs[r].target != runs[0].target + r)
            return 0;
    return 1;
}

/* Pixels [pixel0, pixel1) of the output. */
void gather_channels(const ChannelGather *g, ptrdiff_t pixel0, ptrdiff_t pixel1)
{
    for (ptrdiff_t p = pixel0; p < pixel1; p++) {
        float *y = g->y + p * g->channels;
        for (ptrdiff_t r = 0; r < g->count;) {
            const GatherRun *run = &g->runs[r];
            const float *x[4];
            ptrdiff_t together = interleaved(run, g->count - r) ? run->step : 1;
            for (ptrdiff_t i = 0; i < together; i++)
                x[i] = g->inputs[run[i].input] + p * g->pixel_steps[run[i].input] + run[i].source;
            float *out = y + run->target;
            if (together == 2)
                interleave2(out, x[0], x[1], run->length);
            else if (together == 4)
                interleave4(out, x[0], x[1], x[2], x[3], run->length);
            else if (run->step == 1)
                memcpy(out, x[0], run->length * sizeof(float));
            else
                for (ptrdiff_t k = 0; k < run->length; k++)
                    out[k * run->step] = x[0][k];
            r += together;
        }
    }
}
