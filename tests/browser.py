"""A tiny Chrome DevTools protocol client over ``--remote-debugging-pipe`` (stdlib only, no driver download).

Chromium reads NUL-terminated JSON commands from file descriptor 3 and writes
replies and events to descriptor 4. `Browser` starts a headless Chromium with
the network cut (no DNS, a dead proxy, offline emulation), opens one page and
collects everything its console and log say.
"""

import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# No network: every host resolves to nothing and any proxy use goes to a closed local port.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND", "--window-size=1280,1000",
    "--remote-debugging-pipe",
)  # fmt: skip


class Browser:
    """Headless Chromium driven through the DevTools pipe; one page (``self.session``)."""

    def __init__(self, profile: Path, timeout: float = 60.0) -> None:
        to_child, self._write = os.pipe()  # commands: we write, Chromium reads fd 3
        self._read, from_child = os.pipe()  # replies: Chromium writes fd 4, we read

        def wire() -> None:  # runs in the child before exec
            # Move both out of the way first: the pipes may themselves be fds 3 and 4.
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child, from_child)]
            for fd, target in zip(high, (3, 4)):
                os.dup2(fd, target, inheritable=True)

        self.process = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=wire, close_fds=False,  # os.pipe fds are not inheritable: only 3 and 4 reach the child
        )  # fmt: skip
        os.close(to_child)
        os.close(from_child)
        self.timeout = timeout
        self._next_id = 0
        self._buffer = b""
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)
        self.call("Network.emulateNetworkConditions", session=True, offline=True, latency=0,
                  downloadThroughput=-1, uploadThroughput=-1)  # fmt: skip

    def _message(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no message from Chromium")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise ConnectionError("Chromium closed the DevTools pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        """Send one command (to the page if ``session``) and return its result; events are kept in ``events``."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._message()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str, since: int = 0) -> dict[str, Any]:
        """The first event ``method`` from ``events[since]`` on (already received or next to come)."""
        while True:
            for event in self.events[since:]:
                if event.get("method") == method:
                    return event
            self.events.append(self._message())

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited); raises on a JS exception."""
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True,
                           awaitPromise=True)  # fmt: skip
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:80]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def click(self, x: float, y: float) -> None:
        """A left click at page coordinates (CSS pixels), as a user's mouse would give it."""
        self.call("Input.dispatchMouseEvent", session=True, type="mouseMoved", x=x, y=y)
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", session=True, type=kind, x=x, y=y, button="left", clickCount=1)

    def console(self) -> list[str]:
        """Everything the page's console and log said: console calls, uncaught exceptions, log entries."""
        said = []
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled":
                said.append(f"console.{params['type']}: " + " ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
            elif method == "Runtime.exceptionThrown":
                said.append(f"exception: {params['exceptionDetails']}")
            elif method == "Log.entryAdded":
                said.append(f"log {params['entry']['level']}: {params['entry']['text']}")
        return said

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (ConnectionError, TimeoutError, RuntimeError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._write)
        os.close(self._read)


def open_page(browser: Browser, url: str, ready: str = "document.body && document.body.dataset.explorer === 'ready'") -> float:
    """Navigate to ``url`` and wait until ``ready`` holds; the seconds from navigation to ready."""
    since, start = len(browser.events), time.perf_counter()
    browser.call("Page.navigate", session=True, url=url)
    browser.wait_for("Page.loadEventFired", since)
    deadline = time.monotonic() + browser.timeout
    while not browser.evaluate(ready):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the page never got ready ({ready})")
        time.sleep(0.05)
    return time.perf_counter() - start
