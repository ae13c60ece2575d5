"""A small gRPC server for the kubelet's calls: HTTP/2 (PyPI's and Debian's ``h2``) on Unix sockets.

grpcio's Python server wakes its polling thread five times a second to look for signals, which
cost an idle plugin 2.4–2.7 s of CPU per hour. This one blocks in ``selectors`` with no timeout:
idle, it does not run at all. It serves what the kubelet calls: unary methods and server-streaming
ones (the health stream), messages in gRPC's length-prefixed framing, (de)serialised by the message
classes of ponytail.dra.protos; no compression (the kubelet sends none), no TLS (a Unix socket).

One thread runs the event loop and owns every HTTP/2 connection. A call runs in a worker thread of a
small pool; what it answers comes back to the loop through a queue and a wake-up socket. A stream a
client cancels (RST_STREAM, or its connection closed) ends its call at the next message it yields,
or when ``on_cancel`` (which the caller gives to wake a waiting stream) lets it see ``is_active()``.
"""

from __future__ import annotations

import os
import queue
import selectors
import socket
import struct
import threading
import urllib.parse
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
from google.protobuf.message import DecodeError

OK, UNKNOWN, INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL = 0, 2, 3, 8, 12, 13
MAX_MESSAGE = 4 << 20  # gRPC's default limit on a received message
READ_SIZE = 65536


