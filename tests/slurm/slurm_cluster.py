"""A real one-host Slurm for the tests and the benchmarks: Debian's slurm-wlm (munged,
slurmctld, slurmd) started without systemd from a config generated into a temp directory,
and stopped with everything it made removed.

munged gets its own key and socket (never the host's), the two Slurm daemons their own
ports, state and spool directories, and run as root (SlurmUser=root: the tests are root).
Job containment is Slurm's cgroup plugin on this machine's cgroup v1 hierarchies
(proctrack/cgroup, task/cgroup with ConstrainCores), so each job is a real
``<cpuset mount>/slurm/uid_U/job_N`` cgroup: the layout noded's ``slurm`` job source
finds. Client commands find this cluster through ``SLURM_CONF`` (``env``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import socket
import subprocess
import tempfile

from nodesim import waiting
from nodesim.launch import stop

#: the Debian packages this harness needs (Makefile SLURM_PACKAGES installs them)
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")
CPUSET = "/sys/fs/cgroup/cpuset"


def missing() -> str | None:
    """Why no one-host Slurm can run here (None: it can)."""
    absent = [b for b in BINARIES if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}")]
    if absent:
        return f"{', '.join(absent)} not installed (Debian: slurmctld slurmd slurm-client munge)"
    if os.geteuid() != 0:
        return "the one-host Slurm runs its daemons as root"
    for hierarchy in ("cpuset", "freezer"):
        if not os.path.isdir(f"/sys/fs/cgroup/{hierarchy}") or not os.path.ismount(f"/sys/fs/cgroup/{hierarchy}"):
            return f"no cgroup v1 {hierarchy} hierarchy at /sys/fs/cgroup/{hierarchy} (Slurm's cgroup/v1 plugin needs it)"
    return None


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


#: the harness's polls: most of them run a Slurm command, so every 50 ms rather than the
#: 10 ms of nodesim.waiting.wait_for (the one implementation, which this only parametrises)
SLURM_POLL_S = 0.05
wait_for = functools.partial(waiting.wait_for, interval=SLURM_POLL_S)


class SlurmCluster:
    """``with SlurmCluster(tmpdir, prolog=..., epilog=...) as slurm: slurm.sbatch(...)``."""

    def __init__(self, workdir: str, *, prolog: str | None = None, epilog: str | None = None,
                 task_prolog: str | None = None, extra_conf: str = "", gres_conf: str = "",
                 prolog_env: dict[str, str] | None = None):
        self.dir = tempfile.mkdtemp(prefix="slurm-", dir=workdir)
        os.chmod(self.dir, 0o755)
        self.host = socket.gethostname().split(".")[0]
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.munge_socket = os.path.join(self.dir, "munge", "munge.socket")
        self.prolog, self.epilog, self.task_prolog = prolog, epilog, task_prolog
        self.extra_conf, self.gres_conf = extra_conf, gres_conf
        self.prolog_env = prolog_env or {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.cpus = len(os.sched_getaffinity(0))

    @property
    def env(self) -> dict[str, str]:
        """The environment a client command (sbatch, squeue) needs for this cluster."""
        return {**os.environ, "SLURM_CONF": self.conf}

    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    # -- configuration
    def _write_config(self) -> None:
        ctld_port, slurmd_port = _free_ports(2)
        for d in ("munge", "state", "spool", "log"):
            os.makedirs(self.path(d), mode=0o700, exist_ok=True)
        os.chmod(self.path("munge"), 0o755)  # clients (any user) reach the socket
        key = self.path("munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        hooks = "".join(f"{name}={value}\n" for name, value in (
            ("Prolog", self.prolog), ("Epilog", self.epilog), ("TaskProlog", self.task_prolog)) if value)
        with open(self.conf, "w") as f:
            f.write(f"""\
