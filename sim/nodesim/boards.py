"""What a simulated GPU's board reports to monitoring tools: temperature, power, fan, clocks,
PCIe, NVLink, as a real board of its model would (``BoardSpec``, from NVIDIA's datasheets), driven
by the utilisation the simulation gives it (``Board.step``).

Power follows utilisation at once, from the board's idle draw up to its enforced limit (a
busy GPU is power-limited, so it never exceeds the limit). Temperature follows the power
with the lag of the heatsink: it approaches the level that power holds it at with a time
constant of ``THERMAL_TIME_CONSTANT_S``. Clocks boost while the GPU is busy and drop to
the idle clock otherwise; data-centre boards stay in P0 (persistence mode on), GeForce
boards idle in P8 and run compute in P2. Energy is power integrated over the node's clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nodesim.nvml_shm import TelemetryState

#: seconds for the temperature to cover 63 % of a step (a heatsink's order of magnitude)
THERMAL_TIME_CONSTANT_S = 20.0
NVIDIA_VENDOR = 0x10DE


@dataclass(frozen=True)
class BoardSpec:
    name: str
    idle_power_w: float
    default_limit_w: float
    min_limit_w: float
    max_limit_w: float
    idle_temp_c: float
    limit_temp_c: float  # steady temperature drawing the limit
    max_clock_mhz: tuple[int, int, int, int]  # graphics, SM, memory, video
    idle_clock_mhz: tuple[int, int, int, int]
    pcie_gen: int
    pcie_width: int
    device_id: int  # PCI device id (the vendor is NVIDIA's)
    subsystem_id: int
    bar1_total: int
    nvlinks: int = 0
    fan: bool = False  # data-centre boards are passively cooled: no fan NVML can read
    mig: bool = False
    ecc: bool = True
    idle_pstate: int = 0
    busy_pstate: int = 0
    pcie_gbps_at_full_memory_util: float = 2.0  # host traffic of a memory-bound job, GB/s


BOARDS = {spec.name: spec for spec in (
    BoardSpec("NVIDIA A100-SXM4-80GB", idle_power_w=60, default_limit_w=400, min_limit_w=100, max_limit_w=400,
              idle_temp_c=32, limit_temp_c=68, max_clock_mhz=(1410, 1410, 1593, 1290),
              idle_clock_mhz=(210, 210, 1593, 585), pcie_gen=4, pcie_width=16, device_id=0x20B2,
              subsystem_id=0x147F10DE, bar1_total=128 << 30, nvlinks=12, mig=True),
    BoardSpec("NVIDIA H100 80GB HBM3", idle_power_w=70, default_limit_w=700, min_limit_w=200, max_limit_w=700,
              idle_temp_c=30, limit_temp_c=66, max_clock_mhz=(1980, 1980, 2619, 1755),
              idle_clock_mhz=(345, 345, 2619, 765), pcie_gen=5, pcie_width=16, device_id=0x2330,
              subsystem_id=0x16C110DE, bar1_total=128 << 30, nvlinks=18, mig=True),
    BoardSpec("NVIDIA GeForce RTX 4090", idle_power_w=20, default_limit_w=450, min_limit_w=150, max_limit_w=600,
              idle_temp_c=35, limit_temp_c=72, max_clock_mhz=(3120, 3120, 10501, 2415),
              idle_clock_mhz=(210, 210, 405, 1185), pcie_gen=4, pcie_width=16, device_id=0x2684,
              subsystem_id=0x16F310DE, bar1_total=256 << 20, fan=True, ecc=False, idle_pstate=8, busy_pstate=2),
)}

#: bus numbers of the eight GPUs of an HGX board, in the order the driver numbers them
HGX_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)


def board_spec(name: str) -> BoardSpec:
    try:
        return BOARDS[name]
    except KeyError:
        raise ValueError(f"no simulated board {name!r}: one of {', '.join(BOARDS)}") from None


class Board:
    """One GPU's board over time: ``step`` with the utilisation now gives what NVML reports."""

    def __init__(self, spec: BoardSpec, index: int, now_s: float):
        self.spec, self.index = spec, index
        self.temperature_c = spec.idle_temp_c
        self.energy_mj = 0.0
        self._last_s = now_s

    def power_w(self, util_gpu: float) -> float:
        s = self.spec
        return s.idle_power_w + (s.default_limit_w - s.idle_power_w) * min(max(util_gpu, 0.0), 100.0) / 100.0

    def steady_temp_c(self, power_w: float) -> float:
        s = self.spec
        share = (power_w - s.idle_power_w) / (s.default_limit_w - s.idle_power_w)
        return s.idle_temp_c + (s.limit_temp_c - s.idle_temp_c) * share

    def step(self, util_gpu: float, util_memory: float, now_s: float) -> TelemetryState:
        s = self.spec
        dt = max(0.0, now_s - self._last_s)
        self._last_s = now_s
        power = self.power_w(util_gpu)
        self.energy_mj += power * dt * 1000.0
        approach = 1.0 - math.exp(-dt / THERMAL_TIME_CONSTANT_S)
        self.temperature_c += (self.steady_temp_c(power) - self.temperature_c) * approach
        busy = util_gpu > 0
        clocks = s.max_clock_mhz if busy else s.idle_clock_mhz
        rx_kbps = s.pcie_gbps_at_full_memory_util * 1e6 * min(max(util_memory, 0.0), 100.0) / 100.0
        fan = min(100, round(30 + 70 * max(0.0, self.temperature_c - s.idle_temp_c) /
                             (s.limit_temp_c - s.idle_temp_c))) if s.fan else 0
        bus = HGX_BUSES[self.index] if self.index < len(HGX_BUSES) else 0x10 + self.index
        return TelemetryState(
            fan=s.fan, mig=s.mig, temperature_c=round(self.temperature_c), fan_percent=fan,
            power_mw=round(power * 1000), power_limit_mw=round(s.default_limit_w * 1000),
            power_default_limit_mw=round(s.default_limit_w * 1000), power_min_limit_mw=round(s.min_limit_w * 1000),
            power_max_limit_mw=round(s.max_limit_w * 1000), clock_mhz=clocks, max_clock_mhz=s.max_clock_mhz,
            pcie_gen=s.pcie_gen, pcie_max_gen=s.pcie_gen, pcie_width=s.pcie_width, pcie_max_width=s.pcie_width,
            pcie_tx_kbps=round(rx_kbps / 2), pcie_rx_kbps=round(rx_kbps), ecc_enabled=s.ecc, persistence=True,
            pstate=s.busy_pstate if busy else s.idle_pstate, pci_bus=bus,
            pci_device_id=s.device_id << 16 | NVIDIA_VENDOR, pci_subsystem_id=s.subsystem_id, nvlink_count=s.nvlinks,
            bar1_total=s.bar1_total, energy_mj=round(self.energy_mj), serial=f"{1320221000000 + self.index}")
