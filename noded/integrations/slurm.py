"""Slurm's node hooks for noded: ``python -m noded.integrations.slurm prolog|epilog``.

The shell scripts in ``integrations/slurm/`` (installed with noded) call this only for a
job whose ``--comment`` has a ``noded:`` part, e.g.

    sbatch --comment "noded: model=BiDAF batch_size=32 category=NLP share=mps" train.sh

and hand the Prolog the comment on its stdin, never in an exec's arguments or
environment (a comment is the submitter's, of any length: 128 KiB in one variable fails
an exec with E2BIG). It is read as bytes, at most ``MAX_COMMENT_BYTES`` of it, and parsed
by ``labelwords.comment_words``' grammar.

**Prolog** (slurmd, as root, before the job starts): first records, in a root-only
directory (``RECORD_DIR/job_N``), what the Epilog must clean; then registers the job's
labels with noded (`label`), so the job is known for what it is from noded's first look
at it. With ``share=mps`` it asks for admission onto a shared GPU under MPS (`admit`, as
the job's user, with the comment's model and batch size: labels noded refused, at its
cap of registered jobs, do not cost the job its admission): admitted, the MPS environment
(GPU, thread percentage, pinned memory limit, pipe directory) is written to
``ENV_DIR/job_N.env``, owned by the job's user, for the TaskProlog to hand to every task.
A refusal noded marks transient (its reply's ``transient``: MPS starting or restarting,
noded's first sample not taken) is asked again within ``retry_s``; what is still refused
then goes as the site chose: a final refusal as ``on_refusal``, a transient one as
``on_not_ready``: ``hold`` (`scontrol requeuehold`: pending until someone runs `scontrol
release N`), ``requeue`` (`scontrol requeue`: pending, and started again when Slurm next
schedules it, here or on another node), or (``on_not_ready`` only) ``run`` (it runs
without an MPS share, as with noded down).

**Epilog** (slurmd, as root, after the job): never reads the comment (the submitter may
have changed it since the Prolog ran: `scontrol update JobId=N Comment=`). It cleans all
noded may hold for job N, whatever the Prolog recorded or if its record is missing: the
environment file, and `forget` (the job's labels and its GPU reservation go at once);
then the record. Each step finds nothing to do the second time.

Fail safe: a hook never fails the job for noded's sake. Slurm drains a node whose
prolog exits non-zero, so both hooks exit 0 whatever happens, and say on stderr (the
slurmd log) what went wrong: with noded down, or a comment noded cannot read (said in
the job's AdminComment too), the job runs as it would without noded (without labels,
and without an MPS share: on its GPU as Slurm gave it). Only a refusal by a running
noded keeps a job from starting. All of a Prolog's waits for noded end within
``timeout_s + retry_s`` of its start (``NodedTime``), however slow or hung noded is; the
Epilog reads only the settings it uses, so that none it does not use, wrong, keeps it from
cleaning.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable

from noded.admin.request import DEFAULT_SOCKET, NodectlError, RefusedByNoded, request
from noded.jobs.labelwords import MAX_COMMENT_BYTES, LabelWordError, comment_words, parse_label_words

ON_REFUSAL = {"hold": "requeuehold", "requeue": "requeue"}
#: what a transient refusal (MPS starting, noded's first sample) comes to once retry_s is spent
ON_NOT_READY = ("requeue", "hold", "run")
#: what a hook waits for noded at most, for one request
TIMEOUT_S = 5.0
#: how long a Prolog asks again after a transient refusal (it delays the job's start as much:
#: under Slurm's BatchStartTimeout, 10 s by default, past which a launch may be given up)
RETRY_S = 8.0
#: the first pause between two such asks, doubled up to the last
RETRY_PAUSE_S = (0.25, 2.0)
#: neither is under /run/noded: systemd removes noded's RuntimeDirectory whenever noded stops,
#: and a job's environment file (read again by each later step's TaskProlog) and its record
#: must outlive a restart of noded during the job
DEFAULT_ENV_DIR = "/run/noded-slurm/env"
DEFAULT_RECORD_DIR = "/run/noded-slurm/jobs"
#: a record is a small JSON object; anything longer is not the Prolog's
MAX_RECORD_BYTES = 4096
#: an AdminComment noded writes: one printable line, at most this long
MAX_ADMIN_COMMENT = 250
#: the most a Prolog waits for Slurm's scontrol, its calls together (slurmctld hung: the
#: requeue first, then the AdminComment, each with what is left)
SCONTROL_S = 30.0


@dataclass(frozen=True)
class Settings:
    """The site's choices, from the hooks' environment (the scripts read them from
    /etc/noded/slurm-hooks.conf)."""

    socket: str = DEFAULT_SOCKET
    on_refusal: str = "hold"
    env_dir: str = DEFAULT_ENV_DIR
    timeout_s: float = TIMEOUT_S
    record_dir: str = DEFAULT_RECORD_DIR
    retry_s: float = RETRY_S
    on_not_ready: str = "requeue"

    @classmethod
    def from_environ(cls, env: dict[str, str]) -> "Settings":
        on_refusal = env.get("NODED_SLURM_ON_REFUSAL") or "hold"
        if on_refusal not in ON_REFUSAL:
            raise ValueError(f"NODED_SLURM_ON_REFUSAL must be one of {', '.join(ON_REFUSAL)}, not {on_refusal!r}")
        on_not_ready = env.get("NODED_SLURM_ON_NOT_READY") or "requeue"
        if on_not_ready not in ON_NOT_READY:
            raise ValueError(f"NODED_SLURM_ON_NOT_READY must be one of {', '.join(ON_NOT_READY)}, "
                             f"not {on_not_ready!r}")
        timeout = _seconds(env, "NODED_SLURM_TIMEOUT_S", TIMEOUT_S, 0, 60, low_open=True)
        retry = _seconds(env, "NODED_SLURM_RETRY_S", RETRY_S, 0, 300)
        return cls(env.get("NODED_SOCKET") or DEFAULT_SOCKET, on_refusal,
                   env.get("NODED_SLURM_ENV_DIR") or DEFAULT_ENV_DIR, timeout,
                   env.get("NODED_SLURM_RECORD_DIR") or DEFAULT_RECORD_DIR, retry, on_not_ready)

    @classmethod
    def for_cleaning(cls, env: dict[str, str]) -> tuple["Settings", list[str]]:
        """The Epilog's settings: only those it uses (the socket, the directories, the
        timeout), with what is wrong in them. Nothing wrong keeps it from cleaning (the job's
        environment file, labels and reservation would stay behind, job after job): a wrong
        timeout is said and the default waited; what a refusal does is the Prolog's to say."""
        problems = []
        try:
            timeout = _seconds(env, "NODED_SLURM_TIMEOUT_S", TIMEOUT_S, 0, 60, low_open=True)
        except ValueError as e:
            problems.append(f"{e}: the Epilog waits {TIMEOUT_S:g}s")
            timeout = TIMEOUT_S
        return cls(socket=env.get("NODED_SOCKET") or DEFAULT_SOCKET,
                   env_dir=env.get("NODED_SLURM_ENV_DIR") or DEFAULT_ENV_DIR, timeout_s=timeout,
                   record_dir=env.get("NODED_SLURM_RECORD_DIR") or DEFAULT_RECORD_DIR), problems


