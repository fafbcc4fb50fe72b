"""openpi interop with the real openpi-client package: its client drives our policy, our OpenPIRemotePolicy
drives an openpi-style server built on openpi-client's msgpack_numpy, and errors follow openpi's convention."""

import asyncio
import threading

import numpy as np
import pytest

from policylink.adapters.openpi import OpenPIRemotePolicy, OpenPIServer, pack, unpack
from policylink.adapters.policy import HistoryPolicy
from policylink.adapters.protocol import RemoteError
from policylink.adapters.schema import ActionSpec, FeatureSpec, ObservationError, PolicySpec

openpi_client = pytest.importorskip("openpi_client")
from openpi_client import msgpack_numpy  # noqa: E402
from openpi_client.websocket_client_policy import WebsocketClientPolicy  # noqa: E402

SPEC = PolicySpec(
    {
        "observation.state": FeatureSpec("float32", (2,)),
        "observation.images.front": FeatureSpec("uint8", (8, 8, 3)),
        "task": FeatureSpec("string", ()),
    },
    ActionSpec(("x", "y"), "ee_delta", ("m", "m"), (-1000.0, -1000.0), (1000.0, 1000.0)),
    n_obs_steps=1,
    chunk_size=4,
    n_action_steps=2,
)


class StatePlusImagePolicy(HistoryPolicy):
    """chunk[b, h] = state + mean image value + h; remembers the prompts."""

    def __init__(self):
        super().__init__(SPEC)
        self.prompts = []

    def _predict(self, history, pad_mask, tasks):
        self.prompts.append(tasks)
        s = (
            history["observation.state"][:, -1]
            + history["observation.images.front"][:, -1].mean(axis=(1, 2, 3))[:, None]
        )
        return (s[:, None, :] + np.arange(4, dtype=np.float32)[None, :, None]).astype(np.float32)


# openpi-client 0.1.2 opens its websocket the pre-websockets-17 way; that warning is theirs, not ours.
pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")

OPENPI_KEYS = {"observation/image": "observation.images.front", "prompt": "task"}


@pytest.fixture
def server():
    srv = OpenPIServer(StatePlusImagePolicy(), port=0, key_map=OPENPI_KEYS, metadata={"robot": "point"}).start()
    yield srv
    srv.stop()


def _openpi_obs(state, fill):
    return {
        "observation/state": np.asarray(state, np.float32),
        "observation/image": np.full((8, 8, 3), fill, np.uint8),
        "prompt": "push the block",
    }


def test_openpi_client_drives_our_policy(server):
    client = WebsocketClientPolicy("127.0.0.1", server.port)
    meta = client.get_server_metadata()
    assert meta["robot"] == "point" and meta["policylink"]["spec"] == SPEC.to_dict()
    reply = client.infer(_openpi_obs([1, 2], 10))
    assert reply["actions"].shape == (4, 2) and reply["actions"].dtype == np.float32
    np.testing.assert_array_equal(reply["actions"][:, 0], [11, 12, 13, 14])
    np.testing.assert_array_equal(reply["actions"][0], [11, 12])
    assert reply["server_timing"]["infer_ms"] >= 0
    assert server.policy.prompts[-1] == ["push the block"]


def test_openpi_client_sees_errors_as_openpi_does(server):
    client = WebsocketClientPolicy("127.0.0.1", server.port)
    bad = _openpi_obs([1, 2, 3], 0)
    with pytest.raises(
        RuntimeError, match=r"(?s)invalid_field: .*observation.state: expected shape \(B, 2\), received \(1, 3\)"
    ):
        client.infer(bad)
    fresh = WebsocketClientPolicy("127.0.0.1", server.port)  # the server keeps serving new connections
    np.testing.assert_array_equal(fresh.infer(_openpi_obs([0, 0], 1))["actions"][0], [1, 1])


def test_our_msgpack_numpy_is_byte_compatible_with_openpi_client():
    obs = _openpi_obs([1.5, -2], 7)
    obs["n"] = np.int64(3)
    ours, theirs = unpack(msgpack_numpy.packb(obs)), msgpack_numpy.unpackb(pack(obs))
    for decoded in (ours, theirs):
        np.testing.assert_array_equal(decoded["observation/state"], [1.5, -2])
        assert decoded["observation/image"].dtype == np.uint8 and decoded["observation/image"][0, 0, 0] == 7
        assert decoded["n"] == 3 and decoded["prompt"] == "push the block"
    assert ours["observation/state"].flags.writeable
    with pytest.raises(ValueError, match="dtype object is not supported"):
        pack({"x": np.array([None], dtype=object)})
    forged = msgpack_numpy.packb({"x": np.zeros(2, np.float32)}).replace(b"<f4", b"|O8")
    with pytest.raises(ValueError, match="not supported"):
        unpack(forged)


