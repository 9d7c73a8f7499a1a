/* onnxruntime's CPU provider running one float model under qemu-aarch64, for bench/arm64.py's instruction counts:
 * the peer of tests/arm64/kernel_driver.c.
 *
 *   ort_driver LIBRARY MODEL TIMES INPUT OUTPUT OUTPUT_COUNT DIMS... < input floats > output floats
 *
 * LIBRARY is a user's onnxruntime for arm64 Linux (libonnxruntime.so, loaded with dlopen: nothing of
 * onnxruntime is compiled in or shipped here). One intra-op and one inter-op thread, sequential execution,
 * every graph optimisation; the session is made once and runs the model TIMES times on the input of shape
 * DIMS (read from stdin), writing the last run's OUTPUT_COUNT output floats to stdout and onnxruntime's version
 * to stderr.
 *
 * onnxruntime's C API is a table of function pointers (OrtApi) that only ever grows: a slot's index and
 * signature never change once released, and GetApi(version) hands out the table of an older version too.
 * The driver calls the twelve slots below by index, as API version 1 defined them, instead of including
 * onnxruntime_c_api.h. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API_VERSION 1
typedef void *Status;  /* NULL on success */
typedef struct {
    const void *const *(*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} ApiBase;

/* OrtApi's slots used here (onnxruntime_c_api.h, struct OrtApi, in declaration order from 0). */
enum {
    GET_ERROR_MESSAGE = 2, CREATE_ENV = 3, CREATE_SESSION = 7, RUN = 9, CREATE_SESSION_OPTIONS = 10,
    SET_SESSION_EXECUTION_MODE = 13, SET_SESSION_GRAPH_OPTIMIZATION_LEVEL = 23, SET_INTRA_OP_NUM_THREADS = 24,
    SET_INTER_OP_NUM_THREADS = 25, CREATE_TENSOR_WITH_DATA_AS_ORT_VALUE = 49, GET_TENSOR_MUTABLE_DATA = 51,
    CREATE_CPU_MEMORY_INFO = 69,
};
enum { LOGGING_WARNING = 2, SEQUENTIAL = 0, ENABLE_ALL = 99, ARENA_ALLOCATOR = 1, MEM_TYPE_DEFAULT = 0, FLOAT = 1 };

static const void *const *api;

static void check(Status status, const char *what)
{
    if (status) {
        const char *(*message)(const void *) = (const char *(*)(const void *))api[GET_ERROR_MESSAGE];
        fprintf(stderr, "ort_driver: %s: %s\n", what, message(status));
        exit(1);
    }
}

int main(int argc, char **argv)
{
    if (argc < 8) {
        fprintf(stderr, "usage: ort_driver LIBRARY MODEL TIMES INPUT OUTPUT OUTPUT_COUNT DIMS... < x > y\n");
        return 2;
    }
    void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    const ApiBase *(*get_base)(void) = library ? (const ApiBase *(*)(void))dlsym(library, "OrtGetApiBase") : NULL;
    if (!get_base) {
        fprintf(stderr, "ort_driver: %s is no onnxruntime library: %s\n", argv[1], dlerror());
        return 2;
    }
    const ApiBase *base = get_base();
    api = base->GetApi(API_VERSION);
    if (!api) {
        fprintf(stderr, "ort_driver: onnxruntime %s offers no API version %d\n", base->GetVersionString(), API_VERSION);
        return 2;
    }
    fprintf(stderr, "onnxruntime %s\n", base->GetVersionString());
    long times = strtol(argv[3], NULL, 10);
    size_t outputs = (size_t)strtoll(argv[6], NULL, 10), count = 1;
    int64_t dims[8];
    int rank = argc - 7;
    if (rank > 8 || times < 1) {
        fprintf(stderr, "ort_driver: at most 8 dimensions and at least one run\n");
        return 2;
    }
    for (int i = 0; i < rank; i++)
        count *= (size_t)(dims[i] = strtoll(argv[7 + i], NULL, 10));
    float *x = malloc(count * sizeof *x);
    if (!x || fread(x, sizeof *x, count, stdin) != count) {
        fprintf(stderr, "ort_driver: cannot read %zu input floats\n", count);
        return 2;
    }

    void *env, *options, *session, *memory, *input, *output = NULL;
    check(((Status(*)(int, const char *, void **))api[CREATE_ENV])(LOGGING_WARNING, "bench", &env), "CreateEnv");
    check(((Status(*)(void **))api[CREATE_SESSION_OPTIONS])(&options), "CreateSessionOptions");
    check(((Status(*)(void *, int))api[SET_INTRA_OP_NUM_THREADS])(options, 1), "SetIntraOpNumThreads");
    check(((Status(*)(void *, int))api[SET_INTER_OP_NUM_THREADS])(options, 1), "SetInterOpNumThreads");
    check(((Status(*)(void *, int))api[SET_SESSION_EXECUTION_MODE])(options, SEQUENTIAL), "SetSessionExecutionMode");
    check(((Status(*)(void *, int))api[SET_SESSION_GRAPH_OPTIMIZATION_LEVEL])(options, ENABLE_ALL),
          "SetSessionGraphOptimizationLevel");
    check(((Status(*)(const void *, const char *, const void *, void **))api[CREATE_SESSION])(env, argv[2], options,
                                                                                             &session),
          "CreateSession");
    check(((Status(*)(int, int, void **))api[CREATE_CPU_MEMORY_INFO])(ARENA_ALLOCATOR, MEM_TYPE_DEFAULT, &memory),
          "CreateCpuMemoryInfo");
    check(((Status(*)(const void *, void *, size_t, const int64_t *, size_t, int, void **))
           api[CREATE_TENSOR_WITH_DATA_AS_ORT_VALUE])(memory, x, count * sizeof *x, dims, (size_t)rank, FLOAT, &input),
          "CreateTensorWithDataAsOrtValue");
    const char *input_names[] = {argv[4]}, *output_names[] = {argv[5]};
    Status (*run)(void *, const void *, const char *const *, const void *const *, size_t, const char *const *, size_t,
                  void **) = (Status(*)(void *, const void *, const char *const *, const void *const *, size_t,
                                        const char *const *, size_t, void **))api[RUN];
    for (long time = 0; time < times; time++) {
        output = NULL;  /* onnxruntime allocates it (the previous run's is left: the process ends soon) */
        check(run(session, NULL, input_names, (const void *const *)&input, 1, output_names, 1, &output), "Run");
    }
    float *y;
    check(((Status(*)(void *, void **))api[GET_TENSOR_MUTABLE_DATA])(output, (void **)&y), "GetTensorMutableData");
    return fwrite(y, sizeof *y, outputs, stdout) != outputs || fflush(stdout) != 0;
}
