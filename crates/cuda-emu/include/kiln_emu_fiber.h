// kiln_emu_fiber.h: the block runner behind kiln_emu_runtime.h (included by it; part of the
// kernel runtime). Runs blocks of a grid on the calling OS thread, each thread of a block as a
// fiber, and reports faults and misuse as text for the kernel runtime (src/kernel) to return.
//
// Invariants:
// - kiln_emu_run_blocks takes block indices from the launch's shared counter until the grid is
//   done or some thread of the launch failed (abort flag); a failing block stops the launch.
// - Fibers switch only at synchronising calls (barriers, warp operations) and at exit, back to
//   the scheduler on the OS thread's own stack; the scheduler is the only code that picks a fiber.
// - A fault (SIGSEGV/SIGBUS/SIGFPE/SIGILL) while a block runs is turned, by the kernel runtime's
//   signal handler, into a siglongjmp to the sigsetjmp taken before the block started, here in
//   C++; the abandoned fibers' stacks are plain memory, reused by the next block.
// - The C structs below match src/kernel/abi.rs field for field (KILN_EMU_ABI guards both).
#ifndef KILN_EMU_RUNTIME_H
// Alone: the runtime header, which includes this one after what it needs.
#include "kiln_emu_runtime.h"
#elif !defined(KILN_EMU_FIBER_H)
#define KILN_EMU_FIBER_H

#include <dlfcn.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#if !defined(__x86_64__) || defined(KILN_EMU_UCONTEXT)
#include <ucontext.h>
#define KILN_EMU_USE_UCONTEXT 1
#endif

#define KILN_EMU_ABI 1
#define KILN_EMU_OK 0
#define KILN_EMU_FAULT 1
#define KILN_EMU_FAILED 2

extern "C" {
// One kernel: its parameters by its real signature and its entry point.
struct kiln_emu_kernel_info {
    unsigned abi;
    unsigned param_count;
    const unsigned *param_sizes;
    const unsigned *param_aligns;
    const unsigned char *param_is_pointer;
    unsigned max_threads; // __launch_bounds__'s first value, 0 when absent
    unsigned min_blocks;
    void (*entry)(void *const *args);
    const char *name;
};
// Per OS thread, owned by the kernel runtime's signal handler.
struct kiln_emu_fault_slot {
    volatile int armed;
    volatile int signo;
    volatile unsigned long long addr;
    void (*jump)(struct kiln_emu_fault_slot *);
    void *jmp;
};
struct kiln_emu_launch {
    unsigned abi;
    unsigned schedule; // 0 in order, 1 reverse, 2 random
    unsigned long long seed;
    void (*entry)(void *const *args);
    void *const *args;
    unsigned grid[3];
    unsigned block[3];
    void *dl_handle;
    size_t tls_size;
    char *stacks; // one region of stack_stride bytes per thread, its lowest guard_bytes inaccessible
    size_t stack_stride;
    size_t guard_bytes;
    unsigned long long *next_block;
    unsigned long long total_blocks;
    int *abort_flag;
    struct kiln_emu_fault_slot *slot;
    int code; // out: KILN_EMU_*
    int padding;
    char message[1024]; // out: what failed, without the kernel's name
};
}

