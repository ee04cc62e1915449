"""The stand-in libnvidia-ml.so.1 answers what monitoring tools ask on every refresh (issue
#24, item 3): the running-process queries in every form pynvml and nvitop try, and
temperature, power, fan, clocks, PCIe, ECC, persistence, performance state, versions, as
NVIDIA documents them or NOT_SUPPORTED where a real board of the model would say so. The
values follow the simulation (nodesim.boards): power rises with utilisation between idle
and the limit, temperature follows with the heatsink's lag."""

from __future__ import annotations

import ctypes
import os
import re

import pynvml
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nodesim.boards import BOARDS, THERMAL_TIME_CONSTANT_S, Board, board_spec
from nodesim.gpus import SimGpus, make_gpus
from nodesim.nvml_shm import GpuState, NodeState, Node, SharedGpus

from test_nvml_library import UUID0, UUID1, GIB, in_process

A100 = "NVIDIA A100-SXM4-80GB"
RTX = "NVIDIA GeForce RTX 4090"


@pytest.fixture
def shared(tmp_path):
    node = SharedGpus(str(tmp_path / "nvml.shm"))
    yield node
    node.close()


def busy_a100_and_idle_rtx() -> NodeState:
    a100 = Board(board_spec(A100), 0, 0.0).step(80, 30, 0.0)
    rtx = Board(board_spec(RTX), 1, 0.0).step(0, 0, 0.0)
    return NodeState([GpuState(UUID0, processes=[(4242, 3 * GIB), (4243, GIB)], telemetry=a100),
                      GpuState(UUID1, name=RTX, memory_total=24 * GIB, mps_server_pid=777,
                               mps_clients=[(501, GIB)], telemetry=rtx)])


def test_every_form_of_the_process_queries_lists_the_same_processes(shared):
    shared.publish(busy_a100_and_idle_rtx())
    out = in_process(shared, """
        import ctypes
        pynvml.nvmlInit()
        lib = pynvml.nvmlLib

        class V1(ctypes.Structure):  # nvmlProcessInfo_v1_t: what the unversioned entry points fill
            _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

        def unversioned(name, h):
            n = ctypes.c_uint(0)
            rc = getattr(lib, name)(h, ctypes.byref(n), None)
            if rc == 0:
                return []
            assert rc == pynvml.NVML_ERROR_INSUFFICIENT_SIZE, rc
            buf = (V1 * n.value)()
            assert getattr(lib, name)(h, ctypes.byref(n), buf) == 0
            return [[buf[i].pid, buf[i].usedGpuMemory] for i in range(n.value)]

        for i in range(2):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            rows = lambda ps: [[p.pid, p.usedGpuMemory] for p in ps]
            out[i] = {
                "v1": unversioned("nvmlDeviceGetComputeRunningProcesses", h),
                "v1_mps": unversioned("nvmlDeviceGetMPSComputeRunningProcesses", h),
                "v1_graphics": unversioned("nvmlDeviceGetGraphicsRunningProcesses", h),
                "v2": rows(pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h)),
                "v3": rows(pynvml.nvmlDeviceGetComputeRunningProcesses(h)),
                "graphics_v2": rows(pynvml.nvmlDeviceGetGraphicsRunningProcesses_v2(h)),
                "graphics_v3": rows(pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)),
                "mps": rows(pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h)),
                "detail": rows(pynvml.nvmlDeviceGetRunningProcessDetailList(
                    h, pynvml.nvmlProcessDetailList_v1, pynvml.NVML_PROCESS_MODE_COMPUTE)),
                "detail_mps": rows(pynvml.nvmlDeviceGetRunningProcessDetailList(
                    h, pynvml.nvmlProcessDetailList_v1, pynvml.NVML_PROCESS_MODE_MPS)),
                "instances": [[p.gpuInstanceId, p.computeInstanceId]
                              for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)],
            }
        try:
            pynvml.nvmlDeviceGetRunningProcessDetailList(h, 0x2000018, 0)
        except pynvml.NVMLError as e:
            out["wrong_version"] = type(e).__name__
    """)
    a100, rtx = out["0"], out["1"]
    compute = [[4242, 3 * GIB], [4243, GIB]]
    assert a100["v1"] == a100["v2"] == a100["v3"] == a100["detail"] == compute
    assert a100["instances"] == [[0xFFFFFFFF, 0xFFFFFFFF]] * 2  # no MIG
    # the simulated jobs are compute work: no graphics process on any GPU, in any form
    assert a100["v1_graphics"] == a100["graphics_v2"] == a100["graphics_v3"] == [] == rtx["graphics_v3"]
    # under MPS the driver sees the server; the clients are the MPS query's
    assert rtx["v1"] == rtx["v3"] == rtx["detail"] == [[777, GIB]]
    assert rtx["v1_mps"] == rtx["mps"] == rtx["detail_mps"] == [[501, GIB]]
    assert out["wrong_version"] == "NVMLError_ArgumentVersionMismatch"


