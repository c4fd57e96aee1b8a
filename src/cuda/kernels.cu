// dlframe's device kernels, compiled at run time with NVRTC (src/cuda/launch.rs).
//
// Plain C++ with no headers and no CUDA intrinsics, so that the unit tests can also build this
// file with the host's C++ compiler and run every kernel on the CPU against dlframe's CPU
// kernels (src/cuda/emulate.rs). Every kernel is a grid-stride loop in which each output
// element is written by one thread, and read (in place) only by that thread: run one (block,
// thread) at a time, the result is the same.

typedef unsigned long long u64;
typedef long long i64;

// ---- the general kernel: null fill, bool unpack, cast, interleave and chunk concat ----

// Element type codes: DT_ and the dtype's name in capitals (DT_BOOL, DT_INT8 .. DT_FLOAT64).
// They are not defined here: src/cuda/launch.rs generates a #define of each from the Rust
// DType table (the codes the plans send) and puts them before this file.

#define NO_VALIDITY 0xffffffffffffffffull

// One run of source slots written to out[out + i * stride] (src/cuda/plan.rs, `Seg`). Offsets
// are bytes into the scratch buffer; bit offsets are those of sliced Arrow bitmaps. An `inplace`
// segment's values were copied straight into the output (same dtype, stride 1, no nulls): only
// its mask bytes are written. `group` is the number of segments, this one and those after it,
// whose slots are interleaved in the output (the columns of a C-order matrix over the same
// rows: their slots are written in output order, so that neighbouring threads write
// neighbouring elements), or 0 for a segment written as part of the group before it.
struct Seg {
    u64 src, src_bit, valid, valid_bit, rows, out, stride, dtype, inplace, group;
};

// A value on its way between types: exact for every integer and every float.
struct Num {
    int kind;  // 0 signed, 1 unsigned, 2 float
    i64 i;
    u64 u;
    double f;
};

__device__ __forceinline__ double bits_to_f64(u64 b) {
    union { u64 u; double d; } x;
    x.u = b;
    return x.d;
}

__device__ __forceinline__ u64 f64_to_bits(double d) {
    union { u64 u; double d; } x;
    x.d = d;
    return x.u;
}

// Half -> double, exact (subnormals normalised; a NaN keeps its payload and is made quiet, as
// half::f16::to_f64 does).
__device__ double f16_to_f64(unsigned short h) {
    u64 sign = (u64)(h >> 15) << 63;
    int e = (h >> 10) & 0x1f;
    u64 m = h & 0x3ff;
    if (e == 31) return bits_to_f64(sign | 0x7ff0000000000000ull | (m ? 0x0008000000000000ull : 0) | (m << 42));
    if (e == 0) {
        if (m == 0) return bits_to_f64(sign);
        int shift = 0;
        while (!(m & 0x400)) { m <<= 1; shift++; }
        return bits_to_f64(sign | ((u64)(1023 - 15 + 1 - shift) << 52) | ((m & 0x3ff) << 42));
    }
    return bits_to_f64(sign | ((u64)(e - 15 + 1023) << 52) | (m << 42));
}

// Double -> half, rounding to nearest even once (overflow to infinity), as half::f16::from_f64.
__device__ unsigned short f64_to_f16(double d) {
    u64 x = f64_to_bits(d);
    unsigned short sign = (unsigned short)((x >> 48) & 0x8000);
    int e = (int)((x >> 52) & 0x7ff);
    u64 m = x & 0xfffffffffffffull;
    if (e == 0x7ff) return sign | 0x7c00 | (m ? (0x200 | (unsigned short)(m >> 42)) : 0);
    int he = e - 1023 + 15;
    if (he >= 31) return sign | 0x7c00;
    u64 kept, rest, half;
    if (he <= 0) {
        if (he < -10) return sign;
        m |= 1ull << 52;
        int shift = 43 - he;  // 43..53 bits dropped
        kept = m >> shift;
        rest = m & ((1ull << shift) - 1);
        half = 1ull << (shift - 1);
    } else {
        kept = ((u64)he << 10) | (m >> 42);
        rest = m & ((1ull << 42) - 1);
        half = 1ull << 41;
    }
    if (rest > half || (rest == half && (kept & 1))) kept++;
    return sign | (unsigned short)kept;
}

