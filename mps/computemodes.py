"""EXCLUSIVE_PROCESS on the GPUs MPS serves, and back: each original recorded before the change."""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from mps.errors import MpsError, MpsStopping

log = logging.getLogger(__name__)


#: how long a stop waits for NVML to put the compute modes back
COMPUTE_MODES_DEADLINE_S = 1.0


class ComputeModes:
    """EXCLUSIVE_PROCESS on the GPUs MPS serves, and back, through NVML.

    ``restore(final=True)`` is the last word: a ``set_exclusive`` racing with it (a
    start still running while the service stops) is refused, not applied after it.
    """

    def __init__(self, uuids: list[str], originals: Recorder | None = None):
        self.uuids = uuids
        self.original: dict[str, int] = {}
        # Record before you touch: each GPU's mode is recorded durably before it changes,
        # so the start after a crash puts it back (restore_recorded).
        self.originals = originals
        self._lock = threading.Lock()
        self._final = False

    def set_exclusive(self) -> None:
        import pynvml

        # Not waiting for the lock: it is held only by a call into NVML, and one that has
        # not returned (a hung driver) must not gather a thread per retried start behind it.
        if not self._lock.acquire(blocking=False):
            raise MpsError("an earlier call into NVML for the compute modes has not returned (a hung driver?)")
        try:
            if self._final:
                raise MpsStopping("compute modes already restored for good")
            try:
                pynvml.nvmlInit()
                try:
                    for uuid in self.uuids:
                        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                        mode = pynvml.nvmlDeviceGetComputeMode(handle)
                        if mode == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS:
                            continue  # already so: nothing to record or put back
                        if self.originals is not None and uuid not in self.original:
                            self._record(uuid, mode)
                        self.original.setdefault(uuid, mode)
                        pynvml.nvmlDeviceSetComputeMode(handle, pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
                finally:
                    pynvml.nvmlShutdown()
            except pynvml.NVMLError as e:
                self._restore_locked()
                raise MpsError(f"setting EXCLUSIVE_PROCESS compute mode failed: {e}") from None
        finally:
            self._lock.release()

    def restore(self, *, final: bool = False) -> None:
        with self._lock:
            self._final = self._final or final
            self._restore_locked()

    def _restore_locked(self) -> None:
        import pynvml

        if not self.original:
            return
        try:
            pynvml.nvmlInit()
            try:
                for uuid, mode in list(self.original.items()):
                    pynvml.nvmlDeviceSetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(uuid), mode)
                    del self.original[uuid]
                    self._forget(uuid)
            finally:
                pynvml.nvmlShutdown()
        except pynvml.NVMLError as e:
            log.error("restoring compute modes %s failed: %s", self.original, e)


    def _record(self, uuid: str, mode: int) -> None:
        try:
            self.originals.record(compute_mode_key(uuid), mode)
        except Exception as e:  # the recorder's own error (noded's StateWriteError): change nothing
            raise MpsError(f"not changing the compute mode of {uuid}: its original could not be recorded: {e}") \
                from None

    def _forget(self, uuid: str) -> None:
        if self.originals is None:
            return
        try:
            self.originals.forget(compute_mode_key(uuid))
        except Exception as e:
            log.warning("compute mode of %s restored, but its record could not be removed: %s", uuid, e)

    @staticmethod
    def restore_recorded(originals: Recorder, cancelled: threading.Event | None = None) -> list[str]:
        """At start: put back every compute mode a crashed run recorded; returns what was
        restored. Records stay where NVML cannot be reached (tried again next start), and
        once ``cancelled`` is set (the caller stopped waiting): nothing more is changed or
        forgotten then."""
        import pynvml

        recorded = [(k.removeprefix(COMPUTE_MODE), v) for k, v in originals.items() if k.startswith(COMPUTE_MODE)]
        if not recorded:
            return []
        done = []
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            log.error("compute modes recorded by an earlier run cannot be restored now (%s): %s", e,
                      ", ".join(u for u, _ in recorded))
            return done
        try:
            for uuid, mode in recorded:
                if cancelled is not None and cancelled.is_set():
                    break
                try:
                    pynvml.nvmlDeviceSetComputeMode(pynvml.nvmlDeviceGetHandleByUUID(uuid), mode)
                except pynvml.NVMLError as e:
                    log.error("restoring the compute mode of %s failed: %s", uuid, e)
                    continue
                if cancelled is not None and cancelled.is_set():
                    break  # put back, but nobody waits: the record stays (the next start puts it back again)
                originals.forget(compute_mode_key(uuid))
                done.append(f"{uuid} compute mode <- {mode}")
        finally:
            pynvml.nvmlShutdown()
        return done


COMPUTE_MODE = "compute_mode:"


def compute_mode_key(uuid: str) -> str:
    return f"{COMPUTE_MODE}{uuid}"


class Recorder(Protocol):
    """Where original values are recorded durably before they change (noded.stores.originals.OriginalValues)."""

    def record(self, key: str, value: Any) -> None: ...

    def forget(self, key: str) -> None: ...

    def items(self) -> list[tuple[str, Any]]: ...
