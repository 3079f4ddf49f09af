/* RoPE frequency tables for the rope_scaling types transformers implements: default, linear,
 * llama3 (smooth per-wavelength interpolation), yarn (ramp between interpolation and
 * extrapolation, attention scale; its ends rounded to whole dims unless truncate is false). Computed in double, stored as float32 like transformers. */
#include "arch/transformer.h"

#include <math.h>

static double yarn_correction_dim(double rotations, int dim, double base, int max_pos) {
    return (dim * log(max_pos / (rotations * 2 * M_PI))) / (2 * log(base));
}

void rope_inv_freq(const rope_config *r, int rot_dims, float *inv_freq, float *attn_factor) {
    int half = rot_dims / 2;
    *attn_factor = 1.0f;
    double low = 0, high = 0;
    if (r->type == ROPE_YARN) {
        low = yarn_correction_dim(r->beta_fast, rot_dims, r->theta, r->original_max_position);
        high = yarn_correction_dim(r->beta_slow, rot_dims, r->theta, r->original_max_position);
        if (r->truncate) { /* transformers' default; gpt-oss publishes truncate: false */
            low = floor(low);
            high = ceil(high);
        }
        if (low < 0) low = 0;
        if (high > rot_dims - 1) high = rot_dims - 1;
        if (low == high) high += 0.001;
        double af = r->attention_factor;
        if (af <= 0) af = r->factor > 1 ? 0.1 * log(r->factor) + 1.0 : 1.0;
        *attn_factor = (float)af;
    }
    for (int i = 0; i < half; i++) {
        /* transformers: 1 / base ** (arange(0, dim, 2).float() / dim), in float32 */
        float expo = (float)(2 * i) / (float)rot_dims;
        double f = 1.0 / pow(r->theta, (double)expo);
        switch (r->type) {
        case ROPE_DEFAULT: break;
        case ROPE_LINEAR: f /= r->factor; break;
        case ROPE_LLAMA3: {
            double old = r->original_max_position;
            double low_wavelen = old / r->low_freq_factor, high_wavelen = old / r->high_freq_factor;
            double wavelen = 2 * M_PI / f;
            if (wavelen > low_wavelen) {
                f = f / r->factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = (old / wavelen - r->low_freq_factor) /
                                (r->high_freq_factor - r->low_freq_factor);
                f = (1 - smooth) * f / r->factor + smooth * f;
            }
            break;
        }
        case ROPE_YARN: {
            double ramp = (i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extrapolation = 1 - ramp;
            f = (f / r->factor) * (1 - extrapolation) + f * extrapolation;
            break;
        }
        }
        inv_freq[i] = (float)f;
    }
}
