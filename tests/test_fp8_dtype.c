/* The float <-> e4m3 / e5m2 conversions (include/moe.h "FP8 conversions", specs/FP8.md section 1).
 *
 * Every expectation is computed independently of src/dtype.c: patterns are decoded with ldexp from their
 * fields, and float -> fp8 is the nearest of the format's finite values found by a search over all of
 * them (ties to the even pattern), then saturated to +-max.
 *
 *   - all 256 patterns of each format: decode is exact, NaN patterns decode to NaN (e5m2's Inf to Inf),
 *     fp8 -> f32 -> fp8 is the identity for every finite pattern;
 *   - every halfway point between neighbouring finite values (ties to even), the floats one ulp either
 *     side of it, and each value itself, with both signs;
 *   - saturation: values past max, the float just past each halfway point beyond max, FLT_MAX and +-Inf
 *     give +-max; NaN gives 0x7f with the sign; signed zeros; underflow to signed zero;
 *   - random floats over the formats' range.
 *
 * Usage: test_fp8_dtype [seed] */
#include "moe.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"

typedef struct fp8_model {
    const char *name;
    int mantissa_bits;
    int exponent_bits;
    int has_inf;        /* e5m2: exponent field all ones is Inf / NaN; e4m3: only S.1111.111 is NaN */
    double max;
    uint8_t (*encode)(float);
    float (*decode)(uint8_t);
} fp8_model;

static uint64_t rng_state;
static uint64_t rng_next(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static const fp8_model E4M3 = {"e4m3", 3, 4, 0, 448.0, moe_f32_to_e4m3, moe_e4m3_to_f32};
static const fp8_model E5M2 = {"e5m2", 2, 5, 1, 57344.0, moe_f32_to_e5m2, moe_e5m2_to_f32};

/* The value of a pattern from its fields: NaN for NaN patterns, +-Inf for e5m2's Inf. */
static double model_decode(const fp8_model *f, uint8_t code)
{
    const int sign = code >> 7;
    const int top = (1 << f->exponent_bits) - 1;
    const int exponent = (code >> f->mantissa_bits) & top;
    const int mantissa = code & ((1 << f->mantissa_bits) - 1);
    const int bias = (1 << (f->exponent_bits - 1)) - 1;
    double magnitude;
    if (f->has_inf && exponent == top)
        magnitude = mantissa ? NAN : INFINITY;
    else if (!f->has_inf && exponent == top && mantissa == (1 << f->mantissa_bits) - 1)
        magnitude = NAN;
    else if (exponent == 0)
        magnitude = ldexp(mantissa, 1 - bias - f->mantissa_bits);
    else
        magnitude = ldexp(1.0 + ldexp(mantissa, -f->mantissa_bits), exponent - bias);
    return sign ? -magnitude : magnitude;
}

/* The expected code of a float: NaN -> 0x7f | sign; otherwise the nearest finite value (ties: even
 * pattern), |v| >= max saturating to max.  A search over the 128 non-negative patterns. */
static uint8_t model_encode(const fp8_model *f, float value)
{
    const uint8_t sign = signbit(value) ? 0x80 : 0;
    if (isnan(value))
        return (uint8_t)(sign | 0x7f);
    const double a = fabs((double)value);
    int best = -1;
    double best_distance = INFINITY;
    for (int code = 0; code < 128; code++) {
        const double v = model_decode(f, (uint8_t)code);
        if (!isfinite(v))
            continue;
        const double d = fabs(v - a);
        if (d < best_distance || (d == best_distance && (code & 1) == 0)) {
            best = code;
            best_distance = d;
        }
    }
    if (a >= f->max)
        for (int code = 0; code < 128; code++)
            if (model_decode(f, (uint8_t)code) == f->max)
                best = code;
    return (uint8_t)(sign | best);
}

static void check_encode(const fp8_model *f, float value, const char *what)
{
    const uint8_t got = f->encode(value), want = model_encode(f, value);
    CHECK(got == want, "%s: encode(%a) (%s) = 0x%02x, expected 0x%02x", f->name, (double)value, what, got, want);
}

static void exhaustive_patterns(const fp8_model *f)
{
    for (int code = 0; code < 256; code++) {
        const double want = model_decode(f, (uint8_t)code);
        const float got = f->decode((uint8_t)code);
        if (isnan(want)) {
            CHECK(isnan(got) && !!signbit(got) == !!(code & 0x80), "%s: decode(0x%02x) = %a, expected a NaN of "
                  "that sign", f->name, code, (double)got);
            continue;
        }
        CHECK((double)got == want && !!signbit(got) == !!(code & 0x80), "%s: decode(0x%02x) = %a, expected %a",
              f->name, code, (double)got, want);
        if (isfinite(want))
            CHECK(f->encode(got) == code, "%s: encode(decode(0x%02x)) = 0x%02x", f->name, code, f->encode(got));
    }
}

/* every halfway point between neighbouring finite non-negative values, a float either side, the values */
static void halfway_cases(const fp8_model *f)
{
    for (int code = 0; code < 127; code++) {
        const double lo = model_decode(f, (uint8_t)code), hi = model_decode(f, (uint8_t)(code + 1));
        if (!isfinite(hi))
            continue;
        const float mid = (float)((lo + hi) / 2); /* exact: a few bits more than the format's */
        CHECK((double)mid == (lo + hi) / 2, "%s: halfway point %a not a float", f->name, (lo + hi) / 2);
        const float cases[] = {(float)lo, mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY)};
        for (int i = 0; i < 4; i++) {
            check_encode(f, cases[i], "halfway set");
            check_encode(f, -cases[i], "halfway set, negative");
        }
    }
}