def _seconds(env: dict[str, str], name: str, default: float, low: float, high: float, *,
             low_open: bool = False) -> float:
    try:
        value = float(env.get(name) or default)
    except ValueError:
        raise ValueError(f"{name} must be seconds, not {env[name]!r}") from None
    if not (low < value if low_open else low <= value) or not value <= high:
        raise ValueError(f"{name} must be in {'(' if low_open else '['}{low:g}, {high:g}] seconds, not {value:g}")
    return value


@dataclass(frozen=True)
class JobRequest:
    """What a job's comment asks of noded."""

    labels: dict[str, object]
    share: str | None  # "mps": admission onto a shared GPU

    @classmethod
    def from_job(cls, comment: bytes | str, gres_mps: bool = False) -> "JobRequest":
        """From the job's comment (bytes, as Slurm holds it); ``gres_mps``: Slurm allocated
        the job gres/mps (its Prolog then has CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), which asks
        for admission as share=mps does where the comment names the model and batch size."""
        if len(comment) > MAX_COMMENT_BYTES:
            raise LabelWordError(f"the comment is longer than {MAX_COMMENT_BYTES} bytes: noded reads no further")
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


@dataclass(frozen=True)
class PrologOutcome:
    """What became of a job at its Prolog, and what Slurm must still be told of it."""

    labelled: bool = False
    admitted: bool = False
    put_back: str | None = None  # "hold" or "requeue": the job goes back to the queue
    admin_comment: str | None = None  # for the job's AdminComment: why