def test_monitoring_values_are_the_boards_and_not_supported_where_the_board_has_none(shared):
    shared.publish(busy_a100_and_idle_rtx())
    out = in_process(shared, """
        pynvml.nvmlInit()
        out["cuda"] = pynvml.nvmlSystemGetCudaDriverVersion()
        out["nvml"] = pynvml.nvmlSystemGetNVMLVersion()

        def ask(f, *args):
            try:
                v = f(*args)
                return list(v) if isinstance(v, (list, tuple)) else v
            except pynvml.NVMLError as e:
                return type(e).__name__

        for i in range(2):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            pci = pynvml.nvmlDeviceGetPciInfo(h)
            m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            m1 = pynvml.nvmlDeviceGetMemoryInfo(h)
            out[i] = {
                "temp": ask(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
                "tempV": ask(pynvml.nvmlDeviceGetTemperatureV, h, pynvml.NVML_TEMPERATURE_GPU),
                "fan": ask(pynvml.nvmlDeviceGetFanSpeed, h),
                "power": ask(pynvml.nvmlDeviceGetPowerUsage, h),
                "enforced": ask(pynvml.nvmlDeviceGetEnforcedPowerLimit, h),
                "limit": ask(pynvml.nvmlDeviceGetPowerManagementLimit, h),
                "default": ask(pynvml.nvmlDeviceGetPowerManagementDefaultLimit, h),
                "constraints": ask(pynvml.nvmlDeviceGetPowerManagementLimitConstraints, h),
                "clocks": [pynvml.nvmlDeviceGetClockInfo(h, c) for c in range(4)],
                "max_clocks": [pynvml.nvmlDeviceGetMaxClockInfo(h, c) for c in range(4)],
                "pcie": [pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h), pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
                         pynvml.nvmlDeviceGetCurrPcieLinkWidth(h), pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)],
                "pcie_rx": pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES),
                "ecc": ask(pynvml.nvmlDeviceGetEccMode, h),
                "ecc_errors": ask(pynvml.nvmlDeviceGetTotalEccErrors, h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                  pynvml.NVML_VOLATILE_ECC),
                "persistence": pynvml.nvmlDeviceGetPersistenceMode(h),
                "pstate": pynvml.nvmlDeviceGetPerformanceState(h),
                "mig": ask(pynvml.nvmlDeviceGetMigMode, h),
                "driver_model": ask(pynvml.nvmlDeviceGetDriverModel, h),
                "encoder": ask(pynvml.nvmlDeviceGetEncoderUtilization, h),
                "bus_id": pci.busId, "bus_id_legacy": pci.busIdLegacy, "device_id": pci.pciDeviceId,
                "by_bus_id": pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId(pci.busId)),
                "mem_v2": [m2.total, m2.reserved, m2.used, m2.free], "mem_v1": [m1.total, m1.used, m1.free],
                "bad_sensor": ask(pynvml.nvmlDeviceGetTemperature, h, 1),
                "nvlinks": [[v.nvmlReturn, v.value.uiVal] for v in pynvml.nvmlDeviceGetFieldValues(
                    h, [pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT])],
            }
    """)
    assert out["cuda"] == 12040 and out["nvml"] == "12.550.54.15"
    a100, rtx = out["0"], out["1"]
    spec = board_spec(A100)
    # a busy A100: power between idle and the limit, the limits NVIDIA ships, boost clocks, P0
    assert spec.idle_power_w * 1000 < a100["power"] < 400_000
    assert a100["enforced"] == a100["limit"] == a100["default"] == 400_000
    assert a100["constraints"] == [100_000, 400_000]
    assert a100["temp"] == a100["tempV"] == spec.idle_temp_c  # no time has passed: the heatsink lags
    assert a100["clocks"] == a100["max_clocks"] == [1410, 1410, 1593, 1290]
    assert a100["pcie"] == [4, 4, 16, 16] and a100["pcie_rx"] > 0
    assert (a100["ecc"], a100["ecc_errors"], a100["persistence"], a100["pstate"]) == ([1, 1], 0, 1, 0)
    assert a100["mig"] == [0, 0] and a100["encoder"] == [0, 167000]
    # passively cooled: no fan NVML can read; driver models are Windows'
    assert a100["fan"] == rtx["driver_model"] == a100["driver_model"] == "NVMLError_NotSupported"
    assert a100["bus_id"] == "00000000:07:00.0" and a100["bus_id_legacy"] == "0000:07:00.0"
    assert a100["device_id"] == 0x20B210DE and a100["by_bus_id"] == 0 and rtx["by_bus_id"] == 1
    reserved, used = 531 << 20, 4 * GIB
    assert a100["mem_v2"] == [80 * GIB, reserved, used, 80 * GIB - reserved - used]
    assert a100["mem_v1"] == [80 * GIB, used + reserved, 80 * GIB - reserved - used]  # v1 counts the reservation
    assert a100["bad_sensor"] == "NVMLError_InvalidArgument"
    assert a100["nvlinks"] == [[0, 12]]
    # an idle GeForce board: a fan, no ECC, no MIG, no NVLink, P8 and idle clocks
    assert isinstance(rtx["fan"], int) and 0 < rtx["fan"] <= 100
    assert rtx["ecc"] == [0, 0] and rtx["ecc_errors"] == rtx["mig"] == "NVMLError_NotSupported"
    assert rtx["pstate"] == 8 and rtx["clocks"][0] == 210 and rtx["power"] == 20_000
    assert rtx["nvlinks"][0][0] == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_a_versioned_struct_of_another_version_is_refused(shared):
    shared.publish(busy_a100_and_idle_rtx())
    out = in_process(shared, """
        import ctypes
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        m = pynvml.c_nvmlMemory_v2_t()
        m.version = 0x01000028  # v1's number on v2's struct
        out["mem"] = pynvml.nvmlLib.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m))
        t = pynvml.c_nvmlTemperature_v1_t()
        t.version = 0x200000C
        out["temp"] = pynvml.nvmlLib.nvmlDeviceGetTemperatureV(h, ctypes.byref(t))
    """)
    assert out == {"mem": 25, "temp": 25}  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(sorted(BOARDS)), utils=st.lists(st.floats(0, 100), min_size=2, max_size=2),
       dt=st.floats(0.01, 600))
