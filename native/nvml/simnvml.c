/*
 * A stand-in libnvidia-ml.so.1 for the simulated node: the entry points pynvml resolves
 * for every call noded makes, with NVML's return codes and nvmlErrorString texts, reading
 * the simulated GPUs from the shared memory file named by NODED_SIM_NVML (simnvml.h).
 *
 * Where the real library differs from a naive fake, this one follows the real one:
 * per-process utilisation samples carry their own timestamps and NOT_FOUND means nothing
 * newer than the caller's last seen timestamp; setting a compute mode needs root; memory
 * used includes the driver's reservation. Built with -DSIMNVML_NO_V3 it is a driver that
 * predates the _v3 process queries (pynvml then raises NVMLLibraryMismatchError).
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

#include "simnvml.h"

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
};

/* the structures pynvml passes, as nvml.h defines them */
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t; /* the v2 layout; v3 is the same */
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

struct simnvml_device { unsigned int index; };
typedef struct simnvml_device *nvmlDevice_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int init_count;
static struct simnvml_node *node; /* mapped at the first successful init, kept until exit */
static int writable;              /* mapped read-write: this process may set compute modes */
static struct simnvml_device devices[SIMNVML_MAX_GPUS];

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
static void snapshot(void *dst, const void *src, size_t len)
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
static nvmlReturn_t node_fault(enum simnvml_call call)
{
    uint32_t fault[SIMNVML_CALLS], slow_ms[SIMNVML_CALLS];
    snapshot(fault, node->published.fault, sizeof fault);
    snapshot(slow_ms, node->published.slow_ms, sizeof slow_ms);
    slow(slow_ms[call]);
    return (nvmlReturn_t)fault[call];
}

static nvmlReturn_t initialised(void)
{
    pthread_mutex_lock(&lock);
    int n = init_count;
    pthread_mutex_unlock(&lock);
    return n > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

/* The GPU behind a handle, copied whole; its lost state and the call's faults applied. */
static nvmlReturn_t gpu_of(nvmlDevice_t device, enum simnvml_call call, struct simnvml_gpu *out)
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

static nvmlReturn_t copy_text(char *buf, unsigned int size, const char *text, size_t max)
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

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = gpu_of(device, SIMNVML_MEMORY, &gpu);
    if (rc)
        return rc;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long used = gpu.memory_reserved;
    for (uint32_t i = 0; i < gpu.nprocs && i < SIMNVML_MAX_PROCS; i++)
        used += gpu.procs[i].used_memory;
    for (uint32_t i = 0; i < gpu.nmps && i < SIMNVML_MAX_PROCS; i++)
        used += gpu.mps[i].used_memory;
    if (used > gpu.memory_total)
        used = gpu.memory_total;
    memory->total = gpu.memory_total;
    memory->used = used;
    memory->free = gpu.memory_total - used;
    return NVML_SUCCESS;
}

/* NVML's two-call protocol: a short buffer answers INSUFFICIENT_SIZE with the count. */
static nvmlReturn_t process_list(const struct simnvml_process *procs, uint32_t n, const struct simnvml_process *extra,
                                 unsigned int *count, nvmlProcessInfo_t *infos)
{
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int total = n + (extra != NULL);
    if (!infos || *count < total) {
        *count = total;
        return total == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < total; i++) {
        const struct simnvml_process *p = i < n ? &procs[i] : extra;
        infos[i].pid = p->pid;
        infos[i].usedGpuMemory = p->used_memory;
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    *count = total;
    return NVML_SUCCESS;
}

static nvmlReturn_t compute_processes(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = gpu_of(device, SIMNVML_PROCESSES, &gpu);
    if (rc)
        return rc;
    uint32_t n = gpu.nprocs > SIMNVML_MAX_PROCS ? SIMNVML_MAX_PROCS : gpu.nprocs;
    /* Under MPS the driver sees one server process, holding its clients' memory. */
    struct simnvml_process server = {gpu.mps_server_pid, 0, 0};
    for (uint32_t i = 0; i < gpu.nmps && i < SIMNVML_MAX_PROCS; i++)
        server.used_memory += gpu.mps[i].used_memory;
    return process_list(gpu.procs, n, gpu.mps_server_pid ? &server : NULL, count, infos);
}

static nvmlReturn_t mps_processes(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = gpu_of(device, SIMNVML_MPS_PROCESSES, &gpu);
    if (rc)
        return rc;
    return process_list(gpu.mps, gpu.nmps > SIMNVML_MAX_PROCS ? SIMNVML_MAX_PROCS : gpu.nmps, NULL, count, infos);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i)
{
    return compute_processes(d, c, i);
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i)
{
    return mps_processes(d, c, i);
}

#ifndef SIMNVML_NO_V3
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i)
{
    return compute_processes(d, c, i);
}

EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *i)
{
    return mps_processes(d, c, i);
}
#endif

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

/* Sizes and offsets of the layout, in the order noded/sim/nvml_shm.py checks them. */
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
        SIMNVML_CALLS,
        SIMNVML_VERSION,
    };
    unsigned int k = n < SIMNVML_LAYOUT_FIELDS ? n : SIMNVML_LAYOUT_FIELDS;
    for (unsigned int i = 0; i < k; i++)
        out[i] = v[i];
    return SIMNVML_LAYOUT_FIELDS;
}