def env_file(settings: Settings, job_id: str) -> str:
    return os.path.join(settings.env_dir, f"job_{job_id}.env")


def record_file(settings: Settings, job_id: str) -> str:
    return os.path.join(settings.record_dir, f"job_{job_id}")


def say(job_id: str, text: str) -> None:
    print(f"noded slurm hook: job {job_id}: {text}", file=sys.stderr, flush=True)


def read_comment(stream: BinaryIO) -> bytes:
    """The comment the script hands on stdin, at most one byte past what noded reads: a
    longer one is known to be longer, and is not read whole, whatever its length."""
    out = b""
    while len(out) <= MAX_COMMENT_BYTES:
        chunk = stream.read(MAX_COMMENT_BYTES + 1 - len(out))
        if not chunk:
            break
        out += chunk
    return out


class NodedTime:
    """The Prolog's time for noded, every request and every ask again together: its waits
    end within ``timeout_s + retry_s`` of its start, whatever mix of a slow and a hung noded
    it meets (each request alone bounded by ``timeout_s`` could add a second timeout to the
    retries). ``clock`` is the one request deadlines are kept in (monotonic)."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic):
        self.settings, self.clock = settings, clock
        self.ends_at = clock() + settings.timeout_s + settings.retry_s

    def request(self, command: str, args: dict) -> Any:
        """noded's answer, within what is left (NodectlError where none is)."""
        left = self.ends_at - self.clock()
        if left <= 0:
            raise NodectlError(f"the Prolog's {self.settings.timeout_s + self.settings.retry_s:g}s for noded "
                               "(NODED_SLURM_TIMEOUT_S + NODED_SLURM_RETRY_S) are spent")
        return request(self.settings.socket, command, args, timeout=min(self.settings.timeout_s, left))


def prolog(env: dict[str, str], settings: Settings, comment: bytes, *,
           clock: Callable[[], float] = time.monotonic) -> PrologOutcome:
    job_id, uid = env["SLURM_JOB_ID"], int(env["SLURM_JOB_UID"])
    noded = NodedTime(settings, clock)
    job = f"slurm:{job_id}"
    try:
        req = JobRequest.from_job(comment, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in env)
    except LabelWordError as e:
        say(job_id, f"its comment is not for noded ({e}): it runs without noded labels")
        write_record(settings, job_id, None)
        return PrologOutcome(admin_comment=f"noded: comment not read: {e}")
    if not req.labels:
        write_record(settings, job_id, None)
        return PrologOutcome()
    # Recorded before noded is asked anything: whatever noded comes to hold for the job,
    # the Epilog finds a record that says to clean it.
    write_record(settings, job_id, {"job": job, "env_file": env_file(settings, job_id) if req.share else None})
    try:
        labels_refused = register_labels(noded, job_id, req)
    except NodectlError as e:
        say(job_id, f"noded did not answer ({e}): the job runs without noded" +
            (" (and without an MPS share)" if req.share else ""))
        return PrologOutcome()
    labelled = labels_refused is None
    if req.share is None:
        return PrologOutcome(labelled, admin_comment=labels_refused)
    outcome = ask_admission(settings, job_id, uid, req, labelled, noded)
    if labels_refused is None:
        return outcome
    said = "; ".join(why for why in (labels_refused, outcome.admin_comment) if why)
    return dataclasses.replace(outcome, admin_comment=said)


def register_labels(noded: NodedTime, job_id: str, req: JobRequest) -> str | None:
    """The job's labels registered with noded; what noded refused (a value out of range,
    category=nlp, or noded at its cap of registered jobs), for the job's AdminComment: the
    job runs unlabelled, said where its submitter sees it, as a comment noded cannot read
    is, and admission (if asked) is still asked, with the comment's model and batch size.
    Raises NodectlError where noded does not answer."""
    try:
        noded.request("label", {"job": f"slurm:{job_id}", "labels": req.labels})
        return None
    except RefusedByNoded as e:
        say(job_id, f"noded refused its labels ({e}): it runs unlabelled"
            + ("; admission is asked all the same" if req.share else ""))
        return f"noded: labels refused: {e}"


