"""What a process tree listens on: tests assert that polyrl opens no port beyond loopback by
default (the local Ray cluster, its workers, torch.distributed)."""

from __future__ import annotations

import ipaddress

import psutil


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def non_loopback_listeners(root_pid: int) -> list[str]:
    """``"<process name> (pid) on <ip>:<port>"`` for each TCP socket that ``root_pid`` or any of
    its descendants listens on at an address other than loopback (the wildcard included)."""
    root = psutil.Process(root_pid)
    pids = {root_pid, *(child.pid for child in root.children(recursive=True))}
    found = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN or conn.pid not in pids:
            continue
        if not _is_loopback(conn.laddr.ip):
            try:
                name = psutil.Process(conn.pid).name()
            except psutil.Error:
                name = "?"
            found.append(f"{name} ({conn.pid}) on {conn.laddr.ip}:{conn.laddr.port}")
    return sorted(found)
