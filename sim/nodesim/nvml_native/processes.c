/*
 * The running-process queries, in every form pynvml and the tools built on it try: the
 * unversioned entry points (nvmlProcessInfo_v1_t: pid and memory), _v2 and _v3 (the same
 * 24-byte nvmlProcessInfo_t, with MIG instance ids), and nvmlDeviceGetRunningProcessDetailList
 * (nvmlProcessDetail_v1_t, by mode). Compute processes are what the driver sees: the
 * simulated jobs, and under MPS the one server holding its clients' memory; the MPS query
 * lists the clients. The simulated GPUs run no graphics work: that list is empty.
 * Built with -DSIMNVML_NO_V3, a driver that predates the _v3 entry points.
 */
#include "internal.h"

#define NO_INSTANCE 0xFFFFFFFFu /* gpuInstanceId, computeInstanceId without MIG */

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
    unsigned long long usedGpuCcProtectedMemory;
} nvmlProcessDetail_v1_t;

typedef struct {
    unsigned int version;
    unsigned int mode;
    unsigned int numProcArrayEntries;
    nvmlProcessDetail_v1_t *procArray;
} nvmlProcessDetailList_v1_t;

#define NVML_PROCESS_DETAIL_LIST_V1 ((unsigned int)(sizeof(nvmlProcessDetailList_v1_t) | (1u << 24)))

enum process_mode { MODE_COMPUTE = 0, MODE_GRAPHICS = 1, MODE_MPS = 2 }; /* nvmlProcessMode_t */
enum record { RECORD_V1, RECORD_V2, RECORD_DETAIL };

/* The processes a mode lists on `gpu`, into `out` (at most SIMNVML_MAX_PROCS + 1). */
static unsigned int processes_of(const struct simnvml_gpu *gpu, enum process_mode mode, struct simnvml_process *out)
{
    unsigned int n = 0;
    if (mode == MODE_COMPUTE) {
        for (uint32_t i = 0; i < gpu->nprocs && i < SIMNVML_MAX_PROCS; i++)
            out[n++] = gpu->procs[i];
        if (gpu->mps_server_pid) { /* the driver sees one server process, holding its clients' memory */
            struct simnvml_process server = {gpu->mps_server_pid, 0, 0};
            for (uint32_t i = 0; i < gpu->nmps && i < SIMNVML_MAX_PROCS; i++)
                server.used_memory += gpu->mps[i].used_memory;
            out[n++] = server;
        }
    } else if (mode == MODE_MPS) {
        for (uint32_t i = 0; i < gpu->nmps && i < SIMNVML_MAX_PROCS; i++)
            out[n++] = gpu->mps[i];
    }
    return n;
}

static void write_record(void *array, enum record kind, unsigned int i, const struct simnvml_process *p)
{
    switch (kind) {
    case RECORD_V1: {
        nvmlProcessInfo_v1_t *r = (nvmlProcessInfo_v1_t *)array + i;
        r->pid = p->pid;
        r->usedGpuMemory = p->used_memory;
        break;
    }
    case RECORD_V2: {
        nvmlProcessInfo_t *r = (nvmlProcessInfo_t *)array + i;
        r->pid = p->pid;
        r->usedGpuMemory = p->used_memory;
        r->gpuInstanceId = r->computeInstanceId = NO_INSTANCE;
        break;
    }
    case RECORD_DETAIL: {
        nvmlProcessDetail_v1_t *r = (nvmlProcessDetail_v1_t *)array + i;
        r->pid = p->pid;
        r->usedGpuMemory = p->used_memory;
        r->gpuInstanceId = r->computeInstanceId = NO_INSTANCE;
        r->usedGpuCcProtectedMemory = 0; /* no confidential computing */
        break;
    }
    }
}

/* NVML's two-call protocol: a short (or no) buffer answers INSUFFICIENT_SIZE with the count
   needed, and SUCCESS with 0 where there is nothing to list. */
static nvmlReturn_t list(nvmlDevice_t device, enum process_mode mode, enum record kind, unsigned int *count,
                         void *array)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = gpu_of(device, mode == MODE_MPS ? SIMNVML_MPS_PROCESSES : SIMNVML_PROCESSES, &gpu);
    if (rc)
        return rc;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct simnvml_process procs[SIMNVML_MAX_PROCS + 1];
    unsigned int n = processes_of(&gpu, mode, procs);
    if (!array || *count < n) {
        *count = n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++)
        write_record(array, kind, i, &procs[i]);
    *count = n;
    return NVML_SUCCESS;
}

#define PROCESS_QUERY(name, mode, kind, type) \
    EXPORT nvmlReturn_t name(nvmlDevice_t d, unsigned int *c, type *i) { return list(d, mode, kind, c, i); }

PROCESS_QUERY(nvmlDeviceGetComputeRunningProcesses, MODE_COMPUTE, RECORD_V1, nvmlProcessInfo_v1_t)
PROCESS_QUERY(nvmlDeviceGetGraphicsRunningProcesses, MODE_GRAPHICS, RECORD_V1, nvmlProcessInfo_v1_t)
PROCESS_QUERY(nvmlDeviceGetMPSComputeRunningProcesses, MODE_MPS, RECORD_V1, nvmlProcessInfo_v1_t)
PROCESS_QUERY(nvmlDeviceGetComputeRunningProcesses_v2, MODE_COMPUTE, RECORD_V2, nvmlProcessInfo_t)
PROCESS_QUERY(nvmlDeviceGetGraphicsRunningProcesses_v2, MODE_GRAPHICS, RECORD_V2, nvmlProcessInfo_t)
PROCESS_QUERY(nvmlDeviceGetMPSComputeRunningProcesses_v2, MODE_MPS, RECORD_V2, nvmlProcessInfo_t)
#ifndef SIMNVML_NO_V3
PROCESS_QUERY(nvmlDeviceGetComputeRunningProcesses_v3, MODE_COMPUTE, RECORD_V2, nvmlProcessInfo_t)
PROCESS_QUERY(nvmlDeviceGetGraphicsRunningProcesses_v3, MODE_GRAPHICS, RECORD_V2, nvmlProcessInfo_t)
PROCESS_QUERY(nvmlDeviceGetMPSComputeRunningProcesses_v3, MODE_MPS, RECORD_V2, nvmlProcessInfo_t)

EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_v1_t *plist)
{
    if (!plist)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (plist->version != NVML_PROCESS_DETAIL_LIST_V1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (plist->mode > MODE_MPS)
        return NVML_ERROR_INVALID_ARGUMENT;
    return list(device, (enum process_mode)plist->mode, RECORD_DETAIL, &plist->numProcArrayEntries,
                plist->procArray);
}
#endif