def ask_admission(settings: Settings, job_id: str, uid: int, req: JobRequest, labelled: bool,
                  noded: NodedTime) -> PrologOutcome:
    """Admission onto a shared GPU, with the comment's model and batch size (whether or not
    noded took the job's labels); what is refused goes as the site chose."""
    args = {"job": f"slurm:{job_id}", "model": req.labels["model"], "batch_size": req.labels["batch_size"],
            "uid": uid}
    try:
        decision = admit_within_budget(noded, args)
    except NodectlError as e:
        say(job_id, f"noded did not admit it ({e}): the job runs without an MPS share")
        return PrologOutcome(labelled)
    if decision["admit"]:
        write_env(settings, job_id, uid, decision["env"])
        return PrologOutcome(labelled, admitted=True)
    if decision.get("transient"):
        choice, why = settings.on_not_ready, (f"noded: not ready for {settings.retry_s:g}s "
                                              f"({decision.get('refusal')}): {decision['reason']}")
    else:
        choice, why = settings.on_refusal, f"noded: refused: {decision['reason']}"
    say(job_id, f"{why}: {choice}")
    if choice == "run":
        return PrologOutcome(labelled, admin_comment=f"{why}; it ran without an MPS share")
    return PrologOutcome(labelled, put_back=choice, admin_comment=why)


def admit_within_budget(noded: NodedTime, args: dict) -> dict:
    """noded's admission decision, asked again while noded says its refusal is transient
    (a typed field of its reply, not its prose), until ``retry_s`` is spent (and no ask
    waits past the Prolog's time for noded)."""
    clock = noded.clock
    deadline = min(clock() + noded.settings.retry_s, noded.ends_at)
    pause, longest = RETRY_PAUSE_S
    while True:
        decision = noded.request("admit", args)
        if decision["admit"] or not decision.get("transient") or clock() + pause > deadline:
            return decision
        time.sleep(pause)  # a backoff: noded's MPS or its first tick is what is waited for
        pause = min(pause * 2, longest)


def write_record(settings: Settings, job_id: str, record: dict | None) -> None:
    """What the Epilog must clean for the job (None: nothing, an empty file, as the script
    leaves for a job without ``noded:``), in a directory only root may write. Not kept
    (said on stderr): the Epilog then cleans all noded may hold for the job."""
    try:
        _ensure_private_dir(settings.record_dir, 0o700)
        fd = os.open(record_file(settings, job_id), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, b"" if record is None else json.dumps(record).encode())
        finally:
            os.close(fd)
    except OSError as e:
        say(job_id, f"its record could not be kept in {settings.record_dir} ({e.strerror or e}): its Epilog "
            "cleans all noded may hold for it")


def _ensure_private_dir(path: str, mode: int) -> None:
    """``path`` as a directory only this user may write (made with ``mode`` where missing)."""
    os.makedirs(path, mode=mode, exist_ok=True)
    st = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise OSError(f"{path} is not a directory only this user (uid {os.geteuid()}) may write")