ClusterName=nodedtest
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={self.path("state")}
SlurmdSpoolDir={self.path("spool")}
SlurmctldPidFile={self.path("slurmctld.pid")}
SlurmdPidFile={self.path("slurmd.pid")}
SlurmctldLogFile={self.path("log", "slurmctld.log")}
SlurmdLogFile={self.path("log", "slurmd.log")}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SchedulerParameters=sched_interval=1
MessageTimeout=10
{hooks}{self.extra_conf}
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")
        # One job's cgroup per job on the v1 hierarchies; nothing constrained but its CPUs:
        # memory and devices are left alone (this machine's memory hierarchy is not ours).
        with open(self.path("cgroup.conf"), "w") as f:
            f.write("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainCores=yes\n"
                    "ConstrainRAMSpace=no\nConstrainSwapSpace=no\nConstrainDevices=no\n")
        if self.gres_conf:
            with open(self.path("gres.conf"), "w") as f:
                f.write(self.gres_conf)

    # -- lifecycle
    def start(self, timeout: float = 60.0) -> "SlurmCluster":
        self._write_config()
        try:
            self._spawn("munged", [_binary("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                                   f"--key-file={self.path('munge', 'munge.key')}",
                                   f"--pid-file={self.path('munge', 'munged.pid')}",
                                   f"--seed-file={self.path('munge', 'munged.seed')}",
                                   f"--log-file={self.path('log', 'munged.log')}"])
            wait_for(lambda: os.path.exists(self.munge_socket), timeout, what="munged socket")
            self._spawn("slurmctld", [_binary("slurmctld"), "-D", "-i", "-f", self.conf])
            self._spawn("slurmd", [_binary("slurmd"), "-D", "-f", self.conf])
            wait_for(self._node_idle, timeout, what=f"Slurm node {self.host} idle", interval=0.2)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.path("log", f"{name}.out"), "w")
        env = {**os.environ, **self.prolog_env, "SLURM_CONF": self.conf}
        self.procs[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            env=env, start_new_session=True)
        log.close()

    def _node_idle(self) -> bool:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise AssertionError(f"{name} exited with {p.returncode}:\n{self.logs()}")
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=self.env, capture_output=True, text=True)
        return r.returncode == 0 and r.stdout.strip() == "idle"

    def logs(self) -> str:
        out = []
        for name in sorted(os.listdir(self.path("log"))):
            with open(self.path("log", name), errors="replace") as f:
                out.append(f"--- {name}\n{f.read()[-4000:]}")
        return "\n".join(out)

    def stop(self) -> None:
        """Cancels every job, stops slurmd, slurmctld and munged, and removes the directory;
        the jobs' cgroups go with slurmd's job steps."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "--quiet", "-u", "root"], env=self.env, capture_output=True,
                           timeout=30)
            try:
                wait_for(lambda: not self.jobs_left(), 30, what="jobs gone after scancel", interval=0.2)
            except AssertionError:
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.procs.pop(name, None)
            if p is None:
                continue
            stop(p, 30)  # SIGTERM, then SIGKILL past 30 s
        # Slurm removes each job's cgroups, not its root and the users' below it: empty, they go.
        for root in self.cgroup_roots():
            for uid_dir in os.listdir(root):
                if uid_dir.startswith("uid_"):
                    with contextlib.suppress(OSError):
                        os.rmdir(os.path.join(root, uid_dir))
            with contextlib.suppress(OSError):
                os.rmdir(root)
        shutil.rmtree(self.dir, ignore_errors=True)

    def jobs_left(self) -> list[str]:
        r = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True)
        return r.stdout.split() if r.returncode == 0 else ["?"]

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- jobs
    def sbatch(self, *args: str, script: str, env: dict[str, str] | None = None) -> str:
        """Submits ``script`` (a batch script's text) with ``args``: the job id."""
        r = subprocess.run(["sbatch", "--parsable", *args], input=script, env={**self.env, **(env or {})},
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise AssertionError(f"sbatch {' '.join(args)} failed ({r.returncode}): {r.stderr}")
        return r.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (empty once the job is purged)."""
        r = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=self.env, capture_output=True, text=True)
        if r.returncode != 0:
            return {}
        # One line of Key=value fields; a value may hold spaces (Comment, AdminComment): a field
        # starts where a space is followed by a capitalised key (Slurm's keys are; labels are not).
        return dict(field.partition("=")[::2] for field in re.split(r" (?=[A-Z][A-Za-z_:]*=)", r.stdout.strip())
                    if "=" in field)

    def state(self, job_id: str) -> str:
        return self.job(job_id).get("JobState", "")

    def job_cgroups(self, job_id: str) -> list[str]:
        """The job's cgroup directories on every v1 hierarchy now."""
        return [path for root in self.cgroup_roots() for uid_dir in os.listdir(root)
                if uid_dir.startswith("uid_") and os.path.isdir(path := os.path.join(root, uid_dir, f"job_{job_id}"))]

    def cgroup_roots(self) -> list[str]:
        """Slurm's cgroup root on each v1 hierarchy: ``slurm``, or ``slurm_<node>`` where Slurm
        is built for several slurmd per host (Debian's is)."""
        return [root for hierarchy in sorted(os.listdir("/sys/fs/cgroup"))
                for root in (os.path.join("/sys/fs/cgroup", hierarchy, "slurm"),
                             os.path.join("/sys/fs/cgroup", hierarchy, f"slurm_{self.host}"))
                if os.path.isdir(root)]

    def scancel(self, *job_ids: str) -> None:
        r = subprocess.run(["scancel", *job_ids], env=self.env, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise AssertionError(f"scancel {' '.join(job_ids)} failed ({r.returncode}): {r.stderr}")

    def node_state(self) -> str:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=self.env, capture_output=True, text=True, timeout=30)
        return r.stdout.strip()