namespace kiln_emu {
enum fiber_state : unsigned { READY, AT_BARRIER, AT_WARP, EXITED };
enum barrier_kind : unsigned { BAR_SYNC, BAR_COUNT, BAR_AND, BAR_OR };
enum warp_kind : unsigned {
    W_SHFL_IDX, W_SHFL_UP, W_SHFL_DOWN, W_SHFL_XOR, W_BALLOT, W_ANY, W_ALL, W_UNI, W_SYNCWARP,
    W_MATCH_ANY, W_MATCH_ALL, W_REDUCE_ADD, W_REDUCE_MIN, W_REDUCE_MAX, W_REDUCE_AND, W_REDUCE_OR,
    W_REDUCE_XOR
};
struct site {
    const char *file;
    int line;
};
struct block_state;
struct fiber {
    void *sp;
    block_state *block;
    uint3 thread_idx;
    unsigned linear;
    unsigned state;
    unsigned kind;
    const char *op_name;
    site where;
    unsigned mask;
    int width;
    int arg;
    unsigned long long value;
    unsigned long long result;
#ifdef KILN_EMU_USE_UCONTEXT
    ucontext_t context;
#endif
};
struct block_state {
    uint3 block_idx;
    dim3 block_dim, grid_dim;
    void (*entry)(void *const *);
    void *const *args;
    fiber *fibers;
    unsigned count;
    unsigned schedule;
    unsigned *order;
    unsigned long long rng;
    void *sched_sp;
#ifdef KILN_EMU_USE_UCONTEXT
    ucontext_t sched_context;
#endif
    int failed;
    char message[1024];
};

static thread_local fiber *current = nullptr;
} // namespace kiln_emu

#ifndef KILN_EMU_USE_UCONTEXT
// void kiln_emu_switch(void **save_sp, void *to_sp): saves the callee-saved registers on the
// current stack, stores its pointer, and resumes the context saved on `to_sp`.
extern "C" void kiln_emu_switch(void **save_sp, void *to_sp);
asm(R"(
    .text
    .p2align 4
    .globl kiln_emu_switch
    .hidden kiln_emu_switch
    .type kiln_emu_switch,@function
kiln_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kiln_emu_switch, .-kiln_emu_switch
    .p2align 4
    .globl kiln_emu_fiber_trampoline
    .hidden kiln_emu_fiber_trampoline
    .type kiln_emu_fiber_trampoline,@function
kiln_emu_fiber_trampoline:
    movq %r12, %rdi
    andq $-16, %rsp
    call kiln_emu_fiber_main
    ud2
    .size kiln_emu_fiber_trampoline, .-kiln_emu_fiber_trampoline
)");
extern "C" void kiln_emu_fiber_trampoline();
#endif

