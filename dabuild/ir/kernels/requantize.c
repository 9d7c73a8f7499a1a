/* The integer reference's requantization of a weighted layer's sums, as dabuild.quant.fixed_point computes it.
 *
 * acc holds exact integer sums (as doubles) in memory seen as (outer, channels, inner), contiguous. Each value
 * becomes clamp(round_half_away((acc + bias[c]) * multiplier[c] / 2^shift[c]) + zero_point, low, high), the
 * rounding done on the magnitude in int64 with the sign put back, exactly as fixed_point.requantize does it.
 * Returns 0, or 1 without finishing when some |acc + bias| * multiplier could leave int64 (the caller then
 * takes the arbitrary-precision path).
 */
#include <stddef.h>
#include <stdint.h>

int requantize_channels(const double *acc, ptrdiff_t outer, ptrdiff_t channels, ptrdiff_t inner, const int64_t *bias,
                        const int64_t *multiplier, const int64_t *shift, ptrdiff_t per_channel, int64_t zero_point,
                        int64_t low, int64_t high, int32_t *y)
{
    for (ptrdiff_t o = 0; o < outer; o++)
        for (ptrdiff_t c = 0; c < channels; c++) {
            ptrdiff_t k = per_channel ? c : 0;
            int64_t m = multiplier[k], s = shift[k], half = (int64_t)1 << (s - 1), b = bias[c];
            int64_t limit = (INT64_MAX - half) / (m > 0 ? m : 1);
            const double *a = acc + (o * channels + c) * inner;
            int32_t *out = y + (o * channels + c) * inner;
            for (ptrdiff_t i = 0; i < inner; i++) {
                if (!(a[i] > -9.0e18 && a[i] < 9.0e18))
                    return 1;
                int64_t sum = (int64_t)a[i] + b;
                int64_t magnitude = sum < 0 ? -sum : sum;
                if (magnitude > limit)
                    return 1;
                int64_t rounded = (magnitude * m + half) >> s;
                int64_t value = (sum < 0 ? -rounded : rounded) + zero_point;
                out[i] = (int32_t)(value < low ? low : value > high ? high : value);
            }
        }
    return 0;
}