class Context:
    """What a call may ask about its stream: whether the client still wants it."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def is_active(self) -> bool:
        return not self.cancelled.is_set()


@dataclass
class _Method:
    request: Any  # message class
    function: Callable[[Any, Context], Any]
    streaming: bool


@dataclass
class _Stream:
    path: str = ""
    body: bytearray = field(default_factory=bytearray)
    context: Context = field(default_factory=Context)
    pending: bytearray = field(default_factory=bytearray)  # response bytes waiting for the client's flow-control window
    end_after: list | None = None  # trailers to send once ``pending`` is out
    started: bool = False
    sent_headers: bool = False


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.h2.initiate_connection()
        self.streams: dict[int, _Stream] = {}


class Server:
    def __init__(self, workers: int = 8, on_cancel: Callable[[], None] | None = None) -> None:
        self.methods: dict[str, _Method] = {}
        self.listeners: list[socket.socket] = []
        self.selector = selectors.DefaultSelector()
        self.pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc-call")
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()  # (connection, stream id, kind, value) from the calls
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.on_cancel = on_cancel or (lambda: None)
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.connections: dict[socket.socket, _Connection] = {}

    def add_method(self, service: str, name: str, request: Any, function: Callable[[Any, Context], Any], streaming: bool) -> None:
        """Serve ``/service/name``: ``function(request, context)`` returns the response message, or (``streaming``) yields them."""
        self.methods[f"/{service}/{name}"] = _Method(request, function, streaming)

    def bind(self, path: str) -> None:
        """Listen on the Unix socket ``path`` (an old file there is replaced)."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.listen(16)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self.listeners.append(sock)

    def start(self) -> None:
        for sock in self.listeners:
            self.selector.register(sock, selectors.EVENT_READ, "listen")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.thread = threading.Thread(target=self._loop, name="grpc", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        """Close the sockets, cancel the streams, and end the loop (calls in flight finish in their threads)."""
        self.stopping = True
        self._wake()
        if self.thread is not None:
            self.thread.join(5)
        self.pool.shutdown(wait=False)

    # -- the loop ----------------------------------------------------------------------------------

    def _wake(self) -> None:
        try:
            self.wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # already awake (a full buffer), or closed

    def _loop(self) -> None:
        try:
            while not self.stopping:
                for key, _ in self.selector.select():  # no timeout: an idle server sleeps here
                    if key.data == "listen":
                        self._accept(key.fileobj)  # type: ignore[arg-type]
                    elif key.data == "wake":
                        try:
                            while self.wake_r.recv(4096):
                                pass
                        except BlockingIOError:
                            pass
                    else:
                        self._receive(key.data)
                self._drain_outbox()
        finally:
            for conn in list(self.connections.values()):
                self._close(conn)
            for sock in self.listeners:
                self.selector.unregister(sock)
                sock.close()
            self.selector.close()
            self.wake_r.close()
            self.wake_w.close()

    def _accept(self, listener: socket.socket) -> None:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(False)
        conn = _Connection(sock)
        self.connections[sock] = conn
        self.selector.register(sock, selectors.EVENT_READ, conn)
        self._flush(conn)

    def _receive(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        try:
            events = conn.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._flush(conn)
            self._close(conn)
            return
        for event in events:
            self._on_event(conn, event)
        self._flush(conn)

    def _on_event(self, conn: _Connection, event: Any) -> None:
        if isinstance(event, h2.events.RequestReceived):
            headers = dict(event.headers)
            conn.streams.setdefault(event.stream_id, _Stream()).path = headers.get(b":path", b"").decode("utf-8", "replace")
        elif isinstance(event, h2.events.DataReceived):
            receiving = conn.streams.get(event.stream_id)
            conn.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if receiving is None:
                return
            receiving.body += event.data
            if len(receiving.body) > MAX_MESSAGE + 5:
                self._finish(conn, event.stream_id, RESOURCE_EXHAUSTED, f"a request larger than {MAX_MESSAGE} bytes")
        elif isinstance(event, h2.events.StreamEnded):
            self._call(conn, event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            self._forget(conn, event.stream_id)
        elif isinstance(event, h2.events.WindowUpdated):
            for stream_id in list(conn.streams) if event.stream_id == 0 else [event.stream_id]:
                self._send_pending(conn, stream_id)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._close(conn)

    def _call(self, conn: _Connection, stream_id: int) -> None:
        stream = conn.streams.get(stream_id)
        if stream is None or stream.started:
            return
        stream.started = True
        method = self.methods.get(stream.path)
        if method is None:
            self._finish(conn, stream_id, UNIMPLEMENTED, f"unknown method {stream.path}")
            return
        body = bytes(stream.body)
        if len(body) < 5 or body[0] != 0 or struct.unpack(">I", body[1:5])[0] != len(body) - 5:
            self._finish(conn, stream_id, INVALID_ARGUMENT, "one uncompressed message expected")
            return

        try:
            request = method.request.FromString(body[5:])
        except DecodeError as e:
            self._finish(conn, stream_id, INVALID_ARGUMENT, f"cannot parse the request: {e}")
            return
        self.pool.submit(self._run, conn, stream_id, method, request, stream.context)

    def _run(self, conn: _Connection, stream_id: int, method: _Method, request: Any, context: Context) -> None:
        """A worker thread: the call, its answers posted to the loop."""
        try:
            if method.streaming:
                for response in method.function(request, context):
                    if not context.is_active():
                        return
                    self._post(conn, stream_id, "message", response.SerializeToString())
                self._post(conn, stream_id, "end", (OK, ""))
            else:
                response = method.function(request, context)
                self._post(conn, stream_id, "message", response.SerializeToString())
                self._post(conn, stream_id, "end", (OK, ""))
        except Exception as e:  # noqa: BLE001 - a call's failure is the client's error, never the server's end
            self._post(conn, stream_id, "end", (UNKNOWN, f"{type(e).__name__}: {e}"))

    def _post(self, conn: _Connection, stream_id: int, kind: str, value: Any) -> None:
        self.outbox.put((conn, stream_id, kind, value))
        self._wake()

    def _drain_outbox(self) -> None:
        touched = set()
        while True:
            try:
                conn, stream_id, kind, value = self.outbox.get_nowait()
            except queue.Empty:
                break
            if conn.sock not in self.connections or stream_id not in conn.streams:
                continue  # closed or cancelled meanwhile
            if kind == "message":
                self._message(conn, stream_id, value)
            else:
                self._finish(conn, stream_id, *value)
            touched.add(conn)
        for conn in touched:
            self._flush(conn)

    # -- sending -----------------------------------------------------------------------------------

    def _headers(self, conn: _Connection, stream_id: int) -> None:
        stream = conn.streams[stream_id]
        if not stream.sent_headers:
            conn.h2.send_headers(stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
            stream.sent_headers = True

    def _message(self, conn: _Connection, stream_id: int, payload: bytes) -> None:
        self._headers(conn, stream_id)
        conn.streams[stream_id].pending += b"\0" + struct.pack(">I", len(payload)) + payload
        self._send_pending(conn, stream_id)

    def _finish(self, conn: _Connection, stream_id: int, status: int, message: str) -> None:
        stream = conn.streams.get(stream_id)
        if stream is None:
            return
        trailers = [(b"grpc-status", str(status).encode())]
        if message:
            trailers.append((b"grpc-message", urllib.parse.quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode()))
        if not stream.sent_headers:  # no message: a trailers-only response
            try:
                conn.h2.send_headers(stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc"), *trailers], end_stream=True)
            except h2.exceptions.H2Error:
                pass
            self._forget(conn, stream_id)
            return
        stream.end_after = trailers
        self._send_pending(conn, stream_id)

    def _send_pending(self, conn: _Connection, stream_id: int) -> None:
        stream = conn.streams.get(stream_id)
        if stream is None:
            return
        try:
            while stream.pending:
                size = min(len(stream.pending), conn.h2.local_flow_control_window(stream_id), conn.h2.max_outbound_frame_size)
                if size <= 0:
                    return  # the rest when the client's window opens (WindowUpdated)
                conn.h2.send_data(stream_id, bytes(stream.pending[:size]))
                del stream.pending[:size]
            if stream.end_after is not None:
                conn.h2.send_headers(stream_id, stream.end_after, end_stream=True)
                self._forget(conn, stream_id)
        except h2.exceptions.H2Error:  # the stream closed under us
            self._forget(conn, stream_id)

    def _forget(self, conn: _Connection, stream_id: int) -> None:
        stream = conn.streams.pop(stream_id, None)
        if stream is not None and not stream.context.cancelled.is_set():
            stream.context.cancelled.set()
            self.on_cancel()

    def _flush(self, conn: _Connection) -> None:
        data = conn.h2.data_to_send()
        if not data:
            return
        try:
            conn.sock.setblocking(True)  # small frames to a local client: written whole
            conn.sock.settimeout(10)
            conn.sock.sendall(data)
        except OSError:
            self._close(conn)
        finally:
            if conn.sock.fileno() >= 0:
                conn.sock.setblocking(False)

    def _close(self, conn: _Connection) -> None:
        if self.connections.pop(conn.sock, None) is None:
            return
        for stream_id in list(conn.streams):
            self._forget(conn, stream_id)
        try:
            self.selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
