/*
 * The simulated node's GPUs as the stand-in libnvidia-ml.so.1 reads them: one shared
 * memory file (its path in NODED_SIM_NVML) that the simulated node writes and any process
 * maps. This header is the one definition of its layout; noded/sim/nvml_shm.py mirrors it
 * with ctypes and checks the mirror against simnvml_layout() at attach.
 *
 * Writer (the simulated node, one process): `seq` odd while it writes, even after; it
 * writes the whole `published` part at once. Readers copy what they need and retry while
 * `seq` was odd or changed (a seqlock: the writer never waits for a reader).
 * The `driver` part is written by the library itself (compute modes, which need root) and
 * read by the simulated node.
 */
#ifndef NODED_SIMNVML_H
#define NODED_SIMNVML_H

#include <stdint.h>

#define SIMNVML_MAGIC 0x4d49534445444f4eULL /* "NODEDSIM" little-endian */
#define SIMNVML_VERSION 1u
#define SIMNVML_MAX_GPUS 16
#define SIMNVML_MAX_PROCS 64    /* per GPU: processes, or MPS clients (48 from Volta on) */
#define SIMNVML_MAX_SAMPLES 256 /* per GPU: the driver's buffer of per-process samples */
#define SIMNVML_TEXT 96

/* The calls a fault can be injected into (an NVML return code, and a delay). */
enum simnvml_call {
    SIMNVML_INIT = 0,
    SIMNVML_COUNT,
    SIMNVML_HANDLE,          /* by index and by UUID */
    SIMNVML_INDEX,
    SIMNVML_UUID,
    SIMNVML_NAME,
    SIMNVML_UTILIZATION,
    SIMNVML_MEMORY,
    SIMNVML_PROCESSES,       /* compute running processes */
    SIMNVML_MPS_PROCESSES,
    SIMNVML_PROCESS_UTILIZATION,
    SIMNVML_GET_COMPUTE_MODE,
    SIMNVML_SET_COMPUTE_MODE,
    SIMNVML_COMPUTE_CAPABILITY,
    SIMNVML_DRIVER_VERSION,
    SIMNVML_CALLS
};

struct simnvml_process {
    uint32_t pid;
    uint32_t pad;
    uint64_t used_memory; /* bytes */
};

struct simnvml_sample {
    uint64_t timestamp_us; /* wall clock, as NVML's per-process samples are stamped */
    uint32_t pid;
    uint32_t sm_util;      /* percent */
    uint32_t mem_util;
    uint32_t pad;
};

struct simnvml_gpu {
    char uuid[SIMNVML_TEXT];
    char name[SIMNVML_TEXT];
    uint64_t memory_total;
    uint64_t memory_reserved;  /* the driver's own: memory used is never 0 */
    uint32_t util_gpu;         /* percent; a real driver has been seen above 100 */
    uint32_t util_memory;
    uint32_t cc_major, cc_minor;
    uint32_t lost;             /* GPU_IS_LOST from every call on it */
    uint32_t nprocs;
    uint32_t mps_server_pid;   /* 0: no MPS server */
    uint32_t nmps;
    uint32_t nsamples;         /* samples[0..nsamples) oldest first */
    uint32_t pad;
    uint32_t fault[SIMNVML_CALLS];   /* 0, or the return code the call fails with */
    uint32_t slow_ms[SIMNVML_CALLS]; /* the call takes this long first */
    struct simnvml_process procs[SIMNVML_MAX_PROCS];
    struct simnvml_process mps[SIMNVML_MAX_PROCS];
    struct simnvml_sample samples[SIMNVML_MAX_SAMPLES];
};

struct simnvml_published {
    uint32_t driver_loaded;    /* 0: nvmlInit fails DRIVER_NOT_LOADED */
    uint32_t gpu_count;
    char driver_version[32];
    uint32_t fault[SIMNVML_CALLS];   /* node-wide faults (init, count, ...) */
    uint32_t slow_ms[SIMNVML_CALLS];
    struct simnvml_gpu gpus[SIMNVML_MAX_GPUS];
};

struct simnvml_driver {
    uint32_t compute_mode[SIMNVML_MAX_GPUS]; /* set by nvmlDeviceSetComputeMode (root) */
};

struct simnvml_node {
    uint64_t magic;
    uint32_t version;
    uint32_t size;       /* sizeof(struct simnvml_node) */
    uint32_t seq;        /* the seqlock over `published` */
    uint32_t pad;
    struct simnvml_published published;
    struct simnvml_driver driver;
};

/* sizes and offsets, for the Python mirror's check: see simnvml_layout() */
#define SIMNVML_LAYOUT_FIELDS 12

#endif
