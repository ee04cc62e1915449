"""The contention eliminator's harness: the simulated node and a daemon built as `noded
run --sim` builds it, ticked by the test (the eliminator's tests and every test that needs
a daemon acting on contention)."""

import threading
import time

from noded.commands.wiring import build_daemon
from noded.config import Config, ContentionConfig, MetricsConfig, ResctrlConfig
from nodesim.node import SimNode
from nodesim.scenario import parse_scenario


class Harness:
    """The simulated node and a daemon built as `noded run --sim` builds it, ticked here."""

    def __init__(self, tmp_path, events: str, *, profile="intel", peak=8, tick=0.25, gpus=4, dry_run=False,
                 **contention):
        text = f"seed: 1\nduration_s: 600\nnode: {{profile: {profile}, gpus: {gpus}, peak_gbps: {peak}}}\nevents:\n{events}"
        # The scenario's time is the ticks': an event "at 1.5 s" comes after six ticks of
        # 0.25 s however long a loaded machine takes over them (on wall time, a hog could
        # start before noded had ticked enough to learn the GPU job's baseline, and was then
        # never throttled: seen beside stress-ng, 2026-11-27). Bandwidth still accrues in
        # real time, paced below.
        self._scenario_s = 0.0
        self.sim = SimNode(parse_scenario(text, "test"), clock=lambda: self._scenario_s).start()
        cc = dict(hold_s=1.0, settle_s=0.25)
        cc.update(contention)
        self.config = Config(tick_s=tick, peak_gbps_per_domain=peak, state_dir=str(tmp_path / "state"),
                             resctrl=ResctrlConfig(root=self.sim.emu.root, mounts=self.sim.emu.mounts_file),
                             contention=ContentionConfig(**cc), metrics=MetricsConfig(port=0))
        self.built = build_daemon(self.config, discovery=self.sim.discovery, dry_run=dry_run)
        self.daemon = self.built.daemon
        self.results = []
        self._next = time.monotonic()
        self.root_schemata = self.rc().root_group().read_schemata() if profile != "no-mba" else None

    def rc(self):
        return self.sim.open_resctrl()

    def rebuild(self, **parts):
        """The daemon built again with these parts changed (support.rebuild.rebuilt); returns it."""
        from support.rebuild import rebuilt

        self.daemon = rebuilt(self.daemon, **parts)
        return self.daemon

    def tick(self):
        # Fixed-rate pacing: bandwidth must accrue between ticks, as on a host.
        self._next += self.config.tick_s
        threading.Event().wait(max(0.0, self._next - time.monotonic()))
        self._scenario_s += self.config.tick_s
        self.sim.step()
        r = self.daemon.tick()
        self.results.append(r)
        return r

    def until(self, pred, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.tick()
            if pred(r):
                return r
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {self.describe()}")

    def describe(self):
        r = self.results[-1]
        return {j: (js.kind, js.gpu_util, js.bandwidth_bps, r.levels.get(j, 0)) for j, js in r.sample.jobs.items()}

    def actions(self):
        return [a for r in self.results for a in r.decision.actions]

    def stop(self):
        self.daemon.shutdown()
        self.sim.stop()


def util(r, job):
    js = r.sample.jobs.get(f"sim:{job}")
    return None if js is None else js.gpu_util


NLP_AND_HOG = ("  - {at: 0, start: {id: bert, model: BiDAF, gpu: 0}}\n"
               "  - {at: 1.5, start: {id: hog, cpu: hog}}\n")


def end_threads_as_a_kill_would(daemon) -> None:
    """The threads of a daemon a test treats as SIGKILLed (none of its stop runs) ended, as
    its process's end would end them: its process events' listener and its NVML worker.
    No group is removed and nothing put back: that is the next start's work."""
    telemetry = daemon.parts.telemetry
    if telemetry.events is not None:
        telemetry.events.stop()
    if telemetry.nvml is not None:
        telemetry.nvml.close()
