"""A tiny Chrome DevTools Protocol client for the dashboard test: starts Debian's headless Chromium on loopback and
drives one page over the DevTools websocket (websocket-client). No browser is downloaded: it runs /usr/bin/chromium
(or $CHROMIUM), so a machine without it skips the tests that need it.

  with Browser(tmp_path) as b:          chromium --headless=new --remote-debugging-port=0, its own profile dir
      b.navigate("http://127.0.0.1:p/")  Page.navigate, then waits for the load event
      b.eval("document.title")           Runtime.evaluate (awaits promises, returns by value, raises on a throw)
      b.wait_for("expr", timeout)        polls an expression until it is truthy (bounded)
      b.errors()                         console errors, uncaught exceptions and Log errors seen so far
      b.responses("re")                  (method, url, status) of the page's requests whose URL matches
      b.screenshot(path)                 Page.captureScreenshot as a PNG file

Invariants: every wait is bounded; the browser runs in its own process group, which __exit__ kills (SIGKILL after
a short SIGTERM grace) whatever happened, and its profile dir is removed; the DevTools port is read from the
DevToolsActivePort file Chromium writes into the profile dir, so no port is guessed.
"""
import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

import websocket

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


class CDPError(RuntimeError):
    pass


def chromium_path():
    """The Chromium binary, or None when it is not installed."""
    return CHROMIUM if os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK) else None


class Browser:
    def __init__(self, tmp, width=1400, height=1000, start_timeout=30):
        self.tmp = str(tmp)
        self.width, self.height = width, height
        self.start_timeout = start_timeout
        self.proc = None
        self.ws = None
        self.profile = None
        self.log_path = None
        self._id = 0
        self.events = []  # every event received, in order: {"method", "params"}

    # -- lifecycle
    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _start(self):
        self.profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=self.tmp)
        self.log_path = os.path.join(self.tmp, "chromium.log")
        args = [chromium_path() or CHROMIUM, "--headless=new", "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1", f"--user-data-dir={self.profile}",
                f"--window-size={self.width},{self.height}", "--no-first-run", "--no-default-browser-check",
                "--disable-gpu", "--disable-extensions", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-default-apps", "--disable-domain-reliability", "--no-pings",
                "--metrics-recording-only", "--mute-audio", "--hide-scrollbars", "--disable-dev-shm-usage"]
        if os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium refuses to start as root with its sandbox
        args.append("about:blank")
        self._logf = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self._logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        active = os.path.join(self.profile, "DevToolsActivePort")
        end = time.monotonic() + self.start_timeout
        port = None
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise CDPError(f"chromium exited with status {self.proc.returncode}\n{self.log()}")
            try:
                with open(active) as f:
                    lines = f.read().split("\n")
                if lines and lines[0].strip().isdigit():
                    port = int(lines[0])
                    break
            except OSError:
                pass
            time.sleep(0.05)
        if port is None:
            raise CDPError(f"chromium wrote no DevToolsActivePort within {self.start_timeout} s\n{self.log()}")
        self.port = port
        ws_url = None
        while time.monotonic() < end and ws_url is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as r:
                    targets = json.loads(r.read())
                pages = [t for t in targets if t.get("type") == "page" and t.get("webSocketDebuggerUrl")]
                if pages:
                    ws_url = pages[0]["webSocketDebuggerUrl"]
            except OSError:
                pass
            if ws_url is None:
                time.sleep(0.05)
        if ws_url is None:
            raise CDPError(f"chromium listed no page target within {self.start_timeout} s\n{self.log()}")
        # Chromium refuses DevTools websockets that carry an Origin header unless --remote-allow-origins names it
        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height, deviceScaleFactor=1,
                  mobile=False)

    def close(self):
        if self.ws is not None:
            try:
                self.ws.close()
            except Exception:
                pass
            self.ws = None
        if self.proc is not None and self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self.proc is not None:
            try:  # the renderer and GPU helpers share the group; the main process may have gone first
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if getattr(self, "_logf", None):
            self._logf.close()
            self._logf = None
        if self.profile:
            shutil.rmtree(self.profile, ignore_errors=True)
            self.profile = None

    def log(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-4000:].decode("utf-8", "replace")
        except (OSError, TypeError):
            return ""

    # -- the protocol
    def _recv(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            raise CDPError("timed out waiting for a DevTools message")
        self.ws.settimeout(max(left, 0.01))
        try:
            msg = json.loads(self.ws.recv())
        except websocket.WebSocketTimeoutException:
            raise CDPError("timed out waiting for a DevTools message") from None
        if "method" in msg and "id" not in msg:
            self.events.append(msg)
        return msg

    def call(self, method, timeout=30, **params):
        """Send one command and return its result; a protocol error raises CDPError. Events that arrive meanwhile
        are kept in self.events."""
        self._id += 1
        mid = self._id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = self._recv(deadline)
            if msg.get("id") == mid:
                if "error" in msg:
                    raise CDPError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def pump(self, seconds):
        """Read events for a while (nothing else to do meanwhile)."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                self._recv(deadline)
        except CDPError:
            pass

    def eval(self, expr, timeout=30):
        r = self.call("Runtime.evaluate", timeout=timeout, expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            desc = (d.get("exception") or {}).get("description") or d.get("text")
            raise CDPError(f"evaluating {expr[:200]!r} threw: {desc}")
        return r.get("result", {}).get("value")

    def navigate(self, url, timeout=30):
        n = len(self.events)
        r = self.call("Page.navigate", url=url)
        if r.get("errorText"):
            raise CDPError(f"navigating to {url}: {r['errorText']}")
        deadline = time.monotonic() + timeout
        while not any(e["method"] == "Page.loadEventFired" for e in self.events[n:]):
            self._recv(deadline)

    def reload(self, timeout=30):
        n = len(self.events)
        self.call("Page.reload", ignoreCache=True)
        deadline = time.monotonic() + timeout
        while not any(e["method"] == "Page.loadEventFired" for e in self.events[n:]):
            self._recv(deadline)

    def wait_for(self, expr, timeout=20, interval=0.1, what=None):
        """Poll a JS expression until it is truthy; return its value, or raise CDPError naming what was awaited."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = self.eval(expr)
            if last:
                return last
            self.pump(interval)
        raise CDPError(f"timed out after {timeout} s waiting for {what or expr!r} (last value {last!r})")

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path

    def responses(self, url_re, since=0):
        """(method, url, status) of each request the page made whose URL matches url_re and that got a response."""
        import re
        methods, out = {}, []
        for e in self.events[since:]:
            p = e["params"]
            if e["method"] == "Network.requestWillBeSent":
                methods[p["requestId"]] = p["request"]["method"]
            elif e["method"] == "Network.responseReceived" and re.search(url_re, p["response"]["url"]):
                out.append((methods.get(p["requestId"], "?"), p["response"]["url"], p["response"]["status"]))
        return out

    def errors(self, since=0):
        """Console errors, uncaught exceptions and Log errors among the events from index `since`, as short
        strings; each is (text, source, url) so a caller can tell a network entry from a script error."""
        out = []
        for e in self.events[since:]:
            m, p = e["method"], e["params"]
            if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
                out.append((f"console.{p['type']}: {text}", "console-api", ""))
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                desc = (d.get("exception") or {}).get("description") or d.get("text", "")
                out.append((f"uncaught: {desc} at {d.get('url', '')}:{d.get('lineNumber', '')}", "exception", ""))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                en = p["entry"]
                out.append((f"log ({en.get('source')}): {en.get('text')} {en.get('url', '')}", en.get("source", ""),
                            en.get("url", "")))
        return out