def write_env(settings: Settings, job_id: str, uid: int, env: dict[str, str]) -> None:
    """The job's MPS environment, for its TaskProlog (``export NAME=value`` lines, as Slurm
    reads a TaskProlog's output: the value is the rest of the line, unquoted), in a
    directory only root may write: whoever else may could swap the file for lines of their
    own (LD_PRELOAD=...) before the job's tasks start."""
    lines = []
    for name, value in sorted(env.items()):
        if not name.replace("_", "").isalnum() or "\n" in value or "\r" in value:
            raise ValueError(f"noded's environment for job {job_id} holds {name!r}={value!r:.60}: not one line")
        lines.append(f"export {name}={value}\n")
    _ensure_private_dir(settings.env_dir, 0o755)
    path = env_file(settings, job_id)
    tmp = f"{path}.tmp"
    try:
        os.unlink(tmp)  # an earlier Prolog's, cut short: the file is made new, never reopened
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, "".join(lines).encode())
        os.fchown(fd, uid, -1)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def settle(job_id: str, outcome: PrologOutcome, *, budget_s: float = SCONTROL_S) -> None:
    """Tells Slurm what the Prolog decided: the job back in the queue (hold or requeue),
    and why, in its AdminComment; all within ``budget_s``."""
    import subprocess  # here: only a refusal or an unreadable comment needs it

    ends_at = time.monotonic() + budget_s

    commands = []
    if outcome.put_back:
        commands.append(["scontrol", ON_REFUSAL[outcome.put_back], job_id])
    if outcome.admin_comment:
        why = "".join(c if c.isprintable() else "?" for c in outcome.admin_comment)[:MAX_ADMIN_COMMENT]
        commands.append(["scontrol", "update", f"JobId={job_id}", f"AdminComment={why}"])
    for argv in commands:
        left = ends_at - time.monotonic()
        if left <= 0:
            say(job_id, f"{' '.join(argv)} not run: the Prolog's {budget_s:g}s for scontrol are spent")
            continue
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=left)
        except (OSError, subprocess.TimeoutExpired) as e:
            say(job_id, f"{' '.join(argv)} failed: {e}")
            continue
        if r.returncode != 0:
            say(job_id, f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()[:300]}")


def epilog(env: dict[str, str], settings: Settings) -> None:
    """Cleans all noded may hold for the job, from the Prolog's record and beyond it (the
    record may be missing or unreadable); never from the job's comment."""
    job_id = env["SLURM_JOB_ID"]
    record = read_record(settings, job_id)
    paths = {env_file(settings, job_id)}
    recorded = (record or {}).get("env_file")
    if isinstance(recorded, str) and os.path.basename(recorded) == f"job_{job_id}.env":
        paths.add(recorded)
    for path in sorted(paths):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    try:
        request(settings.socket, "forget", {"job": f"slurm:{job_id}"}, timeout=settings.timeout_s)
    except NodectlError as e:
        say(job_id, f"noded did not forget it ({e}): its reservation goes once noded sees the job gone, its "
            f"labels stay registered until `nodectl forget slurm:{job_id}`")
    try:
        os.unlink(record_file(settings, job_id))
    except FileNotFoundError:
        pass


def read_record(settings: Settings, job_id: str) -> dict | None:
    """The Prolog's record of the job (None: none, or not one the Prolog wrote, said)."""
    try:
        fd = os.open(record_file(settings, job_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        say(job_id, f"its Prolog's record cannot be read ({e.strerror or e}): all noded may hold for it is cleaned")
        return None
    try:
        raw = os.read(fd, MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    if not raw:
        return None
    try:
        record = json.loads(raw) if len(raw) <= MAX_RECORD_BYTES else None
    except ValueError:
        record = None
    if not isinstance(record, dict):
        say(job_id, "its Prolog's record is not one: all noded may hold for it is cleaned")
        return None
    return record


HOOKS = ("prolog", "epilog")


def main(argv: list[str] | None = None, stdin: BinaryIO | None = None) -> int:
    """The hooks' entry: the Prolog reads the job's comment on ``stdin`` (the script's pipe)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] not in HOOKS:
        print(f"usage: python -m noded.integrations.slurm {{{'|'.join(HOOKS)}}} (as Slurm's Prolog/Epilog; the "
              "Prolog reads the job's comment on stdin)", file=sys.stderr)
        return 2
    env = dict(os.environ)
    job_id = env.get("SLURM_JOB_ID", "?")
    try:
        if not job_id.isdigit() or not env.get("SLURM_JOB_UID", "").isdigit():
            raise ValueError("SLURM_JOB_ID and SLURM_JOB_UID must be set (run by slurmd as Prolog/Epilog)")
        if argv[0] == "prolog":
            outcome = prolog(env, Settings.from_environ(env), read_comment(stdin or sys.stdin.buffer))
            settle(job_id, outcome)
        else:
            settings, problems = Settings.for_cleaning(env)
            for problem in problems:
                say(job_id, problem)
            epilog(env, settings)
    except Exception as e:  # noqa: BLE001 - fail safe: never drain the node for noded's sake
        say(job_id, f"{argv[0]} failed ({type(e).__name__}: {e}): the job goes on without noded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
