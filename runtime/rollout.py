"""THE env-facing loop (reset -> observe -> an action source acts -> step), batched over a gymnasium vector env,
with per-episode metrics and subscribers (recorder, video, monitors) that see every step of every planned
episode. ``policylink eval``, ``run``, ``record``, training-time evaluation and the demo all run episodes here.

The loop itself is a few lines any env-facing code can copy::

    obs, info = vec_env.reset()
    executor.reset()
    while running:
        action = executor.act(as_batch(obs))            # (B, A) float32
        obs, reward, terminated, truncated, info = vec_env.step(action)
        executor.reset(np.flatnonzero(terminated | truncated))   # SAME_STEP autoreset: new episodes begin
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np

from policylink.adapters.schema import FAULT_INFO, REALITY_GAP_INFO, TASK_KEY
from policylink.runtime.vector_env import (  # noqa: F401 - re-exported: the loop's vector-env side
    EPISODE_INDEX,
    EPISODE_SEED,
    FINAL_FRAME_INFO,
    BorrowedEnv,
    EpisodePlan,
    RegistryEnvFn,
    env_spec_of,
    make_vector_env,
    plan_episodes,
)

TERMINATED_INFO = "policylink_terminated"  # step-info key: env.step's ``terminated`` (done = terminated | truncated)


@dataclass
class EpisodeResult:
    """Metrics of one finished episode.

    Attributes:
        index: the episode's index in the evaluation plan (its seed is fixed by it).
        seed: the env reset seed.
        task: the instruction (``""`` for single-task envs).
        n_steps: control steps up to and including the terminal step.
        sum_reward, max_reward: over those steps.
        success: ``info["is_success"]`` was True at any of those steps.
        inferences: policy calls made for this episode.
        stall_steps: simulated steps the episode waited for inference (see ``LatencyConfig``).
        frames: rendered frames (uint8 ``(H, W, 3)``), first = the episode's reset frame; only when requested.
        error: why the episode could not finish (``""`` when it did): its environment process crashed or stopped
            answering; such an episode counts as a failure in every table.
        fault: why the env ended the episode on diverged physics (its step info's ``"fault"``, ``""`` for none):
            a failure, which a report may also count apart (success excluding faulted episodes).
    """

    index: int
    seed: int
    task: str
    n_steps: int
    sum_reward: float
    max_reward: float
    success: bool
    inferences: int = 0
    stall_steps: int = 0
    frames: list[np.ndarray] | None = field(default=None, repr=False)
    error: str = ""
    fault: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (without frames)."""
        d = asdict(self)
        d.pop("frames")
        return d


@runtime_checkable
class ActionSource(Protocol):
    """What the loop asks for actions: a :class:`~policylink.runtime.executors.ChunkExecutor` (a policy behind
    a chunk executor) or any other per-row source, such as a scripted expert
    (:class:`policylink.runtime.record.ExpertSource`).

    Attributes:
        inferences, stall_steps: int64 ``(B,)`` per-row counters of the current episodes (policy calls, steps
            waited for inference), cleared by :meth:`reset`.
    """

    inferences: np.ndarray
    stall_steps: np.ndarray

    def act(self, obs_batch: Mapping[str, Any]) -> np.ndarray:
        """float32 ``(B, A)`` actions for one observation per row (arrays ``(B, ...)``, ``task`` list of str)."""

    def reset(self, env_ids: Sequence[int] | None = None) -> None:
        """New episodes start in rows ``env_ids`` (``None`` = all)."""


class EpisodeSubscriber:
    """Observer of the loop; override the hooks you need (each default does nothing).

    Hooks run in this order for a slot (vector-env index) ``j``: :meth:`on_reset` when a planned episode starts
    there (after the action source's reset), :meth:`on_step` once per step of that episode, then
    :meth:`on_episode_end` with its :class:`EpisodeResult`, or :meth:`on_abort` when an exception ends the
    loop inside it. Padding episodes (run after a slot's plan is exhausted) are never reported. A monitor
    keeps the action source from :meth:`on_start` and may truncate or re-plan its rows from :meth:`on_step`.
    """

    def on_start(self, vec_env: gym.vector.VectorEnv, source: ActionSource) -> None:
        """Called once before the first reset."""

    def on_reset(self, slot: int, index: int, seed: int, info: Mapping[str, Any]) -> None:
        """Planned episode ``index`` (reset seed ``seed``, -1 for none) starts in ``slot``; ``info`` is its
        reset info (one env's, no batch dimension)."""

    def on_step(
        self, slot: int, obs: Mapping[str, Any], action: np.ndarray, reward: float, done: bool, info: Mapping[str, Any]
    ) -> None:
        """One step of ``slot``'s episode: the observation ``o_t`` (one row: arrays without batch dim, ``task``
        a str), the action ``a_t`` float32 ``(A,)`` the source chose (before any ``perturb``), and the reward,
        ``done`` (terminated or truncated) and info that ``env.step`` returned (the final info on the last step)."""

    def on_episode_end(self, slot: int, result: EpisodeResult) -> None:
        """``slot``'s episode ended (its last step was reported with ``done=True``)."""

    def on_abort(self, slot: int) -> None:
        """An exception ends the loop while ``slot``'s episode is unfinished."""


class RecorderSubscriber(EpisodeSubscriber):
    """Records every planned episode through a :class:`~policylink.data.recorder.EpisodeRecorder`, one recorder
    slot per vector-env slot: an episode reaches the store whole when it ends; an aborted one leaves no trace.

    Args:
        recorder: the recorder (the caller opens and closes it).
        meta: template of each episode's :class:`~policylink.data.episode_meta.EpisodeMeta` (task, source, quality);
            its ``seed`` is replaced by the episode's reset seed and ``success`` by the episode's success (True
            when ``info["is_success"]`` was True at the reset or at any step). Default: source ``policy``, as
            :func:`rollout`'s own ``source`` (the loop runs an executor over a policy; a scripted source passes
            its own meta, e.g. ``expert``), so a recorder built without one (``run --robot --record``'s
            deployment recorder) does not tag its episodes ``unknown``.

    Attributes:
        committed: ``{episode index: (store index, success, n_steps)}`` of the episodes written.
    """

    def __init__(self, recorder: Any, meta: Any = None):
        from policylink.data.episode_meta import EpisodeMeta

        self.recorder = recorder
        self.meta = meta if meta is not None else EpisodeMeta(source="policy")
        self.committed: dict[int, tuple[int, bool, int]] = {}
        self._reset_success: dict[int, bool] = {}

    def on_reset(self, slot: int, index: int, seed: int, info: Mapping[str, Any]) -> None:
        """Open the episode in the recorder's ``slot``; its metadata carries the reset info's reality gap
        (``"reality_gap"``, JSON) when the env has one."""
        from policylink.data.episode_meta import EpisodeMeta

        m = self.meta
        gap = str(info.get(REALITY_GAP_INFO, m.gap))  # the env's drawn reality gap, when it has one
        meta = EpisodeMeta(task=m.task, seed=None if seed < 0 else seed, source=m.source, quality=m.quality, gap=gap)
        self.recorder.start_episode(meta, slot=slot)
        self._reset_success[slot] = bool(info.get("is_success", False))

    def on_step(self, slot, obs, action, reward, done, info) -> None:
        """Buffer ``(o_t, a_t, r_t, done_t)`` and the true termination (``info[TERMINATED_INFO]``)."""
        self.recorder.add_step(obs, action, reward, done, slot=slot, terminated=bool(info.get(TERMINATED_INFO, done)))

    def on_episode_end(self, slot: int, result: EpisodeResult) -> None:
        """Commit the episode with its success flag."""
        success = result.success or self._reset_success.pop(slot, False)
        self.committed[result.index] = (self.recorder.end_episode(success=success, slot=slot), success, result.n_steps)

    def on_abort(self, slot: int) -> None:
        """Discard the unfinished episode."""
        self.recorder.abort_episode(slot=slot)


RUNNING_COLOUR, SUCCESS_COLOUR, FAILURE_COLOUR = (60, 60, 60), (40, 160, 60), (200, 50, 40)
"""RGB of a video caption strip: grey while the episode runs, then green (success) or red (failure) on its last
frame."""


class VideoSubscriber(EpisodeSubscriber):
    """Films the planned episodes ``episodes``: the reset frame, one frame per step, and the terminal state (the
    env must render ``rgb_array``; the terminal frame comes from :class:`EpisodePlan`'s ``final_info``). With
    ``video_dir`` each film is written to ``video_dir/episode_NNNN.mp4`` at ``fps`` Hz when its episode ends,
    captioned with its episode, seed and step, ``running`` on a grey strip until its last frame, which shows the
    outcome (``success`` green, ``failure`` red; :func:`policylink.data.video.caption_frames`);
    otherwise the raw frames go to :attr:`EpisodeResult.frames`.

    Args:
        episodes: planned episode indices always filmed.
        video_dir, fps: where and at which rate films are written (None: frames kept in the results).
        failures: also film every other episode and keep failed ones until this many films of failed episodes
            exist (so a report shows a failure when there is one; costs one render per step of every episode).

    Attributes:
        paths: ``{episode index: mp4 path}`` of the films written.

    Raises:
        ValueError: ``video_dir`` without a positive ``fps``, ``failures`` < 0; ``env.render()`` returned None.
    """

    def __init__(
        self,
        episodes: Sequence[int],
        video_dir: str | Path | None = None,
        fps: float | None = None,
        failures: int = 0,
    ):
        if video_dir is not None and not (fps and fps > 0):
            raise ValueError(f"fps: expected a positive frame rate with video_dir, received {fps!r}")
        if failures < 0:
            raise ValueError(f"failures: expected an int >= 0, received {failures}")
        self.episodes = {int(i) for i in episodes}
        self.video_dir = None if video_dir is None else Path(video_dir)
        self.fps = fps
        self.failures = int(failures)
        self.paths: dict[int, Path] = {}
        self._frames: dict[int, list[np.ndarray]] = {}
        self._failed_films = 0
        self._vec: gym.vector.VectorEnv | None = None

    def on_start(self, vec_env, source) -> None:
        """Keep the vector env to render its slots."""
        self._vec = vec_env

    def on_reset(self, slot, index, seed, info) -> None:
        """Start a film with the reset frame when ``index`` is filmed (or failures are still wanted)."""
        if index in self.episodes or self._failed_films < self.failures:
            self._frames[slot] = [render_slot(self._vec, slot)]

    def on_step(self, slot, obs, action, reward, done, info) -> None:
        """Add the frame after a step; after the terminal step, the terminal frame from the final info (the slot
        itself already shows the next episode)."""
        if slot not in self._frames:
            return
        if not done:
            self._frames[slot].append(render_slot(self._vec, slot))
        elif FINAL_FRAME_INFO in info:
            self._frames[slot].append(np.asarray(info[FINAL_FRAME_INFO], np.uint8))

    def on_episode_end(self, slot, result) -> None:
        """Write the film (or hand its frames to ``result``) when it is kept."""
        frames = self._frames.pop(slot, None)
        if frames is None:
            return
        failed_film = not result.success and self._failed_films < self.failures
        if result.index not in self.episodes and not failed_film:
            return
        self._failed_films += int(not result.success)
        if self.video_dir is None:
            result.frames = frames
            return
        from policylink.data.video import caption_frames, write_video

        last = len(frames) - 1  # the outcome is known on the terminal frame only: "running" before it
        outcome = "success" if result.success else "failure"
        texts = [
            f"ep {result.index} | seed {result.seed} | step {min(t, result.n_steps)}/{result.n_steps} | "
            + (outcome if t == last else "running")
            for t in range(len(frames))
        ]
        path = self.video_dir / f"episode_{result.index:04d}.mp4"
        colours = [RUNNING_COLOUR] * last + [SUCCESS_COLOUR if result.success else FAILURE_COLOUR]
        self.paths[result.index] = write_video(path, caption_frames(frames, texts, colours), fps=float(self.fps))

    def on_abort(self, slot) -> None:
        """Drop the unfinished film."""
        self._frames.pop(slot, None)


def rollout(
    vec_env: gym.vector.VectorEnv,
    executor: ActionSource,
    n_episodes: int,
    *,
    subscribers: Sequence[EpisodeSubscriber] = (),
    recorder: Any = None,
    video_episodes: Sequence[int] = (),
    source: str = "policy",
    progress: Callable[[EpisodeResult], None] | None = None,
    perturb: Callable[[np.ndarray], np.ndarray] | None = None,
) -> list[EpisodeResult]:
    """Run ``n_episodes`` planned episodes (see :class:`EpisodePlan`) and return their results by index.

    Args:
        vec_env: a vector env from :func:`make_vector_env` (SAME_STEP autoreset).
        executor: the :class:`ActionSource` choosing each step's actions ``(B, A)``.
        n_episodes: how many planned episodes to finish (padding episodes are run but not counted).
        subscribers: :class:`EpisodeSubscriber` hooks, called in this order.
        recorder: shorthand for a :class:`RecorderSubscriber` (after ``subscribers``) over this
            ``policylink.data.recorder.EpisodeRecorder``, with ``EpisodeMeta(source=source)``.
        video_episodes: shorthand for a :class:`VideoSubscriber` keeping these episodes' frames in their results.
        source: the recorder's ``EpisodeMeta.source``.
        progress: called with each finished episode (after the subscribers).
        perturb: ``(B, A) -> (B, A)`` float32: the actions sent to the env, while subscribers see the source's
            (DART noise injection, Laskey et al. 2017: the clean action labels the perturbed state).

    Returns:
        Results sorted by episode index. An exception aborts every unfinished episode (``on_abort``) and
        propagates.
    """
    subs = _subscribers(subscribers, recorder, video_episodes, source)
    for s in subs:
        s.on_start(vec_env, executor)
    obs, info = vec_env.reset()
    executor.reset()
    slots = [_Trace(-1, -1) for _ in range(vec_env.num_envs)]
    for j in range(vec_env.num_envs):
        slots[j] = _begin(j, slot_info(info, j), subs)
    results: dict[int, EpisodeResult] = {}
    try:
        while len(results) < n_episodes:
            batch = as_batch(obs)
            action = np.asarray(executor.act(batch), dtype=np.float32)
            sent = action if perturb is None else np.asarray(perturb(action), dtype=np.float32)
            obs, reward, terminated, truncated, info = vec_env.step(sent)
            done = np.logical_or(terminated, truncated)
            for j, trace in enumerate(slots):
                if trace.index < 0:
                    continue
                step_info = {**slot_info(info, j, final=bool(done[j])), TERMINATED_INFO: bool(terminated[j])}
                trace.add(float(reward[j]), bool(done[j]), bool(step_info.get("is_success", False)), batch, j)
                if step_info.get(FAULT_INFO):
                    trace.fault = str(step_info[FAULT_INFO])
                row = {k: v[j] for k, v in batch.items()}
                for s in subs:
                    s.on_step(j, row, action[j], float(reward[j]), bool(done[j]), step_info)
            finished = np.flatnonzero(done)
            for j in finished:
                if slots[j].index >= 0:
                    res = _finish(slots, int(j), executor, subs, progress)
                    results[res.index] = res
            if finished.size:
                executor.reset(finished.tolist())
                for j in finished:
                    slots[j] = _begin(int(j), slot_info(info, int(j)), subs)
    except BaseException:
        for j, trace in enumerate(slots):
            if trace.index >= 0:
                for s in subs:
                    s.on_abort(j)
        raise
    return [results[i] for i in sorted(results)]


def _subscribers(
    subscribers: Sequence[EpisodeSubscriber], recorder: Any, video_episodes: Sequence[int], source: str
) -> list[EpisodeSubscriber]:
    """``subscribers`` plus the recorder / video shorthands of :func:`rollout`, in that order."""
    subs = list(subscribers)
    if recorder is not None:
        from policylink.data.episode_meta import EpisodeMeta

        subs.append(RecorderSubscriber(recorder, EpisodeMeta(source=source)))
    if len(video_episodes):
        subs.append(VideoSubscriber(video_episodes))
    return subs


def _finish(slots: list, j: int, source: ActionSource, subs: Sequence[EpisodeSubscriber], progress) -> EpisodeResult:
    """Close slot ``j``'s planned episode: its result, the subscribers' ``on_episode_end``, then ``progress``."""
    res = slots[j].result(source, j)
    slots[j] = _Trace(-1, -1)
    for s in subs:
        s.on_episode_end(j, res)
    if progress is not None:
        progress(res)
    return res


def episode_metrics(
    rewards: Sequence[float], dones: Sequence[bool], successes: Sequence[bool]
) -> tuple[int, float, float, bool]:
    """``(n_steps, sum_reward, max_reward, success)`` of one episode trace, counting steps up to and including
    the first ``done`` only (whatever padding follows is ignored).

    Args:
        rewards, dones, successes: per-step sequences of equal length ``T`` (floats, bools, bools).

    Raises:
        ValueError: lengths differ or the trace is empty.
    """
    r, d, s = np.asarray(rewards, np.float64), np.asarray(dones, bool), np.asarray(successes, bool)
    if not (r.shape == d.shape == s.shape) or r.ndim != 1 or r.size == 0:
        raise ValueError(
            f"episode trace: expected three equal non-empty 1-D sequences, received lengths "
            f"{r.shape}, {d.shape}, {s.shape}"
        )
    n = int(np.argmax(d)) + 1 if d.any() else r.size
    return n, float(r[:n].sum()), float(r[:n].max()), bool(s[:n].any())


def as_batch(obs: Mapping[str, Any]) -> dict[str, Any]:
    """A vector env's observation as a policy batch: arrays ``(B, ...)``, ``task`` a list of ``B`` str."""
    out = {k: v for k, v in obs.items() if k != TASK_KEY}
    if TASK_KEY in obs:
        out[TASK_KEY] = [str(s) for s in obs[TASK_KEY]]
    return out


def slot_info(info: Mapping[str, Any], j: int, final: bool = False) -> dict[str, Any]:
    """One env's info out of a vector env's info dict (arrays ``(B,)`` with ``_key`` validity masks, as
    gymnasium batches them): the entries valid for slot ``j``. With ``final`` (slot ``j`` finished in this
    SAME_STEP step) the finished episode's ``final_info`` is read instead of the new episode's reset info."""
    if final and "final_info" in info:
        return slot_info(info["final_info"], j)
    out: dict[str, Any] = {}
    for k, v in info.items():
        if k.startswith("_") or k in ("final_info", "final_obs"):
            continue
        mask = info.get("_" + k)
        if mask is not None and not bool(np.asarray(mask)[j]):
            continue
        out[k] = slot_info(v, j) if isinstance(v, Mapping) else v[j]
    return out


def render_slot(vec_env: gym.vector.VectorEnv, j: int) -> np.ndarray:
    """``env.render()`` of slot ``j`` as uint8 ``(H, W, 3)``.

    Raises:
        ValueError: the env rendered None (it was not created with ``render_mode='rgb_array'``).
    """
    if isinstance(vec_env, gym.vector.SyncVectorEnv):
        frame = vec_env.envs[j].render()
    else:
        frame = vec_env.call("render")[j]
    if frame is None:
        raise ValueError(
            "video: expected env.render() to return an rgb_array frame, received None; create the "
            "env with render_mode='rgb_array'"
        )
    return np.asarray(frame, dtype=np.uint8)


class _Trace:
    """Per-slot metrics of the running episode ``index`` (-1: padding, nothing is kept)."""

    def __init__(self, index: int, seed: int):
        self.index, self.seed, self.task, self.fault = index, seed, "", ""
        self.rewards: list[float] = []
        self.dones: list[bool] = []
        self.successes: list[bool] = []

    def add(self, reward: float, done: bool, success: bool, batch: Mapping[str, Any], j: int) -> None:
        if not self.rewards and TASK_KEY in batch:
            self.task = str(batch[TASK_KEY][j])
        self.rewards.append(reward)
        self.dones.append(done)
        self.successes.append(success)

    def result(self, source: ActionSource, j: int) -> EpisodeResult:
        n, total, best, ok = episode_metrics(self.rewards, self.dones, self.successes)
        return EpisodeResult(
            self.index,
            self.seed,
            self.task,
            n,
            total,
            best,
            ok,
            int(source.inferences[j]),
            int(source.stall_steps[j]),
            fault=self.fault,
        )


def _begin(j: int, info: Mapping[str, Any], subs: Sequence[EpisodeSubscriber]) -> _Trace:
    """The trace of the episode that slot ``j``'s reset ``info`` announces; subscribers hear of planned ones."""
    trace = _Trace(int(info[EPISODE_INDEX]), int(info[EPISODE_SEED]))
    if trace.index >= 0:
        for s in subs:
            s.on_reset(j, trace.index, trace.seed, info)
    return trace