// bfloat16 -> double, exact: the value is the upper half of a float's bits.
__device__ __forceinline__ double bf16_to_f64(unsigned short h) {
    union { unsigned int u; float f; } x;
    x.u = (unsigned int)h << 16;
    return (double)x.f;
}

// Double -> bfloat16, rounding to nearest even once, as bf16_from_f64 in kernels/round.rs does:
// first to a float rounded *to odd* (truncated, last bit set when anything was dropped), then
// to nearest even. Overflow goes to infinity; NaN stays a quiet NaN.
__device__ unsigned short f64_to_bf16(double d) {
    union { unsigned int u; float f; } x;
    x.f = (float)d;
    if (d != d) return (unsigned short)((x.u >> 16) | 0x40);
    if ((x.u & 0x7f800000u) == 0x7f800000u) return (unsigned short)(x.u >> 16);
    double back = (double)x.f;
    if (back != d) {
        if (d > 0.0 ? back > d : back < d) x.u -= 1;
        x.u |= 1;
    }
    x.u += 0x7fffu + ((x.u >> 16) & 1);
    return (unsigned short)(x.u >> 16);
}

// An integer's magnitude as a double rounded *to odd* (exact below 2^53), so that a later
// rounding to bfloat16 rounds once; as odd_f64 in kernels/round.rs. Rounding to odd truncates
// toward zero, so a negative integer is the negated rounding of its magnitude.
__device__ double odd_u64(u64 v) {
    double d = (double)v;
    int above;
    if (d >= 18446744073709551616.0) {
        above = 1;
    } else {
        u64 t = (u64)d;
        if (t == v) return d;
        above = t > v;
    }
    u64 b = f64_to_bits(d);
    if (above) b -= 1;
    return bits_to_f64(b | 1);
}

__device__ __forceinline__ double odd_i64(i64 v) {
    // The magnitude of i64's minimum, 2^63, fits a u64.
    return v < 0 ? -odd_u64(0 - (u64)v) : odd_u64((u64)v);
}

// 2^e for the exponents float8 reaches (inside double's normal range).
__device__ __forceinline__ double pow2(int e) { return bits_to_f64((u64)(e + 1023) << 52); }

// float8 (e4m3fn: man 3, bias 7, no infinities, NaN S.1111.111; e5m2: man 2, bias 15, IEEE)
// -> double, exactly; as dtype/float8.rs decodes.
__device__ double f8_to_f64(unsigned char b, int man, int bias, int ieee) {
    double sign = (b & 0x80) ? -1.0 : 1.0;
    int emask = (1 << (7 - man)) - 1;
    int e = (b >> man) & emask;
    int m = b & ((1 << man) - 1);
    if (ieee && e == emask) return m ? bits_to_f64(0x7ff8000000000000ull) : sign * bits_to_f64(0x7ff0000000000000ull);
    if (!ieee && (b & 0x7f) == 0x7f) return bits_to_f64(0x7ff8000000000000ull);
    if (e == 0) return sign * (double)m * pow2(1 - bias - man);
    return sign * (1.0 + (double)m / (double)(1 << man)) * pow2(e - bias);
}

