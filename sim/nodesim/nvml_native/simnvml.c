/*
 * A stand-in libnvidia-ml.so.1 for the simulated node: the entry points pynvml resolves
 * for every call noded makes, with NVML's return codes and nvmlErrorString texts, reading
 * the simulated GPUs from the shared memory file named by NODED_SIM_NVML (simnvml.h).
 * This file: mapping the node, init, counts, handles, identity, utilisation, memory,
 * per-process samples, compute modes. processes.c has the running-process queries,
 * monitoring.c what monitoring tools read besides (temperature, power, clocks, ...).
 *
 * Where the real library differs from a naive fake, this one follows the real one:
 * per-process utilisation samples carry their own timestamps and NOT_FOUND means nothing
 * newer than the caller's last seen timestamp; setting a compute mode needs root; memory
 * used includes the driver's reservation (v1; v2 reports it apart). Built with
 * -DSIMNVML_NO_V3 it is a driver that predates the _v3 process queries (pynvml then raises
 * NVMLLibraryMismatchError).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>



#include "internal.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int init_count;
struct simnvml_node *node; /* mapped at the first successful init, kept until exit */
static int writable;              /* mapped read-write: this process may set compute modes */
struct simnvml_device devices[SIMNVML_MAX_GPUS];

/* -- reading the node */

static dev_t mapped_dev;
static ino_t mapped_ino;

static int mapped(void)
{
    /* Maps the node named by NODED_SIM_NVML at each first init (under `lock`): 0 when there
       is none (no file, a wrong one), which a caller reports as "driver not loaded". A
       mapping replaced by another file's is never unmapped: a call in another thread may
       still be reading it (a few hundred KiB per file a process ever sees). */
    const char *path = getenv("NODED_SIM_NVML");
    if (!path || !*path)
        return 0;
    int rw = geteuid() == 0;
    int fd = open(path, (rw ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && rw) {
        rw = 0;
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    }
    if (fd < 0)
        return 0;
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size < sizeof(struct simnvml_node)) {
        close(fd);
        return 0;
    }
    if (node && st.st_dev == mapped_dev && st.st_ino == mapped_ino) {
        close(fd);
        return 1;
    }
    void *p = mmap(NULL, sizeof(struct simnvml_node), PROT_READ | (rw ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return 0;
    struct simnvml_node *n = p;
    if (n->magic != SIMNVML_MAGIC || n->version != SIMNVML_VERSION || n->size != sizeof(struct simnvml_node)) {
        munmap(p, sizeof(struct simnvml_node));
        return 0;
    }
    __atomic_store_n(&node, n, __ATOMIC_RELEASE);
    writable = rw;
    mapped_dev = st.st_dev;
    mapped_ino = st.st_ino;
    return 1;
}

/* A consistent copy of `len` bytes at `src` inside the published part (the seqlock). */
void snapshot(void *dst, const void *src, size_t len)
{
    for (;;) {
        uint32_t before = __atomic_load_n(&node->seq, __ATOMIC_ACQUIRE);
        if (before & 1) {
            sched_yield();
            continue;
        }
        memcpy(dst, src, len);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&node->seq, __ATOMIC_RELAXED) == before)
            return;
    }
}

static void slow(uint32_t ms)
{
    if (!ms)
        return;
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR)
        ;
}

/* The node-wide fault of a call (after its delay); 0 when it may go on. */
nvmlReturn_t node_fault(enum simnvml_call call)
{
    uint32_t fault[SIMNVML_CALLS], slow_ms[SIMNVML_CALLS];
    snapshot(fault, node->published.fault, sizeof fault);
    snapshot(slow_ms, node->published.slow_ms, sizeof slow_ms);
    slow(slow_ms[call]);
    return (nvmlReturn_t)fault[call];
}

nvmlReturn_t initialised(void)
{
    pthread_mutex_lock(&lock);
    int n = init_count;
    pthread_mutex_unlock(&lock);
    return n > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

/* The GPU behind a handle, copied whole; its lost state and the call's faults applied. */
nvmlReturn_t gpu_of(nvmlDevice_t device, enum simnvml_call call, struct simnvml_gpu *out)
{
    nvmlReturn_t rc = initialised();
    if (rc)
        return rc;
    if (device < devices || device >= devices + SIMNVML_MAX_GPUS || device != &devices[device->index])
        return NVML_ERROR_INVALID_ARGUMENT;
    uint32_t count;
    snapshot(&count, &node->published.gpu_count, sizeof count);
    if (device->index >= count)
        return NVML_ERROR_INVALID_ARGUMENT;
    snapshot(out, &node->published.gpus[device->index], sizeof *out);
    slow(out->slow_ms[call]);
    if (out->lost)
        return NVML_ERROR_GPU_IS_LOST;
    return (nvmlReturn_t)out->fault[call];
}

nvmlReturn_t copy_text(char *buf, unsigned int size, const char *text, size_t max)
{
    size_t n = strnlen(text, max);
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (size < n + 1)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, text, n);
    buf[n] = 0;
    return NVML_SUCCESS;
}

