"""Slurm's node hooks for noded: ``python -m noded.integrations.slurm prolog|epilog``.

The shell scripts in ``integrations/slurm/`` (installed with noded) call this only for a
job whose ``--comment`` has a ``noded:`` part, e.g.

    sbatch --comment "noded: model=BiDAF batch_size=32 category=NLP share=mps" train.sh

**Prolog** (slurmd, as root, before the job starts): registers the job's labels with
noded (`label`), so the job is known for what it is from noded's first look at it. With
``share=mps`` it asks for admission onto a shared GPU under MPS (`admit`, as the job's
user): admitted, the MPS environment (GPU, thread percentage, pinned memory limit, pipe
directory) is written to ``ENV_DIR/job_N.env``, owned by the job's user, for the
TaskProlog to hand to every task; refused, the job is put back in the queue as the site
chose (``on_refusal``): ``hold`` (`scontrol requeuehold`: pending until someone runs
`scontrol release N`) or ``requeue`` (`scontrol requeue`: pending, and started again when
Slurm next schedules it, here or on another node).

**Epilog** (slurmd, as root, after the job): `forget`: the job's labels and its GPU
reservation go at once, and the environment file is removed.

Fail safe: a hook never fails the job for noded's sake. Slurm drains a node whose
prolog exits non-zero, so both hooks exit 0 whatever happens, and say on stderr (the
slurmd log) what went wrong: with noded down, or a comment noded cannot read, the job runs
as it would without noded (without labels, and without an MPS share: on its GPU as
Slurm gave it). Only a refusal by a running noded keeps a job from starting.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from ..admin.nodectl import DEFAULT_SOCKET, NodectlError, request
from ..labelwords import LabelWordError, comment_words, parse_label_words

ON_REFUSAL = {"hold": "requeuehold", "requeue": "requeue"}
#: what a hook waits for noded at most (the prolog delays the job's start by as much)
TIMEOUT_S = 5.0
DEFAULT_ENV_DIR = "/run/noded/slurm"


@dataclass(frozen=True)
class Settings:
    """The site's choices, from the hooks' environment (the scripts read them from
    /etc/noded/slurm-hooks.conf)."""

    socket: str = DEFAULT_SOCKET
    on_refusal: str = "hold"
    env_dir: str = DEFAULT_ENV_DIR
    timeout_s: float = TIMEOUT_S

    @classmethod
    def from_environ(cls, env: dict[str, str]) -> "Settings":
        on_refusal = env.get("NODED_SLURM_ON_REFUSAL") or "hold"
        if on_refusal not in ON_REFUSAL:
            raise ValueError(f"NODED_SLURM_ON_REFUSAL must be one of {', '.join(ON_REFUSAL)}, not {on_refusal!r}")
        try:
            timeout = float(env.get("NODED_SLURM_TIMEOUT_S") or TIMEOUT_S)
        except ValueError:
            raise ValueError(f"NODED_SLURM_TIMEOUT_S must be seconds, not {env['NODED_SLURM_TIMEOUT_S']!r}") from None
        if not 0 < timeout <= 60:
            raise ValueError(f"NODED_SLURM_TIMEOUT_S must be in (0, 60] seconds, not {timeout:g}")
        return cls(env.get("NODED_SOCKET") or DEFAULT_SOCKET, on_refusal,
                   env.get("NODED_SLURM_ENV_DIR") or DEFAULT_ENV_DIR, timeout)


@dataclass(frozen=True)
class JobRequest:
    """What a job's comment asks of noded."""

    labels: dict[str, object]
    share: str | None  # "mps": admission onto a shared GPU

    @classmethod
    def from_job(cls, comment: str, gres_mps: bool = False) -> "JobRequest":
        """From the job's comment; ``gres_mps``: Slurm allocated the job gres/mps (its Prolog
        then has CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), which asks for admission as share=mps
        does where the comment names the model and batch size."""
        words = parse_label_words(comment_words(comment), extra=("share",))
        share = words.pop("share", None)
        if share not in (None, "mps"):
            raise LabelWordError(f"share={share}: the one way to share a GPU is share=mps")
        has_profile_keys = "model" in words and "batch_size" in words
        if share and not has_profile_keys:
            raise LabelWordError("share=mps needs model= and batch_size= (admission predicts from them)")
        if gres_mps and has_profile_keys:
            share = "mps"
        return cls(words, share)