// Double -> float8, rounding to nearest even once, as dtype/float8.rs encodes: overflow goes to
// infinity (e5m2) or NaN (e4m3fn); the host checked that finite values fit.
__device__ unsigned char f64_to_f8(double d, int man, int bias, double max, int ieee) {
    unsigned char sign = (f64_to_bits(d) >> 63) ? 0x80 : 0;
    unsigned char nan = ieee ? 0x7e : 0x7f;
    unsigned char overflow = sign | (ieee ? 0x7c : 0x7f);
    if (d != d) return sign | nan;
    double a = d < 0 ? -d : d;
    if (a > max * 2.0) return overflow;  // infinities included
    int emin = 1 - bias;
    int e = (int)((f64_to_bits(a) >> 52) & 0x7ff) - 1023;
    if (e < emin) e = emin;
    u64 one = 1ull << man;
    // |d| in units of its quantum, exactly; then rounded to nearest, ties to even.
    double x = a * pow2(man - e);
    u64 n = (u64)x;
    double rest = x - (double)n;
    if (rest > 0.5 || (rest == 0.5 && (n & 1))) n++;
    if (n == 2 * one) { n = one; e += 1; }
    if ((double)n * pow2(e - man) > max) return overflow;
    if (n < one) return sign | (unsigned char)n;
    return sign | (unsigned char)(((e + bias) << man) | (int)(n - one));
}

__device__ __forceinline__ Num load(const unsigned char* p, u64 dt, u64 r, u64 bit) {
    Num n;
    n.kind = 0; n.i = 0; n.u = 0; n.f = 0.0;
    switch (dt) {
        case DT_BOOL: { u64 b = bit + r; n.i = (p[b >> 3] >> (b & 7)) & 1; break; }
        case DT_INT8: n.i = ((const signed char*)p)[r]; break;
        case DT_INT16: n.i = ((const short*)p)[r]; break;
        case DT_INT32: n.i = ((const int*)p)[r]; break;
        case DT_INT64: n.i = ((const i64*)p)[r]; break;
        case DT_UINT8: n.kind = 1; n.u = p[r]; break;
        case DT_UINT16: n.kind = 1; n.u = ((const unsigned short*)p)[r]; break;
        case DT_UINT32: n.kind = 1; n.u = ((const unsigned int*)p)[r]; break;
        case DT_UINT64: n.kind = 1; n.u = ((const u64*)p)[r]; break;
        case DT_FLOAT16: n.kind = 2; n.f = f16_to_f64(((const unsigned short*)p)[r]); break;
        case DT_FLOAT32: n.kind = 2; n.f = ((const float*)p)[r]; break;
        case DT_BFLOAT16: n.kind = 2; n.f = bf16_to_f64(((const unsigned short*)p)[r]); break;
        case DT_FLOAT8_E4M3FN: n.kind = 2; n.f = f8_to_f64(p[r], 3, 7, 0); break;
        case DT_FLOAT8_E5M2: n.kind = 2; n.f = f8_to_f64(p[r], 2, 15, 1); break;
        case DT_FLOAT64: default: n.kind = 2; n.f = ((const double*)p)[r]; break;
    }
    return n;
}

// Integers from any kind; the host checked that a lossy cast's values fit (whole, in range).
__device__ __forceinline__ i64 as_i64(Num n) {
    return n.kind == 0 ? n.i : n.kind == 1 ? (i64)n.u : (i64)n.f;
}

__device__ __forceinline__ u64 as_u64(Num n) {
    return n.kind == 0 ? (u64)n.i : n.kind == 1 ? n.u : (u64)n.f;
}