/* -- the library */

/* The texts NVIDIA's own Python bindings know for these codes (pynvml's table). */
EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt Request Issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    case 22: return "The requested vgpu operation is not available on target device, because ECC is enabled";
    case 23: return "Ran out of critical resources, other than memory";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = NVML_SUCCESS;
    if ((init_count == 0 && !mapped()) || !node) {
        rc = NVML_ERROR_DRIVER_NOT_LOADED;
    } else {
        uint32_t loaded;
        snapshot(&loaded, &node->published.driver_loaded, sizeof loaded);
        rc = loaded ? node_fault(SIMNVML_INIT) : NVML_ERROR_DRIVER_NOT_LOADED;
    }
    if (rc == NVML_SUCCESS) {
        for (unsigned int i = 0; i < SIMNVML_MAX_GPUS; i++)
            devices[i].index = i;
        init_count++;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&lock);
    nvmlReturn_t rc = init_count > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (init_count > 0)
        init_count--;
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t rc = initialised();
    if (rc || (rc = node_fault(SIMNVML_DRIVER_VERSION)))
        return rc;
    char text[32];
    snapshot(text, node->published.driver_version, sizeof text);
    return copy_text(version, length, text, sizeof text);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    nvmlReturn_t rc = initialised();
    if (rc || (rc = node_fault(SIMNVML_COUNT)))
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint32_t n;
    snapshot(&n, &node->published.gpu_count, sizeof n);
    *count = n > SIMNVML_MAX_GPUS ? SIMNVML_MAX_GPUS : n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t rc = initialised();
    if (rc || (rc = node_fault(SIMNVML_HANDLE)))
        return rc;
    uint32_t n;
    snapshot(&n, &node->published.gpu_count, sizeof n);
    if (!device || index >= n || index >= SIMNVML_MAX_GPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct simnvml_gpu gpu;
    rc = gpu_of(&devices[index], SIMNVML_HANDLE, &gpu);
    if (rc)
        return rc;
    *device = &devices[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    nvmlReturn_t rc = initialised();
    if (rc || (rc = node_fault(SIMNVML_HANDLE)))
        return rc;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint32_t n;
    snapshot(&n, &node->published.gpu_count, sizeof n);
    for (unsigned int i = 0; i < n && i < SIMNVML_MAX_GPUS; i++) {
        char text[SIMNVML_TEXT];
        snapshot(text, node->published.gpus[i].uuid, sizeof text);
        if (strncmp(text, uuid, sizeof text) == 0) {
            struct simnvml_gpu gpu;
            rc = gpu_of(&devices[i], SIMNVML_HANDLE, &gpu);
            if (rc)
                return rc;
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = gpu_of(device, SIMNVML_INDEX, &gpu);
    if (rc)
        return rc;
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = device->index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = gpu_of(device, SIMNVML_UUID, &gpu);
    return rc ? rc : copy_text(uuid, length, gpu.uuid, sizeof gpu.uuid);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = gpu_of(device, SIMNVML_NAME, &gpu);
    return rc ? rc : copy_text(name, length, gpu.name, sizeof gpu.name);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = gpu_of(device, SIMNVML_UTILIZATION, &gpu);
    if (rc)
        return rc;
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    utilization->gpu = gpu.util_gpu; /* as published: out of range where the node says so */
    utilization->memory = gpu.util_memory;
    return NVML_SUCCESS;
}

/* What the processes on the GPU hold (under MPS the clients' memory, the server's). */
static unsigned long long used_by_processes(const struct simnvml_gpu *gpu)
{
    unsigned long long used = 0;
    for (uint32_t i = 0; i < gpu->nprocs && i < SIMNVML_MAX_PROCS; i++)
        used += gpu->procs[i].used_memory;
    for (uint32_t i = 0; i < gpu->nmps && i < SIMNVML_MAX_PROCS; i++)
        used += gpu->mps[i].used_memory;
    return used;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = gpu_of(device, SIMNVML_MEMORY, &gpu);
    if (rc)
        return rc;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* v1: used includes the driver's reservation */
    unsigned long long used = gpu.memory_reserved + used_by_processes(&gpu);
    if (used > gpu.memory_total)
        used = gpu.memory_total;
    memory->total = gpu.memory_total;
    memory->used = used;
    memory->free = gpu.memory_total - used;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = gpu_of(device, SIMNVML_MEMORY, &gpu);
    if (rc)
        return rc;
    /* v2: the reservation on its own, used only what was allocated; free the same as v1's */
    unsigned long long reserved = gpu.memory_reserved < gpu.memory_total ? gpu.memory_reserved : gpu.memory_total;
    unsigned long long used = used_by_processes(&gpu);
    if (used > gpu.memory_total - reserved)
        used = gpu.memory_total - reserved;
    memory->total = gpu.memory_total;
    memory->reserved = reserved;
    memory->used = used;
    memory->free = gpu.memory_total - reserved - used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = gpu_of(device, SIMNVML_PROCESS_UTILIZATION, &gpu);
    if (rc)
        return rc;
    if (!processSamplesCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* Only samples newer than the caller's last seen, each with its own timestamp; a
       process with nothing in the period has no sample at all. */
    unsigned int n = 0;
    uint32_t have = gpu.nsamples > SIMNVML_MAX_SAMPLES ? SIMNVML_MAX_SAMPLES : gpu.nsamples;
    for (uint32_t i = 0; i < have; i++)
        n += gpu.samples[i].timestamp_us > lastSeenTimeStamp;
    if (n == 0)
        return NVML_ERROR_NOT_FOUND;
    if (!utilization || *processSamplesCount < n) {
        *processSamplesCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int k = 0;
    for (uint32_t i = 0; i < have; i++) {
        const struct simnvml_sample *s = &gpu.samples[i];
        if (s->timestamp_us <= lastSeenTimeStamp)
            continue;
        utilization[k].pid = s->pid;
        utilization[k].timeStamp = s->timestamp_us;
        utilization[k].smUtil = s->sm_util;
        utilization[k].memUtil = s->mem_util;
        utilization[k].encUtil = 0;
        utilization[k].decUtil = 0;
        k++;
    }
    *processSamplesCount = k;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, int *mode)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = gpu_of(device, SIMNVML_GET_COMPUTE_MODE, &gpu);
    if (rc)
        return rc;
    if (!mode)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mode = (int)__atomic_load_n(&node->driver.compute_mode[device->index], __ATOMIC_ACQUIRE);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, int mode)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = gpu_of(device, SIMNVML_SET_COMPUTE_MODE, &gpu);
    if (rc)
        return rc;
    if (geteuid() != 0 || !writable)
        return NVML_ERROR_NO_PERMISSION; /* NVIDIA: "Requires root/admin permissions" */
    if (mode != 0 && mode != 2 && mode != 3)
        return NVML_ERROR_INVALID_ARGUMENT; /* 1, EXCLUSIVE_THREAD, is gone since CUDA 8 */
    __atomic_store_n(&node->driver.compute_mode[device->index], (uint32_t)mode, __ATOMIC_RELEASE);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = gpu_of(device, SIMNVML_COMPUTE_CAPABILITY, &gpu);
    if (rc)
        return rc;
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = (int)gpu.cc_major;
    *minor = (int)gpu.cc_minor;
    return NVML_SUCCESS;
}

/* Sizes and offsets of the layout, in the order sim/nodesim/nvml_shm.py checks them. */
EXPORT unsigned int simnvml_layout(unsigned long long *out, unsigned int n)
{
    unsigned long long v[SIMNVML_LAYOUT_FIELDS] = {
        sizeof(struct simnvml_node),
        offsetof(struct simnvml_node, seq),
        offsetof(struct simnvml_node, published),
        offsetof(struct simnvml_node, driver),
        sizeof(struct simnvml_gpu),
        offsetof(struct simnvml_published, gpus),
        offsetof(struct simnvml_gpu, fault),
        offsetof(struct simnvml_gpu, procs),
        offsetof(struct simnvml_gpu, samples),
        sizeof(struct simnvml_sample),
        offsetof(struct simnvml_gpu, telemetry),
        sizeof(struct simnvml_telemetry),
        SIMNVML_CALLS,
        SIMNVML_VERSION,
    };
    unsigned int k = n < SIMNVML_LAYOUT_FIELDS ? n : SIMNVML_LAYOUT_FIELDS;
    for (unsigned int i = 0; i < k; i++)
        out[i] = v[i];
    return SIMNVML_LAYOUT_FIELDS;
}