static void saturation_and_specials(const fp8_model *f)
{
    const float max = (float)f->max;
    const uint8_t max_code = model_encode(f, max);
    CHECK(model_decode(f, max_code) == f->max, "%s: the model's max code 0x%02x", f->name, max_code);
    const float beyond[] = {nextafterf(max, INFINITY), max * 1.0625f, max * 1.125f, max * 2.0f, 1e30f, FLT_MAX,
                            INFINITY};
    for (size_t i = 0; i < sizeof beyond / sizeof beyond[0]; i++) {
        CHECK(f->encode(beyond[i]) == max_code, "%s: encode(%a) = 0x%02x, expected max 0x%02x", f->name,
              (double)beyond[i], f->encode(beyond[i]), max_code);
        CHECK(f->encode(-beyond[i]) == (uint8_t)(0x80 | max_code), "%s: encode(%a) = 0x%02x, expected -max",
              f->name, -(double)beyond[i], f->encode(-beyond[i]));
    }
    CHECK(f->encode(NAN) == 0x7f && f->encode(-NAN) == 0xff, "%s: encode(NaN) = 0x%02x, encode(-NaN) = 0x%02x",
          f->name, f->encode(NAN), f->encode(-NAN));
    CHECK(f->encode(0.0f) == 0x00 && f->encode(-0.0f) == 0x80, "%s: signed zeros 0x%02x 0x%02x", f->name,
          f->encode(0.0f), f->encode(-0.0f));
    const double tiny = model_decode(f, 1); /* the smallest subnormal */
    const float under[] = {(float)(tiny / 2), (float)(tiny / 4), 1e-30f, FLT_TRUE_MIN};
    for (size_t i = 0; i < sizeof under / sizeof under[0]; i++)
        CHECK(f->encode(under[i]) == 0x00 && f->encode(-under[i]) == 0x80, "%s: encode(+-%a) = 0x%02x 0x%02x, "
              "expected signed zeros", f->name, (double)under[i], f->encode(under[i]), f->encode(-under[i]));
    CHECK(f->encode(nextafterf((float)(tiny / 2), 1.0f)) == 0x01, "%s: just above half the smallest subnormal",
          f->name);
}

static void random_floats(const fp8_model *f, int count)
{
    for (int i = 0; i < count; i++) {
        /* uniform in log scale over [2^-30, 2^20], either sign */
        const double e = -30.0 + 50.0 * (double)(rng_next() >> 11) * 0x1p-53;
        float v = (float)exp2(e);
        if (rng_next() & 1)
            v = -v;
        check_encode(f, v, "random");
    }
}

int main(int argc, char **argv)
{
    const uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : 20261206;
    printf("seed %llu\n", (unsigned long long)seed);
    rng_state = seed;
    const fp8_model *formats[] = {&E4M3, &E5M2};
    for (int i = 0; i < 2; i++) {
        const long before = failures;
        exhaustive_patterns(formats[i]);
        halfway_cases(formats[i]);
        saturation_and_specials(formats[i]);
        random_floats(formats[i], 200000);
        printf("%s: 256 patterns, halfway cases, saturation, 2e5 random floats: %s\n", formats[i]->name,
               failures == before ? "ok" : "FAILED");
    }
    if (failures) {
        printf("%ld failures (seed %llu)\n", failures, (unsigned long long)seed);
        return 1;
    }
    printf("all fp8 conversion checks passed\n");
    return 0;
}