__device__ __forceinline__ void store(unsigned char* out, u64 dt, u64 at, Num n) {
    switch (dt) {
        case DT_BOOL: out[at] = as_u64(n) != 0; break;
        case DT_INT8: ((signed char*)out)[at] = (signed char)as_i64(n); break;
        case DT_INT16: ((short*)out)[at] = (short)as_i64(n); break;
        case DT_INT32: ((int*)out)[at] = (int)as_i64(n); break;
        case DT_INT64: ((i64*)out)[at] = as_i64(n); break;
        case DT_UINT8: out[at] = (unsigned char)as_u64(n); break;
        case DT_UINT16: ((unsigned short*)out)[at] = (unsigned short)as_u64(n); break;
        case DT_UINT32: ((unsigned int*)out)[at] = (unsigned int)as_u64(n); break;
        case DT_UINT64: ((u64*)out)[at] = as_u64(n); break;
        case DT_FLOAT16: {
            // Integers reach half through double, as the CPU kernels do.
            double d = n.kind == 0 ? (double)n.i : n.kind == 1 ? (double)n.u : n.f;
            ((unsigned short*)out)[at] = f64_to_f16(d);
            break;
        }
        case DT_BFLOAT16: {
            double d = n.kind == 0 ? odd_i64(n.i) : n.kind == 1 ? odd_u64(n.u) : n.f;
            ((unsigned short*)out)[at] = f64_to_bf16(d);
            break;
        }
        case DT_FLOAT8_E4M3FN: case DT_FLOAT8_E5M2: {
            // Integers that round in double overflow float8 anyway.
            double d = n.kind == 0 ? (double)n.i : n.kind == 1 ? (double)n.u : n.f;
            out[at] = dt == DT_FLOAT8_E4M3FN ? f64_to_f8(d, 3, 7, 448.0, 0) : f64_to_f8(d, 2, 15, 57344.0, 1);
            break;
        }
        case DT_FLOAT32:
            // One rounding from the exact value (integers straight to float, not via double).
            ((float*)out)[at] = n.kind == 0 ? (float)n.i : n.kind == 1 ? (float)n.u : (float)n.f;
            break;
        case DT_FLOAT64: default:
            ((double*)out)[at] = n.kind == 0 ? (double)n.i : n.kind == 1 ? (double)n.u : n.f;
            break;
    }
}

__device__ __forceinline__ void store_fill(unsigned char* out, u64 size, u64 at, u64 fill) {
    switch (size) {
        case 1: out[at] = (unsigned char)fill; break;
        case 2: ((unsigned short*)out)[at] = (unsigned short)fill; break;
        case 4: ((unsigned int*)out)[at] = (unsigned int)fill; break;
        default: ((u64*)out)[at] = fill; break;
    }
}

// The element's bits, unchanged (same dtype in and out: NaN payloads kept, as the CPU copies them).
__device__ __forceinline__ u64 load_same(const unsigned char* src, u64 size, u64 r) {
    switch (size) {
        case 1: return src[r];
        case 2: return ((const unsigned short*)src)[r];
        case 4: return ((const unsigned int*)src)[r];
        default: return ((const u64*)src)[r];
    }
}

// Whether row r of segment g is valid (1 where it has no validity bitmap).
__device__ __forceinline__ bool valid_row(const unsigned char* scratch, const Seg& g, u64 r) {
    const u64 v = g.valid_bit + r;
    return g.valid == NO_VALIDITY || ((scratch[g.valid + (v >> 3)] >> (v & 7)) & 1);
}

// Writes row r of segment g: `fill` where it is null, nothing over a valid in-place value,
// otherwise the value in out_dt (its bits when the dtype does not change); and its mask byte
// when there is a mask.
__device__ __forceinline__ void convert_slot(unsigned char* out, unsigned char* mask, const unsigned char* scratch,
        const Seg& g, u64 r, u64 out_dt, u64 out_size, u64 fill) {
    const bool ok = valid_row(scratch, g, r);
    const u64 at = g.out + r * g.stride;
    if (!ok) store_fill(out, out_size, at, fill);
    else if (g.inplace) {}
    else if (g.dtype == out_dt && out_dt != DT_BOOL) store_fill(out, out_size, at, load_same(scratch + g.src, out_size, r));
    else store(out, out_dt, at, load(scratch + g.src, g.dtype, r, g.src_bit));
    if (mask) mask[at] = ok;
}

// The n (1 to 8) bits of an LSB-first bitmap from bit b on, in the low bits (reading the next
// byte only when they reach into it).
__device__ __forceinline__ unsigned int bits_at(const unsigned char* p, u64 b, u64 n) {
    const u64 i = b >> 3;
    const unsigned int shift = (unsigned int)(b & 7);
    unsigned int x = p[i] >> shift;
    if (shift + n > 8) x |= (unsigned int)p[i + 1] << (8 - shift);
    return x;
}

