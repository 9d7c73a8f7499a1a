/* Layer threads for the native kernels: one layer's output rows shared among a few persistent threads.
 *
 * A Python thread pool costs tens of microseconds to wake a worker per layer, as much as a small layer's
 * whole work, so splitting a batch-1 network's layers across two threads made it slower. Here the rows are
 * handed out in chunks from a shared counter, and the caller takes chunks too: a worker that is late (asleep,
 * or waiting for a core on a busy machine) takes fewer chunks or none, and the caller never waits for a
 * worker that has not started, only for a chunk a worker is computing. Which thread computes a row does not
 * change its result: every row is computed by the same code in the same order.
 *
 * On a busy machine a worker costs the caller time unless it runs on another core, so it gives way:
 * - Spinning is bounded in time on both sides. A worker spins SPIN_NS after a job (so the next layer, a few
 *   microseconds of Python later, finds it awake) and then sleeps on a condition variable; the caller spins
 *   for a worker's last chunk as long as two of its own chunks took (at least WAIT_NS, at most WAIT_MAX_NS:
 *   longer means the worker lost its core) and then sleeps until the worker signals it. A worker that spun
 *   through all the Python between layers kept a core busy for the whole inference, time the caller's Python
 *   needed.
 * - A worker that wakes on the caller's core (the scheduler puts a woken thread there when no core is idle,
 *   and it then preempts the caller) takes no rows and sleeps at once, so the caller goes on alone. Two
 *   threads time-sharing one core made a 2-thread MobileNetV2 three times slower than 1 thread.
 * - After a job no worker helped with, the caller leaves sleeping workers asleep for the next 1, 2, 4 ..
 *   QUIET_JOBS jobs before it tries again, so a busy machine does not cost a wake-up and two context
 *   switches per layer.
 *
 * One job at a time: a caller that finds the pool busy (another Python thread's layer) runs its rows alone.
 * A forked child starts without workers and starts its own when it needs them.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#ifdef __linux__
int sched_getcpu(void);  /* glibc's and musl's; <sched.h> declares it only under _GNU_SOURCE, which would have to
                            come before the first include of the library's one source (see native.py) */
#endif

#define MAX_WORKERS 15
#ifndef SPIN_NS
#define SPIN_NS 50000  /* a worker spins this long after a job before it sleeps */
#endif
#ifndef WAIT_NS
#define WAIT_NS 20000  /* the caller spins at least this long for a worker's last chunk before it sleeps */
#endif
#define WAIT_MAX_NS 1000000  /* and at most this long */
#define QUIET_JOBS 8  /* the most jobs the caller runs alone, without waking workers, after one nobody helped */

typedef void (*RowsFunction)(const void *call, ptrdiff_t row0, ptrdiff_t row1);

static struct {
    pthread_mutex_t busy;         /* held by the caller whose job runs */
    pthread_mutex_t lock;         /* guards the sleeps on `wake` and `done` */
    pthread_cond_t wake;          /* a new job: signalled to sleeping workers */
    pthread_cond_t done;          /* the job's last rows finished: signalled to a sleeping caller */
    atomic_ullong ticket;         /* the job's generation << 32 | the first row no thread has claimed yet */
    atomic_llong finished;        /* rows of the current job computed */
    atomic_int sleepers;          /* workers asleep on `wake` (or about to be) */
    atomic_int caller_sleeps;     /* the caller is asleep on `done` (or about to be) */
    atomic_int caller_cpu;        /* the core the caller published the current job from */
    atomic_int helped;            /* a worker claimed rows of the current job */
    int quiet, backoff;           /* jobs left before the caller wakes workers again; the next such pause */
    RowsFunction function;        /* the current job: set before its generation's ticket is published */
    const void *call;
    ptrdiff_t rows, chunk;
    int helpers;                  /* workers taking part in the current job */
    int started;
    int registered;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER};