def test_power_rises_with_utilisation_between_idle_and_the_limit(name, utils, dt):
    spec = board_spec(name)
    low, high = sorted(utils)
    p_low = Board(spec, 0, 0.0).step(low, 0, dt).power_mw
    p_high = Board(spec, 0, 0.0).step(high, 0, dt).power_mw
    assert spec.idle_power_w * 1000 <= p_low <= p_high <= spec.default_limit_w * 1000


def test_temperature_follows_power_with_the_heatsinks_lag_and_settles_below_the_limits_level():
    spec = board_spec(A100)
    board = Board(spec, 0, 0.0)
    temps = [board.step(100, 0, t).temperature_c for t in (1.0, THERMAL_TIME_CONSTANT_S, 10 * THERMAL_TIME_CONSTANT_S)]
    assert spec.idle_temp_c <= temps[0] < temps[1] < temps[2] == round(spec.limit_temp_c)
    # idle again: it cools back, as slowly
    cooled = board.step(0, 0, 11 * THERMAL_TIME_CONSTANT_S).temperature_c
    assert spec.idle_temp_c < cooled < temps[2]
    # energy is power over time: 10 tau at the limit, then one tau at idle
    e = board.step(0, 0, 11 * THERMAL_TIME_CONSTANT_S).energy_mj
    assert e == pytest.approx((spec.default_limit_w * 10 + spec.idle_power_w) * THERMAL_TIME_CONSTANT_S * 1000)


