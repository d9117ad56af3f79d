// kiln_emu_warp.h: warp operations of the block runner (included by kiln_emu_fiber.h; part of
// the kernel runtime): a lane waits at an operation until every lane of its mask is there, then
// every lane's result is computed at once.
//
// Invariants:
// - An operation completes only when every lane of its mask waits at an operation of the same
//   kind, mask and width; a lane of the mask that exited or waits elsewhere is an error.
// - Shuffles pick their source lane by PTX's shfl rules (segment mask and clamp from `width`);
//   reading a lane outside the mask is an error, never an undefined value.
#ifndef KILN_EMU_RUNTIME_H
// Alone: the runtime header, which includes this one after what it needs.
#include "kiln_emu_runtime.h"
#elif !defined(KILN_EMU_WARP_H)
#define KILN_EMU_WARP_H

namespace kiln_emu {
// True when every lane of `me`'s mask waits at the same kind of operation with the same mask.
inline bool warp_complete(block_state *b, fiber *me) {
    unsigned base = me->linear & ~31u;
    for (unsigned m = me->mask; m; m &= m - 1) {
        unsigned lane = __builtin_ctz(m);
        fiber *g = &b->fibers[base + lane];
        char other[256];
        if (g->state == EXITED || (g->state == AT_WARP && (g->kind != me->kind || g->mask != me->mask ||
                                                           g->width != me->width))) {
            describe_wait(other, sizeof other, g);
            fail("%s (%s:%d) with mask 0x%08x waits for lane %u, but %s", me->op_name, me->where.file,
                 me->where.line, me->mask, lane, other);
        }
        if (g->state != AT_WARP) return false;
    }
    return true;
}

// The lane a shuffle reads, by PTX's shfl rules (clamp and segment mask from `width`).
inline unsigned shfl_source(unsigned kind, unsigned lane, int b, int width) {
    unsigned segmask = (32u - (unsigned)width) & 0x1f;
    unsigned clamp = kind == W_SHFL_UP ? 0 : 0x1f;
    int bval = b & 0x1f;
    int max_lane = (int)((lane & segmask) | (clamp & ~segmask));
    int min_lane = (int)(lane & segmask);
    int j;
    bool ok;
    switch (kind) {
    case W_SHFL_UP: j = (int)lane - bval; ok = j >= max_lane; break;
    case W_SHFL_DOWN: j = (int)lane + bval; ok = j <= max_lane; break;
    case W_SHFL_XOR: j = (int)lane ^ bval; ok = j <= max_lane; break;
    default: j = min_lane | (bval & (int)~segmask); ok = j <= max_lane; break;
    }
    return ok ? (unsigned)j : lane;
}

// Computes every lane's result of a complete warp operation and makes the lanes ready again.
inline void warp_finish(block_state *b, fiber *me) {
    unsigned base = me->linear & ~31u, mask = me->mask;
    fiber *w = &b->fibers[base];
    unsigned long long bits = 0;
    for (unsigned m = mask; m; m &= m - 1)
        if (w[__builtin_ctz(m)].value) bits |= 1ull << __builtin_ctz(m);
    for (unsigned m = mask; m; m &= m - 1) {
        unsigned lane = __builtin_ctz(m);
        fiber *f = &w[lane];
        switch (me->kind) {
        case W_SHFL_IDX: case W_SHFL_UP: case W_SHFL_DOWN: case W_SHFL_XOR: {
            unsigned src = shfl_source(me->kind, lane, f->arg, f->width);
            if (!(mask >> src & 1))
                fail("%s (%s:%d): lane %u reads lane %u, which is not in the mask 0x%08x", me->op_name,
                     me->where.file, me->where.line, lane, src, mask);
            f->result = w[src].value;
            break;
        }
        case W_BALLOT: f->result = bits; break;
        case W_ANY: f->result = bits != 0; break;
        case W_ALL: f->result = bits == mask; break;
        case W_UNI: f->result = bits == 0 || bits == mask; break;
        case W_MATCH_ANY: case W_MATCH_ALL: {
            unsigned same = 0;
            for (unsigned n = mask; n; n &= n - 1)
                if (w[__builtin_ctz(n)].value == f->value) same |= 1u << __builtin_ctz(n);
            f->result = me->kind == W_MATCH_ANY ? same : (same == mask ? mask : 0);
            break;
        }
        case W_REDUCE_ADD: case W_REDUCE_MIN: case W_REDUCE_MAX: case W_REDUCE_AND: case W_REDUCE_OR:
        case W_REDUCE_XOR: {
            bool is_signed = f->arg != 0;
            long long acc = 0;
            bool first = true;
            for (unsigned n = mask; n; n &= n - 1) {
                long long v = is_signed ? (long long)(int)w[__builtin_ctz(n)].value
                                        : (long long)(unsigned)w[__builtin_ctz(n)].value;
                if (first) acc = v;
                else if (me->kind == W_REDUCE_ADD) acc += v;
                else if (me->kind == W_REDUCE_MIN) acc = v < acc ? v : acc;
                else if (me->kind == W_REDUCE_MAX) acc = v > acc ? v : acc;
                else if (me->kind == W_REDUCE_AND) acc &= v;
                else if (me->kind == W_REDUCE_OR) acc |= v;
                else acc ^= v;
                first = false;
            }
            f->result = (unsigned long long)(unsigned)acc;
            break;
        }
        default: f->result = 0; break;
        }
    }
    for (unsigned m = mask; m; m &= m - 1) w[__builtin_ctz(m)].state = READY;
}

inline unsigned long long warp_op(unsigned kind, unsigned mask, unsigned long long value, int arg, int width,
                                  const char *name, site where) {
    fiber *f = current;
    block_state *b = f->block;
    unsigned lane = f->linear & 31;
    f->kind = kind;
    f->op_name = name;
    f->where = where;
    f->mask = mask;
    f->width = width;
    f->arg = arg;
    f->value = value;
    if (!(mask >> lane & 1))
        fail("%s (%s:%d): the mask 0x%08x does not name the calling lane %u", name, where.file, where.line, mask,
             lane);
    if (mask & ~lanes_in_warp(b, f->linear & ~31u))
        fail("%s (%s:%d): the mask 0x%08x names lanes this block does not have (warp of lanes 0x%08x)", name,
             where.file, where.line, mask, lanes_in_warp(b, f->linear & ~31u));
    if (kind <= W_SHFL_XOR && (width < 1 || width > 32 || (width & (width - 1))))
        fail("%s (%s:%d): width %d is not a power of two from 1 to 32", name, where.file, where.line, width);
    f->state = AT_WARP;
    if (warp_complete(b, f)) warp_finish(b, f);
    else to_scheduler(f);
    return f->result;
}

} // namespace kiln_emu

#endif