class _OpenPIStyleServer:
    """A server written only with openpi-client's msgpack_numpy and websockets, as openpi's own server is."""

    def __init__(self):
        self.port, self.seen = None, []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    async def _main(self):
        import websockets.asyncio.server as ws_server

        self._stop = asyncio.Event()

        async def handler(ws):
            packer = msgpack_numpy.Packer()
            await ws.send(packer.pack({"action_dim": 2}))
            async for message in ws:
                obs = msgpack_numpy.unpackb(message)
                self.seen.append(obs)
                actions = np.tile(obs["observation/state"], (6, 1)) * np.arange(1, 7)[:, None]  # (6, 2) float64
                await ws.send(packer.pack({"actions": actions}))

        self._loop = asyncio.get_running_loop()
        async with ws_server.serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as srv:
            self.port = srv.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop.wait()

    def stop(self):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def test_openpi_remote_policy_maps_keys_batches_and_cuts_the_chunk():
    srv = _OpenPIStyleServer()
    key_map = {
        "observation.state": "observation/state",
        "observation.images.front": "observation/image",
        "task": "prompt",
    }
    try:
        with pytest.raises(ValueError, match="pass spec=PolicySpec"):
            OpenPIRemotePolicy(f"ws://127.0.0.1:{srv.port}", timeout_s=5)
        policy = OpenPIRemotePolicy(f"ws://127.0.0.1:{srv.port}", SPEC, key_map, timeout_s=5)
        assert policy.metadata == {"action_dim": 2}
        policy.update_observation(
            {
                "observation.state": np.array([[1, 2], [3, 4]], np.float32),
                "observation.images.front": np.zeros((2, 8, 8, 3), np.uint8),
                "task": ["a", "b"],
            }
        )
        chunk = policy.predict_action_chunk()
        assert chunk.shape == (2, 4, 2) and chunk.dtype == np.float32  # 6 steps cut to chunk_size 4
        np.testing.assert_array_equal(chunk[1, :, 1], [4, 8, 12, 16])
        assert [o["prompt"] for o in srv.seen] == ["a", "b"]
        assert srv.seen[0]["observation/image"].shape == (8, 8, 3)  # unbatched, openpi's convention
        only = policy.predict_action_chunk([1])  # one row: one request, for episode 1
        assert only.shape == (1, 4, 2) and len(srv.seen) == 3 and srv.seen[2]["prompt"] == "b"
        np.testing.assert_array_equal(only[0], chunk[1])
        policy.close()
    finally:
        srv.stop()


def test_openpi_remote_policy_against_our_server_reads_the_spec(server):
    policy = OpenPIRemotePolicy(
        f"ws://127.0.0.1:{server.port}",
        key_map={"observation.images.front": "observation/image", "task": "prompt"},
        timeout_s=5,
    )
    assert policy.spec == SPEC
    policy.update_observation(
        {
            "observation.state": np.array([[1, 1]], np.float32),
            "observation.images.front": np.full((1, 8, 8, 3), 2, np.uint8),
            "task": ["go"],
        }
    )
    np.testing.assert_array_equal(policy.predict_action_chunk()[0, :, 0], [3, 4, 5, 6])
    with pytest.raises(ObservationError, match=r"expected shape \(B, 2\), received \(1, 3\)"):  # checked locally
        policy.update_observation(
            {
                "observation.state": np.array([[1, 1, 1]], np.float32),
                "observation.images.front": np.zeros((1, 8, 8, 3), np.uint8),
                "task": ["go"],
            }
        )
    policy.close()


def test_openpi_server_error_reaches_remote_policy_as_remote_error(server):
    policy = OpenPIRemotePolicy(
        f"ws://127.0.0.1:{server.port}",
        SPEC.__class__({"observation.state": FeatureSpec("float32", (2,))}, SPEC.action, chunk_size=4),
        timeout_s=5,
    )
    policy.update_observation({"observation.state": np.array([[1, 1]], np.float32)})  # no image, no prompt
    with pytest.raises(RemoteError, match="(?s)infer_failed: invalid_field: .*observation.images.front: missing"):
        policy.predict_action_chunk()
