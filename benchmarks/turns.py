"""What the per-op benches share: an onnxruntime session on a given number of threads,
and the peers timed in interleaved turns (a VM's speed drifts, so only turns taken side
by side compare)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import onnx
import onnxruntime as ort


def ort_session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options)


def interleaved(
    calls: Mapping[str, Callable[[], object]], turns: int, repeat: int, pause: float = 0.3
) -> dict[str, list[float]]:
    """Per peer, one time per turn: the best of `repeat` runs after a warm-up run; the
    peers take their turns one after the other, each after a `pause` in which the other
    peers' spinning worker threads go to sleep (else they steal the cores)."""
    times: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(turns):
        for label, call in calls.items():
            time.sleep(pause)
            call()
            best = float("inf")
            for _ in range(repeat):
                start = time.perf_counter()
                call()
                best = min(best, time.perf_counter() - start)
            times[label].append(best)
    return times
