"""Headless Chromium driven over the Chrome DevTools Protocol, with the standard library only.

    with Browser() as browser:
        page = browser.page()
        page.navigate("http://127.0.0.1:9464/#/")
        page.wait_for("window.fitrunPage.view === 'list'", 10, "the job list")
        page.screenshot("list.png")

Browser starts Debian's chromium (--headless=new, no sandbox: the tests run as root) on a port of its
choosing with a throwaway profile, and kills its whole process group on close. Page speaks CDP over
a small WebSocket client (RFC 6455: masked client frames, fragments, ping/pong, close) to one tab.
"""

import base64
import http.client
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.parse


class CdpError(Exception):
    """A CDP command failed, the browser went away, or a page-side condition never held."""


class WebSocket:
    """A blocking WebSocket client connection: enough of RFC 6455 for DevTools (text messages)."""

    def __init__(self, url, timeout=30.0):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "ws":
            raise CdpError(f"{url}: only ws:// URLs")
        self._sock = socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        # No Origin header: Chromium refuses DevTools WebSockets from origins it was not told to allow.
        request = (f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
        self._sock.sendall(request.encode())
        self._buffer = b""
        head = self._read_until(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status + b" ":
            raise CdpError(f"WebSocket handshake with {url} refused: {status.decode(errors='replace')}")

    def _read_until(self, marker):
        while marker not in self._buffer:
            self._fill()
        head, self._buffer = self._buffer.split(marker, 1)
        return head

    def _fill(self):
        chunk = self._sock.recv(1 << 16)
        if not chunk:
            raise CdpError("the browser closed the DevTools connection")
        self._buffer += chunk

    def _read_exact(self, n):
        while len(self._buffer) < n:
            self._fill()
        data, self._buffer = self._buffer[:n], self._buffer[n:]
        return data

    def _send_frame(self, opcode, payload):
        header = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", n)
        mask = os.urandom(4)
        self._sock.sendall(header + mask + _mask(payload, mask))

    def send(self, text):
        self._send_frame(0x1, text.encode())

    def recv(self, timeout):
        """The next whole text message; CdpError when none arrives within `timeout` seconds."""
        self._sock.settimeout(timeout)
        message, opcode = b"", None
        try:
            while True:
                first, second = self._read_exact(2)
                fin, op = first & 0x80, first & 0x0F
                n = second & 0x7F
                if n == 126:
                    n = struct.unpack("!H", self._read_exact(2))[0]
                elif n == 127:
                    n = struct.unpack("!Q", self._read_exact(8))[0]
                mask = self._read_exact(4) if second & 0x80 else None
                payload = self._read_exact(n)
                if mask:
                    payload = _mask(payload, mask)
                if op == 0x8:
                    raise CdpError("the browser closed the DevTools connection")
                if op == 0x9:
                    self._send_frame(0xA, payload)
                    continue
                if op == 0xA:
                    continue
                if op in (0x1, 0x2):
                    message, opcode = payload, op
                elif op == 0x0:
                    message += payload
                if fin and opcode is not None:
                    return message.decode()
        except socket.timeout:
            raise CdpError(f"no DevTools message within {timeout} s") from None

    def close(self):
        try:
            self._send_frame(0x8, struct.pack("!H", 1000))
        except OSError:
            pass
        self._sock.close()


def _mask(payload, mask):
    # XOR with the repeated 4-byte mask through one big integer: fast enough for multi-MB frames.
    repeated = (mask * (len(payload) // 4 + 1))[:len(payload)]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(len(payload), "big")


class Page:
    """One browser tab over its own DevTools WebSocket. Events that arrive while a command waits for
    its answer are kept in `events` (method, params), oldest first."""

    def __init__(self, ws_url):
        self._ws = WebSocket(ws_url)
        self._next_id = 0
        self.events = []

    def call(self, method, timeout=30.0, **params):
        """Sends one CDP command and returns its result; CdpError with the protocol's message if it fails."""
        self._next_id += 1
        command_id = self._next_id
        self._ws.send(json.dumps({"id": command_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self._ws.recv(max(0.1, deadline - time.monotonic())))
            if message.get("id") == command_id:
                if "error" in message:
                    raise CdpError(f"{method}: {message['error'].get('message')} {message['error'].get('data', '')}".strip())
                return message.get("result", {})
            if "method" in message:
                self.events.append((message["method"], message.get("params", {})))

    def wait_event(self, method, timeout=30.0):
        """Waits for (and consumes) the first `method` event, including ones already received."""
        deadline = time.monotonic() + timeout
        while True:
            for i, (name, params) in enumerate(self.events):
                if name == method:
                    del self.events[i]
                    return params
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CdpError(f"no {method} within {timeout} s")
            message = json.loads(self._ws.recv(remaining))
            if "method" in message:
                self.events.append((message["method"], message.get("params", {})))

    def set_viewport(self, width, height):
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def navigate(self, url, timeout=30.0):
        """Loads `url` and waits for its load event; a change of the fragment alone (one hash route to
        another) loads nothing, so it returns at once."""
        self.call("Page.enable")
        self.events = [e for e in self.events if e[0] != "Page.loadEventFired"]
        result = self.call("Page.navigate", url=url)
        if result.get("errorText"):
            raise CdpError(f"navigating to {url}: {result['errorText']}")
        if result.get("loaderId"):  # omitted for a same-document navigation
            self.wait_event("Page.loadEventFired", timeout)

    def evaluate(self, expression, timeout=30.0):
        """The value of a JavaScript expression in the page (JSON-serialisable; promises awaited)."""
        result = self.call("Runtime.evaluate", timeout=timeout, expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CdpError(f"evaluating {expression!r}: {text}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression, timeout, what):
        """Polls `expression` until it is truthy and returns its value; CdpError naming `what` if it
        is not within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise CdpError(f"timed out after {timeout} s waiting for {what} ({expression} was {value!r})")
            time.sleep(0.1)

    def screenshot(self, path, full_page=False, selector=None, margin=0):
        """Saves a PNG of the viewport, of the whole page (full_page), or of the first element matching
        the CSS `selector` and `margin` pixels around it to `path`; returns its size in bytes."""
        params = {"format": "png"}
        clip = None
        if selector:
            clip = self.evaluate(
                f"(() => {{ const r = document.querySelector({json.dumps(selector)}).getBoundingClientRect(), m = {margin};"
                " return {x: Math.max(0, r.left + scrollX - m), y: Math.max(0, r.top + scrollY - m),"
                " width: r.width + 2 * m, height: r.height + 2 * m}; })()")
        elif full_page:
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"]}
        if clip:
            params["captureBeyondViewport"] = True
            params["clip"] = dict(clip, scale=1)
        data = base64.b64decode(self.call("Page.captureScreenshot", timeout=60, **params)["data"])
        with open(path, "wb") as f:
            f.write(data)
        return len(data)

    def close(self):
        self._ws.close()


class Browser:
    """A headless Chromium of our own: its profile in a temporary directory, its DevTools port chosen
    by itself (read from its stderr), its process group killed on close."""

    def __init__(self, binary="/usr/bin/chromium", width=1280, height=900, timeout=60.0):
        self.width, self.height = width, height
        self._profile = tempfile.mkdtemp(prefix="chromium-", dir=os.environ.get("TEST_TMPDIR"))
        self._pages = []
        self._stderr = []
        self.process = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
             f"--user-data-dir={self._profile}", f"--window-size={width},{height}", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--mute-audio",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        try:
            self.ws_url = self._read_devtools_url(timeout)
            self.port = urllib.parse.urlsplit(self.ws_url).port
            # Chromium must never block on a full stderr pipe; keep its lines for error messages.
            threading.Thread(target=self._drain_stderr, daemon=True).start()
        except BaseException:
            self.close()
            raise

    def _read_devtools_url(self, timeout):
        deadline = time.monotonic() + timeout
        fd = self.process.stderr.fileno()
        pending = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if not ready:
                if self.process.poll() is not None:
                    break
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                text = line.decode(errors="replace")
                self._stderr.append(text)
                if text.startswith("DevTools listening on "):
                    return text[len("DevTools listening on "):].strip()
        raise CdpError("chromium did not report its DevTools address:\n" + "\n".join(self._stderr[-20:]))

    def _drain_stderr(self):
        for line in self.process.stderr:
            self._stderr.append(line.decode(errors="replace").rstrip())
            del self._stderr[:-200]

    def stderr_tail(self, lines=20):
        return "\n".join(self._stderr[-lines:])

    def targets(self):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            connection.request("GET", "/json/list")
            response = connection.getresponse()
            return json.loads(response.read())
        finally:
            connection.close()

    def page(self):
        """The tab Chromium opened on about:blank, connected and sized to the browser's viewport."""
        deadline = time.monotonic() + 30
        while True:
            pages = [t for t in self.targets() if t.get("type") == "page" and t.get("webSocketDebuggerUrl")]
            if pages:
                break
            if time.monotonic() > deadline:
                raise CdpError("chromium has no page target")
            time.sleep(0.1)
        page = Page(pages[0]["webSocketDebuggerUrl"])
        self._pages.append(page)
        page.set_viewport(self.width, self.height)
        return page

    def close(self):
        for page in self._pages:
            try:
                page.close()
            except OSError:
                pass
        # The whole group: the renderer and utility processes outlive a browser process that exited.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self.process.stderr.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
