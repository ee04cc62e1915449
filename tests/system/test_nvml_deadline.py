"""The NVML sampler's deadline on a call hung in the driver, through NVIDIA's own pynvml over
the stand-in libnvidia-ml.so.1 loaded in this process (conftest's ``nvml_node``). In the
system tier, not with the sampler's other tests in tests/unit/test_nvml_sampler.py: the
stand-in's slow call holds a thread in the "driver" for 1.5 s of real time."""

import time

from noded.samplers.nvml import NvmlSampler
from support.nvml import Clock
from support.waiting import wait_for


def test_a_hung_driver_call_costs_the_tick_its_deadline_then_nothing_until_it_returns(nvml_node):
    """A call into the driver that takes seconds (a GPU off the bus): the sample comes back
    at its deadline, NVML missing and which jobs hold GPUs unknown; while that call is still
    in the driver, every sample is answered at once without a second call; once it has
    returned, NVML is read again."""
    sampler = NvmlSampler(wall_clock=Clock(), deadline_s=0.2)
    assert sampler.sample(0.0).available
    nvml_node.state.slow_ms = {"count": 1500}
    nvml_node.publish(nvml_node.state)
    t0 = time.monotonic()
    s = sampler.sample(1.0)
    assert time.monotonic() - t0 < 1.0
    assert not s.available and "NVML has not answered for" in s.reason and not s.processes_known
    nvml_node.state.slow_ms = {}
    nvml_node.publish(nvml_node.state)
    t0 = time.monotonic()
    again = sampler.sample(2.0)  # the slow call is still in the driver
    assert time.monotonic() - t0 < 0.1 and not again.available and not again.processes_known
    wait_for(lambda: sampler.sample(3.0).available, timeout=10, interval=0.05, what="NVML read again")
    sampler.close()