def env_file(settings: Settings, job_id: str) -> str:
    return os.path.join(settings.env_dir, f"job_{job_id}.env")


def say(job_id: str, text: str) -> None:
    print(f"noded slurm hook: job {job_id}: {text}", file=sys.stderr, flush=True)


def prolog(env: dict[str, str], settings: Settings) -> None:
    job_id, uid = env["SLURM_JOB_ID"], int(env["SLURM_JOB_UID"])
    job = f"slurm:{job_id}"
    try:
        req = JobRequest.from_job(env.get("SLURM_JOB_COMMENT", ""), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in env)
    except LabelWordError as e:
        say(job_id, f"its comment is not for noded ({e}): it runs without noded labels")
        return
    try:
        if req.labels:
            request(settings.socket, "label", {"job": job, "labels": req.labels}, timeout=settings.timeout_s)
        if req.share is None:
            return
        decision = request(settings.socket, "admit", {"job": job, "model": req.labels["model"],
                                                      "batch_size": req.labels["batch_size"], "uid": uid},
                           timeout=settings.timeout_s)
    except NodectlError as e:
        say(job_id, f"noded did not answer ({e}): the job runs without noded" +
            (" (and without an MPS share)" if req.share else ""))
        return
    if decision["admit"]:
        write_env(settings, job_id, uid, decision["env"])
        return
    say(job_id, f"refused a shared GPU by noded ({decision['reason']}): {settings.on_refusal}")
    put_back(job_id, settings.on_refusal, f"noded: refused: {decision['reason']}")


def write_env(settings: Settings, job_id: str, uid: int, env: dict[str, str]) -> None:
    """The job's MPS environment, for its TaskProlog (``export NAME=value`` lines, as Slurm
    reads a TaskProlog's output: the value is the rest of the line, unquoted)."""
    lines = []
    for name, value in sorted(env.items()):
        if not name.replace("_", "").isalnum() or "\n" in value or "\r" in value:
            raise ValueError(f"noded's environment for job {job_id} holds {name!r}={value!r:.60}: not one line")
        lines.append(f"export {name}={value}\n")
    os.makedirs(settings.env_dir, mode=0o755, exist_ok=True)
    path = env_file(settings, job_id)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, "".join(lines).encode())
        os.fchown(fd, uid, -1)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def put_back(job_id: str, on_refusal: str, why: str) -> None:
    """The refused job back in the queue (hold or requeue); why, in its admin comment."""
    import subprocess  # here: only a refusal needs it, and every import is a job's start

    for argv in (["scontrol", ON_REFUSAL[on_refusal], job_id],
                 ["scontrol", "update", f"JobId={job_id}", f"AdminComment={why[:250]}"]):
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            say(job_id, f"{' '.join(argv)} failed: {e}")
            continue
        if r.returncode != 0:
            say(job_id, f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()[:300]}")


def epilog(env: dict[str, str], settings: Settings) -> None:
    job_id = env["SLURM_JOB_ID"]
    try:
        os.unlink(env_file(settings, job_id))
    except FileNotFoundError:
        pass
    try:
        request(settings.socket, "forget", {"job": f"slurm:{job_id}"}, timeout=settings.timeout_s)
    except NodectlError as e:
        say(job_id, f"noded did not answer ({e}): it drops the job's reservation itself once the job is gone")


HOOKS = {"prolog": prolog, "epilog": epilog}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] not in HOOKS:
        print(f"usage: python -m noded.integrations.slurm {{{'|'.join(HOOKS)}}} (as Slurm's Prolog/Epilog)",
              file=sys.stderr)
        return 2
    env = dict(os.environ)
    job_id = env.get("SLURM_JOB_ID", "?")
    try:
        if not job_id.isdigit() or not env.get("SLURM_JOB_UID", "").isdigit():
            raise ValueError("SLURM_JOB_ID and SLURM_JOB_UID must be set (run by slurmd as Prolog/Epilog)")
        HOOKS[argv[0]](env, Settings.from_environ(env))
    except Exception as e:  # noqa: BLE001 - fail safe: never drain the node for noded's sake
        say(job_id, f"{argv[0]} failed ({type(e).__name__}: {e}): the job goes on without noded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