def test_the_simulated_gpus_publish_their_boards_as_utilisation_changes(tmp_path):
    clock = [1000.0]
    gpus = SimGpus(str(tmp_path / "nvml.shm"), make_gpus(2), wall_clock=lambda: clock[0])
    try:
        gpus[0].util_gpu = 100
        clock[0] += 5 * THERMAL_TIME_CONSTANT_S
        gpus.publish()
        with open(gpus.path, "rb") as f:
            node = Node.from_buffer_copy(f.read(ctypes.sizeof(Node)))
        busy, idle = (node.published.gpus[i].telemetry for i in range(2))
        assert busy.power_mw == 400_000 and idle.power_mw == 60_000
        assert busy.temperature_c > idle.temperature_c == 32
        assert busy.clock_mhz[1] == 1410 and idle.clock_mhz[1] == 210
        assert [busy.pci_bus, idle.pci_bus] == [0x07, 0x0F]
    finally:
        gpus.close()


def test_a_board_the_simulator_does_not_know_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="no simulated board 'NVIDIA Tesla K80'"):
        SimGpus(str(tmp_path / "nvml.shm"), make_gpus(1, "NVIDIA Tesla K80"))
    assert not os.path.exists(tmp_path / "nvml.shm")  # refused before anything was made


@pytest.fixture(scope="module")
def eight_gpus(tmp_path_factory):
    """Eight simulated GPUs (an HGX board's bus ids) read through this process's pynvml."""
    gpus = SimGpus(str(tmp_path_factory.mktemp("nvml") / "nvml.shm"), make_gpus(8))
    gpus.install()
    pynvml.nvmlInit()
    yield gpus
    pynvml.nvmlShutdown()
    gpus.close()


def handle_by_bus_id(text: bytes) -> tuple[int, int | None]:
    """(the return code, the index found) of nvmlDeviceGetHandleByPciBusId_v2 on ``text``."""
    handle = pynvml.c_nvmlDevice_t()
    rc = pynvml.nvmlLib.nvmlDeviceGetHandleByPciBusId_v2(ctypes.c_char_p(text), ctypes.byref(handle))
    return rc, pynvml.nvmlDeviceGetIndex(handle) if rc == 0 else None


BUS_ID = re.compile(rb"(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.[0-7]")


def expected_lookup(text: bytes) -> tuple[int, int | None]:
    """What NVML answers for ``text``: a bus id as nvidia-smi prints it (domain optional) finds
    the GPU there, or none; anything else is an invalid argument."""
    m = BUS_ID.fullmatch(text)
    if not m or int(m.group(3), 16) > 0x1F:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT, None
    where = (int(m.group(1) or b"0", 16), int(m.group(2), 16), int(m.group(3), 16))
    for i in range(8):
        pci = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(i))
        if (pci.domain, pci.bus, pci.device) == where:
            return pynvml.NVML_SUCCESS, i
    return pynvml.NVML_ERROR_NOT_FOUND, None


@settings(max_examples=400, deadline=None)
@given(text=st.one_of(st.binary(max_size=40), st.from_regex(
    rb"\A([0-9A-Fa-f]{1,9}:)?[0-9A-Fa-f]{1,3}:[0-9A-Fa-f]{1,3}\.[0-9a-f]\Z")).filter(lambda b: b"\0" not in b))
@example(text=b"47:00.3").via("GPU 2, any function")
@example(text=b"0:4e:0.0").via("GPU 3, short fields")
@example(text=b"00000001:07:00.0").via("another domain: none there")
@example(text=b"07:20.0").via("device past 0x1f")
@example(text=b"000000000:07:00.0").via("a domain of 9 digits")
@example(text=b"000:0.0").via("a bus of 3 digits, no domain")
def test_a_bus_id_of_any_bytes_finds_the_gpu_it_spells_or_is_refused(eight_gpus, text):
    assert handle_by_bus_id(text) == expected_lookup(text)


def test_the_examples_reach_every_answer(eight_gpus):
    assert [expected_lookup(t)[0] for t in (b"47:00.3", b"00000001:07:00.0", b"07:20.0")] == [0, 6, 2]


@settings(max_examples=100, deadline=None)
@given(index=st.integers(0, 7), lower=st.booleans(), legacy=st.booleans())
def test_every_gpus_bus_id_as_nvml_prints_it_finds_that_gpu(eight_gpus, index, lower, legacy):
    pci = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
    text = pci.busIdLegacy if legacy else pci.busId
    text = text.lower() if lower else text
    assert handle_by_bus_id(text.encode()) == (pynvml.NVML_SUCCESS, index)
    assert handle_by_bus_id(text.encode() + b" ")[0] == pynvml.NVML_ERROR_INVALID_ARGUMENT
    assert handle_by_bus_id(b"0x" + text.encode())[0] == pynvml.NVML_ERROR_INVALID_ARGUMENT
