"""Asking the GCS of a Ray cluster at ``host:port`` a question, without joining it.

``ray.init(address=...)`` cannot be bounded: at a port where something other than Ray listens it
retries for ever in native code, deaf to SIGTERM. One gRPC call to the cluster's GCS, with a
deadline, tells first whether Ray answers there at all, and what it says (the nodes' addresses,
what is still held) shapes how to join it and whether a finished run left anything behind.
The wait polls the call's future, so a stop signal is handled within a fraction of a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from polyrl.errors import PolyrlError

#: How often a pending call looks up from its wait (a stop signal is handled between two looks).
_POLL_S = 0.1


class NotRayError(PolyrlError):
    """Nothing at the address answered as a Ray cluster's GCS within the deadline."""


def _call(address: str, stub_name: str, method: str, request: Any, timeout_s: float) -> Any:
    """The reply of ``<stub_name>.<method>(request)`` at ``address``; :class:`NotRayError`
    when no Ray GCS answers within ``timeout_s``. An authentication refusal is Ray answering:
    the ``grpc.RpcError`` is raised for the caller to judge."""
    import grpc
    from ray.core.generated import gcs_service_pb2_grpc

    channel = grpc.insecure_channel(address)
    try:
        stub = getattr(gcs_service_pb2_grpc, stub_name)(channel)
        future = getattr(stub, method).future(request, timeout=timeout_s)
        try:
            while True:
                try:
                    return future.result(timeout=_POLL_S)
                except grpc.FutureTimeoutError:
                    continue
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise
            raise NotRayError(
                f"nothing at RAY_ADDRESS={address} answers as a Ray cluster within "
                f"{timeout_s:g} s ({exc.code().name.lower()}): give the address `ray start "
                f"--head` printed (its GCS port), or unset RAY_ADDRESS to start a local cluster"
            ) from None
        finally:
            future.cancel()
    finally:
        channel.close()


def alive_node_addresses(address: str, timeout_s: float) -> list[str] | None:
    """The addresses of the cluster's alive nodes (``node_manager_address``), or None when the
    cluster wants a token to say (it is Ray; ``ray.init`` then authenticates)."""
    import grpc
    from ray.core.generated import gcs_pb2, gcs_service_pb2

    try:
        reply = _call(
            address,
            "NodeInfoGcsServiceStub",
            "GetAllNodeInfo",
            gcs_service_pb2.GetAllNodeInfoRequest(),
            timeout_s,
        )
    except grpc.RpcError:
        return None
    alive = gcs_pb2.GcsNodeInfo.GcsNodeState.ALIVE
    return [node.node_manager_address for node in reply.node_info_list if node.state == alive]


def held_by_jobs(address: str, timeout_s: float = 10.0) -> list[str]:
    """What the cluster's jobs still hold: live actors (by class) and placement groups that are
    not removed, one phrase each; empty when everything was released."""
    from ray.core.generated import gcs_pb2, gcs_service_pb2

    actors = _call(
        address,
        "ActorInfoGcsServiceStub",
        "GetAllActorInfo",
        gcs_service_pb2.GetAllActorInfoRequest(),
        timeout_s,
    ).actor_table_data
    groups = _call(
        address,
        "PlacementGroupInfoGcsServiceStub",
        "GetAllPlacementGroup",
        gcs_service_pb2.GetAllPlacementGroupRequest(),
        timeout_s,
    ).placement_group_table_data
    actor_done = gcs_pb2.ActorTableData.ActorState.DEAD
    group_done = gcs_pb2.PlacementGroupTableData.PlacementGroupState.REMOVED
    held = [f"actor {a.class_name}" for a in actors if a.state != actor_done]
    held += [
        f"placement group {g.placement_group_id.hex()[:8]}" for g in groups if g.state != group_done
    ]
    return held


def wait_until(check: Callable[[], bool], timeout_s: float, every_s: float = 0.5) -> bool:
    """Whether ``check()`` became true within ``timeout_s`` (polled; signals are handled)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)
    return True
