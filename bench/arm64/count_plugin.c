/* A qemu TCG plugin that counts the guest instructions a process executes and prints
 * "instructions N" on stderr at exit, for bench/arm64.py.
 *
 * Each translated block adds its instruction count to one counter inline (no callback per block), so
 * counting costs little. Debian's qemu-user (7.2) loads plugins but ships neither qemu-plugin.h nor the
 * example plugins: the few API functions used are declared here as qemu's plugin API version 1 defines them
 * (include/qemu/qemu-plugin.h; QEMU_PLUGIN_INLINE_ADD_U64 is 0). One vCPU: the benched code runs one thread. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct qemu_info_t qemu_info_t;
enum { QEMU_PLUGIN_INLINE_ADD_U64 = 0 };

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id,
                                           void (*translated)(qemu_plugin_id_t, struct qemu_plugin_tb *));
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, int op, void *counter, uint64_t add);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, void (*at_exit)(qemu_plugin_id_t, void *), void *data);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

static uint64_t executed;

static void translated(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &executed, qemu_plugin_tb_n_insns(tb));
}

static void at_exit(qemu_plugin_id_t id, void *data)
{
    (void)id;
    (void)data;
    fprintf(stderr, "instructions %llu\n", (unsigned long long)executed);
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                                               char **argv)
{
    (void)info;
    (void)argc;
    (void)argv;
    qemu_plugin_register_vcpu_tb_trans_cb(id, translated);
    qemu_plugin_register_atexit_cb(id, at_exit, NULL);
    return 0;
}