static inline void pool_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static long long pool_now(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* Return once done(argument): spin up to `nanoseconds` (the clock read every 64 pauses), then sleep on
 * `condition` with `sleeping` raised, which tells the thread that makes done() true to signal (it raises what
 * done() reads, then reads `sleeping`; both sequentially consistent, so one of the two sees the other). */
static void pool_wait(int (*done)(const void *), const void *argument, long long nanoseconds,
                      pthread_cond_t *condition, atomic_int *sleeping)
{
    long long deadline = 0;
    for (unsigned spins = 1; nanoseconds > 0; spins++) {
        if (done(argument))
            return;
        if (spins % 64 == 0) {
            long long now = pool_now();
            if (deadline == 0)
                deadline = now + nanoseconds;
            else if (now >= deadline)
                break;
        }
        pool_pause();
    }
    pthread_mutex_lock(&pool.lock);
    atomic_fetch_add(sleeping, 1);
    while (!done(argument))
        pthread_cond_wait(condition, &pool.lock);
    atomic_fetch_sub(sleeping, 1);
    pthread_mutex_unlock(&pool.lock);
}

/* Whether this thread runs on the core the caller published the job from (never known off Linux). */
static int on_callers_core(void)
{
#ifdef __linux__
    return sched_getcpu() == atomic_load_explicit(&pool.caller_cpu, memory_order_relaxed);
#else
    return 0;
#endif
}

static int generation_moved(const void *seen)
{
    return atomic_load(&pool.ticket) >> 32 != *(const unsigned long long *)seen;
}

static int job_finished(const void *rows)
{
    return atomic_load(&pool.finished) >= *(const ptrdiff_t *)rows;
}

/* Claim and compute chunks of job `generation`'s rows until none is left. A claim is a compare-and-swap of
 * the ticket, which holds the generation: a thread that read the job's fields while the caller was already
 * setting up the next job fails its claim, so a late worker never runs one job's rows with another's call,
 * and nobody waits for a worker that has not claimed anything. A worker that finishes the job's last rows
 * wakes the caller if it sleeps (both sides' flag-then-check is sequentially consistent, so one of them
 * always sees the other). Returns how many chunks this thread computed. */
static int pool_take(unsigned long long generation, int worker)
{
    for (int taken = 0;;) {
        unsigned long long ticket = atomic_load_explicit(&pool.ticket, memory_order_acquire);
        if (ticket >> 32 != generation)
            return taken;
        RowsFunction function = pool.function;
        const void *call = pool.call;
        ptrdiff_t rows = pool.rows, row0 = (ptrdiff_t)(ticket & 0xffffffffu);
        if (row0 >= rows)
            return taken;
        ptrdiff_t row1 = row0 + pool.chunk < rows ? row0 + pool.chunk : rows;
        if (!atomic_compare_exchange_weak(&pool.ticket, &ticket, ticket + (unsigned long long)(row1 - row0)))
            continue;
        taken++;
        if (worker)
            atomic_store_explicit(&pool.helped, 1, memory_order_relaxed);
        function(call, row0, row1);
        if (atomic_fetch_add(&pool.finished, row1 - row0) + (row1 - row0) == rows && worker
            && atomic_load(&pool.caller_sleeps)) {
            pthread_mutex_lock(&pool.lock);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.lock);
        }
    }
}

static void *pool_worker(void *argument)
{
    int index = (int)((intptr_t)argument & 0xff);
    unsigned long long seen = (unsigned long long)((intptr_t)argument >> 8);  /* the generation before its job */
    int spin = 1;
    for (;;) {
        pool_wait(generation_moved, &seen, spin ? SPIN_NS : 0, &pool.wake, &pool.sleepers);
        seen = atomic_load_explicit(&pool.ticket, memory_order_acquire) >> 32;
        /* on the caller's core it would keep the caller from running: no rows, and no spin */
        spin = index < pool.helpers && !on_callers_core();
        if (spin)
            pool_take(seen, 1);
    }
    return NULL;
}

static void pool_forked(void)
{
    pthread_mutex_init(&pool.busy, NULL);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    atomic_store(&pool.sleepers, 0);
    atomic_store(&pool.caller_sleeps, 0);
    pool.started = 0;
}

/* function(call, row0, row1) over rows [0, rows) in chunks of `chunk`, on this thread and up to threads - 1
 * workers. */
void parallel_rows(RowsFunction function, const void *call, ptrdiff_t rows, ptrdiff_t chunk, int threads)
{
    if (threads > MAX_WORKERS + 1)
        threads = MAX_WORKERS + 1;
    if (threads < 2 || rows >= (ptrdiff_t)1 << 31 || pthread_mutex_trylock(&pool.busy) != 0) {
        function(call, 0, rows);
        return;
    }
    if (!pool.registered) {
        pthread_atfork(NULL, NULL, pool_forked);
        pool.registered = 1;
    }
    unsigned long long generation = (atomic_load(&pool.ticket) >> 32) + 1;
    while (pool.started < threads - 1) {
        pthread_t thread;
        pthread_attr_t attributes;
        pthread_attr_init(&attributes);
        pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
        intptr_t argument = (intptr_t)(generation - 1) << 8 | pool.started;
        int failed = pthread_create(&thread, &attributes, pool_worker, (void *)argument);
        pthread_attr_destroy(&attributes);
        if (failed)
            break;
        pool.started++;
    }
    pool.function = function;
    pool.call = call;
    pool.rows = rows;
    pool.chunk = chunk > 0 ? chunk : 1;
    pool.helpers = threads - 1;
    atomic_store(&pool.finished, 0);
    atomic_store(&pool.helped, 0);
#ifdef __linux__
    atomic_store_explicit(&pool.caller_cpu, sched_getcpu(), memory_order_relaxed);
#endif
    atomic_store(&pool.ticket, generation << 32);
    int quiet = pool.quiet > 0;
    if (quiet)
        pool.quiet--;
    else if (atomic_load(&pool.sleepers)) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }
    long long start = pool_now();
    int taken = pool_take(generation, 0);
    long long wait = taken ? 2 * (pool_now() - start) / taken : WAIT_NS;
    wait = wait < WAIT_NS ? WAIT_NS : wait > WAIT_MAX_NS ? WAIT_MAX_NS : wait;
    pool_wait(job_finished, &rows, wait, &pool.done, &pool.caller_sleeps);  /* a worker's last chunk */
    if (atomic_load_explicit(&pool.helped, memory_order_relaxed)) {
        pool.quiet = pool.backoff = 0;
    } else if (!quiet) {
        pool.quiet = pool.backoff;
        pool.backoff = pool.backoff ? (2 * pool.backoff < QUIET_JOBS ? 2 * pool.backoff : QUIET_JOBS) : 1;
    }
    pthread_mutex_unlock(&pool.busy);
}
