/* Layer threads for the native kernels: one conv's output rows shared among a few persistent threads.
 *
 * A Python thread pool costs tens of microseconds to wake a worker per layer, as much as a small layer's
 * whole work, so splitting a batch-1 network's layers across two threads made it slower. Here the workers
 * spin a short while after each job before they sleep, so the next layer (a few microseconds of Python
 * later) finds them awake, and the rows are handed out in chunks from a shared counter, so a thread that a
 * busy machine delays takes fewer chunks instead of holding the others up. Which thread computes a row does
 * not change its result: every row is computed by the same code in the same order.
 *
 * One job at a time: a caller that finds the pool busy (another Python thread's layer) runs its rows alone.
 * A forked child starts without workers and starts its own when it needs them.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define MAX_WORKERS 15
#define SPIN_ROUNDS 20000  /* pauses a worker spins through after a job before it sleeps (about half a ms) */
#define WAIT_SPINS 2000    /* pauses the caller spins through waiting for a worker's last chunk before yielding */

typedef void (*RowsFunction)(const void *call, ptrdiff_t row0, ptrdiff_t row1);

static struct {
    pthread_mutex_t busy;         /* held by the caller whose job runs */
    pthread_mutex_t lock;         /* guards the sleepers' wait on `wake` */
    pthread_cond_t wake;
    atomic_ullong ticket;         /* the job's generation << 32 | the first row no thread has claimed yet */
    atomic_llong finished;        /* rows of the current job computed */
    RowsFunction function;        /* the current job: set before its generation's ticket is published */
    const void *call;
    ptrdiff_t rows, chunk;
    int helpers;                  /* workers taking part in the current job */
    int started;
    int registered;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

static inline void pool_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claim and compute chunks of job `generation`'s rows until none is left. A claim is a compare-and-swap of
 * the ticket, which holds the generation: a thread that read the job's fields while the caller was already
 * setting up the next job fails its claim, so a late worker never runs one job's rows with another's call,
 * and nobody waits for a worker that has not claimed anything. */
static void pool_take(unsigned long long generation)
{
    for (;;) {
        unsigned long long ticket = atomic_load_explicit(&pool.ticket, memory_order_acquire);
        if (ticket >> 32 != generation)
            return;
        RowsFunction function = pool.function;
        const void *call = pool.call;
        ptrdiff_t rows = pool.rows, row0 = (ptrdiff_t)(ticket & 0xffffffffu);
        if (row0 >= rows)
            return;
        ptrdiff_t row1 = row0 + pool.chunk < rows ? row0 + pool.chunk : rows;
        if (!atomic_compare_exchange_weak(&pool.ticket, &ticket, ticket + (unsigned long long)(row1 - row0)))
            continue;
        function(call, row0, row1);
        atomic_fetch_add_explicit(&pool.finished, row1 - row0, memory_order_release);
    }
}

static void *pool_worker(void *argument)
{
    int index = (int)((intptr_t)argument & 0xff);
    unsigned long long seen = (unsigned long long)((intptr_t)argument >> 8);  /* the generation before its job */
    for (;;) {
        unsigned long long now;
        int spins = 0;
        while ((now = atomic_load_explicit(&pool.ticket, memory_order_acquire) >> 32) == seen) {
            if (++spins < SPIN_ROUNDS) {
                pool_pause();
                continue;
            }
            pthread_mutex_lock(&pool.lock);
            while (atomic_load(&pool.ticket) >> 32 == seen)
                pthread_cond_wait(&pool.wake, &pool.lock);
            pthread_mutex_unlock(&pool.lock);
        }
        seen = now;
        if (index < pool.helpers)
            pool_take(now);
    }
    return NULL;
}

static void pool_forked(void)
{
    pthread_mutex_init(&pool.busy, NULL);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
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
    pthread_mutex_lock(&pool.lock);
    atomic_store_explicit(&pool.ticket, generation << 32, memory_order_release);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    pool_take(generation);
    /* a worker still on its last chunk: spin briefly, then yield the core (on a loaded machine the worker may
     * be waiting for one) */
    for (int spins = 0; atomic_load_explicit(&pool.finished, memory_order_acquire) < rows; spins++) {
        if (spins < WAIT_SPINS)
            pool_pause();
        else
            sched_yield();
    }
    pthread_mutex_unlock(&pool.busy);
}
