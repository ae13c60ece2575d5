"""ponytail.dra.grpcserver against grpcio's own client (the kubelet's gRPC, in Go, speaks the same):
unary and streaming calls, a response larger than the client's first flow-control window, errors
(an unknown method, a request that is not a message, a call that raises), a stream the client
cancels, and a server that does not run at all while it waits."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ponytail.dra import protos
from ponytail.dra.grpcserver import Context, Server

REG = protos.load("pluginregistration.proto")
HEALTH = protos.load("dra_health.proto", "v1beta1")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Server, str, dict]]:
    grpc = pytest.importorskip("grpc")
    state: dict = {"cancelled": threading.Event(), "go": threading.Condition(), "sent": 0, "released": 0}

    def get_info(request: object, context: Context) -> object:
        return REG.PluginInfo(type="DRAPlugin", name="x" * state.get("name_size", 3), endpoint="/e", supported_versions=["v1"])

    def notify(request: object, context: Context) -> object:
        raise RuntimeError("refused on purpose")

    def watch(request: object, context: Context) -> Iterator[object]:
        while context.is_active():
            state["sent"] += 1
            yield HEALTH.NodeWatchResourcesResponse()
            with state["go"]:  # a release counted, not a bare notify: one sent before this wait is not lost
                state["go"].wait_for(lambda: state["released"] >= state["sent"] or not context.is_active(), 30)
        state["cancelled"].set()

    def wake() -> None:
        with state["go"]:
            state["go"].notify_all()

    server = Server(on_cancel=wake)
    server.add_method("pluginregistration.Registration", "GetInfo", REG.InfoRequest, get_info, False)
    server.add_method("pluginregistration.Registration", "NotifyRegistrationStatus", REG.RegistrationStatus, notify, False)
    server.add_method("v1beta1.DRAResourceHealth", "NodeWatchResources", HEALTH.NodeWatchResourcesRequest, watch, True)
    path = str(tmp_path / "s.sock")
    server.bind(path)
    server.start()
    channel = grpc.insecure_channel(f"unix://{path}")
    try:
        yield server, path, {"channel": channel, "grpc": grpc, **state, "state": state}
    finally:
        channel.close()
        server.stop()


def _unary(channel: object, path: str, request: object, response: object) -> object:
    call = channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=response.FromString)  # type: ignore[attr-defined]
    return call(request, timeout=10)


def test_a_unary_call_and_a_response_larger_than_the_first_flow_control_window(served: tuple[Server, str, dict]) -> None:
    _, _, t = served
    info = _unary(t["channel"], "/pluginregistration.Registration/GetInfo", REG.InfoRequest(), REG.PluginInfo)
    assert (info.type, info.name, list(info.supported_versions)) == ("DRAPlugin", "xxx", ["v1"])  # type: ignore[attr-defined]
    t["state"]["name_size"] = 300_000  # past HTTP/2's initial 65535-byte window: sent as the client opens it
    assert len(_unary(t["channel"], "/pluginregistration.Registration/GetInfo", REG.InfoRequest(), REG.PluginInfo).name) == 300_000  # type: ignore[attr-defined]


def test_errors_are_grpc_statuses(served: tuple[Server, str, dict]) -> None:
    _, _, t = served
    grpc = t["grpc"]
    with pytest.raises(grpc.RpcError) as unknown:
        _unary(t["channel"], "/pluginregistration.Registration/Nope", REG.InfoRequest(), REG.PluginInfo)
    assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
    raw = t["channel"].unary_unary("/pluginregistration.Registration/GetInfo")  # bytes through: not a message
    with pytest.raises(grpc.RpcError) as garbage:
        raw(b"\xff\xff\xff", timeout=10)
    assert garbage.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as failed:
        _unary(t["channel"], "/pluginregistration.Registration/NotifyRegistrationStatus", REG.RegistrationStatus(), REG.RegistrationStatusResponse)
    assert failed.value.code() == grpc.StatusCode.UNKNOWN and "refused on purpose" in failed.value.details()
    assert _unary(t["channel"], "/pluginregistration.Registration/GetInfo", REG.InfoRequest(), REG.PluginInfo).type == "DRAPlugin"  # type: ignore[attr-defined]


def test_a_cancelled_stream_ends_its_call(served: tuple[Server, str, dict]) -> None:
    _, _, t = served
    stream = t["channel"].unary_stream("/v1beta1.DRAResourceHealth/NodeWatchResources", request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=HEALTH.NodeWatchResourcesResponse.FromString)(HEALTH.NodeWatchResourcesRequest(), timeout=30)
    next(stream)
    with t["go"]:
        t["state"]["released"] += 1
        t["go"].notify_all()
    next(stream)
    stream.cancel()
    assert t["cancelled"].wait(10), "the call did not see the cancel"


def _switches(native_id: int) -> int:
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    return sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches:" in line)


def test_the_server_does_not_run_while_it_waits(served: tuple[Server, str, dict]) -> None:
    """With a connection and a stream open and nothing to say, its thread sleeps (grpcio's woke five times a second)."""
    server, _, t = served
    stream = t["channel"].unary_stream("/v1beta1.DRAResourceHealth/NodeWatchResources", request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=HEALTH.NodeWatchResourcesResponse.FromString)(HEALTH.NodeWatchResourcesRequest(), timeout=30)
    next(stream)
    time.sleep(0.3)
    assert server.thread is not None and server.thread.native_id is not None
    before = _switches(server.thread.native_id)
    time.sleep(1.5)
    assert _switches(server.thread.native_id) - before == 0
    stream.cancel()
