/*
 * The simulated node's GPUs as the stand-in libnvidia-ml.so.1 reads them: one shared
 * memory file (its path in NODED_SIM_NVML) that the simulated node writes and any process
 * maps. This header is the one definition of its layout; sim/nodesim/nvml_shm.py mirrors it
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
#define SIMNVML_VERSION 2u
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
    SIMNVML_TELEMETRY,       /* temperature, power, fan, clocks, PCIe, ECC, modes, codecs */
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

/* What monitoring tools (nvidia-smi, gpustat, nvitop) read besides utilisation and memory:
   the simulated node derives it from the model's specification and its utilisation. */
#define SIMNVML_HAS_FAN (1u << 0)     /* a dedicated fan: data-centre boards are passively cooled */
#define SIMNVML_HAS_MIG (1u << 1)     /* MIG mode can be queried (A100, H100) */


struct simnvml_telemetry {
    uint32_t supported;            /* SIMNVML_HAS_* */
    uint32_t temperature_c;        /* GPU core sensor */
    uint32_t fan_percent;
    uint32_t power_mw;             /* board draw now */
    uint32_t power_limit_mw;       /* enforced = management limit here */
    uint32_t power_default_limit_mw;
    uint32_t power_min_limit_mw, power_max_limit_mw;
    uint32_t clock_mhz[4];         /* nvmlClockType_t: graphics, SM, memory, video */
    uint32_t max_clock_mhz[4];
    uint32_t pcie_gen, pcie_max_gen, pcie_width, pcie_max_width;
    uint32_t pcie_tx_kbps, pcie_rx_kbps;
    uint32_t ecc_enabled;
    uint32_t persistence;          /* 1: enabled (nvidia-persistenced runs) */
    uint32_t pstate;               /* 0 = P0 */
    uint32_t encoder_util, decoder_util;
    uint32_t pci_domain, pci_bus, pci_device;
    uint32_t pci_device_id;        /* device << 16 | vendor 0x10de */
    uint32_t pci_subsystem_id;
    uint32_t nvlink_count;         /* 0: no NVLink */
    uint32_t pad;
    uint64_t bar1_total;
    uint64_t energy_mj;            /* since the driver loaded */
    char serial[32];
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
    struct simnvml_telemetry telemetry;
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
    char nvml_version[32];         /* "12.550.54.15": the CUDA major it ships with, then the driver's */
    uint32_t cuda_driver_version;  /* 1000 * major + 10 * minor, as cudaDriverGetVersion: 12040 */
    uint32_t pad;
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
#define SIMNVML_LAYOUT_FIELDS 14

#endif