// Writes the n (1 to 8) bools of one unit from row r of segment g: bit i of v where bit i of ok
// is set, `f` where it is not; as one 8-byte word where the output is contiguous and aligned.
__device__ __forceinline__ void put_unit(unsigned char* dst, const Seg& g, u64 r, u64 n, unsigned int v,
        unsigned int ok, unsigned char f) {
    if (n == 8 && g.stride == 1 && ((g.out + r) & 7) == 0) {
        u64 w = 0;
        for (int i = 0; i < 8; i++) w |= (u64)(((ok >> i) & 1) ? (v >> i) & 1 : f) << (8 * i);
        *(u64*)(dst + r) = w;
    } else {
        for (u64 i = 0; i < n; i++) dst[(r + i) * g.stride] = ((ok >> i) & 1) ? (v >> i) & 1 : f;
    }
}

// Bit-packed bools written as one byte each (0 or 1, `fill` where null), eight rows at a time:
// the units u0, u0 + ustep, ... of eight rows each, from one byte of bits and one of validity.
__device__ void unpack_or_fill(unsigned char* out, const unsigned char* scratch, const Seg& g, u64 u0, u64 ustep,
        u64 fill) {
    const unsigned char* bits = scratch + g.src;
    const u64 units = (g.rows + 7) / 8;
    for (u64 u = u0; u < units; u += ustep) {
        const u64 r = 8 * u, n = g.rows - r < 8 ? g.rows - r : 8;
        const unsigned int v = bits_at(bits, g.src_bit + r, n);
        const unsigned int ok = g.valid == NO_VALIDITY ? 0xffu : bits_at(scratch + g.valid, g.valid_bit + r, n);
        put_unit(out + g.out, g, r, n, v, ok, (unsigned char)fill);
    }
}

// The rows r0, r0 + rstep, ... of segment g, not in place and with no mask: each value as Out,
// or `fill` (Out's bits) where the validity bit is 0. Without the per-slot dtype dispatch of
// convert_slot, four rows at a time with their loads issued before their stores, so that each
// thread has several loads in flight (one at a time leaves the memory half idle). With In and
// Out the same unsigned type of the element's size it copies the bits (a null fill, an
// interleave: NaN payloads kept); otherwise it is one C conversion between the common numeric
// types, as store() makes it (integers to floats round to nearest, floats to integers truncate
// a value the host checked to be whole and in range).
template <typename In, typename Out>
__device__ void rows_or_fill(unsigned char* out, const unsigned char* scratch, const Seg& g, u64 r0, u64 rstep,
        u64 fill) {
    const In* src = (const In*)(scratch + g.src);
    Out* dst = (Out*)out + g.out;
    union { u64 bits; Out value; } f;
    f.bits = fill;
    u64 r = r0;
    for (; r + 3 * rstep < g.rows; r += 4 * rstep) {
        In a[4];
        bool ok[4];
        for (int u = 0; u < 4; u++) {
            a[u] = src[r + u * rstep];
            ok[u] = valid_row(scratch, g, r + u * rstep);
        }
        for (int u = 0; u < 4; u++) dst[(r + u * rstep) * g.stride] = ok[u] ? (Out)a[u] : f.value;
    }
    for (; r < g.rows; r += rstep) dst[r * g.stride] = valid_row(scratch, g, r) ? (Out)src[r] : f.value;
}

// rows_or_fill from In to out_dt, when out_dt is one of the common types; false otherwise.
template <typename In>
__device__ bool cast_from(unsigned char* out, const unsigned char* scratch, const Seg& g, u64 r0, u64 rstep,
        u64 fill, u64 out_dt) {
    switch (out_dt) {
        case DT_INT32: rows_or_fill<In, int>(out, scratch, g, r0, rstep, fill); return true;
        case DT_INT64: rows_or_fill<In, i64>(out, scratch, g, r0, rstep, fill); return true;
        case DT_FLOAT32: rows_or_fill<In, float>(out, scratch, g, r0, rstep, fill); return true;
        case DT_FLOAT64: rows_or_fill<In, double>(out, scratch, g, r0, rstep, fill); return true;
        default: return false;
    }
}

