/*
 * What monitoring tools read on every refresh besides utilisation and memory (nvidia-smi,
 * gpustat, nvitop): temperature, power, fan, clocks, PCIe, ECC, persistence, performance
 * state, codecs, PCI identity, the CUDA and NVML versions. Values are the simulated node's
 * (struct simnvml_telemetry); a query a real board of the model cannot answer (a fan on a
 * passively cooled data-centre GPU, MIG before Ampere, driver models off Windows) answers
 * NVML_ERROR_NOT_SUPPORTED, as NVIDIA documents.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* The telemetry of the GPU behind a handle (after the call's faults). */
static nvmlReturn_t telemetry_of(nvmlDevice_t device, struct simnvml_gpu *gpu)
{
    return gpu_of(device, SIMNVML_TELEMETRY, gpu);
}

/* One unsigned value of the telemetry, the common shape of these queries. */
#define UINT_QUERY(name, expr)                                              \
    EXPORT nvmlReturn_t name(nvmlDevice_t device, unsigned int *out)        \
    {                                                                       \
        struct simnvml_gpu gpu;                                             \
        nvmlReturn_t rc = telemetry_of(device, &gpu);                       \
        if (rc)                                                             \
            return rc;                                                      \
        if (!out)                                                           \
            return NVML_ERROR_INVALID_ARGUMENT;                             \
        const struct simnvml_telemetry *t = &gpu.telemetry;                 \
        (void)t;                                                            \
        *out = (expr);                                                      \
        return NVML_SUCCESS;                                                \
    }

/* -- versions (node-wide) */

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    nvmlReturn_t rc = initialised();
    if (rc || (rc = node_fault(SIMNVML_DRIVER_VERSION)))
        return rc;
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint32_t v;
    snapshot(&v, &node->published.cuda_driver_version, sizeof v);
    *version = (int)v;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) { return nvmlSystemGetCudaDriverVersion(version); }

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    nvmlReturn_t rc = initialised();
    if (rc || (rc = node_fault(SIMNVML_DRIVER_VERSION)))
        return rc;
    char text[sizeof node->published.nvml_version];
    snapshot(text, node->published.nvml_version, sizeof text);
    return copy_text(version, length, text, sizeof text);
}

/* -- thermal, power, fan */

enum { NVML_TEMPERATURE_GPU = 0 };

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    if (rc)
        return rc;
    if (!temp || sensor != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = gpu.telemetry.temperature_c;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned int version;
    int sensorType;
    int temperature;
} nvmlTemperature_v1_t;

#define NVML_TEMPERATURE_V1 ((unsigned int)(sizeof(nvmlTemperature_v1_t) | (1u << 24)))

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_v1_t *temperature)
{
    if (!temperature)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (temperature->version != NVML_TEMPERATURE_V1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned int t;
    nvmlReturn_t rc = nvmlDeviceGetTemperature(device, temperature->sensorType, &t);
    if (rc == NVML_SUCCESS)
        temperature->temperature = (int)t;
    return rc;
}

UINT_QUERY(nvmlDeviceGetPowerUsage, t->power_mw)
UINT_QUERY(nvmlDeviceGetPowerManagementLimit, t->power_limit_mw)
UINT_QUERY(nvmlDeviceGetEnforcedPowerLimit, t->power_limit_mw)
UINT_QUERY(nvmlDeviceGetPowerManagementDefaultLimit, t->power_default_limit_mw)

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int *min_mw,
                                                                 unsigned int *max_mw)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    if (rc)
        return rc;
    if (!min_mw || !max_mw)
        return NVML_ERROR_INVALID_ARGUMENT;
    *min_mw = gpu.telemetry.power_min_limit_mw;
    *max_mw = gpu.telemetry.power_max_limit_mw;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy_mj)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    if (rc)
        return rc;
    if (!energy_mj)
        return NVML_ERROR_INVALID_ARGUMENT;
    *energy_mj = gpu.telemetry.energy_mj;
    return NVML_SUCCESS;
}