namespace kiln_emu {
inline void to_scheduler(fiber *f) {
#ifdef KILN_EMU_USE_UCONTEXT
    swapcontext(&f->context, &f->block->sched_context);
#else
    kiln_emu_switch(&f->sp, f->block->sched_sp);
#endif
}

inline bool same_site(site a, site b) {
    return a.line == b.line && (a.file == b.file || strcmp(a.file, b.file) == 0);
}

inline int describe_thread(char *out, size_t cap, const fiber *f) {
    return snprintf(out, cap, "thread (%u,%u,%u)", f->thread_idx.x, f->thread_idx.y, f->thread_idx.z);
}

// What a waiting or exited thread is doing, for error messages.
inline void describe_wait(char *out, size_t cap, const fiber *f) {
    int n = describe_thread(out, cap, f);
    if (f->state == EXITED)
        snprintf(out + n, cap - n, " has exited");
    else if (f->state == AT_WARP)
        snprintf(out + n, cap - n, " waits at %s (%s:%d) with mask 0x%08x", f->op_name, f->where.file,
                 f->where.line, f->mask);
    else if (f->state == AT_BARRIER)
        snprintf(out + n, cap - n, " waits at %s (%s:%d)", f->op_name, f->where.file, f->where.line);
    else
        snprintf(out + n, cap - n, " is running");
}

// Ends the calling fiber's block with an error (the message is prefixed with the thread).
[[noreturn]] __attribute__((format(printf, 1, 2))) inline void fail(const char *fmt, ...) {
    fiber *f = current;
    block_state *b = f->block;
    int n = describe_thread(b->message, sizeof b->message, f);
    n += snprintf(b->message + n, sizeof b->message - n, ": ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->message + n, sizeof b->message - n, fmt, ap);
    va_end(ap);
    b->failed = 1;
    to_scheduler(f);
    __builtin_trap();
}

inline int barrier(unsigned kind, int predicate, const char *name, site where) {
    fiber *f = current;
    f->state = AT_BARRIER;
    f->kind = kind;
    f->op_name = name;
    f->where = where;
    f->value = predicate != 0;
    to_scheduler(f);
    return (int)f->result;
}

inline unsigned lanes_in_warp(const block_state *b, unsigned warp_base) {
    unsigned n = b->count - warp_base;
    return n >= 32 ? 0xffffffffu : (1u << n) - 1u;
}

inline unsigned active_mask() {
    fiber *f = current;
    block_state *b = f->block;
    unsigned base = f->linear & ~31u, mask = 0;
    for (unsigned lane = 0; lane < 32 && base + lane < b->count; ++lane)
        if (b->fibers[base + lane].state != EXITED) mask |= 1u << lane;
    return mask;
}

} // namespace kiln_emu

#include "kiln_emu_warp.h"

namespace kiln_emu {
inline void shuffle_order(block_state *b) {
    for (unsigned i = b->count; i > 1; --i) {
        b->rng ^= b->rng << 13;
        b->rng ^= b->rng >> 7;
        b->rng ^= b->rng << 17;
        unsigned j = (unsigned)(b->rng % i);
        unsigned t = b->order[i - 1];
        b->order[i - 1] = b->order[j];
        b->order[j] = t;
    }
}

// Nobody is ready: release a barrier every live thread reached, or explain the deadlock.
// Returns false after an error (in b->message) and when every thread has exited.
inline bool release_or_fail(block_state *b) {
    fiber *exited = nullptr, *at_bar = nullptr, *at_warp = nullptr;
    for (unsigned i = 0; i < b->count; ++i) {
        fiber *f = &b->fibers[i];
        if (f->state == EXITED && !exited) exited = f;
        if (f->state == AT_BARRIER && !at_bar) at_bar = f;
        if (f->state == AT_WARP && !at_warp) at_warp = f;
    }
    char a[256], c[256];
    if (at_warp) {
        unsigned base = at_warp->linear & ~31u;
        fiber *other = at_warp;
        for (unsigned m = at_warp->mask; m; m &= m - 1)
            if (b->fibers[base + __builtin_ctz(m)].state != AT_WARP) other = &b->fibers[base + __builtin_ctz(m)];
        describe_wait(a, sizeof a, at_warp);
        describe_wait(c, sizeof c, other);
        snprintf(b->message, sizeof b->message, "deadlock: %s, but lane %u of its mask: %s", a,
                 other->linear & 31, c);
        b->failed = 1;
        return false;
    }
    if (!at_bar) return false; // every thread has exited
    if (exited) {
        describe_wait(a, sizeof a, at_bar);
        describe_wait(c, sizeof c, exited);
        snprintf(b->message, sizeof b->message,
                 "%s, but %s: every thread of a block must reach each __syncthreads", a, c);
        b->failed = 1;
        return false;
    }
    unsigned long long count = 0;
    for (unsigned i = 0; i < b->count; ++i) {
        fiber *f = &b->fibers[i];
        if (f->kind != at_bar->kind || !same_site(f->where, at_bar->where)) {
            describe_wait(a, sizeof a, at_bar);
            describe_wait(c, sizeof c, f);
            snprintf(b->message, sizeof b->message, "threads wait at different barriers: %s, %s", a, c);
            b->failed = 1;
            return false;
        }
        count += f->value;
    }
    unsigned long long result = at_bar->kind == BAR_COUNT ? count
                                : at_bar->kind == BAR_AND ? count == b->count
                                : at_bar->kind == BAR_OR  ? count != 0
                                                          : 0;
    for (unsigned i = 0; i < b->count; ++i) {
        b->fibers[i].result = result;
        b->fibers[i].state = READY;
    }
    return true;
}

inline void run_fibers(block_state *b) {
    for (;;) {
        bool ran = false;
        if (b->schedule == 2) shuffle_order(b);
        for (unsigned k = 0; k < b->count; ++k) {
            fiber *f = &b->fibers[b->order[k]];
            if (f->state != READY) continue;
            ran = true;
            current = f;
#ifdef KILN_EMU_USE_UCONTEXT
            swapcontext(&b->sched_context, &f->context);
#else
            kiln_emu_switch(&b->sched_sp, f->sp);
#endif
            current = nullptr;
            if (b->failed) return;
        }
        if (!ran && !release_or_fail(b)) return;
    }
}
} // namespace kiln_emu

extern "C" __attribute__((used, visibility("hidden"))) void kiln_emu_fiber_main(void *arg) {
    kiln_emu::fiber *f = static_cast<kiln_emu::fiber *>(arg);
    f->block->entry(f->block->args);
    f->state = kiln_emu::EXITED;
    kiln_emu::to_scheduler(f);
    __builtin_trap();
}

#ifdef KILN_EMU_USE_UCONTEXT
static void kiln_emu_fiber_start(unsigned hi, unsigned lo) {
    kiln_emu_fiber_main((void *)(((unsigned long long)hi << 32) | lo));
}
#endif

extern "C" __attribute__((visibility("default"))) void kiln_emu_fault_jump(kiln_emu_fault_slot *slot) {
    siglongjmp(*static_cast<sigjmp_buf *>(slot->jmp), 1);
}

namespace kiln_emu {
inline void init_fiber(kiln_emu_launch *l, block_state *b, unsigned i) {
    fiber *f = &b->fibers[i];
    memset(f, 0, offsetof(fiber, value));
    f->block = b;
    f->linear = i;
    f->thread_idx = uint3{i % b->block_dim.x, i / b->block_dim.x % b->block_dim.y,
                          i / (b->block_dim.x * b->block_dim.y)};
    f->state = READY;
    char *top = l->stacks + (size_t)(i + 1) * l->stack_stride;
#ifdef KILN_EMU_USE_UCONTEXT
    getcontext(&f->context);
    f->context.uc_stack.ss_sp = l->stacks + (size_t)i * l->stack_stride + l->guard_bytes;
    f->context.uc_stack.ss_size = l->stack_stride - l->guard_bytes;
    f->context.uc_link = nullptr;
    unsigned long long p = (unsigned long long)f;
    makecontext(&f->context, (void (*)())kiln_emu_fiber_start, 2, (unsigned)(p >> 32), (unsigned)p);
#else
    void **sp = reinterpret_cast<void **>(top) - 8;
    memset(sp, 0, 8 * sizeof(void *));
    sp[3] = f;                                                // r12: the fiber
    sp[6] = reinterpret_cast<void *>(&kiln_emu_fiber_trampoline); // return address
    f->sp = sp;
#endif
}

inline const char *signal_name(int signo) {
    switch (signo) {
    case SIGSEGV: return "illegal memory access (SIGSEGV)";
    case SIGBUS: return "illegal memory access (SIGBUS)";
    case SIGFPE: return "arithmetic fault, e.g. an integer division by zero (SIGFPE)";
    case SIGILL: return "illegal instruction (SIGILL)";
    default: return "fault";
    }
}
} // namespace kiln_emu

// Runs blocks of the launch until the grid is done or the launch aborts; see the file comment.
extern "C" __attribute__((visibility("default"))) int kiln_emu_run_blocks(kiln_emu_launch *l) {
    using namespace kiln_emu;
    l->code = KILN_EMU_OK;
    l->message[0] = 0;
    if (l->abi != KILN_EMU_ABI) {
        snprintf(l->message, sizeof l->message, "module built for runtime ABI %d, the emulator speaks %d",
                 KILN_EMU_ABI, (int)l->abi);
        return l->code = KILN_EMU_FAILED;
    }
    current = nullptr; // allocates this thread's TLS block of the module
    void *tls = nullptr;
    if (l->tls_size && (dlinfo(l->dl_handle, RTLD_DI_TLS_DATA, &tls) != 0 || !tls)) {
        snprintf(l->message, sizeof l->message, "no thread-local (shared memory) block: %s", dlerror());
        return l->code = KILN_EMU_FAILED;
    }
    block_state b;
    unsigned count = l->block[0] * l->block[1] * l->block[2];
    fiber *fibers = static_cast<fiber *>(calloc(count, sizeof(fiber)));
    unsigned *order = static_cast<unsigned *>(calloc(count, sizeof(unsigned)));
    sigjmp_buf jump;
    for (;;) {
        unsigned long long idx = __atomic_fetch_add(l->next_block, 1, __ATOMIC_RELAXED);
        if (idx >= l->total_blocks || __atomic_load_n(l->abort_flag, __ATOMIC_RELAXED)) break;
        if (tls) memset(tls, 0xff, l->tls_size); // poisons shared memory (and `current`)
        current = nullptr;
        memset((void *)&b, 0, offsetof(block_state, message));
        b.message[0] = 0;
        b.block_idx = uint3{(unsigned)(idx % l->grid[0]), (unsigned)(idx / l->grid[0] % l->grid[1]),
                            (unsigned)(idx / ((unsigned long long)l->grid[0] * l->grid[1]))};
        b.block_dim = dim3(l->block[0], l->block[1], l->block[2]);
        b.grid_dim = dim3(l->grid[0], l->grid[1], l->grid[2]);
        b.entry = l->entry;
        b.args = l->args;
        b.fibers = fibers;
        b.count = count;
        b.order = order;
        b.schedule = l->schedule;
        b.rng = (l->seed ^ (idx * 0x9e3779b97f4a7c15ull)) | 1;
        for (unsigned i = 0; i < count; ++i) {
            order[i] = l->schedule == 1 ? count - 1 - i : i;
            init_fiber(l, &b, i);
        }
        l->slot->jump = &kiln_emu_fault_jump;
        l->slot->jmp = &jump;
        if (sigsetjmp(jump, 1) == 0) {
            l->slot->armed = 1;
            run_fibers(&b);
            l->slot->armed = 0;
        } else {
            l->slot->armed = 0;
            fiber *f = current;
            current = nullptr;
            int n = snprintf(l->message, sizeof l->message, "block (%u,%u,%u) ", b.block_idx.x, b.block_idx.y,
                             b.block_idx.z);
            if (f) n += describe_thread(l->message + n, sizeof l->message - n, f);
            else n += snprintf(l->message + n, sizeof l->message - n, "(in the emulator's scheduler)");
            unsigned long long addr = l->slot->addr;
            bool overflow = false;
            if (f) {
                unsigned long long low = (unsigned long long)(l->stacks + (size_t)f->linear * l->stack_stride);
                overflow = addr >= low && addr < low + l->guard_bytes;
            }
            snprintf(l->message + n, sizeof l->message - n, ": %s at address 0x%llx%s",
                     signal_name(l->slot->signo), addr,
                     overflow ? " (the thread overflowed its stack)" : "");
            l->code = l->slot->signo == SIGSEGV || l->slot->signo == SIGBUS ? KILN_EMU_FAULT : KILN_EMU_FAILED;
            __atomic_store_n(l->abort_flag, 1, __ATOMIC_RELAXED);
            break;
        }
        if (b.failed) {
            snprintf(l->message, sizeof l->message, "block (%u,%u,%u) %s", b.block_idx.x, b.block_idx.y,
                     b.block_idx.z, b.message);
            l->code = KILN_EMU_FAILED;
            __atomic_store_n(l->abort_flag, 1, __ATOMIC_RELAXED);
            break;
        }
    }
    free(fibers);
    free(order);
    return l->code;
}

#endif