// rows_or_fill for segment g to out_dt when both are int32, int64, float32 or float64; false
// (nothing written) for any other pair, which the general path takes.
__device__ bool cast_common(unsigned char* out, const unsigned char* scratch, const Seg& g, u64 r0, u64 rstep,
        u64 fill, u64 out_dt) {
    switch (g.dtype) {
        case DT_INT32: return cast_from<int>(out, scratch, g, r0, rstep, fill, out_dt);
        case DT_INT64: return cast_from<i64>(out, scratch, g, r0, rstep, fill, out_dt);
        case DT_FLOAT32: return cast_from<float>(out, scratch, g, r0, rstep, fill, out_dt);
        case DT_FLOAT64: return cast_from<double>(out, scratch, g, r0, rstep, fill, out_dt);
        default: return false;
    }
}

// Writes every slot of every segment: the value cast to out_dt, or `fill` (the fill value's
// little-endian bytes in out_dt) where the segment's validity bit is 0; and, when `mask` is not
// null, 1 or 0 for valid or null at the same element index. Blocks along y take groups of
// segments; blocks along x and threads take the slots of a group in output order: slot f of a
// group of k is row f / k of its segment f % k.
extern "C" __global__ void convert(unsigned char* out, unsigned char* mask, const unsigned char* scratch,
        const Seg* segs, u64 nseg, u64 out_dt, u64 out_size, u64 fill) {
    const u64 step = (u64)gridDim.x * blockDim.x;
    const u64 first = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    for (u64 s = blockIdx.y; s < nseg; s += gridDim.y) {
        const u64 k = segs[s].group;
        if (k == 0) continue;
        if (step % k == 0) {
            // The launch's usual case: the grid's width is a multiple of k, so each thread stays
            // on one segment of the group, kept in registers, and takes every (step / k)-th row
            // of it.
            const Seg g = segs[s + first % k];
            const u64 r0 = first / k, rstep = step / k;
            if (!mask && g.dtype == DT_BOOL && out_dt == DT_BOOL) {
                unpack_or_fill(out, scratch, g, r0, rstep, fill);
                continue;
            }
            if (!mask && !g.inplace && g.dtype == out_dt && out_dt != DT_BOOL) {
                switch (out_size) {
                    case 1: rows_or_fill<unsigned char, unsigned char>(out, scratch, g, r0, rstep, fill); break;
                    case 2: rows_or_fill<unsigned short, unsigned short>(out, scratch, g, r0, rstep, fill); break;
                    case 4: rows_or_fill<unsigned int, unsigned int>(out, scratch, g, r0, rstep, fill); break;
                    default: rows_or_fill<u64, u64>(out, scratch, g, r0, rstep, fill); break;
                }
                continue;
            }
            if (!mask && !g.inplace && cast_common(out, scratch, g, r0, rstep, fill, out_dt)) continue;
            for (u64 r = r0; r < g.rows; r += rstep) convert_slot(out, mask, scratch, g, r, out_dt, out_size, fill);
        } else {
            // Any other grid: slot by slot.
            for (u64 f = first; f < segs[s].rows * k; f += step)
                convert_slot(out, mask, scratch, segs[s + f % k], f / k, out_dt, out_size, fill);
        }
    }
}

// ---- bools only: a kernel of its own ----

// Bits 0..3 of b, one per byte (byte k holds bit k): the product adds four copies of b shifted
// by 0, 7, 14 and 21 bits, which do not overlap, so bit k of the copy shifted by 7k is bit 8k.
__device__ __forceinline__ unsigned int bytes_of4(unsigned int b) {
    return ((b & 0xfu) * 0x00204081u) & 0x01010101u;
}

