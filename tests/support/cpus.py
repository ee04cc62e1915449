"""The CPUs side of a tick as a test sets it up: a Sample of jobs' placements as the CPU
placement sampler reads them now, and a process that forks a child on request (a child born
after noded halved its parent inherits the halved affinity)."""

import os
import subprocess
import sys
from types import MappingProxyType

from noded.jobs.model import Job, JobMeta
from noded.samplers.sample import JobSample, Sample
from noded.samplers.cpus import CpuPlacementSampler


def observe(*jobs: Job) -> Sample:
    """A Sample of these jobs as the CPU placement sampler reads them now."""
    placements = CpuPlacementSampler().sample({j.id: j for j in jobs})
    samples = {j.id: JobSample(j.id, j.source, j.pids, JobMeta(), "cpu", (), None, 1e9, "own", j.cgroup,
                               None, placements[j.id]) for j in jobs}
    return Sample(0.0, MappingProxyType(samples), (), False, None, (), MappingProxyType({}), (), ())



class ForkOnRequest:
    """A process that forks a child when asked (a line on stdin): a child born after noded
    halved its parent inherits the halved affinity."""

    CODE = ("import os,sys,time\n"
            "sys.stdin.readline()\n"
            "pid=os.fork()\n"
            "if pid==0: time.sleep(300)\n"
            "print(pid,flush=True); time.sleep(300)\n")

    def __init__(self):
        self.parent = subprocess.Popen([sys.executable, "-c", self.CODE], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True)
        self.pid = self.parent.pid
        self.child: int | None = None

    def fork(self) -> int:
        self.parent.stdin.write("fork\n")
        self.parent.stdin.flush()
        self.child = int(self.parent.stdout.readline())
        return self.child

    def close(self) -> None:
        if self.child:
            os.kill(self.child, 9)
        self.parent.kill()
        self.parent.wait()
