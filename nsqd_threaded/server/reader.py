"""The connection thread's reader: a buffered socket reader with nsqd's line limit.

It owns the read side of one TCP connection: the read deadline (enforced by
the kernel through SO_RCVTIMEO), the heartbeat ticker while no pump runs,
parking with the :class:`~nsqd_threaded.server.idle.IdleWatcher` after
:data:`~nsqd_threaded.server.idle.IDLE_AFTER` quiet seconds, and decoding
through TLS or compression once negotiated.
"""

import select
import socket
import sys
import time

from ..internal.dial import timeval as _timeval
from ..wire import protocol_v2
from ..wire.transport import TransportError
from .idle import IDLE_AFTER, REPARK_AFTER, TIMED_OUT, WOKEN, WOKEN_UNCOUNTED


class ConnectionEnded(Exception):
    """EOF, a read error or timeout, or an over-long line: close without an error frame."""


class WouldWait(Exception):
    """A command run without waiting (:attr:`Reader.holding`) needs bytes that have not
    arrived: the caller rewinds it (:meth:`Reader.rewind_command`) and runs it where it may wait."""


# The receive chunk: small while a connection is idle (thousands of consumers
# each hold one), doubled while recvs come back full (a publisher streaming
# commands), sized up to a large body's length while reading it, and shrunk
# back once recvs come back small again.
MIN_CHUNK = 4096
MAX_LINE = protocol_v2.MAX_LINE
_monotonic = time.monotonic
MAX_CHUNK = 262144
_decode_size_from = protocol_v2.decode_size_from
_MSG_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_FIN_LINE = protocol_v2.FIN_LINE
_fin_one = protocol_v2.FIN_ONE.match