/* NVIDIA: "For all discrete products with dedicated fans"; a passively cooled board has none. */
EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan, unsigned int *speed)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    if (rc)
        return rc;
    if (!(gpu.telemetry.supported & SIMNVML_HAS_FAN))
        return NVML_ERROR_NOT_SUPPORTED;
    if (!speed || fan != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *speed = gpu.telemetry.fan_percent;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
    return nvmlDeviceGetFanSpeed_v2(device, 0, speed);
}

EXPORT nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t device, unsigned int *count)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    if (rc)
        return rc;
    if (!(gpu.telemetry.supported & SIMNVML_HAS_FAN))
        return NVML_ERROR_NOT_SUPPORTED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 1;
    return NVML_SUCCESS;
}

/* -- clocks, performance state */

enum { NVML_CLOCK_COUNT = 4 }; /* graphics, SM, memory, video */

static nvmlReturn_t clock_of(nvmlDevice_t device, int type, unsigned int *mhz, int max)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    if (rc)
        return rc;
    if (!mhz || type < 0 || type >= NVML_CLOCK_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *mhz = max ? gpu.telemetry.max_clock_mhz[type] : gpu.telemetry.clock_mhz[type];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock)
{
    return clock_of(device, type, clock, 0);
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *clock)
{
    return clock_of(device, type, clock, 1);
}

UINT_QUERY(nvmlDeviceGetPerformanceState, t->pstate)
UINT_QUERY(nvmlDeviceGetPowerState, t->pstate) /* the older name of the same query */

/* -- PCIe */

UINT_QUERY(nvmlDeviceGetCurrPcieLinkGeneration, t->pcie_gen)
UINT_QUERY(nvmlDeviceGetMaxPcieLinkGeneration, t->pcie_max_gen)
UINT_QUERY(nvmlDeviceGetCurrPcieLinkWidth, t->pcie_width)
UINT_QUERY(nvmlDeviceGetMaxPcieLinkWidth, t->pcie_max_width)

enum { NVML_PCIE_UTIL_TX_BYTES = 0, NVML_PCIE_UTIL_RX_BYTES = 1 };

EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, int counter, unsigned int *kbps)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    if (rc)
        return rc;
    if (!kbps || (counter != NVML_PCIE_UTIL_TX_BYTES && counter != NVML_PCIE_UTIL_RX_BYTES))
        return NVML_ERROR_INVALID_ARGUMENT;
    *kbps = counter == NVML_PCIE_UTIL_TX_BYTES ? gpu.telemetry.pcie_tx_kbps : gpu.telemetry.pcie_rx_kbps;
    return NVML_SUCCESS;
}

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

static void pci_info(const struct simnvml_telemetry *t, nvmlPciInfo_t *pci)
{
    memset(pci, 0, sizeof *pci);
    pci->domain = t->pci_domain;
    pci->bus = t->pci_bus;
    pci->device = t->pci_device;
    pci->pciDeviceId = t->pci_device_id;
    pci->pciSubSystemId = t->pci_subsystem_id;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", t->pci_domain & 0xFFFFu,
             t->pci_bus & 0xFFu, t->pci_device & 0xFFu);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", t->pci_domain, t->pci_bus & 0xFFu,
             t->pci_device & 0xFFu);
}

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    if (rc)
        return rc;
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    pci_info(&gpu.telemetry, pci);
    return NVML_SUCCESS;
}

/* 1 to `max` hex digits at *p into *out, *p moved past them; 0 when there are none or more. */
static int hex_field(const char **p, int max, unsigned int *out)
{
    unsigned int v = 0;
    int n = 0;
    for (;; n++) {
        char c = (*p)[n];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            break;
        if (n == max)
            return 0;
        v = v << 4 | (unsigned int)d;
    }
    if (n == 0)
        return 0;
    *p += n;
    *out = v;
    return 1;
}

