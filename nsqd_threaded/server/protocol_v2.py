"""The V2 protocol loop of one TCP connection: read a command, execute it, answer.

This mirrors nsqd's protocol_v2.go: one method per command, each performing
its checks in nsqd's order so that the first failing check produces exactly
nsqd's error.  Reading is done here, command by command, because nsqd's error
order interleaves validation with reading (a PUB with a bad topic fails before
its body is read).  Everything that can be computed without I/O lives in
:mod:`nsqd_threaded.wire.protocol_v2`; the socket's reads and writes are
:mod:`nsqd_threaded.server.connection`'s.
"""

import functools
import ssl
import threading
import time
import traceback

from ..broker import auth
from ..broker.channel import ChannelError, FinishError
from ..broker.client import STATE_CLOSING, STATE_INIT, STATE_SUBSCRIBED
from ..broker.topic import TopicError
from ..internal import gocompat
from ..internal.gocompat import go_quote
from ..wire import protocol_v2, transport
from ..wire.protocol_v2 import ProtocolError, text
from . import auth_query
from .reader import ConnectionEnded, Reader, WouldWait


class ProtocolV2:
    """Executes one client's commands.  Runs on the connection thread."""

    __slots__ = (  # (one per connection, read on every command: see Client.__slots__)
        "nsqd", "options", "client", "limits", "_valid_topics", "transport", "_topics", "_auth_enabled",
        "_tls_gate", "_hb", "waits", "_waits_with_lookupds", "reader",
    )

    def __init__(self, nsqd, client, sock, limits=None):
        """``limits``: the listener's LimitReporter, told of a pump thread that could not start."""
        self.nsqd = nsqd
        self.options = nsqd.options
        self.client = client
        self.limits = limits
        # The hangup closes over nsqd and client, not self (a cycle would wait for a full collection).
        if client.polled:  # (the poller's timers send its heartbeats; it never parks a thread)
            self.reader = Reader(sock, None, client)
        else:
            self.reader = Reader(sock, nsqd.idle_watcher, client, client.tick_heartbeat,
                                 lambda: leave_on_hangup(nsqd, client))
        self._valid_topics = {}  # raw name -> str, for names already validated
        self.transport = None  # the TLS/compression layers, once IDENTIFY has negotiated one
        self._topics = {}  # name -> Topic
        self._auth_enabled = bool(self.options.auth_http_addresses)
        self._tls_gate = bool(self.options.tls_required)
        self._hb = None  # the heartbeat interval the command timeout was last set for
        # The commands the poller never runs itself (see serve_ready): those that may wait on
        # something other than the client's bytes: AUTH's auth server; IDENTIFY's TLS handshake
        # (with a TLS context); SUB's auth server, a durable queue's creation, or nsqlookupd's
        # channel query for a new topic (with lookupds, which /config may add: see _waiting_commands);
        # a publish's auth server or durable sync.
        waits = {b"AUTH"}
        if nsqd.tls_context is not None:
            waits.add(b"IDENTIFY")
        if self._auth_enabled or nsqd.options.durable:
            waits.update((b"SUB",) + _PUBLISH)
        self.waits = frozenset(waits)
        self._waits_with_lookupds = self.waits | {b"SUB"}
        # (a partial over the limits, not a closure over self or client: no reference cycle)
        client.pump_refused = functools.partial(refuse_pump, limits)

    def io_loop(self):
        """Serve commands until the connection ends or a fatal error is sent (the connection's own thread)."""
        read_command = self.reader.read_command
        execute = self.execute
        try:
            while True:
                self.between_commands()
                if not execute(read_command()):
                    return
        except ConnectionEnded as e:
            self.nsqd.log.debug("%r: connection closed - %s", self.client, e)

    def serve_ready(self, inline, limit, drained=False):
        """Serve the commands that have arrived, without waiting for more (the polled model).

        ``inline``: the caller is the poller, which must never wait: a command
        that may (see :attr:`waits`), or that finds its body incomplete, is
        given back whole and :data:`NEEDS_THREAD` answered.  At most ``limit``
        commands are served.  Answers :data:`WAIT_INPUT` (nothing more to read
        now), :data:`WAIT_OUTPUT` (the client is not reading its answers: stop
        reading until they are written), :data:`NEEDS_THREAD`, :data:`MORE`
        (the limit was reached) or :data:`ENDED` (the connection is done).
        ``drained``: the caller's recv has just drained the socket (what it read is buffered), so
        nothing is asked of it before what is buffered is served.
        """
        reader = self.reader
        client = self.client
        execute = self.execute
        waits = self._waits_with_lookupds if self.options.nsqlookupd_tcp_addresses else self.waits
        poll_command = reader.poll_command
        reader.drained = drained  # (woken for input: ask the socket, unless the caller just did)
        # (between_commands and the backlog's test inline, each a test of its own: once per command)
        try:
            for _ in range(limit):
                if client.pump_deferred or client.heartbeat_interval != self._hb:
                    self.between_commands()
                if client.output_backlog is not None and client.output_backlogged() and not client.disconnected:
                    return WAIT_OUTPUT
                params = poll_command()
                if params is None:
                    return WAIT_INPUT
                if not inline:
                    if not execute(params):
                        return ENDED
                    continue
                if params[0] in waits:
                    reader.rewind_command()
                    return NEEDS_THREAD
                reader.holding = True  # (see Reader.holding)
                try:
                    if not execute(params):
                        return ENDED
                except WouldWait:
                    reader.rewind_command()
                    return NEEDS_THREAD
                finally:
                    reader.holding = False
            return MORE
        except ConnectionEnded as e:
            self.nsqd.log.debug("%r: connection closed - %s", client, e)
            return ENDED

    def serve_fins(self):
        """:meth:`serve_ready`'s common case for a consumer, alone (the poller, inline): what
        arrives is a run of plain FINs and nothing more, as from a consumer at RDY 1, which
        sends one per message.  Answers :data:`WAIT_INPUT` once they are finished and nothing
        else is there; None otherwise (:meth:`serve_ready` then serves what is buffered: the rest
        of the line, or whatever follows the FINs finished here).
        """
        client = self.client
        if (client.state != STATE_SUBSCRIBED or client.pump_deferred or client.heartbeat_interval != self._hb
                or client.output_backlog is not None or (self._tls_gate and not client.tls)):
            return None
        reader = self.reader
        try:
            got = reader.recv_fin_nowait()
        except ConnectionEnded as e:
            _, pos, end = reader.buffered()
            if pos != end:
                return None  # (serve_ready serves what came before the end, meets it again and ends)
            self.nsqd.log.debug("%r: connection closed - %s", client, e)  # (a hang-up: no second recv)
            return ENDED
        if got is False:
            return None
        if got is not True:  # one FIN and nothing else, as from a consumer at RDY 1, consumed
            try:
                client.channel.finish_one(client, got)
            except FinishError as e:
                if not client.send(self._fin_failures(e)):
                    return ENDED
            return WAIT_INPUT
        buf, pos, end = reader.buffered()
        ids, stop = protocol_v2.fin_run(buf, pos)
        if not ids:
            return None
        reader.advance(stop)
        try:
            client.channel.finish_many(client, ids)
        except FinishError as e:
            if not client.send(self._fin_failures(e)):
                return ENDED
        return WAIT_INPUT if stop == end and reader.drained else None

    def between_commands(self):
        """Before each command: start a pump the last one made due, and follow the heartbeat interval."""
        client = self.client
        if client.pump_deferred:  # (the last command woke this consumer: see ClientConnection.wake)
            client.start_deferred_pump()
        if client.heartbeat_interval != self._hb:  # (the first command, or IDENTIFY changed it)
            hb = self._hb = client.heartbeat_interval
            self.reader.set_command_timeout(2 * hb if hb > 0 else None)

    def execute(self, params):
        """Run one command and write its answer; False when the connection must end (a fatal
        error was sent, or a write failed)."""
        client = self.client
        name = params[0]
        try:
            # --tls-required (true or tcp-https): until the connection has
            # upgraded, every command but IDENTIFY fails (fatally).
            if self._tls_gate and not client.tls and name != b"IDENTIFY":
                raise ProtocolError("E_INVALID", "cannot %s in current state (TLS required)" % text(name))
            handler = _COMMANDS.get(name)
            if handler is None:
                raise ProtocolError("E_INVALID", "invalid command %s" % text(name))
            response = handler(self, params)
        except ProtocolError as err:
            self.nsqd.log.debug("%r: %s %s", client, err.code, err.description)
            return client.send(protocol_v2.error_frame(err)) and not err.fatal
        return response is None or client.send(response)

    # -- helpers -----------------------------------------------------------

    def _read_size(self, code, what):
        try:
            return protocol_v2.decode_size(self.reader.read(4))
        except ConnectionEnded:
            raise ProtocolError(code, what) from None

    def _read_body(self, n, code, what):
        try:
            return self.reader.read(n)
        except ConnectionEnded:
            raise ProtocolError(code, what) from None

    def _subscribed_or_closing(self, cmd):
        if self.client.state not in (STATE_SUBSCRIBED, STATE_CLOSING):
            raise ProtocolError("E_INVALID", "cannot %s in current state" % cmd)

    def _message_id(self, raw):
        if len(raw) != protocol_v2.MSG_ID_LENGTH:
            raise ProtocolError("E_INVALID", "invalid message ID")
        return raw

    def _topic_name(self, raw, cmd, code_prefix=""):
        name = self._valid_topics.get(raw)
        if name is not None:
            return name
        if not protocol_v2.is_valid_name(raw):
            raise ProtocolError("E_BAD_TOPIC", "%s%s topic name %s is not valid" % (code_prefix, cmd, go_quote(raw)))
        name = raw.decode("ascii")
        if len(self._valid_topics) < 64:  # a producer publishes to a handful of topics
            self._valid_topics[raw] = name
        return name

    def _topic(self, name):
        """The topic, from a per-connection cache unless it has been deleted since."""
        topic = self._topics.get(name)
        if topic is None or topic.exiting:
            topic = self.nsqd.get_topic(name)
            if len(self._topics) < 64:
                self._topics[name] = topic
        return topic

    def _publish(self, cmd, topic_name, bodies, defer_ns=0):
        topic = self._topics.get(topic_name)
        if topic is None or topic.exiting:
            topic = self._topic(topic_name)
        try:
            topic.publish(bodies, defer_ns)
        except TopicError as e:
            raise ProtocolError("E_%s_FAILED" % cmd, "%s failed %s" % (cmd, e)) from None
        self.client.count_published(topic_name, len(bodies))
        return protocol_v2.OK_FRAME

    # -- commands ----------------------------------------------------------

    def NOP(self, params):
        return None

    def IDENTIFY(self, params):
        client = self.client
        if client.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot IDENTIFY in current state")
        size = self._read_size("E_BAD_BODY", "IDENTIFY failed to read body size")
        protocol_v2.check_body_size("IDENTIFY", size, self.options.max_body_size)
        body = self._read_body(size, "E_BAD_BODY", "IDENTIFY failed to read body")
        memo = self.nsqd.identify_memo
        known = memo.get(body)  # (a program's consumers identify alike: see IdentifyMemo)
        if known is None:
            fields = protocol_v2.decode_identify(body)
            client.set_identity(fields)  # (kept even if the settings are refused)
            settings = protocol_v2.negotiate_identify(fields, self.options, gocompat.ms(self.options.client_timeout))
            known = memo.add(body, fields, settings)
        fields = known.fields
        client.identify(fields, known.settings)
        if not fields.get("feature_negotiation"):
            return protocol_v2.OK_FRAME
        options = self.options
        tls_v1 = self.nsqd.tls_context is not None and bool(fields.get("tls_v1")) and not client.tls
        deflate = options.deflate and bool(fields.get("deflate"))
        level = protocol_v2.deflate_level(deflate, fields.get("deflate_level", 0), options.max_deflate_level)
        snappy = options.snappy and bool(fields.get("snappy"))
        if deflate and snappy:
            raise ProtocolError("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
        if client.transport is not None and client.transport.compression and (deflate or snappy):
            # A repeated IDENTIFY cannot stack a second compressor.
            deflate = snappy = False
        if not (tls_v1 or deflate or snappy):
            # (an answer that upgrades nothing, its deflate_level included, follows from the body and
            # the broker's options alone: the same bytes for every connection that sends this body)
            if known.answer is None:
                known.answer = protocol_v2.response_frame(protocol_v2.identify_response(
                    known.settings, options, deflate_level=level))
            return known.answer
        response = protocol_v2.response_frame(protocol_v2.identify_response(
            known.settings, options, tls_v1=tls_v1, deflate=deflate, snappy=snappy, deflate_level=level
        ))
        # nsqd's sequence: the JSON response in the clear, then each upgrade
        # followed by an OK frame sent through it.  All of it holds the write
        # lock, so no heartbeat slips in between with the wrong encoding.
        layers = self.transport or transport.Transport()
        tls_layer = transport.TLSLayer(self.nsqd.tls_context) if tls_v1 else None
        compressor = None
        if snappy:
            compressor = ("snappy", transport.SnappyDecoder(), transport.SnappyEncoder())
        elif deflate:
            compressor = ("deflate", transport.DeflateDecoder(), transport.DeflateEncoder(level))
        early = self.reader.take_buffered() if tls_v1 else b""  # a client may start its handshake early

        def negotiate(sock, send, install):
            send(response)
            if tls_layer is not None:
                transport.handshake(sock, tls_layer, early, time.monotonic() + transport.HANDSHAKE_TIMEOUT)
                layers.add_tls(tls_layer, threading.Lock())
                install(layers)
                send(protocol_v2.OK_FRAME)
            if compressor is not None:
                layers.add_compression(*compressor)
                install(layers)
                send(protocol_v2.OK_FRAME)

        self.reader.arm_timeout()  # (the upgrade's writes block: bounded as the command is)
        try:
            client.upgrade(negotiate)
        except (ssl.SSLError, TimeoutError) as e:
            raise ProtocolError("E_IDENTIFY_FAILED", "IDENTIFY failed %s" % transport.handshake_error(e)) from None
        except OSError as e:
            raise ConnectionEnded(str(e)) from None
        self.transport = layers
        decode = layers.decoder()
        if tls_layer is not None:
            self.reader.set_decoder(decode, layers.decrypt_layer(), layers)
        if compressor is not None:
            self.reader.set_decoder(decode, compressor[1].decode, layers)
        return None

    def AUTH(self, params):
        client = self.client
        if client.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot AUTH in current state")
        if len(params) != 1:
            raise ProtocolError("E_INVALID", "AUTH invalid number of parameters")
        size = self._read_size("E_BAD_BODY", "AUTH failed to read body size")
        protocol_v2.check_body_size("AUTH", size, self.options.max_body_size)
        secret = self._read_body(size, "E_BAD_BODY", "AUTH failed to read body")
        if client.has_authorizations():
            raise ProtocolError("E_INVALID", "AUTH already set")
        if not self._auth_enabled:
            raise ProtocolError("E_AUTH_DISABLED", "AUTH disabled")
        client.auth_secret = secret
        self._query_auth("AUTH failed")
        if not client.has_authorizations():
            raise ProtocolError("E_UNAUTHORIZED", "AUTH no authorizations found")
        return protocol_v2.response_frame(client.auth_state.response())

    def _query_auth(self, what):
        """Ask the auth server(s) with the client's secret; the reason is logged, never sent."""
        client = self.client
        remote_ip = client.remote_address.rpartition(":")[0].strip("[]")
        try:
            client.auth_state = auth_query.query_any(
                self.options, remote_ip, client.tls, client.auth_secret, client.tls_common_name, self.nsqd.log
            )
        except auth.AuthError as e:
            self.nsqd.log.warn("PROTOCOL(V2): [%r] %s %s", client, what, e)
            raise ProtocolError("E_AUTH_FAILED", "AUTH failed") from None

    def _check_auth(self, cmd, topic_name, channel_name=""):
        """SUB/PUB/MPUB/DPUB with auth enabled: the cached answer (asked again once expired) must allow it."""
        client = self.client
        if not client.has_authorizations():
            raise ProtocolError("E_AUTH_FIRST", "AUTH required before %s" % cmd)
        if client.auth_state.expired():
            self._query_auth("auth failed -")
        if not client.auth_state.is_allowed(topic_name, channel_name):
            raise ProtocolError(
                "E_UNAUTHORIZED", "AUTH failed for %s on %s %s" % (cmd, go_quote(topic_name), go_quote(channel_name))
            )

    def SUB(self, params):
        client = self.client
        if client.state != STATE_INIT:
            raise ProtocolError("E_INVALID", "cannot SUB in current state")
        if client.heartbeat_interval <= 0:
            raise ProtocolError("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise ProtocolError("E_INVALID", "SUB insufficient number of parameters")
        topic_name = self._topic_name(params[1], "SUB")
        if not protocol_v2.is_valid_name(params[2]):
            raise ProtocolError("E_BAD_CHANNEL", "SUB channel name %s is not valid" % go_quote(params[2]))
        channel_name = params[2].decode("ascii")
        if self._auth_enabled:
            self._check_auth("SUB", topic_name, channel_name)
        try:
            channel = self.nsqd.subscribe(client, topic_name, channel_name)
        except (ChannelError, TopicError) as e:
            raise ProtocolError("E_SUB_FAILED", "SUB failed %s" % e) from None
        client.subscribe(topic_name, channel)
        return protocol_v2.OK_FRAME

    def RDY(self, params):
        client = self.client
        if client.state == STATE_CLOSING:
            return None
        if client.state != STATE_SUBSCRIBED:
            raise ProtocolError("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            count = protocol_v2.parse_uint(params[1])
            if count is None:
                raise ProtocolError("E_INVALID", "RDY could not parse count %s" % text(params[1]))
            count = protocol_v2.int64(count)
        if not 0 <= count <= self.options.max_rdy_count:
            raise ProtocolError("E_INVALID", "RDY count %d out of range 0-%d" % (count, self.options.max_rdy_count))
        client.set_ready(count)  # (a pump due if there is something to pump: io_loop starts it next; ClientConnection.wake)
        return None

    def FIN(self, params):
        # (_subscribed_or_closing and _message_id, inline: once per message)
        if self.client.state not in (STATE_SUBSCRIBED, STATE_CLOSING):
            raise ProtocolError("E_INVALID", "cannot FIN in current state")
        if len(params) < 2:
            raise ProtocolError("E_INVALID", "FIN insufficient number of params")
        if len(params[1]) != protocol_v2.MSG_ID_LENGTH:
            raise ProtocolError("E_INVALID", "invalid message ID")
        ids = [params[1]]
        # Batch the FINs already buffered behind this one: one channel lock
        # acquisition and at most one pump wake-up for the whole run.
        # A line that is not a plain FIN ends the run; it is parsed normally next.
        buf, pos, end = self.reader.buffered()
        if end > pos:  # (a FIN alone, as in a round trip, has nothing behind it)
            more, end = protocol_v2.fin_run(buf, pos)
            if more:
                ids += more
                self.reader.advance(end)
        try:
            self.client.channel.finish_many(self.client, ids)
        except FinishError as e:
            return self._fin_failures(e)
        return None

    @staticmethod
    def _fin_failures(e):
        """The answer to FINs that failed: each is answered (non-fatal), as nsqd answers each FIN."""
        return b"".join(
            protocol_v2.error_frame(ProtocolError("E_FIN_FAILED", "FIN %s failed %s" % (text(i), why)))
            for i, why in e.failures
        )

    def REQ(self, params):
        self._subscribed_or_closing("REQ")
        if len(params) < 3:
            raise ProtocolError("E_INVALID", "REQ insufficient number of params")
        msg_id = self._message_id(params[1])
        timeout_ms = protocol_v2.parse_uint(params[2])
        if timeout_ms is None:
            raise ProtocolError("E_INVALID", "REQ could not parse timeout %s" % text(params[2]))
        delay_ns = protocol_v2.int64(timeout_ms * 1000000)
        max_ns = gocompat.ns(self.options.max_req_timeout)
        if delay_ns < 0:
            delay_ns = 0
        elif delay_ns > max_ns:
            self.nsqd.log.info("%r: REQ timeout %d out of range 0-%d. Setting to max.", self.client, timeout_ms, max_ns // 1000000)
            delay_ns = max_ns
        try:
            self.client.channel.requeue(self.client, msg_id, delay_ns)
        except ChannelError as e:
            raise ProtocolError("E_REQ_FAILED", "REQ %s failed %s" % (text(msg_id), e)) from None
        return None

    def TOUCH(self, params):
        self._subscribed_or_closing("TOUCH")
        if len(params) < 2:
            raise ProtocolError("E_INVALID", "TOUCH insufficient number of params")
        msg_id = self._message_id(params[1])
        try:
            self.client.channel.touch(self.client, msg_id)
        except ChannelError as e:
            raise ProtocolError("E_TOUCH_FAILED", "TOUCH %s failed %s" % (text(msg_id), e)) from None
        return None

    def CLS(self, params):
        client = self.client
        if client.state != STATE_SUBSCRIBED:
            raise ProtocolError("E_INVALID", "cannot CLS in current state")
        client.start_close()
        return protocol_v2.CLOSE_WAIT_FRAME

    def PUB(self, params):
        if len(params) < 2:
            raise ProtocolError("E_INVALID", "PUB insufficient number of parameters")
        topic_name = self._valid_topics.get(params[1]) or self._topic_name(params[1], "PUB")
        # The common case first: size and body already buffered, the size valid.
        # Anything else takes the step-by-step path below, from the same position.
        body = self.reader.take_body(self.options.max_msg_size)
        if body is not None:  # (a bytearray: publish_one keeps it only inside a record)
            if self._auth_enabled:
                self._check_auth("PUB", topic_name)
            topic = self._topics.get(topic_name)
            if topic is None or topic.exiting:
                topic = self._topic(topic_name)
            try:
                topic.publish_one(body)
            except TopicError as e:
                raise ProtocolError("E_PUB_FAILED", "PUB failed %s" % e) from None
            counts = self.client.pub_counts  # (Client.count_published, inline: once per PUB)
            counts[topic_name] = counts.get(topic_name, 0) + 1
            return protocol_v2.OK_FRAME
        size = self._read_size("E_BAD_MESSAGE", "PUB failed to read message body size")
        protocol_v2.check_message_size("PUB", size, self.options.max_msg_size)
        body = self._read_body(size, "E_BAD_MESSAGE", "PUB failed to read message body")
        if self._auth_enabled:
            self._check_auth("PUB", topic_name)
        return self._publish("PUB", topic_name, [body])

    def DPUB(self, params):
        if len(params) < 3:
            raise ProtocolError("E_INVALID", "DPUB insufficient number of parameters")
        topic_name = self._topic_name(params[1], "DPUB")
        timeout_ms = protocol_v2.parse_uint(params[2])
        if timeout_ms is None:
            raise ProtocolError("E_INVALID", "DPUB could not parse timeout %s" % text(params[2]))
        # Go: the parsed uint64 wraps, and time.Duration(ms) * time.Millisecond
        # wraps in int64; the range check is on that duration, the text shows
        # the uint64.
        timeout_ms &= 0xFFFFFFFFFFFFFFFF
        defer_ns = protocol_v2.int64(timeout_ms * 1000000)
        max_ns = gocompat.ns(self.options.max_req_timeout)
        if not 0 <= defer_ns <= max_ns:
            raise ProtocolError(
                "E_INVALID", "DPUB timeout %d out of range 0-%d" % (timeout_ms, max_ns // 1000000)
            )
        size = self._read_size("E_BAD_MESSAGE", "DPUB failed to read message body size")
        protocol_v2.check_message_size("DPUB", size, self.options.max_msg_size)
        body = self._read_body(size, "E_BAD_MESSAGE", "DPUB failed to read message body")
        if self._auth_enabled:
            self._check_auth("DPUB", topic_name)
        return self._publish("DPUB", topic_name, [body], defer_ns)

    def MPUB(self, params):
        if len(params) < 2:
            raise ProtocolError("E_INVALID", "MPUB insufficient number of parameters")
        topic_name = self._topic_name(params[1], "MPUB", "E_BAD_TOPIC ")
        if self._auth_enabled:
            self._check_auth("MPUB", topic_name)  # before the body, unlike PUB/DPUB (as nsqd)
        self._topic(topic_name)  # nsqd creates the topic before reading the body
        body_size = self._read_size("E_BAD_BODY", "MPUB failed to read body size")
        protocol_v2.check_mpub_body_size(body_size, self.options.max_body_size)
        count = self._read_size("E_BAD_BODY", "MPUB failed to read message count")
        protocol_v2.check_mpub_count(count, self.options.max_body_size)
        # nsqd trusts the inner sizes, not body_size: parse item by item over
        # whatever is buffered, reading more only when an item is incomplete.
        bodies = []
        reader = self.reader
        max_msg_size = self.options.max_msg_size
        expected = body_size - 4  # (the items' bytes by body_size: a bound on the parser's copy)
        while len(bodies) < count:
            buf, pos, end = reader.buffered()
            parsed = protocol_v2.parse_mpub_messages(buf, pos, end, len(bodies), count, max_msg_size, bodies,
                                                     expected)
            expected -= parsed - pos
            pos = parsed
            reader.advance(pos)
            if len(bodies) == count:
                break
            index = len(bodies)
            buf, pos, end = reader.buffered()
            try:
                if end - pos < 4:
                    reader.ensure(4)
                else:
                    size = protocol_v2.decode_size(bytes(buf[pos : pos + 4]))
                    reader.ensure(4 + size)
            except ConnectionEnded:
                if end - pos < 4:
                    raise ProtocolError(
                        "E_BAD_MESSAGE", "MPUB failed to read message(%d) body size" % index
                    ) from None
                raise ProtocolError("E_BAD_MESSAGE", "MPUB failed to read message body") from None
        return self._publish("MPUB", topic_name, bodies)


# The commands by name (plain functions of (protocol, params): a table of bound methods held by
# the protocol would be a reference cycle, and every ended connection would wait for a full
# garbage collection, which an idle broker may never run).
_COMMANDS = {
    b"FIN": ProtocolV2.FIN,
    b"RDY": ProtocolV2.RDY,
    b"REQ": ProtocolV2.REQ,
    b"PUB": ProtocolV2.PUB,
    b"MPUB": ProtocolV2.MPUB,
    b"DPUB": ProtocolV2.DPUB,
    b"NOP": ProtocolV2.NOP,
    b"TOUCH": ProtocolV2.TOUCH,
    b"SUB": ProtocolV2.SUB,
    b"CLS": ProtocolV2.CLS,
    b"AUTH": ProtocolV2.AUTH,
    b"IDENTIFY": ProtocolV2.IDENTIFY,
}
_PUBLISH = (b"PUB", b"MPUB", b"DPUB")  # with auth (its answer may have expired) or a durable sync

# ProtocolV2.serve_ready's answers: what the connection waits for next.
WAIT_INPUT = "input"
WAIT_OUTPUT = "output"
NEEDS_THREAD = "thread"
MORE = "more"
ENDED = "ended"


def thread_refusal(reason="can't start new thread"):
    """The error frame that refuses a connection the host has no thread for (see docs/deploy.md)."""
    return protocol_v2.error_frame(ProtocolError("E_INVALID", "cannot start a client thread - %s" % reason))


def refuse_pump(limits, client, error):
    """A consumer's pump could not start (``error``: the RuntimeError of a host at its task limit):
    ``limits`` (the listener's LimitReporter, if any) hears of it and the client is told, as a
    connection is at accept; the caller (:meth:`ClientConnection.wake`) disconnects it."""
    if limits is not None:
        limits.hit("thread", "cannot start a client pump thread - %s" % error,
                   "raise the task limit (ulimit -u, systemd TasksMax, pids cgroup)")
    client.send(thread_refusal(str(error)))


def leave_on_hangup(nsqd, client):
    """The idle watcher saw this parked client's peer close: stop its pump and unsubscribe now.

    Runs on the watcher thread, so that after a mass disconnect every client
    leaves its channel in one pass instead of as its thread's turn comes; the
    connection thread's teardown (:func:`handle_connection`) repeats both
    steps, which then find nothing to do.  The watcher holds
    ``nsqd.teardown_lock`` meanwhile, taken once for all the hangups of its
    wake-up (the daemon makes its watcher so).  Never raises (the watcher must go on).
    """
    try:
        client.stop_pump(wake=False)  # (its connection thread's teardown wakes it)
        nsqd.remove_client(client)
    except Exception:  # noqa: BLE001 - logged; the connection thread's teardown still runs
        nsqd.log.error("client(%s): leaving on hangup failed\n%s", client, traceback.format_exc())


def handle_connection(nsqd, sock, address, limits=None):
    """Serve one accepted connection from its magic to its close (connection thread).

    ``limits`` (the listener's LimitReporter) hears of a pump thread that
    could not start (when the consumer first had something to pump); that client is
    refused with :func:`thread_refusal` and disconnected.
    """
    try:
        magic = b""
        while len(magic) < 4:
            chunk = sock.recv(4 - len(magic))
            if not chunk:
                return
            magic += chunk
    except OSError:
        return
    if magic != protocol_v2.MAGIC_V2:
        try:
            sock.sendall(protocol_v2.BAD_PROTOCOL_FRAME)
        except OSError:
            pass
        return
    client = nsqd.connect(sock, address)
    proto = None
    try:
        proto = ProtocolV2(nsqd, client, sock, limits)
        proto.io_loop()
    finally:
        tear_down(nsqd, client, proto)


def tear_down(nsqd, client, proto):
    """A connection ended: stop its pump, leave its channel, give back what its reader holds."""
    # One teardown at a time (see NSQD.teardown_lock): when thousands of
    # connections end together, their threads wait on this lock, outside
    # the contest for the GIL, instead of all contending at once.
    # No system call under the lock: after one, the thread must win the
    # GIL back, and under a busy broker that takes a switch interval
    # (5 ms) while every other teardown waits on the lock.
    with nsqd.teardown_lock:
        client.stop_pump()
        nsqd.remove_client(client)
    if client.has_pump():
        client.close_connection()  # ends a pump blocked in a send
        client.join_pump()  # outside the lock: the pump needs its turn at the GIL to end
    if proto is not None:
        proto.reader.close()
    if nsqd.idle_watcher is not None:
        nsqd.idle_watcher.connection_closed()
