/*
 * What the stand-in library's source files share: NVML's types and return codes as
 * nvml.h defines them, and the helpers that read the simulated node (simnvml.c).
 * Everything here is hidden (-fvisibility=hidden); only EXPORT entry points are the library's.
 */
#ifndef NODED_SIMNVML_INTERNAL_H
#define NODED_SIMNVML_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

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
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
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
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t; /* what the unversioned entry points fill */
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

struct simnvml_device { unsigned int index; };
typedef struct simnvml_device *nvmlDevice_t;

extern struct simnvml_node *node;
extern struct simnvml_device devices[SIMNVML_MAX_GPUS];

/* A consistent copy of `len` bytes at `src` inside the published part (the seqlock). */
void snapshot(void *dst, const void *src, size_t len);
/* The node-wide fault of a call (after its delay); 0 when it may go on. */
nvmlReturn_t node_fault(enum simnvml_call call);
nvmlReturn_t initialised(void);
/* The GPU behind a handle, copied whole; its lost state and the call's faults applied. */
nvmlReturn_t gpu_of(nvmlDevice_t device, enum simnvml_call call, struct simnvml_gpu *out);
nvmlReturn_t copy_text(char *buf, unsigned int size, const char *text, size_t max);

#endif
