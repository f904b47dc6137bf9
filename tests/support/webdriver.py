"""A minimal W3C WebDriver client over chromedriver's HTTP API, for the browser tests (no new dependency).

::

    with Chrome(profile_dir) as browser:
        browser.get(url)
        browser.click(browser.find("button.pause"))
        browser.screenshot(path)

Chromium runs headless with a fresh profile directory and every background
service off; chromedriver listens on 127.0.0.1 on an ephemeral port.  Every
call is bounded (``timeout``), and :meth:`Chrome.wait` polls with a deadline.
"""

import base64
import json
import os
import shutil
import socket
import subprocess
import urllib.error
import urllib.request

from support.wire import wait_for

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"
CHROME_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--disable-dev-shm-usage", "--window-size=1280,900"]
INSTALL_HINT = "apt-get install -y chromium chromium-driver"


def find_browser():
    """``(chromium, chromedriver)`` paths, or None when either is missing."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if chromium and driver:
        return chromium, driver
    return None


class WebDriverError(Exception):
    pass


class Chrome:
    def __init__(self, profile_dir, timeout=30.0):
        found = find_browser()
        if found is None:
            raise WebDriverError("chromium and chromedriver are needed: " + INSTALL_HINT)
        self.chromium, driver = found
        self.timeout = timeout
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.base = "http://127.0.0.1:%d" % port
        self.proc = subprocess.Popen([driver, "--port=%d" % port, "--allowed-ips=127.0.0.1"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        self.session = None
        try:
            self._wait_ready()
            caps = {"browserName": "chrome", "goog:loggingPrefs": {"browser": "ALL"},
                    "goog:chromeOptions": {"binary": self.chromium,
                                           "args": CHROME_ARGS + ["--user-data-dir=" + str(profile_dir)]}}
            value = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})
            self.session = value["sessionId"]
        except BaseException:
            self.quit()
            raise

    def _wait_ready(self):
        def ready():
            try:
                if self._call("GET", "/status", timeout=2).get("ready"):
                    return True
            except (OSError, WebDriverError):
                pass
            if self.proc.poll() is not None:
                raise WebDriverError("chromedriver did not start (it exited)")
            return False

        try:
            wait_for(ready, self.timeout, interval=0.05, what="chromedriver")
        except AssertionError:
            raise WebDriverError("chromedriver did not start") from None

    def _call(self, method, path, body=None, timeout=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                doc = json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            raise WebDriverError("%s %s: %s" % (method, path, e.read().decode("utf-8", "replace")[:500])) from None
        return doc.get("value")

    def _s(self, path, method="GET", body=None):
        return self._call(method, "/session/%s%s" % (self.session, path), body)

    # -- the commands the tests use

    def get(self, url):
        self._s("/url", "POST", {"url": url})

    @property
    def url(self):
        return self._s("/url")

    def find_all(self, css):
        return [e[ELEMENT] for e in self._s("/elements", "POST", {"using": "css selector", "value": css})]

    def find(self, css):
        found = self.find_all(css)
        if not found:
            raise WebDriverError("no element matches %r on %s" % (css, self.url))
        return found[0]

    def click(self, element):
        self._s("/element/%s/click" % element, "POST", {})

    def text(self, element):
        return self._s("/element/%s/text" % element)

    def disable_script(self):
        """Run no page script from now on (Chromium's DevTools, through chromedriver): a browser without it."""
        self._s("/goog/cdp/execute", "POST", {"cmd": "Emulation.setScriptExecutionDisabled",
                                              "params": {"value": True}})

    def type(self, element, keys):
        """Type ``keys`` into an element as a user does (its key and input events fire)."""
        self._s("/element/%s/value" % element, "POST", {"text": keys})

    def run(self, script, *args):
        return self._s("/execute/sync", "POST", {"script": script, "args": list(args)})

    def accept_alert(self):
        self._s("/alert/accept", "POST", {})

    def alert_open(self):
        try:
            self._s("/alert/text")
            return True
        except WebDriverError:
            return False

    def set_window_size(self, width, height):
        self._s("/window/rect", "POST", {"width": width, "height": height})

    def screenshot(self, path):
        data = base64.b64decode(self._s("/screenshot"))
        with open(path, "wb") as f:
            f.write(data)
        return data

    def browser_log(self):
        """The console's messages since the last call (chromedriver's log endpoint)."""
        try:
            return self._call("POST", "/session/%s/se/log" % self.session, {"type": "browser"}) or []
        except WebDriverError:
            return []

    def wait(self, predicate, what, timeout=None):
        """Poll ``predicate()`` until true (page scripts run on their own clock); returns its value."""
        last = []  # the last WebDriverError, named in the failure

        def answered():
            try:
                return predicate()
            except WebDriverError as e:
                last[:] = [e]
                return None

        return wait_for(answered, timeout or self.timeout, interval=0.05,
                        what=lambda: "%s (%s)" % (what() if callable(what) else what, last[0] if last else None))

    def quit(self):
        if self.session is not None:
            try:
                self._call("DELETE", "/session/" + self.session, timeout=10)
            except (OSError, WebDriverError):
                pass
            self.session = None
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.quit()


def require_browser():
    """Skip without chromium/chromedriver, unless CI is set: then fail naming the packages."""
    import pytest

    if find_browser() is None:
        if os.environ.get("CI"):
            pytest.fail("chromium and chromedriver are missing: " + INSTALL_HINT)
        pytest.skip("chromium/chromedriver absent (" + INSTALL_HINT + ")")
