"""The peer tier's sharing side: what a client with trackers shares with other clients (its
serving cache, its ``PeerServer`` and announce loop: ``Sharing``) and its side of the
trackers (hello, heartbeat, locate, announce, report; every answer checked).  The fetching
side is ``blobsdk.tiers``' ``PeerTier``."""

from __future__ import annotations

from .server import PeerServer
from .sharing import Sharing
from .trackers import ConnectTrackers, TrackerClient, tracker_servers

__all__ = ["ConnectTrackers", "PeerServer", "Sharing", "TrackerClient", "tracker_servers"]