// Eight bools as the bytes of a little-endian word: bit i of v where bit i of ok is set, `f`
// where it is not. The same as put_unit's loop over the bits, in a few multiplications.
__device__ __forceinline__ u64 bytes_of8(unsigned int v, unsigned int ok, unsigned char f) {
    const unsigned int fill = f * 0x01010101u;
    const unsigned int keep_lo = bytes_of4(ok) * 0xffu, keep_hi = bytes_of4(ok >> 4) * 0xffu;
    const unsigned int lo = (bytes_of4(v) & keep_lo) | (fill & ~keep_lo);
    const unsigned int hi = (bytes_of4(v >> 4) & keep_hi) | (fill & ~keep_hi);
    return (u64)lo | ((u64)hi << 32);
}

// Sixteen bytes written with one store.
struct alignas(16) Pair {
    u64 lo, hi;
};

// Every segment of a plan whose input and output are all bools with stride 1, and no mask
// (`Plan::kernel` in src/cuda/plan.rs): each row as one byte, 0 or 1, or `fill` where null.
// The same arguments as convert, so that the launch only picks the function. Each thread
// takes 32 rows at a time: it reads four bytes of bits and four of validity, spreads them with
// multiplications, and writes 32 bytes in two 16-byte stores. convert's way, eight rows per
// thread with a loop over the bits, reached a third of a device-to-device copy's bandwidth on
// an H200, and four such units per thread no more than half; this reached 78%. A kernel of its
// own, so that its registers do not slow convert's other paths.
extern "C" __global__ void unpack(unsigned char* out, unsigned char* mask, const unsigned char* scratch,
        const Seg* segs, u64 nseg, u64 out_dt, u64 out_size, u64 fill) {
    const u64 step = (u64)gridDim.x * blockDim.x;
    const u64 first = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    const unsigned char f = (unsigned char)fill;
    for (u64 s = blockIdx.y; s < nseg; s += gridDim.y) {
        const Seg g = segs[s];
        const unsigned char* bits = scratch + g.src;
        unsigned char* dst = out + g.out;
        const u64 whole = g.rows / 32;
        for (u64 u = first; u < whole; u += step) {
            const u64 r = 32 * u;
            unsigned int v[4], ok[4];
            for (int i = 0; i < 4; i++) {
                v[i] = bits_at(bits, g.src_bit + r + 8 * i, 8);
                ok[i] = g.valid == NO_VALIDITY ? 0xffu : bits_at(scratch + g.valid, g.valid_bit + r + 8 * i, 8);
            }
            if (g.stride == 1 && ((g.out + r) & 15) == 0) {
                for (int i = 0; i < 4; i += 2) {
                    Pair p;
                    p.lo = bytes_of8(v[i], ok[i], f);
                    p.hi = bytes_of8(v[i + 1], ok[i + 1], f);
                    *(Pair*)(dst + r + 8 * i) = p;
                }
            } else {
                for (int i = 0; i < 4; i++) put_unit(dst, g, r + 8 * i, 8, v[i], ok[i], f);
            }
        }
        // The last rows (fewer than 32), eight at a time.
        unpack_or_fill(out, scratch, g, 4 * whole + first, step, fill);
    }
    (void)mask; (void)out_dt; (void)out_size;
}

// ---- strided views to C order (device-to-device copies, downloads of strided tensors) ----

// Copies the `n` elements of a view of `in` into `out` in C order. `dims` holds the shape, then
// the strides in elements (any sign, zero included), `ndim` of each; `in` points at element 0.
extern "C" __global__ void gather(unsigned char* out, const unsigned char* in, const i64* dims, u64 ndim,
        u64 n, u64 item) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        u64 rem = i;
        i64 off = 0;
        for (u64 d = ndim; d-- > 0;) {
            u64 extent = (u64)dims[d];
            off += (i64)(rem % extent) * dims[ndim + d];
            rem /= extent;
        }
        const unsigned char* src = in + off * (i64)item;
        switch (item) {
            case 1: out[i] = *src; break;
            case 2: ((unsigned short*)out)[i] = *(const unsigned short*)src; break;
            case 4: ((unsigned int*)out)[i] = *(const unsigned int*)src; break;
            default: ((u64*)out)[i] = *(const u64*)src; break;
        }
    }
}