class Reader:
    """A buffered reader over a socket with nsqd's 16 KiB line limit.

    Used by the connection thread only.
    """

    __slots__ = (  # (one per connection, read on every command: see Client.__slots__)
        "_sock", "_recv_into", "_connection", "_ticker", "_tick_at", "_buf", "_pos", "_command_timeout",
        "_deadline", "_timeout", "_lazy_timeout", "_idle", "_hangup", "_holds_permit", "_chunk", "_last_recv",
        "_decode", "_layers", "_command_start", "holding", "_readable", "drained",
    )

    def __init__(self, sock, idle_watcher=None, connection=None, ticker=None, hangup=None):
        """``connection``: an object whose ``disconnected`` attribute turns true once the
        connection is being closed (read before each recv and each decode: a stream that
        inflates to gigabytes from what is already received must not outlive the broker).

        ``ticker(now)``: called with ``time.monotonic()`` once the time it last
        returned has come (and whenever the command timeout changes: IDENTIFY
        may change the heartbeat interval); it sends a heartbeat if one is
        due and returns when to call it next, or None for never (the pump
        sends them now, or heartbeats are off).  Without a command timeout (no
        heartbeats) it is not called.

        ``hangup``: given to the idle watcher with each park (see
        :meth:`IdleWatcher.park <nsqd_threaded.server.idle.IdleWatcher.park>`):
        the watcher calls it when the peer has closed the parked connection.
        """
        self._sock = sock
        # What _fill receives with: the socket's recv_into, or once after a long park _recv_or_park.
        self._recv_into = sock.recv_into
        self._connection = connection
        self._ticker = ticker
        self._tick_at = 0.0 if ticker is not None else None  # when to call the ticker next
        self._buf = bytearray()
        self._pos = 0
        # The command deadline (see set_command_timeout): each command's seconds, and when the
        # one being read must be in (None until its first recv: read_command clears it).
        self._command_timeout = None
        self._deadline = None
        if sock.gettimeout() is not None:  # (an accepted socket is blocking already: no syscall then)
            sock.settimeout(None)  # blocking: deadlines are the kernel's (see set_command_timeout)
        self._timeout = None  # the socket's (SO_RCVTIMEO/SO_SNDTIMEO) now: the command's, or what is left of it
        # The polled model (no watcher, no ticker) reads between commands without waiting: the
        # socket gets the command timeout only when a recv may wait (_fill) or an upgrade writes
        # (arm_timeout), not with each change of the heartbeat interval: two setsockopt calls
        # fewer per change, twice per connection (its first command and its IDENTIFY).
        self._lazy_timeout = idle_watcher is None and ticker is None
        # With a watcher, a recv also times out after IDLE_AFTER seconds and
        # the thread parks there (see nsqd_threaded.server.idle).
        self._idle = idle_watcher
        self._hangup = hangup
        self._holds_permit = False
        if idle_watcher is not None:
            self._set_timeout(None)
        # recv_into one reused buffer: recv(n) would allocate n bytes per call.
        self._chunk = bytearray(MIN_CHUNK)
        self._last_recv = 0  # bytes the last recv returned
        # Socket bytes -> command bytes once TLS or compression is negotiated
        # (see nsqd_threaded.wire.transport); None on a plain connection.
        self._decode = None
        self._layers = None  # the Transport behind _decode
        # The polled model: where the last polled command's line starts.
        self._command_start = 0
        # While True (set by the polled model's caller, around one command: an attribute, not a
        # method, as it is set twice per command), the command just polled runs without waiting: a
        # read that needs bytes not yet arrived raises WouldWait, and every byte from the command's
        # line on stays buffered, so that rewind_command can give it back whole.
        self.holding = False
        self._readable = None  # a poll object for the socket, once wait_for_command needs one
        # The last recv of this serve took less than it could, or nothing: the socket is drained,
        # so the next poll_command need not ask again (the caller clears it as a serve begins),
        # and a poller that parks the connection knows that what comes next is an edge of its own.
        self.drained = False

    def set_command_timeout(self, seconds):
        """Each command's line and body must arrive within ``seconds`` of its start (None or 0: no limit).

        nsqd sets one read deadline before each command (2 x heartbeat
        interval; none when heartbeats are off), so a client trickling bytes
        cannot extend it.  Here a command's deadline starts with the first
        recv it needs (:meth:`read_command` clears it; a command already
        buffered needs none, and one that is not starts its recv at once), and
        is enforced by the kernel (SO_RCVTIMEO/SO_SNDTIMEO on a blocking
        socket: no poll() before every recv and send, unlike a Python socket
        timeout), lowered only for a command that has used half its time.
        """
        if seconds is not None and seconds <= 0:
            seconds = None
        if self._ticker is not None:
            self._tick_at = 0.0  # the heartbeat interval may have changed: ask the ticker again
        self._command_timeout = seconds
        self._deadline = None
        if self._timeout != seconds and not self._lazy_timeout:
            self._set_timeout(seconds)

    def arm_timeout(self):
        """Give the socket the command timeout now, for blocking I/O that is not this reader's
        recv (an IDENTIFY upgrade's writes and TLS handshake): the polled model sets it lazily."""
        if self._timeout != self._command_timeout:
            self._set_timeout(self._command_timeout)

    def read_command(self):
        """Start a command (its deadline) and return its line's params, split as nsqd splits them
        (see :func:`~nsqd_threaded.wire.protocol_v2.parse_line`, inline here: once per command)."""
        self._deadline = None
        buf = self._buf
        pos = self._pos
        if pos == len(buf):  # drained (one command at a time): nothing to search before the recv
            self._fill()
            buf = self._buf
            pos = self._pos
        while True:
            i = buf.find(b"\n", pos, pos + MAX_LINE)
            if i >= 0:
                break
            if len(buf) - pos >= MAX_LINE:
                raise ConnectionEnded("line longer than %d bytes" % MAX_LINE)
            self._fill()
            buf = self._buf
            pos = self._pos
        self._pos = i + 1
        if i > pos and buf[i - 1] == 13:  # one trailing \r is dropped
            i -= 1
        return bytes(buf[pos:i]).split(b" ")

    def poll_command(self):
        """The next command's params if its whole line is buffered or arrives without waiting;
        None (nothing consumed) when the connection has nothing more for now.

        The polled model's :meth:`read_command`: a connection between commands
        waits in the poller, not in a recv.  The command's deadline, for a
        body still to come, starts with the body's first blocking recv.
        """
        buf = self._buf
        pos = self._pos
        i = buf.find(b"\n", pos, pos + MAX_LINE) if pos < len(buf) else -1
        while i < 0:
            if len(buf) - pos >= MAX_LINE:
                raise ConnectionEnded("line longer than %d bytes" % MAX_LINE)
            if self.drained and not (self._layers is not None and self._layers.pending()):
                return None  # (the socket had no more a moment ago: the poller hears of what comes next)
            if not self._fill(nowait=True):
                return None
            buf = self._buf
            pos = self._pos
            i = buf.find(b"\n", pos, pos + MAX_LINE)
        self._deadline = None
        self._command_start = pos
        self._pos = i + 1
        if i > pos and buf[i - 1] == 13:  # one trailing \r is dropped
            i -= 1
        return bytes(buf[pos:i]).split(b" ")

    def recv_fin_nowait(self):
        """One recv that does not wait (see :meth:`poll_command`), shaped for a consumer at RDY 1,
        whose recv brings one ``FIN`` line at a time.

        Answers the message ID (bytes) when the recv brought exactly one plain FIN line
        (:data:`protocol_v2.FIN_ONE`) and nothing else: it is consumed, nothing is left
        buffered and the socket is drained.  Otherwise what came stays buffered, and the answer
        is False when nothing was there, True when something was.  (:meth:`_fill`'s case of a
        plain connection with nothing buffered, whose last recv did not fill the chunk, inline.)
        """
        chunk = self._chunk
        if (self._decode is not None or self.holding or self._pos != len(self._buf)
                or self._last_recv == len(chunk) or len(chunk) > MIN_CHUNK):
            return self._fill(nowait=True)
        connection = self._connection
        if connection is not None and connection.disconnected:
            raise ConnectionEnded("closed by the broker")
        try:
            n = self._sock.recv_into(chunk, 0, _MSG_DONTWAIT)
        except BlockingIOError:
            self.drained = True
            return False
        except (OSError, ValueError) as e:  # reset, closed
            raise ConnectionEnded(str(e)) from None
        self._last_recv = n
        if n == _FIN_LINE:
            m = _fin_one(chunk, 0, n)
            if m is not None:  # (nothing buffered before it, nothing after: _buf and _pos stand)
                self.drained = True
                return m.group(1)
        elif not n:
            raise ConnectionEnded("EOF")
        if n < len(chunk):
            self.drained = True
            self._buf = chunk[:n]
        else:
            self.drained = False
            self._buf = bytearray(chunk)
        self._pos = 0
        return True

    def rewind_command(self):
        """Unread the command last polled (its line and whatever of its body was read)."""
        self._pos = self._command_start

    def _set_timeout(self, seconds):
        tv = _timeval(seconds)
        recv_seconds = seconds
        # Parking (or, without a watcher, a heartbeat) needs the recv to come
        # back after IDLE_AFTER seconds of nothing.
        if (self._idle is not None or self._ticker is not None) and (seconds is None or seconds > IDLE_AFTER):
            recv_seconds = IDLE_AFTER
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(recv_seconds))
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)  # the pump's writes too
        self._timeout = seconds

    def wait_for_command(self, seconds):
        """The polled model's short wait for a connection's next command, in one recv: True when
        bytes (or the connection's end) came within ``seconds``, False when nothing did.

        A worker that has served what arrived calls it before it parks the
        connection: a client that waits for each answer (a durable PUB waits for
        its fsync) sends the next command a round trip later.  The wait is the
        kernel's (SO_RCVTIMEO, set to ``seconds`` and left so: the next command
        that needs a waiting recv sets its own deadline again, and a polled
        connection's sends never wait), so no poll() precedes the recv.  After a
        command that waited for its body (an MPUB's), the next one likely will
        too, with the command's timeout: a poll() then, not two setsockopt calls
        per command to move the timeout back and forth.
        """
        if self._layers is not None and self._layers.pending():
            return True
        if self._deadline is not None and self._timeout != seconds:
            readable = self._readable
            if readable is None:
                readable = self._readable = select.poll()
                readable.register(self._sock.fileno(), select.POLLIN)
            return bool(readable.poll(seconds * 1000))
        if self._timeout != seconds:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(seconds))
            self._timeout = seconds
        try:
            return self._fill(within=True)
        except ConnectionEnded:
            return True  # (the serve that follows finds the end again, and ends the connection)

    def _fill(self, missing=0, nowait=False, within=False):
        """One recv; ``missing`` is how many more bytes the caller is known to need.

        ``nowait``: a recv that does not wait (the polled model between
        commands): answers False when nothing was there, True otherwise.
        ``within``: a recv that waits only as long as SO_RCVTIMEO says (see
        :meth:`wait_for_command`), answering the same way.
        """
        connection = self._connection
        if connection is not None and connection.disconnected:
            raise ConnectionEnded("closed by the broker")
        timeout = self._command_timeout
        late = False  # the deadline passed: only what the kernel already holds may still be read
        if timeout is None:
            if self._timeout is not None and not nowait and not within:
                self._set_timeout(None)  # (no limit: not wait_for_command's short one)
        elif not nowait and not within:
            now = _monotonic()
            deadline = self._deadline
            if deadline is None:  # the command's first recv: its deadline starts now, all of it left
                self._deadline = now + timeout
                if self._timeout != timeout:  # (lowered for the last command)
                    self._set_timeout(timeout)
            else:
                remaining = deadline - now
                if remaining <= 0:
                    late = self._deadline_passed(now)
                    remaining = self._deadline - now
                if not late and remaining < self._timeout * 0.5:
                    self._set_timeout(remaining)
            tick_at = self._tick_at
            if tick_at is not None and now >= tick_at:
                self._tick_at = self._ticker(now)
        layers = self._layers
        if layers is not None and layers.pending():
            # A large inflate stopped at its limit: its input is already here.
            self._append_decoded(b"", lambda _: layers.drain())
            return True
        chunk = self._chunk
        size = len(chunk)
        last = self._last_recv
        if last == size or missing > size:  # (the usual command needs neither: one test)
            if size < MAX_CHUNK:  # a large body, or a stream: fewer, larger recvs
                chunk = self._chunk = bytearray(min(MAX_CHUNK, 2 * size if last == size else missing))
        elif size > MIN_CHUNK and missing <= MIN_CHUNK and last < size // 8:
            chunk = self._chunk = bytearray(MIN_CHUNK)  # quiet again: give the memory back
        holding = self.holding
        try:
            if nowait or holding or late:
                n = self._sock.recv_into(chunk, 0, _MSG_DONTWAIT)
            elif within:
                n = self._sock.recv_into(chunk)
            else:
                n = self._recv_into(chunk)
        except BlockingIOError:  # SO_RCVTIMEO: idle, or the deadline passed (or _recv_or_park found nothing)
            if nowait or within:
                self.drained = True  # (nothing there: as drained as a short recv leaves it)
                return False
            if late:
                raise ConnectionEnded("i/o timeout") from None
            if holding:
                raise WouldWait() from None
            n = self._recv_after_idle(chunk)
        except (OSError, ValueError) as e:  # reset, closed
            raise ConnectionEnded(str(e)) from None
        if not n:
            raise ConnectionEnded("EOF")
        self._last_recv = n
        self.drained = n < len(chunk)
        if self._decode is not None:
            self._append_decoded(memoryview(chunk)[:n])
            return True
        if holding:
            self._buf += memoryview(chunk)[:n]  # (the held command's bytes must stay where they are)
            return True
        if self._pos == len(self._buf):
            # Drained: a fresh buffer rather than a resized one, so that one
            # large body's allocation is not kept for the connection's life.
            self._buf = chunk[:n] if n < len(chunk) else bytearray(chunk)
            self._pos = 0
            return True
        if self._pos > 65536:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += memoryview(chunk)[:n]
        return True

    def _append_decoded(self, data, decode=None):
        """Decode ``data`` into the buffer (maybe nothing yet: a partial record or frame)."""
        try:
            data = (decode or self._decode)(data)
        except TransportError as e:
            raise ConnectionEnded(str(e)) from None
        if not data:
            return
        if not self.holding and (self._pos > 65536 or self._pos == len(self._buf)):
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def set_decoder(self, decode, layer_decode=None, layers=None):
        """Read through ``decode`` from now on.

        ``layer_decode`` is the newly added layer alone: the bytes already
        buffered (received before the upgrade, but after the IDENTIFY that
        asked for it) are fed through it, so nothing a client sent early is
        lost and nothing decodable is left undecoded.
        """
        self._decode = decode
        self._layers = layers
        if layer_decode is not None:
            rest = bytes(self._buf[self._pos :])
            self._buf = bytearray()
            self._pos = 0
            self._append_decoded(rest, layer_decode)

    def take_buffered(self):
        """Remove and return the unread bytes (the start of a TLS handshake)."""
        rest = bytes(self._buf[self._pos :])
        self._buf = bytearray()
        self._pos = 0
        return rest

    def _deadline_passed(self, now):
        """Whether the command's deadline has passed at ``now`` (it has come: called then).

        Not while a heartbeat that went out late (the connection's
        ``late_heartbeat_at``) has had less than its interval to be answered:
        the deadline moves to then.  On time, a heartbeat never moves it (the
        deadline is nsqd's: twice the interval after the command's start).
        """
        connection = self._connection
        interval = self._command_timeout / 2  # (the command timeout is two heartbeat intervals)
        late = getattr(connection, "late_heartbeat_at", None)
        if (late is None or late + interval <= self._deadline) and connection is not None:
            overdue = getattr(connection, "heartbeat_overdue", None)
            if overdue is not None and overdue(now):
                late = now  # (another thread is about to send it: count it from now)
        if late is not None and late + interval > self._deadline:
            self._deadline = late + interval
        return now >= self._deadline

    def _recv_late(self, chunk):
        """The deadline passed: what the kernel already holds arrived while this thread was late to
        read it, and is read; nothing there is the timeout (ConnectionEnded)."""
        try:
            return self._sock.recv_into(chunk, 0, _MSG_DONTWAIT)
        except BlockingIOError:
            raise ConnectionEnded("i/o timeout") from None
        except (OSError, ValueError) as e:
            raise ConnectionEnded(str(e)) from None

    def _recv_after_idle(self, chunk):
        """The recv timed out: park with the idle watcher (without one: recv
        again) until readable, sending heartbeats as they fall due; then recv
        (ConnectionEnded at the deadline).

        A connection parked for :data:`~nsqd_threaded.server.idle.REPARK_AFTER`
        seconds or more is taken to be idle still after what woke it (most
        often the NOP answering a heartbeat): its next recv does not wait
        IDLE_AFTER seconds in the kernel before parking again, but parks at
        once if nothing is there (:meth:`_recv_or_park`).  Otherwise a tenth of
        the idle consumers of a 5-second heartbeat would be blocked in recv at
        any moment, each waking on its own when the peers go away together."""
        idle = self._idle
        parked_at = _monotonic() if idle is not None else None
        while True:
            wait = None
            tick_at = None
            if self._deadline is not None:
                now = _monotonic()
                wait = self._deadline - now
                if wait <= 0:
                    if self._deadline_passed(now):
                        return self._recv_late(chunk)
                    wait = self._deadline - now
                tick_at = self._tick_at
                if tick_at is not None and now >= tick_at:
                    tick_at = self._tick_at = self._ticker(now)
                if self._connection is not None and self._connection.disconnected:
                    raise ConnectionEnded("closed by the broker")  # the heartbeat's write failed
                if tick_at is not None and tick_at - now < wait:
                    wait = tick_at - now
                else:
                    tick_at = None
            if idle is None:
                woken = WOKEN_UNCOUNTED  # the blocking recv waits, for IDLE_AFTER seconds at most
            else:
                woken = idle.park(self._sock.fileno(), wait, self._hangup)
                if woken == TIMED_OUT:
                    now = _monotonic()
                    if tick_at is not None and now >= tick_at:
                        continue  # a heartbeat is due, not the deadline
                    if self._deadline is not None and now >= self._deadline:
                        continue  # the deadline: checked above (a late heartbeat moves it; bytes here are read)
                    raise ConnectionEnded("i/o timeout")  # (the watcher is stopping)
            counted = woken == WOKEN
            try:
                n = self._sock.recv_into(chunk)
            except BlockingIOError:
                if counted:
                    idle.resumed()
                continue  # not readable after all (a spurious wake-up): park again
            except (OSError, ValueError) as e:
                self._holds_permit = counted
                raise ConnectionEnded(str(e)) from None
            if not n:
                # The connection ends: the permit is kept through its teardown
                # (see close), so a mass close is torn down a few at a time.
                self._holds_permit = counted
                return n
            if counted:
                idle.resumed()
            if parked_at is not None and _monotonic() - parked_at >= REPARK_AFTER:
                self._recv_into = self._recv_or_park
            return n

    def _recv_or_park(self, chunk):
        """One recv that does not wait (BlockingIOError when nothing is there: the caller parks);
        the recvs after it wait as usual."""
        recv_into = self._recv_into = self._sock.recv_into
        return recv_into(chunk, 0, _MSG_DONTWAIT)

    def close(self):
        """The connection is torn down: return a permit kept since its last recv."""
        if self._holds_permit:
            self._holds_permit = False
            self._idle.resumed()

    def memory(self):
        """Bytes held by this reader's buffers (for tests and diagnostics).

        CPython's ``getsizeof`` includes a bytearray's spare capacity; PyPy has
        no ``getsizeof``, and its length is the best estimate there.
        """
        try:
            held = sys.getsizeof(self._buf)
        except TypeError:  # PyPy
            held = len(self._buf)
        return len(self._chunk) + held

    def readline(self):
        """One line without its ``\\n``."""
        buf = self._buf
        pos = self._pos
        while True:
            i = buf.find(b"\n", pos, pos + MAX_LINE)
            if i >= 0:
                self._pos = i + 1
                return bytes(buf[pos:i])
            if len(buf) - pos >= MAX_LINE:
                raise ConnectionEnded("line longer than %d bytes" % MAX_LINE)
            self._fill()
            buf = self._buf
            pos = self._pos

    def has_partial(self):
        """True if bytes of a command not yet complete are buffered (no I/O)."""
        return self._pos < len(self._buf)

    def has_line(self):
        """True if a complete line is already buffered (no I/O)."""
        return self._buf.find(b"\n", self._pos, self._pos + protocol_v2.MAX_LINE) >= 0

    def read(self, n):
        while len(self._buf) - self._pos < n:
            self._fill(n - (len(self._buf) - self._pos))
        data = bytes(self._buf[self._pos : self._pos + n])
        self._pos += n
        return data

    def ensure(self, n):
        """Buffer at least ``n`` unread bytes; returns (buffer, position)."""
        while len(self._buf) - self._pos < n:
            self._fill(n - (len(self._buf) - self._pos))
        return self._buf, self._pos

    def take_body(self, limit):
        """A PUB's size and body when both are buffered whole and ``0 < size <= limit``: the body
        (a bytearray), consumed; None otherwise, with nothing consumed (the step-by-step path
        then reads them, and reports what is wrong in nsqd's order)."""
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 4:
            return None
        size = _decode_size_from(buf, pos)[0]
        start = pos + 4
        end = start + size
        if size <= 0 or size > limit or end > len(buf):
            return None
        self._pos = end
        return buf[start:end]

    def buffered(self):
        return self._buf, self._pos, len(self._buf)

    def preload(self, data):
        """Bytes that came before any command was read (what followed the protocol magic in the
        poller's first recv): the first commands' start."""
        self._buf += data

    def advance(self, pos):
        self._pos = pos