static int expect(const char **p, char c)
{
    if (**p != c)
        return 0;
    (*p)++;
    return 1;
}

/* "domain:bus:device.function" (domain up to 8 hex digits) or "bus:device.function", as
   nvidia-smi and NVML print bus ids; anything else is refused (strictly: no sign, space or
   0x, nothing after). */
static int parse_bus_id(const char *text, unsigned int *domain, unsigned int *bus, unsigned int *dev)
{
    const char *p = text;
    unsigned int a, b, fn;
    if (!hex_field(&p, 8, &a))
        return 0;
    long first = p - text;  /* the bus in the short form has 1 or 2 digits, like any bus */
    if (!expect(&p, ':') || !hex_field(&p, 2, &b))
        return 0;
    if (expect(&p, ':')) {
        *domain = a, *bus = b;
        if (!hex_field(&p, 2, dev))
            return 0;
    } else {
        if (first > 2)
            return 0;
        *domain = 0, *bus = a, *dev = b;
    }
    return expect(&p, '.') && hex_field(&p, 1, &fn) && *p == '\0' && *dev <= 0x1F && fn <= 7;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device)
{
    nvmlReturn_t rc = initialised();
    if (rc || (rc = node_fault(SIMNVML_HANDLE)))
        return rc;
    unsigned int domain, bus, dev;
    if (!bus_id || !device || !parse_bus_id(bus_id, &domain, &bus, &dev))
        return NVML_ERROR_INVALID_ARGUMENT;
    uint32_t n;
    snapshot(&n, &node->published.gpu_count, sizeof n);
    for (unsigned int i = 0; i < n && i < SIMNVML_MAX_GPUS; i++) {
        struct simnvml_telemetry t;
        snapshot(&t, &node->published.gpus[i].telemetry, sizeof t);
        if (t.pci_domain == domain && t.pci_bus == bus && t.pci_device == dev) {
            struct simnvml_gpu gpu;
            if ((rc = gpu_of(&devices[i], SIMNVML_HANDLE, &gpu)))
                return rc;
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus_id, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

/* -- identity, memory aperture */

EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    return rc ? rc : copy_text(serial, length, gpu.telemetry.serial, sizeof gpu.telemetry.serial);
}

typedef struct { unsigned long long bar1Total, bar1Free, bar1Used; } nvmlBAR1Memory_t;

EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    if (rc)
        return rc;
    if (!bar1)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* the driver maps a little of the aperture for itself and for each process on the GPU */
    unsigned long long used = (1ULL << 20) * (1 + gpu.nprocs + (gpu.mps_server_pid != 0));
    bar1->bar1Total = gpu.telemetry.bar1_total;
    bar1->bar1Used = used < gpu.telemetry.bar1_total ? used : gpu.telemetry.bar1_total;
    bar1->bar1Free = gpu.telemetry.bar1_total - bar1->bar1Used;
    return NVML_SUCCESS;
}

/* -- modes */

enum { NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1 };

UINT_QUERY(nvmlDeviceGetPersistenceMode, t->persistence)
/* No monitor is attached to a simulated GPU. */
UINT_QUERY(nvmlDeviceGetDisplayMode, NVML_FEATURE_DISABLED)
UINT_QUERY(nvmlDeviceGetDisplayActive, NVML_FEATURE_DISABLED)
/* MIG is never enabled here, so no handle is a MIG device's. */
UINT_QUERY(nvmlDeviceIsMigDeviceHandle, 0)

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    if (rc)
        return rc;
    if (!current || !pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = gpu.telemetry.ecc_enabled ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int error_type, int counter_type,
                                                unsigned long long *count)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    if (rc)
        return rc;
    if (!gpu.telemetry.ecc_enabled)
        return NVML_ERROR_NOT_SUPPORTED; /* no ECC counters while ECC is off */
    if (!count || error_type < 0 || error_type > 1 || counter_type < 0 || counter_type > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0; /* the simulated memory never errs */
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    if (rc)
        return rc;
    if (!(gpu.telemetry.supported & SIMNVML_HAS_MIG))
        return NVML_ERROR_NOT_SUPPORTED;
    if (!current || !pending)
        return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

/* Driver models (WDDM, TCC, MCDM) are Windows': NOT_SUPPORTED on Linux. */
static nvmlReturn_t no_driver_model(nvmlDevice_t device)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    return rc ? rc : NVML_ERROR_NOT_SUPPORTED;
}

EXPORT nvmlReturn_t nvmlDeviceGetDriverModel(nvmlDevice_t device, int *current, int *pending)
{
    (void)current, (void)pending;
    return no_driver_model(device);
}

EXPORT nvmlReturn_t nvmlDeviceGetDriverModel_v2(nvmlDevice_t device, int *current, int *pending)
{
    (void)current, (void)pending;
    return no_driver_model(device);
}

/* Confidential computing is off on the simulated GPUs. */
EXPORT nvmlReturn_t nvmlDeviceGetConfComputeMemSizeInfo(nvmlDevice_t device, void *info)
{
    (void)info;
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    return rc ? rc : NVML_ERROR_NOT_SUPPORTED;
}

/* -- video engines */

#define CODEC_SAMPLING_PERIOD_US 167000u /* about a sixth of a second, as drivers report it */

static nvmlReturn_t codec_util(nvmlDevice_t device, int decoder, unsigned int *util, unsigned int *period_us)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    if (rc)
        return rc;
    if (!util || !period_us)
        return NVML_ERROR_INVALID_ARGUMENT;
    *util = decoder ? gpu.telemetry.decoder_util : gpu.telemetry.encoder_util;
    *period_us = CODEC_SAMPLING_PERIOD_US;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *util, unsigned int *period_us)
{
    return codec_util(device, 0, util, period_us);
}

EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *util, unsigned int *period_us)
{
    return codec_util(device, 1, util, period_us);
}

/* -- field values: NVLink's link count and throughput counters (no NVLink traffic is simulated) */

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;     /* the link, for per-link fields */
    long long timestamp;      /* microseconds, wall clock */
    long long latencyUsec;
    int valueType;            /* nvmlValueType_t */
    nvmlReturn_t nvmlReturn;  /* each value's own result */
    union { double d; unsigned int ui; unsigned long ul; unsigned long long ull; long long sll; int si; } value;
} nvmlFieldValue_t;

enum {
    NVML_VALUE_TYPE_UNSIGNED_INT = 1,
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3,
    NVML_FI_DEV_NVLINK_LINK_COUNT = 91,
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138, /* ... DATA_RX, RAW_TX, RAW_RX: 139..141, KiB */
    NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX = 141,
};

static void field_value(const struct simnvml_telemetry *t, nvmlFieldValue_t *v)
{
    v->latencyUsec = 0;
    if (v->fieldId == NVML_FI_DEV_NVLINK_LINK_COUNT && t->nvlink_count) {
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
        v->value.ui = t->nvlink_count;
        v->nvmlReturn = NVML_SUCCESS;
    } else if (v->fieldId >= NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX && v->fieldId <= NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX &&
               t->nvlink_count) {
        v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
        v->value.ull = 0;
        v->nvmlReturn = v->scopeId < t->nvlink_count ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
    } else {
        v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; /* a field this board or this stand-in has not */
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int count, nvmlFieldValue_t *values)
{
    struct simnvml_gpu gpu;
    nvmlReturn_t rc = telemetry_of(device, &gpu);
    if (rc)
        return rc;
    if (count < 0 || (count > 0 && !values))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < count; i++) {
        values[i].timestamp = (long long)now.tv_sec * 1000000LL + now.tv_nsec / 1000;
        field_value(&gpu.telemetry, &values[i]);
    }
    return NVML_SUCCESS;
}
